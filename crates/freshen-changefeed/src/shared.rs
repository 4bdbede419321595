//! What the log's parts share: the store, the writer's request queue, what the writer
//! publishes (the latest sequence, the log's size, its metrics) and the stop signal
//! of the background tasks ([`Core`]). The log ([`Changefeed`](crate::Changefeed)), its
//! consumer groups and its retention all work through it, and it knows none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb::Database;
use tokio::sync::{mpsc, oneshot, watch};

use crate::Error;
use crate::filter::Selection;
use crate::metrics::{self, Metrics};
use crate::record::{self, RecordRef};
use crate::store::{self, LogState};
use crate::writer::{self, Request, Tally};

/// The log's size, as `GET /changefeed/stats` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Events stored.
    pub total_events: u64,
    /// The last sequence appended (0: none yet).
    pub latest_sequence: u64,
    /// The oldest sequence stored (`latest_sequence + 1` when empty).
    pub oldest_sequence: u64,
    /// Bytes of stored events.
    pub total_size_bytes: u64,
}

/// What the writer publishes; shared with readers. Holds no sender, so that dropping
/// every `Changefeed` stops the writer.
pub(crate) struct Published {
    latest: watch::Sender<u64>,
    oldest: AtomicU64,
    size: AtomicU64,
    count: AtomicU64,
    truncated: AtomicU64,
    tx_complete: watch::Sender<u64>,
    closed: Mutex<Option<String>>,
    pub(crate) metrics: Metrics,
}

impl Published {
    /// What a store opened at `state` publishes before the writer's first commit.
    pub(crate) fn new(state: &LogState) -> Published {
        Published {
            latest: watch::Sender::new(state.last),
            oldest: AtomicU64::new(state.oldest),
            size: AtomicU64::new(state.size),
            count: AtomicU64::new(state.count),
            truncated: AtomicU64::new(state.truncated),
            tx_complete: watch::Sender::new(state.tx_complete),
            closed: Mutex::new(None),
            metrics: Metrics::default(),
        }
    }
}

impl writer::Publish for Arc<Published> {
    fn committed(&self, s: &LogState, commit: Duration, t: &Tally) {
        self.oldest.store(s.oldest, Ordering::Relaxed);
        self.size.store(s.size, Ordering::Relaxed);
        self.count.store(s.count, Ordering::Relaxed);
        self.truncated.store(s.truncated, Ordering::Relaxed);
        metrics::inc(&self.metrics.commits);
        metrics::add(&self.metrics.commit_micros, commit.as_micros() as u64);
        metrics::add(&self.metrics.appended, t.appended);
        metrics::add(&self.metrics.duplicates, t.duplicates);
        metrics::add(&self.metrics.filled, t.filled);
        metrics::add(&self.metrics.partial, t.partial);
        metrics::add(&self.metrics.compacted, t.compacted);
        metrics::add(&self.metrics.snapshot_rows, t.snapshot_rows);
        metrics::add(&self.metrics.snapshot_dropped, t.snapshot_dropped);
        self.latest.send_if_modified(|l| {
            let changed = *l != s.last;
            *l = s.last;
            changed
        });
        // After `latest`: a reader that sees this value sees every event it covers.
        self.tx_complete.send_if_modified(|c| {
            let changed = *c != s.tx_complete;
            *c = s.tx_complete;
            changed
        });
    }

    fn failed(&self, reason: String) {
        tracing::error!(%reason, "changefeed store commit failed; the changefeed stops accepting writes");
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }
}

pub(crate) struct Core {
    pub(crate) db: Arc<Database>,
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    pub(crate) published: Arc<Published>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Background tasks watch this and stop when it turns true.
    stop: watch::Sender<bool>,
}

impl Core {
    /// The store `db`, its writer (`requests` in, `writer` the thread) and what it
    /// publishes.
    pub(crate) fn new(
        db: Arc<Database>,
        requests: mpsc::UnboundedSender<Request>,
        published: Arc<Published>,
        writer: std::thread::JoinHandle<()>,
    ) -> Core {
        Core {
            db,
            requests: Mutex::new(Some(requests)),
            published,
            writer: Mutex::new(Some(writer)),
            stop: watch::Sender::new(false),
        }
    }

    /// Stops the background tasks and the writer (after it finished what was queued)
    /// and waits for them.
    pub(crate) async fn close(&self) {
        self.stop.send_replace(true);
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.published.metrics
    }

