//! The replication reader: its own thread and current-thread runtime (measured 2–3×
//! faster than a multi-thread runtime for this loop), reconnecting with backoff, handing
//! batches to the source through a bounded channel, and sending feedback that never
//! confirms past what was acknowledged — nor a position the server called idle, except
//! while nothing is pending and within the session that saw it (`feedback.rs`).
//!
//! The replication client's worker runs on this thread's runtime too, so the stream loop
//! must wait on something whenever it has nothing to do: a pass that neither reads nor
//! waits starves the client, and the session then looks connected while nothing is read.
//! What the loop decides from (the age of the batch under construction) lives with the
//! batch in the assembler, so it cannot outlive a batch a reconnect dropped.
//!
//! Large transactions (PostgreSQL 14+, `stream_in_progress`) come in blocks while they
//! run; `streamed.rs` holds them and, at their Stream Commit, the reader replays them
//! through the assembler between a Begin and a Commit of their own. Feedback needs no
//! change: a position past a held transaction's start may be confirmed, since the server
//! streams an unfinished transaction again from its start in the next session
//! (`tests/it/source_streaming.rs` terminates the walsender to show it).
//!
//! Reading in bursts. A thread waiting on the socket is woken by the server for every
//! message, and on loopback that wake-up is paid by the sending walsender: most of its
//! CPU per row on a busy OLTP stream went to waking this thread. So once a wait ended
//! because data came, the next time the socket is empty the thread *sleeps* for
//! `read_gap` instead of waiting on it (a sleeping thread is not on the socket's wait
//! queue, so arrivals just queue), then takes everything that gathered in one read.
//! A wait that ends any other way (a quiet stream, an ack) leaves the next one an
//! ordinary wait, so an idle source still reads a change the moment it comes.
//!
//! On a connection to this host the wait after a pause is not woken per message either:
//! the socket's wake-up threshold is raised (`lowat.rs`), so the kernel wakes the thread
//! once 64 KiB have gathered, and `read_gap` after the last data the threshold is lowered
//! again, which releases whatever is queued. On the one-transaction capture this took the
//! server's CPU per row from 6.9 µs to 3.5–3.8 µs (BENCHMARKS.md, capture).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freshen::{Ack, Batch, BoxFuture, Jitter, Retry, SourceError};
use futures_util::FutureExt;
use pgwire_replication::{
    Lsn as WireLsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent,
};
use rustls::ClientConfig;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::admin::{slot_lost, slot_missing};
use crate::capture::assemble::{Assembler, Committed, Output};
use crate::capture::durable::{DurableConfig, POLL as DURABLE_POLL, Probe, durable};
use crate::capture::feedback::{Acked, Feedback};
use crate::capture::lowat::Lowat;
use crate::capture::rows::Relations;
use crate::capture::streamed::{Fed, Replay, StreamError, Streams};
use crate::capture::xid::XidClock;
use crate::error::ErrorKind;
use crate::quote::quote_literal;
use crate::tls::{self, Transport};
use crate::{Lsn, PgError, PgSourceConfig, SlotMode, StartPosition, TableName};

/// How long a partly filled batch waits for more rows once the wire goes quiet.
const LINGER: Duration = Duration::from_millis(1);

/// The raised wake-up threshold of a busy stream on this host (`lowat.rs`).
const LOWAT_BYTES: usize = 64 * 1024;

/// Whether `host` names this machine over TCP.
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// How old a partly filled batch may grow while rows keep coming: once the reader has
/// read everything sent, a batch this old is handed over without waiting for a quiet
/// wire. A steady stream (5k transactions a second, Poisson) is almost never quiet for
/// `LINGER`, so without this bound its batches waited for 1024 rows: tens of ms.
const MAX_GATHER: Duration = Duration::from_millis(5);

