//! The binlog reader: its own thread and current-thread runtime, one replication
//! session at a time (reconnecting with backoff), row images decoded as they arrive and
//! handed to the source in bounded batches. The parts:
//!
//! - [`connect`]: a session opened from the resume point; which failures end the reader;
//! - [`assemble`]: events in, the batch being gathered and resume points out (no I/O);
//! - [`progress`]: the acknowledgement rule — which position is safe, and when it is
//!   worth storing (no I/O);
//! - [`shared`]: what the reader shares with the source, its handles and the acks.
//!
//! This module is the I/O around them: the thread, the reconnect loop, reading the
//! stream, handing batches over, and the task that stores the safe position.

mod assemble;
mod connect;
mod progress;
mod shared;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use freshen::{Ack, Batch, Retry, SourceError};
use futures_util::{FutureExt, StreamExt};
use mysql_async::{BinlogStream, Opts};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use self::assemble::{Assembler, Head, Step};
use self::connect::Failure;
use self::progress::Progress;
pub(crate) use self::shared::{Shared, lock, taken};
use crate::config::TablePattern;
use crate::error::ErrorKind;
use crate::schema::SchemaChange;
use crate::store::Store;
use crate::{Checkpoint, MySqlError, MySqlSourceConfig};

/// How long a partly filled batch waits for more rows once the wire goes quiet.
const LINGER: Duration = Duration::from_millis(1);

/// What the reader needs to run.
pub(crate) struct ReaderSetup {
    pub(crate) config: Arc<MySqlSourceConfig>,
    pub(crate) opts: Opts,
    pub(crate) start: Checkpoint,
    pub(crate) by_gtid: bool,
    pub(crate) patterns: Vec<TablePattern>,
    pub(crate) store: Store,
    pub(crate) shared: Arc<Shared>,
    pub(crate) schema_tx: broadcast::Sender<SchemaChange>,
    pub(crate) tx: mpsc::Sender<Result<Batch, SourceError>>,
    pub(crate) stop: watch::Receiver<bool>,
}

/// Starts the reader thread.
pub(crate) fn spawn(
    setup: ReaderSetup,
    ready: oneshot::Sender<Result<(), MySqlError>>,
    done: oneshot::Sender<()>,
) -> Result<(), MySqlError> {
    std::thread::Builder::new()
        .name("freshen-mysql-binlog".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(MySqlError::new(
                        ErrorKind::Connection,
                        format!("cannot start the binlog reader's runtime: {e}"),
                    )));
                    return;
                }
            };
            let shared = Arc::clone(&setup.shared);
            shared.running.store(true, Ordering::SeqCst);
            let inner = Arc::clone(&shared);
            rt.block_on(async move {
                let shared = inner;
                let store = setup.store.clone();
                let interval = Duration::from_millis(setup.config.position_interval_ms);
                let task = tokio::spawn(store_loop(store.clone(), Arc::clone(&shared), interval));
                Reader::new(setup).run(ready).await;
                task.abort();
                let _ = task.await;
                // The last safe position, stored before the reader reports it ended.
                persist(&store, &shared).await;
            });
            shared.running.store(false, Ordering::SeqCst);
            shared.streaming.store(false, Ordering::SeqCst);
            let _ = done.send(());
        })
        .map_err(|e| {
            MySqlError::new(
                ErrorKind::Connection,
                format!("cannot start the binlog reader thread: {e}"),
            )
        })?;
    Ok(())
}

/// Persists the safe position every `interval` while the reader runs.
async fn store_loop(store: Store, shared: Arc<Shared>, interval: Duration) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.store_notify.notified() => {}
        }
        persist(&store, &shared).await;
        tokio::time::sleep(interval).await;
    }
}

/// Stores the safe position when it is worth storing ([`progress::worth_storing`]).
async fn persist(store: &Store, shared: &Shared) {
    let Some(m) = lock(&shared.safe).clone() else {
        return;
    };
    if !progress::worth_storing(*lock(&shared.stored_mark), &m) {
        return;
    }
    match store.save(&m.cp).await {
        Ok(()) => {
            *lock(&shared.stored_mark) = Some((m.serial, m.foreign));
            shared.stores.fetch_add(1, Ordering::Relaxed);
            *lock(&shared.stored) = Some(m.cp.clone());
        }
        Err(e) => {
            shared.store_failures.fetch_add(1, Ordering::Relaxed);
            shared.set_error(&e);
            tracing::warn!(error = %e, "freshen-mysql: storing the resume position failed; retrying");
        }
    }
}