    fn closed_error(&self) -> Error {
        Error::Closed {
            reason: self
                .published
                .closed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    pub(crate) fn submit(&self, request: Request) -> Result<(), Error> {
        let requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        match requests.as_ref() {
            Some(tx) => tx.send(request).map_err(|_| self.closed_error()),
            None => Err(self.closed_error()),
        }
    }

    /// Applies consumer-group changes durably.
    pub(crate) fn write_submit(
        &self,
        ops: Vec<writer::WriteOp>,
    ) -> Result<oneshot::Receiver<Result<(), Error>>, Error> {
        let (reply, rx) = oneshot::channel();
        self.submit(Request::Write { ops, reply })?;
        Ok(rx)
    }

    pub(crate) async fn wait<T>(
        &self,
        rx: oneshot::Receiver<Result<T, Error>>,
    ) -> Result<T, Error> {
        rx.await.map_err(|_| self.closed_error())?
    }

    pub(crate) fn latest(&self) -> u64 {
        *self.published.latest.borrow()
    }

    pub(crate) fn watch_latest(&self) -> watch::Receiver<u64> {
        self.published.latest.subscribe()
    }

    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    pub(crate) fn stats(&self) -> Stats {
        let latest = self.latest();
        // The oldest is stored before the latest is published: never above latest + 1.
        let oldest = self
            .published
            .oldest
            .load(Ordering::Relaxed)
            .min(latest + 1);
        Stats {
            total_events: self.published.count.load(Ordering::Relaxed),
            latest_sequence: latest,
            oldest_sequence: oldest,
            total_size_bytes: self.published.size.load(Ordering::Relaxed),
        }
    }

    /// Visits durable events after `after` (at most `max_scan`), in order, until `visit`
    /// returns false; returns the last sequence visited.
    pub(crate) fn scan(
        &self,
        after: u64,
        max_scan: usize,
        visit: impl FnMut(u64, &RecordRef<'_>) -> bool,
    ) -> Result<u64, Error> {
        let mut corrupt = 0;
        let last = store::scan(
            &self.db,
            after,
            self.latest(),
            max_scan,
            &mut corrupt,
            visit,
        );
        if corrupt > 0 {
            metrics::add(&self.metrics().corrupt_records, corrupt);
        }
        last
    }

    /// Up to `limit` durable events after `after` that match `filter`, examining at most
    /// `max_scan` events; returns them as `(sequence, json)` and the last sequence
    /// examined (where the next read starts).
    pub(crate) fn read_json(
        &self,
        after: u64,
        limit: usize,
        max_scan: usize,
        filter: &(impl Selection + ?Sized),
        mut each: impl FnMut(u64, &RecordRef<'_>),
    ) -> Result<u64, Error> {
        let mut n = 0;
        let mut last_match = after;
        let last = self.scan(after, max_scan, |seq, r| {
            if filter.delivers(seq, r) {
                each(seq, r);
                n += 1;
                last_match = seq;
            }
            n < limit
        })?;
        // Stopped at the limit: resume right after the last event returned.
        Ok(if n >= limit { last_match } else { last })
    }

    /// The commit position through which every transaction is known to be wholly in
    /// the log (0: none known), published after the events it covers: read it before
    /// reading the events.
    pub(crate) fn watch_tx_complete(&self) -> watch::Receiver<u64> {
        self.published.tx_complete.subscribe()
    }

    /// The transaction of the record at `at`, if it has a source position: where it
    /// began and how many of its events up to `at` match `filter` (looking back at most
    /// `max_scan` records).
    pub(crate) fn tx_at(
        &self,
        at: u64,
        max_scan: usize,
        filter: &(impl Selection + ?Sized),
    ) -> Result<Option<crate::txmark::Open>, Error> {
        let mut found: Option<((u64, u64), u64, u64)> = None;
        store::scan_back(&self.db, at, max_scan, |seq, r| {
            let position = record::position_of(r);
            match (&mut found, position) {
                (None, Some(p)) => {
                    found = Some((p, seq, u64::from(filter.keeps(r))));
                    true
                }
                (Some((p, first, count)), Some(q)) if *p == q => {
                    *first = seq;
                    *count += u64::from(filter.keeps(r));
                    true
                }
                _ => false,
            }
        })?;
        Ok(found.map(|(p, first, count)| crate::txmark::Open::before(p, first, at, count)))
    }

    /// Every sequence below this one was deleted from the front of the log: a reader
    /// positioned below it has missed events (a gap).
    pub(crate) fn truncated(&self) -> u64 {
        self.published.truncated.load(Ordering::Relaxed)
    }

    /// Compaction: deletes `seqs`; returns how many were deleted.
    pub(crate) async fn compact(&self, seqs: Vec<u64>) -> Result<u64, Error> {
        let (reply, rx) = oneshot::channel();
        self.submit(Request::Compact { seqs, reply })?;
        self.wait(rx).await
    }

    pub(crate) async fn truncate(&self, before: u64) -> Result<u64, Error> {
        let mut total = 0;
        loop {
            let (reply, rx) = oneshot::channel();
            self.submit(Request::Truncate { before, reply })?;
            let n = self.wait(rx).await?;
            total += n;
            if n < writer::TRUNCATE_CHUNK {
                return Ok(total);
            }
        }
    }
}

/// Resolves once the published latest sequence exceeds `after`.
pub(crate) async fn newer_than(rx: &mut watch::Receiver<u64>, after: u64) {
    // The sender lives as long as the log; if it is gone, nothing newer comes.
    if rx.wait_for(|l| *l > after).await.is_err() {
        std::future::pending::<()>().await;
    }
}