/// State shared by the reader, the source, its handles and the acks.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) running: AtomicBool,
    pub(crate) streaming: AtomicBool,
    /// The session found its socket's wake-up threshold (`lowat.rs`).
    pub(crate) wake_threshold: AtomicBool,
    pub(crate) received_lsn: AtomicU64,
    pub(crate) server_lsn: AtomicU64,
    pub(crate) confirmed_lsn: AtomicU64,
    /// Position the acknowledgements release (`feedback.rs`); with a durability gate
    /// (`durable.rs`) it is confirmed once the standbys have the rebuilds behind it.
    pub(crate) acknowledged_lsn: AtomicU64,
    /// Position the durability gate released (the standbys flushed past the rebuilds
    /// acknowledged by then).
    durable_lsn: AtomicU64,
    /// Wakes the durability watcher: more is acknowledged than it released.
    durable_wanted: Notify,
    pub(crate) events: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) queued_events: AtomicU64,
    pub(crate) peak_queued_events: AtomicU64,
    /// Messages taken from replication sessions (any kind): the reader's pulse, which
    /// the stall watch (`stall.rs`) compares with the server's WAL.
    pub(crate) messages: AtomicU64,
    /// The reader waits for the consumer to take a batch (the queue is full).
    pub(crate) waiting_consumer: AtomicBool,
    pub(crate) last_error: Mutex<Option<String>>,
    /// Tables discovered while running (see [`SourceHealth::discovered`](freshen::SourceHealth)).
    pub(crate) discovered: Mutex<Vec<TableName>>,
    /// Highest `end_lsn` of an acknowledged commit batch.
    acked_end: AtomicU64,
    /// Sequence number of the newest acknowledged commit batch.
    acked_seq: AtomicU64,
    ack_notify: Notify,
    /// Handed-out commit batches not yet known to be acknowledged, with the commit time
    /// of the first transaction each completes (oldest first, at most
    /// [`UNCONFIRMED_TRACKED`]): the age of what the slot still retains.
    unconfirmed: Mutex<std::collections::VecDeque<(u64, std::time::SystemTime)>>,
}

/// How many unacknowledged commit batches the age of the oldest is tracked over; past
/// it the age is a lower bound (the newest batches are not recorded).
const UNCONFIRMED_TRACKED: usize = 65_536;

/// Commit time of the oldest transaction handed over and not yet acknowledged.
pub(crate) fn oldest_unconfirmed(shared: &Shared) -> Option<std::time::SystemTime> {
    let acked = shared.acked_seq.load(Ordering::SeqCst);
    let mut q = shared.unconfirmed.lock().unwrap_or_else(|p| p.into_inner());
    while q.front().is_some_and(|(seq, _)| *seq <= acked) {
        q.pop_front();
    }
    q.front().map(|(_, t)| *t)
}

impl Shared {
    fn set_error(&self, e: &PgError) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }
}

/// Why a session ended without an error.
enum Ended {
    /// The source asked to stop.
    Stopped,
    /// The consumer dropped the source.
    ConsumerGone,
}

/// What the reader needs from the source.
pub(crate) struct ReaderSetup {
    pub(crate) config: Arc<PgSourceConfig>,
    pub(crate) tls: Option<Arc<ClientConfig>>,
    pub(crate) watched: Option<std::collections::HashSet<TableName>>,
    /// Tables watched by pattern, those created later too.
    pub(crate) patterns: Vec<crate::TablePattern>,
    /// Primary keys of the tables with REPLICA IDENTITY FULL (for `pk_names`).
    pub(crate) primary_keys: std::collections::HashMap<TableName, Vec<String>>,
    /// The watched tables' shapes at start (OID, name, columns), for schema changes.
    pub(crate) shapes: Vec<crate::capture::drift::StartShape>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: mpsc::Sender<Result<Batch, SourceError>>,
    pub(crate) stop: watch::Receiver<bool>,
    /// Ask for streamed in-progress transactions: configured, and the server is 14+.
    pub(crate) stream_in_progress: bool,
    /// Hold confirmations until the standbys have the rebuilds (`durable.rs`).
    pub(crate) durable: Option<DurableConfig>,
}

/// Starts the reader thread. `ready` gets the outcome of the first successful start of
/// streaming (or the error that ended the attempts); `done` fires when the thread ends.
pub(crate) fn spawn(
    setup: ReaderSetup,
    ready: oneshot::Sender<Result<(), PgError>>,
    done: oneshot::Sender<()>,
) -> Result<(), PgError> {
    std::thread::Builder::new()
        .name("freshen-pg-reader".into())
        .spawn(move || {
            let shared = Arc::clone(&setup.shared);
            shared.running.store(true, Ordering::SeqCst);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    let reader = Reader::new(setup);
                    rt.block_on(reader.run(ready));
                }
                Err(e) => {
                    let _ = ready.send(Err(PgError::new(
                        ErrorKind::Connection,
                        format!("cannot start the replication runtime: {e}"),
                    )));
                }
            }
            shared.running.store(false, Ordering::SeqCst);
            shared.streaming.store(false, Ordering::SeqCst);
            let _ = done.send(());
        })
        .map(|_| ())
        .map_err(|e| {
            PgError::new(
                ErrorKind::Connection,
                format!("cannot start the replication thread: {e}"),
            )
        })
}