/// How a session ended.
enum Ended {
    Stopped,
    ConsumerGone,
}

enum Wake {
    Stop,
    Acked,
    Quiet,
    Event(Option<Result<mysql_async::binlog::events::Event, mysql_async::Error>>),
    Panicked,
}

/// The reader: the I/O around the assembler and the acknowledgement rule.
struct Reader {
    cfg: Arc<MySqlSourceConfig>,
    opts: Opts,
    by_gtid: bool,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    stop: watch::Receiver<bool>,
    asm: Assembler,
    progress: Progress,
}

impl Reader {
    fn new(s: ReaderSetup) -> Reader {
        let self_table = s.store.table_name().cloned();
        let asm = Assembler::new(
            s.start,
            s.by_gtid,
            s.patterns,
            self_table,
            Arc::clone(&s.shared),
            s.schema_tx,
        );
        Reader {
            cfg: s.config,
            opts: s.opts,
            by_gtid: s.by_gtid,
            progress: Progress::new(Arc::clone(&s.shared)),
            shared: s.shared,
            tx: s.tx,
            stop: s.stop,
            asm,
        }
    }

    async fn run(mut self, ready: oneshot::Sender<Result<(), MySqlError>>) {
        // The starting point is safe by definition: store it before anything else, so a
        // crash before the first acknowledgement resumes here and not at a later
        // "current" position.
        *lock(&self.shared.safe) = Some(Arc::clone(self.asm.resume()));
        self.shared.store_notify.notify_one();
        let mut ready = Some(ready);
        let backoff = self.cfg.reconnect();
        let deadline = Duration::from_secs(self.cfg.reconnect_deadline_s);
        let mut attempt = 0u32;
        let mut failing_since: Option<Instant> = None;
        let mut jitter = freshen::Jitter::from_clock();
        loop {
            let result = self.session(&mut ready).await;
            self.shared.streaming.store(false, Ordering::SeqCst);
            match result {
                Ok(Ended::Stopped) | Ok(Ended::ConsumerGone) => break,
                Err(f) => {
                    self.shared.set_error(&f.error);
                    tracing::warn!(error = %f.error, "freshen-mysql: binlog session ended");
                    if f.fatal || ready.is_some() {
                        // Before the first session streams, the caller of start() hears it.
                        if let Some(r) = ready.take() {
                            let _ = r.send(Err(f.error));
                        } else {
                            let _ = self.tx.send(Err(SourceError::new(f.error))).await;
                        }
                        break;
                    }
                    if f.streamed {
                        attempt = 0;
                        failing_since = None;
                    }
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= deadline {
                        // An outage, told to the refresher (which reads on) once it has
                        // lasted the deadline, and again after each further one; the
                        // reader goes on reconnecting.
                        let e = MySqlError::new(
                            ErrorKind::Connection,
                            format!("reconnecting has failed for {deadline:?}; retrying"),
                        )
                        .with_source(f.error);
                        failing_since = Some(Instant::now());
                        let outage = SourceError::new(e).with_retry(Retry::Path);
                        let (tx, stop) = (&self.tx, &mut self.stop);
                        tokio::select! {
                            sent = tx.send(Err(outage)) => if sent.is_err() { break },
                            _ = stopped(stop) => break,
                        }
                    }
                    self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    let delay = backoff.delay(attempt, jitter.unit());
                    attempt = attempt.saturating_add(1);
                    let stop = &mut self.stop;
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stopped(stop) => break,
                    }
                }
            }
        }
        self.advance();
    }

    async fn session(
        &mut self,
        ready: &mut Option<oneshot::Sender<Result<(), MySqlError>>>,
    ) -> Result<Ended, Failure> {
        let timeout = Duration::from_secs(30);
        let open = connect::open(&self.opts, &self.cfg, self.by_gtid, &self.asm.resume().cp);
        let mut stream = match tokio::time::timeout(timeout, open).await {
            Ok(Ok(s)) => {
                let crc32 = s.info.checksum.eq_ignore_ascii_case("CRC32");
                self.asm.start_session(s.charsets, crc32);
                s.stream
            }
            Ok(Err(e)) => return Err(Failure::retry(e, false)),
            Err(_) => {
                return Err(Failure::retry(
                    MySqlError::new(ErrorKind::Connection, "connecting for the binlog timed out"),
                    false,
                ));
            }
        };
        self.shared.streaming.store(true, Ordering::SeqCst);
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        let result = self.stream(&mut stream).await;
        // Whatever was gathered goes out (its commits are acknowledged as usual): the
        // next session resumes after the last transaction seen.
        if !matches!(result, Ok(Ended::ConsumerGone)) && self.asm.has_output() {
            let _ = self.flush().await;
        }
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.close()).await;
        });
        result.map_err(|e| Failure::retry(e, true))
    }

    async fn stream(&mut self, stream: &mut BinlogStream) -> Result<Ended, MySqlError> {
        loop {
            // mysql_common parses each event header before this crate sees it and can
            // panic on a malformed one; a panic ends the session instead of the thread.
            let next = AssertUnwindSafe(stream.next()).catch_unwind();
            let wake = match next.now_or_never() {
                Some(Ok(ev)) => Wake::Event(ev),
                Some(Err(_)) => Wake::Panicked,
                None => {
                    let linger = self.asm.has_output();
                    let stop = &mut self.stop;
                    let acks = &self.shared.ack_notify;
                    tokio::select! {
                        biased;
                        _ = stopped(stop) => Wake::Stop,
                        _ = acks.notified() => Wake::Acked,
                        ev = AssertUnwindSafe(stream.next()).catch_unwind() => match ev {
                            Ok(ev) => Wake::Event(ev),
                            Err(_) => Wake::Panicked,
                        },
                        _ = tokio::time::sleep(LINGER), if linger => Wake::Quiet,
                    }
                }
            };
            match wake {
                Wake::Stop => return Ok(Ended::Stopped),
                Wake::Acked => self.advance(),
                Wake::Quiet => {
                    if self.flush().await? {
                        return Ok(Ended::ConsumerGone);
                    }
                }
                Wake::Panicked => {
                    return Err(MySqlError::new(
                        ErrorKind::Decode,
                        "a malformed binlog event broke the client's parser",
                    ));
                }
                Wake::Event(None) => {
                    return Err(MySqlError::new(
                        ErrorKind::Connection,
                        "the binlog stream ended",
                    ));
                }
                Wake::Event(Some(Err(e))) => {
                    return Err(MySqlError::driver("the binlog stream broke", e));
                }
                Wake::Event(Some(Ok(ev))) => {
                    let h = ev.header();
                    let head = Head {
                        kind: h.event_type_raw(),
                        timestamp: h.timestamp(),
                        end: u64::from(h.log_pos()),
                        size: u64::from(h.event_size()),
                        server_id: h.server_id(),
                    };
                    match self.asm.handle(head, ev.data())? {
                        Step::Continue => {}
                        Step::Advance => self.advance(),
                        Step::Flush => {
                            if self.flush().await? {
                                return Ok(Ended::ConsumerGone);
                            }
                        }
                    }
                    if self.asm.gathered() >= self.cfg.batch_size && self.flush().await? {
                        return Ok(Ended::ConsumerGone);
                    }
                }
            }
        }
    }

    /// Hands the gathered batch over (waiting, and still taking acks, while the queue is
    /// full). Returns true when the consumer is gone.
    async fn flush(&mut self) -> Result<bool, MySqlError> {
        if !self.asm.has_output() {
            return Ok(false);
        }
        // A fresh batch of the usual size: no regrowth per batch.
        let out = self.asm.take_output(self.cfg.batch_size.min(4096));
        let n = out.events.len() as u64;
        let ack = match out.commit {
            Some(mark) => self.progress.ack(mark),
            None => Ack::none(),
        };
        let batch = out.skipped.into_iter().fold(
            Batch::new(out.events, ack).with_schema_changes(out.changes),
            Batch::with_skipped,
        );
        let sender = self.tx.clone();
        let permit = loop {
            let stop = &mut self.stop;
            let acks = &self.shared.ack_notify;
            let got = tokio::select! {
                biased;
                _ = stopped(stop) => None,
                _ = acks.notified() => Some(None),
                p = sender.reserve() => Some(Some(p)),
            };
            match got {
                None => return Ok(true),
                Some(None) => self.advance(),
                Some(Some(Ok(p))) => break p,
                Some(Some(Err(_))) => return Ok(true),
            }
        };
        let s = &self.shared;
        let queued = s.queued_events.fetch_add(n, Ordering::Relaxed) + n;
        s.peak_queued_events.fetch_max(queued, Ordering::Relaxed);
        s.events.fetch_add(n, Ordering::Relaxed);
        s.batches.fetch_add(1, Ordering::Relaxed);
        permit.send(Ok(batch));
        Ok(false)
    }

    /// Publishes the safe position ([`Progress::advance`]).
    fn advance(&mut self) {
        self.progress.advance(self.asm.resume(), self.asm.busy());
    }
}

/// Resolves once a stop is requested (or the source is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}