struct Reader {
    cfg: Arc<PgSourceConfig>,
    tls: Option<Arc<ClientConfig>>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    stop: watch::Receiver<bool>,
    asm: Assembler,
    /// What may be confirmed to the server (`feedback.rs`).
    feedback: Feedback,
    /// Streamed in-progress transactions held until their commit (`streamed.rs`).
    streams: Streams,
    /// Whether sessions ask for streaming (protocol 2).
    stream_in_progress: bool,
    /// The durability gate, when one applies (`durable.rs`).
    durable: Option<DurableConfig>,
    /// The position given to the server as confirmed: the feedback rule's, held back
    /// by the durability gate.
    sent: u64,
}

/// What woke the stream loop.
enum Wake {
    Stop,
    Acked,
    /// The wire stayed quiet for [`LINGER`] with rows waiting.
    Quiet,
    /// No data for `read_gap` with the wake-up threshold raised.
    Slowed,
    /// The server is shutting down (the sentinel connection was terminated).
    ShuttingDown(PgError),
    Event(Result<Option<ReplicationEvent>, PgWireError>),
}

impl Reader {
    fn new(s: ReaderSetup) -> Reader {
        let batch = s.config.batch_size;
        let mut asm = Assembler::new(
            Relations::new(s.watched)
                .with_patterns(s.patterns)
                .with_primary_keys(s.primary_keys),
            XidClock::new(0),
            batch,
        );
        for (oid, table, columns) in s.shapes {
            asm.known_shape(oid, &table, columns);
        }
        Reader {
            asm,
            streams: Streams::new(
                s.config.stream_memory,
                (s.config.stream_spill_dir.clone()).unwrap_or_else(std::env::temp_dir),
            ),
            stream_in_progress: s.stream_in_progress,
            durable: s.durable,
            sent: 0,
            cfg: s.config,
            tls: s.tls,
            shared: s.shared,
            tx: s.tx,
            stop: s.stop,
            feedback: Feedback::default(),
        }
    }

    fn stop_requested(&self) -> bool {
        *self.stop.borrow() || self.stop.has_changed().is_err()
    }

    async fn run(mut self, ready: oneshot::Sender<Result<(), PgError>>) {
        if let Some(config) = self.durable.clone() {
            tokio::spawn(watch_durable(
                config,
                Arc::clone(&self.shared),
                self.stop.clone(),
            ));
        }
        let mut ready = Some(ready);
        let mut attempt: u32 = 0;
        let mut down_since: Option<Instant> = None;
        let mut jitter = Jitter::from_clock();
        loop {
            if self.stop_requested() {
                break;
            }
            let result = self.session(&mut ready).await;
            self.shared.streaming.store(false, Ordering::SeqCst);
            let error = match result {
                Ok(Ended::Stopped | Ended::ConsumerGone) => break,
                Err((e, streamed)) => {
                    if streamed {
                        attempt = 0;
                        down_since = None;
                    }
                    e
                }
            };
            self.shared.set_error(&error);
            let since = *down_since.get_or_insert_with(Instant::now);
            let gave_up = since.elapsed() >= self.cfg.reconnect_deadline;
            let retryable = error.retry() == Retry::Path;
            if !retryable || gave_up {
                let error = if gave_up && retryable {
                    PgError::new(
                        ErrorKind::Connection,
                        format!(
                            "replication stream down for {:?} (reconnect deadline); last error",
                            since.elapsed()
                        ),
                    )
                    .with_source(error)
                } else {
                    error
                };
                match ready.take() {
                    Some(r) => {
                        let _ = r.send(Err(error));
                    }
                    None => {
                        let _ = self.tx.send(Err(SourceError::new(error))).await;
                    }
                }
                break;
            }
            attempt = attempt.saturating_add(1);
            let delay = self.cfg.reconnect.delay(attempt, jitter.unit());
            tracing::warn!(
                slot = %self.cfg.slot,
                attempt,
                retry_in = ?delay,
                "replication session ended, reconnecting: {error}"
            );
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stopped(&mut stop) => break,
            }
            self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn wire_config(&self, c: &crate::ConnectionConfig, transport: &Transport) -> ReplicationConfig {
        let host = match transport {
            Transport::Direct => c.host.clone(),
            Transport::Bridged { dir } => dir.display().to_string(),
        };
        let start = match self.cfg.start {
            StartPosition::Slot => 0,
            StartPosition::Lsn(l) => l.0,
        };
        ReplicationConfig::new(
            host,
            c.user.clone(),
            c.password.clone().unwrap_or_default(),
            c.dbname.clone(),
            self.cfg.slot.clone(),
            self.cfg.publication.as_str(),
        )
        .with_port(c.port)
        .with_start_lsn(WireLsn(start))
        // Always say what is confirmed: starting from a position without it would
        // report the start position as flushed and skip what was never acknowledged.
        .with_ack_lsn(WireLsn(self.sent))
        .with_status_interval(self.cfg.status_interval)
        .with_wakeup_interval(self.cfg.status_interval)
        .with_buffer_size(self.cfg.wire_buffer)
        .with_application_name(c.application_name.clone())
        .with_streaming(self.stream_in_progress)
    }

    /// Connects, prepares the slot, streams until stopped or broken. The error carries
    /// whether streaming had started (which resets the backoff).
    async fn session(
        &mut self,
        ready: &mut Option<oneshot::Sender<Result<(), PgError>>>,
    ) -> Result<Ended, (PgError, bool)> {
        let timeout = self.cfg.connection.connect_timeout;
        let prepared = tokio::time::timeout(timeout * 2, self.connect())
            .await
            .map_err(|_| {
                (
                    PgError::new(
                        ErrorKind::Connection,
                        "connecting for replication timed out",
                    ),
                    false,
                )
            })?
            .map_err(|e| (e, false))?;
        let (mut client, xids, lowat) = prepared;
        let sentinel = sentinel(&self.cfg).await;
        // What the last session gathered and did not hand over is gone, and with it
        // what that session's idle positions promised: the server resends both.
        self.asm.reset(xids);
        // The server streams every unfinished transaction again from its start.
        self.streams.reset();
        self.feedback.session_started();
        self.shared.streaming.store(true, Ordering::SeqCst);
        self.shared
            .wake_threshold
            .store(lowat.is_some(), Ordering::Relaxed);
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        let ended = self.stream(&mut client, sentinel, lowat).await;
        self.shared.wake_threshold.store(false, Ordering::Relaxed);
        ended.map_err(|e| (e, true))
    }

    async fn connect(&mut self) -> Result<(ReplicationClient, XidClock, Option<Lowat>), PgError> {
        // Of several hosts, the one to stream from now (a promotion moves it).
        let conn = crate::hosts::pick(&self.cfg.connection).await?;
        let transport = tls::replication_transport(&conn, self.tls.as_ref()).await?;
        let mut client = ReplicationClient::connect_gated(self.wire_config(&conn, &transport))
            .await
            .map_err(classify)?;
        let slot = &self.cfg.slot;
        let rows = client
            .simple_query(&format!(
                "SELECT pg_snapshot_xmax(pg_current_snapshot())::text, \
                        (SELECT wal_status FROM pg_replication_slots WHERE slot_name = {lit}), \
                        (SELECT count(*) FROM pg_replication_slots WHERE slot_name = {lit})::text, \
                        inet_client_port()::text, inet_server_port()::text",
                lit = quote_literal(slot)
            ))
            .await
            .map_err(classify)?;
        let text = |i: usize| -> Option<String> {
            let v = rows.first()?.get(i)?.as_ref()?;
            Some(String::from_utf8_lossy(v).into_owned())
        };
        let next_xid: u64 = text(0).and_then(|s| s.parse().ok()).ok_or_else(|| {
            PgError::new(ErrorKind::Protocol, "cannot read the transaction epoch")
        })?;
        let exists = text(2).as_deref() == Some("1");
        match self.cfg.slot_mode {
            SlotMode::Temporary => {
                if exists {
                    return Err(PgError::new(
                        ErrorKind::Slot,
                        format!(
                            "a slot named {slot:?} already exists; a temporary slot needs a free name"
                        ),
                    ));
                }
                client
                    .simple_query(&format!(
                        "CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT"
                    ))
                    .await
                    .map_err(classify)?;
            }
            _ if !exists => return Err(slot_missing(slot)),
            _ if text(1).as_deref() == Some("lost") => return Err(slot_lost(slot)),
            _ => {}
        }
        client.start().await.map_err(classify)?;
        client.wait_started().await.map_err(classify)?;
        // The wake-up threshold serves a reader on the server's own host only: there the
        // walsender pays for waking it.
        let port = |i: usize| text(i).and_then(|p| p.parse::<u16>().ok());
        let lowat = match (&transport, port(3), port(4)) {
            (Transport::Direct, Some(local), Some(peer))
                if !self.cfg.read_gap.is_zero() && is_loopback(&conn.host) =>
            {
                Lowat::find(local, peer, LOWAT_BYTES)
            }
            _ => None,
        };
        Ok((client, XidClock::new(next_xid), lowat))
    }

    async fn stream(
        &mut self,
        client: &mut ReplicationClient,
        mut sentinel: BoxFuture<'static, PgError>,
        mut lowat: Option<Lowat>,
    ) -> Result<Ended, PgError> {
        let gap = self.cfg.read_gap;
        // The last wait on the socket ended because data came: the stream is busy.
        let mut busy = false;
        // When data last came (or a pause ended): a raised threshold is lowered `gap`
        // after it.
        let mut last_data = Instant::now();
        loop {
            let wake = match client.recv().now_or_never() {
                Some(ev) => Wake::Event(ev),
                // Caught up, with a batch that has gathered long enough.
                None if self
                    .asm
                    .age(Instant::now())
                    .is_some_and(|a| a >= MAX_GATHER) =>
                {
                    Wake::Quiet
                }
                None => {
                    if busy && !gap.is_zero() {
                        // Raised before the pause as well: data arriving then does not
                        // signal the socket's readiness either, which the sender pays for
                        // per message even with nobody waiting.
                        if let Some(l) = lowat.as_mut() {
                            l.raise();
                        }
                        // Blocking on purpose: this thread's runtime holds only the
                        // replication session, and a timer wait would sit on the
                        // socket's wait queue and be woken per message again.
                        std::thread::sleep(gap);
                        // The raised wait below ends `gap` after the pause at the latest.
                        last_data = Instant::now();
                    }
                    let raised = lowat.as_ref().is_some_and(Lowat::is_raised);
                    // The wire is momentarily empty. With rows waiting, linger briefly
                    // for more (a batch per row would cost more than the rows), then
                    // hand over what has gathered.
                    let linger = self.asm.has_output() && !raised;
                    let stop = &mut self.stop;
                    let acks = &self.shared.ack_notify;
                    let woke = tokio::select! {
                        biased;
                        _ = stopped(stop) => Wake::Stop,
                        e = &mut sentinel => Wake::ShuttingDown(e),
                        _ = acks.notified() => Wake::Acked,
                        ev = client.recv() => Wake::Event(ev),
                        _ = tokio::time::sleep_until((last_data + gap).into()), if raised => {
                            Wake::Slowed
                        }
                        _ = tokio::time::sleep(LINGER), if linger => Wake::Quiet,
                    };
                    busy = matches!(woke, Wake::Event(Ok(Some(_))));
                    if busy {
                        last_data = Instant::now();
                    }
                    woke
                }
            };
            match wake {
                Wake::Stop => {
                    self.finish(client).await;
                    return Ok(Ended::Stopped);
                }
                Wake::Acked => self.advance(client),
                Wake::Slowed => {
                    if let Some(l) = lowat.as_mut() {
                        l.lower();
                    }
                    // Should lowering fail, the next try is a deadline away, not at once.
                    last_data = Instant::now();
                }
                Wake::ShuttingDown(e) => {
                    // Leave without confirming anything more: the replay after the
                    // restart covers what is not acknowledged.
                    client.stop();
                    let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
                    return Err(e);
                }
                Wake::Quiet => {
                    if let Some(out) = self.asm.take()
                        && let Some(end) = self.send(out, client).await?
                    {
                        return Ok(end);
                    }
                }
                Wake::Event(Ok(Some(ev))) => {
                    self.shared.messages.fetch_add(1, Ordering::Relaxed);
                    if let Some(end) = self.handle(ev, client).await? {
                        return Ok(end);
                    }
                    self.asm.stamp(Instant::now);
                }
                Wake::Event(Ok(None)) => {
                    return Err(PgError::new(
                        ErrorKind::Connection,
                        "the replication stream ended",
                    ));
                }
                Wake::Event(Err(e)) => return Err(classify(e)),
            }
        }
    }

    async fn handle(
        &mut self,
        ev: ReplicationEvent,
        client: &mut ReplicationClient,
    ) -> Result<Option<Ended>, PgError> {
        match ev {
            ReplicationEvent::Begin {
                final_lsn,
                xid,
                commit_time_micros,
            } => self.asm.begin(final_lsn.0, xid, commit_time_micros),
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => {
                self.shared
                    .received_lsn
                    .fetch_max(wal_start.0, Ordering::Relaxed);
                if self.stream_in_progress {
                    match self
                        .streams
                        .feed(&data)
                        .map_err(|e| self.stream_failed(e))?
                    {
                        Fed::Pass => {}
                        Fed::Taken => return Ok(None),
                        Fed::Commit(replay) => return self.replay(replay, client).await,
                    }
                }
                return self.change(&data, client).await;
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                return self.committed(end_lsn.0, client).await;
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                self.shared
                    .server_lsn
                    .fetch_max(wal_end.0, Ordering::Relaxed);
                self.feedback.idle_at(wal_end.0);
                self.advance(client);
            }
            ReplicationEvent::StoppedAt { .. } => return Ok(Some(Ended::Stopped)),
            // Markers written into the WAL (the changefeed's snapshot watermarks),
            // handed over in stream order among the rows.
            ReplicationEvent::Message {
                lsn,
                prefix,
                content,
                ..
            } => {
                self.shared.received_lsn.fetch_max(lsn.0, Ordering::Relaxed);
                self.asm.mark(&prefix, &content, lsn.0);
            }
        }
        Ok(None)
    }

    /// One change message through the assembler, handing over any batch it fills.
    async fn change(
        &mut self,
        data: &[u8],
        client: &mut ReplicationClient,
    ) -> Result<Option<Ended>, PgError> {
        let outs = self.asm.change(data);
        let found = self.asm.take_discovered();
        if !found.is_empty() {
            let mut d = self
                .shared
                .discovered
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for t in found {
                // A table is discovered again after a reconnect: listed once.
                if !d.contains(&t) {
                    d.push(t);
                }
            }
        }
        for out in outs {
            if let Some(end) = self.send(out, client).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// A transaction's commit (read, or replayed for a streamed one).
    async fn committed(
        &mut self,
        end_lsn: u64,
        client: &mut ReplicationClient,
    ) -> Result<Option<Ended>, PgError> {
        self.shared
            .received_lsn
            .fetch_max(end_lsn, Ordering::Relaxed);
        if let Committed::Empty(end) = self.asm.commit(end_lsn) {
            self.feedback.idle_at(end);
            self.advance(client);
            if let Some(out) = self.asm.tx_end()
                && let Some(end) = self.send(out, client).await?
            {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// A streamed transaction committed: its held messages go through the assembler as
    /// protocol 1 would have sent them, between a Begin and a Commit of its own.
    async fn replay(
        &mut self,
        mut replay: Replay,
        client: &mut ReplicationClient,
    ) -> Result<Option<Ended>, PgError> {
        self.asm
            .begin(replay.commit_lsn, replay.xid, replay.commit_ts);
        let mut buf = Vec::new();
        while replay
            .next_into(&mut buf)
            .map_err(|e| self.stream_failed(e))?
        {
            if let Some(end) = self.change(&buf, client).await? {
                return Ok(Some(end));
            }
        }
        self.committed(replay.end_lsn, client).await
    }

    /// A streamed transaction the reader could not hold or read back. A spill file that
    /// cannot be written (no writable temporary directory, a full disk) would fail the
    /// same way on every session, and no transaction that large would ever be read: so
    /// later sessions ask for whole transactions (protocol 1) and the server spills them
    /// to its own disk instead, as it did before streaming.
    fn stream_failed(&mut self, e: StreamError) -> PgError {
        if let StreamError::Spill(io) = &e {
            self.stream_in_progress = false;
            tracing::warn!(
                dir = %self.streams.dir().display(),
                error = %io,
                "freshen-postgres: cannot hold a streamed transaction in a temporary file; \
                 reading whole transactions (protocol 1) from now on (point TMPDIR at a \
                 writable directory and restart to stream again)"
            );
        }
        stream_error(e)
    }

    /// Hands a batch over, waiting (and still processing acks) while the queue is full.
    async fn send(
        &mut self,
        out: Output,
        client: &mut ReplicationClient,
    ) -> Result<Option<Ended>, PgError> {
        let n = out.events.len() as u64;
        let skipped = out.skipped.len() as u64;
        let ack = match out.commit_end {
            Some(end) => {
                let seq = self.feedback.handed();
                if let Some(t) = out.first_commit {
                    let mut q = self
                        .shared
                        .unconfirmed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if q.len() < UNCONFIRMED_TRACKED {
                        q.push_back((seq, t));
                    }
                }
                let shared = Arc::clone(&self.shared);
                Ack::new(move || {
                    shared.acked_end.fetch_max(end, Ordering::SeqCst);
                    shared.acked_seq.fetch_max(seq, Ordering::SeqCst);
                    shared.ack_notify.notify_one();
                })
            }
            None => Ack::none(),
        };
        let mut batch = Batch::new(out.events, ack)
            .with_marks(out.marks)
            .with_schema_changes(out.schema_changes)
            .with_committed_through(out.committed_through);
        for e in out.skipped {
            batch = batch.with_skipped(e);
        }
        let sender = self.tx.clone();
        let mut waited = false;
        let permit = loop {
            if let Ok(p) = sender.try_reserve() {
                break p;
            }
            if !waited {
                waited = true;
                self.shared.waiting_consumer.store(true, Ordering::Relaxed);
            }
            let stop = &mut self.stop;
            let acks = &self.shared.ack_notify;
            let got = tokio::select! {
                biased;
                _ = stopped(stop) => None,
                _ = acks.notified() => Some(None),
                p = sender.reserve() => Some(Some(p)),
            };
            match got {
                None => {
                    self.finish(client).await;
                    return Ok(Some(Ended::Stopped));
                }
                Some(None) => self.advance(client),
                Some(Some(Ok(p))) => break p,
                Some(Some(Err(_))) => return Ok(Some(Ended::ConsumerGone)),
            }
        };
        if waited {
            self.shared.waiting_consumer.store(false, Ordering::Relaxed);
        }
        let s = &self.shared;
        let queued = s.queued_events.fetch_add(n, Ordering::Relaxed) + n;
        s.peak_queued_events.fetch_max(queued, Ordering::Relaxed);
        s.events.fetch_add(n, Ordering::Relaxed);
        s.skipped.fetch_add(skipped, Ordering::Relaxed);
        s.batches.fetch_add(1, Ordering::Relaxed);
        permit.send(Ok(batch));
        Ok(None)
    }

    /// Raises the confirmed position as far as the feedback rule allows.
    fn advance(&mut self, client: &ReplicationClient) {
        let acked = Acked {
            seq: self.shared.acked_seq.load(Ordering::SeqCst),
            end: self.shared.acked_end.load(Ordering::SeqCst),
        };
        let unsent = self.asm.in_transaction() || self.asm.has_output();
        self.feedback.advance(acked, unsent);
        let released = self.feedback.confirmed();
        self.shared
            .acknowledged_lsn
            .store(released, Ordering::SeqCst);
        let target = match self.durable {
            None => released,
            Some(_) => {
                let durable = self.shared.durable_lsn.load(Ordering::SeqCst);
                if released > durable {
                    self.shared.durable_wanted.notify_one();
                }
                released.min(durable)
            }
        };
        if target > self.sent {
            self.sent = target;
            client.update_applied_lsn(WireLsn(target));
            self.shared.confirmed_lsn.store(target, Ordering::SeqCst);
        }
    }

    /// Final feedback: report the last confirmed position, then end the stream.
    async fn finish(&mut self, client: &mut ReplicationClient) {
        self.advance(client);
        let target = self.sent;
        let deadline = Instant::now() + self.cfg.status_interval + Duration::from_secs(1);
        while client.metrics().last_applied_lsn().0 < target && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        client.stop();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
    }
}

/// The durability gate's watcher (`durable.rs`): takes the position acknowledged now,
/// reads the primary's WAL position, waits until the standbys flushed past it, and
/// releases the position to the reader. Runs until the reader stops.
async fn watch_durable(
    config: DurableConfig,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut probe = None;
    let mut warned = false;
    loop {
        let wanted = shared.acknowledged_lsn.load(Ordering::SeqCst);
        if wanted <= shared.durable_lsn.load(Ordering::SeqCst) {
            tokio::select! {
                _ = shared.durable_wanted.notified() => continue,
                _ = stopped(&mut stop) => return,
            }
        }
        let step = async {
            if probe.is_none() {
                probe = Some(Probe::new(&config)?);
            }
            let p = probe.as_ref().expect("set above");
            // Read after `wanted`: every rebuild acknowledged by then committed before.
            let w = p.primary_wal().await?;
            let since = Instant::now();
            loop {
                if durable(w, p.flushed().await?) {
                    return Ok::<(), PgError>(());
                }
                if !warned && since.elapsed() > Duration::from_secs(10) {
                    warned = true;
                    tracing::warn!(
                        "freshen-postgres: confirming the slot waits for the standbys to flush the rebuilds' WAL ({}): a standby is behind or gone",
                        crate::Lsn(w)
                    );
                }
                tokio::time::sleep(DURABLE_POLL).await;
            }
        };
        tokio::select! {
            done = step => match done {
                Ok(()) => {
                    warned = false;
                    shared.durable_lsn.fetch_max(wanted, Ordering::SeqCst);
                    shared.ack_notify.notify_one();
                }
                Err(e) => {
                    tracing::warn!("freshen-postgres: cannot read the standbys' positions, confirmations wait: {e}");
                    probe = None;
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stopped(&mut stop) => return,
                    }
                }
            },
            _ = stopped(&mut stop) => return,
        }
    }
}

/// A plain SQL connection held beside the replication session, resolving when the
/// server terminates it for a shutdown.
///
/// In a fast shutdown the server terminates regular backends first (57P01) and then
/// waits for its walsenders, and a walsender exits only once its client has confirmed
/// everything sent — which after-rebuild acks do not allow while the rebuilds cannot
/// connect to the stopping server. So when the sentinel is terminated the reader closes
/// the session (confirming nothing early) and reconnects with backoff, and the server
/// can stop. A sentinel lost for any other reason (an idle timeout, a failed connect)
/// simply never resolves: the replication connection reports its own failures.
async fn sentinel(cfg: &PgSourceConfig) -> BoxFuture<'static, PgError> {
    let never = || -> BoxFuture<'static, PgError> { Box::pin(std::future::pending()) };
    let Ok(tls) = tls::sql_connector(&cfg.connection) else {
        return never();
    };
    let config = cfg.connection.to_tokio();
    let connect = config.connect(tls);
    let Ok(Ok((client, connection))) =
        tokio::time::timeout(cfg.connection.connect_timeout, connect).await
    else {
        return never();
    };
    Box::pin(async move {
        let _client = client;
        let ended = connection.await;
        let code = ended
            .as_ref()
            .err()
            .and_then(|e| e.code())
            .map(|c| c.code().to_owned());
        match code.as_deref() {
            // admin_shutdown, crash_shutdown, cannot_connect_now
            Some(c @ ("57P01" | "57P02" | "57P03")) => PgError::new(
                ErrorKind::Connection,
                "the server is shutting down: replication session closed, nothing more confirmed",
            )
            .with_sqlstate(c),
            _ => std::future::pending().await,
        }
    })
}

/// A stream message the reader cannot follow ends the session: the server streams the
/// unfinished transactions again on the next (or, after a spill failure, sends them
/// whole: [`Reader::stream_failed`]); a malformed message is logged with the session's
/// error.
fn stream_error(e: StreamError) -> PgError {
    let kind = match e {
        StreamError::Spill(_) => ErrorKind::Connection,
        StreamError::Malformed(_) => ErrorKind::Protocol,
    };
    PgError::new(kind, e.to_string())
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

/// Classifies a replication-client error: what a reconnect can fix, and what it cannot.
///
/// The client reports a server error as text; the SQLSTATE in it is the code the
/// server sent, formatted by the client as `(SQLSTATE xxxxx)`. Only that code is read,
/// never the message.
pub(crate) fn classify(e: PgWireError) -> PgError {
    let text = e.to_string();
    let code = match &e {
        PgWireError::Server(m) => m
            .rsplit_once("(SQLSTATE ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .filter(|c| c.len() == 5)
            .map(str::to_owned),
        _ => None,
    };
    let kind = match (&e, code.as_deref()) {
        (PgWireError::Auth(_), _) => ErrorKind::Auth,
        (PgWireError::Tls(_), _) => ErrorKind::Tls,
        (PgWireError::Server(_), Some(c)) if c.starts_with("28") => ErrorKind::Auth,
        // undefined object (a publication), invalid catalog, privileges, unsupported
        (PgWireError::Server(_), Some("42704" | "3D000" | "42501" | "0A000")) => ErrorKind::Setup,
        (PgWireError::Server(_), _) => ErrorKind::Server,
        (PgWireError::MessageTooLarge { .. }, _) => ErrorKind::Protocol,
        (PgWireError::Protocol(_), _) => ErrorKind::Protocol,
        _ => ErrorKind::Connection,
    };
    if matches!(e, PgWireError::MessageTooLarge { .. }) {
        // Repeats forever on reconnect: not worth retrying.
        return PgError::new(ErrorKind::Config, format!("replication connection: {text}"));
    }
    let mut err = PgError::new(kind, format!("replication connection: {text}"));
    if let Some(c) = code {
        err = err.with_sqlstate(c);
    }
    err
}

/// The source-side view of queued events (decremented as batches are taken).
pub(crate) fn taken(shared: &Shared, events: usize) {
    shared
        .queued_events
        .fetch_sub(events as u64, Ordering::Relaxed);
}

/// The confirmed position as an [`Lsn`].
pub(crate) fn lsn(a: &AtomicU64) -> Lsn {
    Lsn(a.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_server_errors_by_code() {
        let missing = classify(PgWireError::Server(
            "publication \"p\" does not exist (SQLSTATE 42704)".into(),
        ));
        assert_eq!(missing.kind(), ErrorKind::Setup);
        assert_eq!(missing.retry(), Retry::Fix);
        let busy = classify(PgWireError::Server(
            "replication slot \"s\" is active for PID 7 (SQLSTATE 55006)".into(),
        ));
        assert_eq!(busy.sqlstate(), Some("55006"));
        assert_eq!(busy.retry(), Retry::Path);
        let auth = classify(PgWireError::Server(
            "password authentication failed (SQLSTATE 28P01)".into(),
        ));
        assert_eq!(auth.kind(), ErrorKind::Auth);
        let down = classify(PgWireError::Server(
            "terminating connection (SQLSTATE 57P01)".into(),
        ));
        assert_eq!(down.retry(), Retry::Path);
        let io = classify(PgWireError::Io(Arc::new(std::io::Error::other("reset"))));
        assert_eq!(io.retry(), Retry::Path);
        // A message that merely mentions a code is not a code.
        let odd = classify(PgWireError::Protocol("saw (SQLSTATE 28P01)".into()));
        assert_eq!(odd.sqlstate(), None);
    }
}
