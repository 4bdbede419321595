//! `Changefeed`: the handle to the log — append, read, wait, retention, close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use freshen::RowEvent;
use redb::Database;
use tokio::sync::{mpsc, oneshot, watch};

use crate::filter::Selection;
use crate::groups::{GroupInfo, GroupSpec, Groups, Start};
use crate::metrics::{self, GroupGauges, LogGauges, Metrics};
use crate::record::{self, Encoder, Extra, RecordRef};
use crate::store::{self, LogState};
use crate::writer::{self, AppendOutcome, Item, Part, Request, Tally};
use crate::{ChangefeedConfig, Error, Filter};

/// One event as the log serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Its position in the log.
    pub sequence: u64,
    /// Its JSON (ThemisDB's fields plus ours).
    pub json: String,
}

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

/// A durable, sequenced change log: append row events (idempotently, with group
/// commit), read them back in order, serve them over HTTP ([`crate::app`]).
///
/// Cloning is cheap; clones share the log. The writer stops when the last clone is
/// dropped or [`Changefeed::close`] is called.
#[derive(Clone)]
pub struct Changefeed {
    pub(crate) core: Arc<Core>,
    pub(crate) groups: Arc<Groups>,
    /// Snapshot progress, the chunk in flight, the driver's tables.
    pub(crate) snapshots: Arc<crate::snapshot::Snapshots>,
    /// The latest-per-key index is kept: unchanged values can be filled in.
    key_index: bool,
    /// Column redaction, applied before a record is built: the store never holds a
    /// redacted column's clear value.
    redact: freshen_codec::Redactor,
}

impl std::fmt::Debug for Changefeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changefeed")
            .field("stats", &self.core.stats())
            .finish_non_exhaustive()
    }
}

impl Changefeed {
    /// Opens the log at `config.path` (creating it when missing), loads consumer-group
    /// state, and starts the retention policy and the lease sweeper in the background
    /// (on the current tokio runtime).
    pub async fn open(config: &ChangefeedConfig) -> Result<Changefeed, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Invalid(problems.join("; ")));
        }
        let path = config.path.clone();
        let key_index = config.key_index;
        let cache = config.cache_mb.saturating_mul(1024 * 1024);
        let (db, state) = tokio::task::spawn_blocking(move || store::open(&path, key_index, cache))
            .await
            .map_err(|e| Error::Invalid(format!("opening the store panicked: {e}")))??;
        let db = Arc::new(db);
        let stored = store::snapshots(&db)?;
        let snapshots = Arc::new(crate::snapshot::Snapshots::new(
            config.snapshot,
            config.snapshot_chunk_rows,
            Duration::from_millis(config.snapshot_pause_ms),
            stored,
        ));
        let published = Arc::new(Published {
            latest: watch::Sender::new(state.last),
            oldest: AtomicU64::new(state.oldest),
            size: AtomicU64::new(state.size),
            count: AtomicU64::new(state.count),
            truncated: AtomicU64::new(state.truncated),
            tx_complete: watch::Sender::new(state.tx_complete),
            closed: Mutex::new(None),
            metrics: Metrics::default(),
        });
        let settings = writer::WriterConfig {
            durability: config.durability,
            commit_delay: Duration::from_millis(config.commit_delay_ms),
            max_commit_events: config.max_commit_events,
            key_index: config.key_index,
        };
        let (requests, handle) = writer::spawn(db.clone(), state, settings, published.clone())
            .map_err(|e| Error::Store(redb::Error::Io(e)))?;
        let core = Arc::new(Core {
            db,
            requests: Mutex::new(Some(requests)),
            published,
            writer: Mutex::new(Some(handle)),
            stop: watch::Sender::new(false),
        });
        let groups = Arc::new(Groups::load(core.clone(), config.groups.clone())?);
        let cf = Changefeed {
            core,
            groups,
            snapshots,
            key_index: config.key_index,
            redact: freshen_codec::Redactor::default(),
        };
        crate::retention::spawn(&cf, config.retention.clone());
        crate::groups::spawn_sweeper(&cf);
        Ok(cf)
    }

    /// This changefeed with `redactor` applied to every event and snapshot row before it
    /// is stored (so its values, before and after images and snapshots never hold a
    /// redacted column's clear value). Set it right after [`Changefeed::open`]: clones
    /// made before keep the rules they had.
    pub fn with_redactor(mut self, redactor: freshen_codec::Redactor) -> Changefeed {
        self.redact = redactor;
        self
    }

    /// The redaction rules this changefeed applies.
    pub(crate) fn redactor(&self) -> &freshen_codec::Redactor {
        &self.redact
    }

    /// Appends `events` and returns once they are durable. Events carrying a source
    /// position ([`freshen::Tx`]) at or below the last one appended are skipped: a
    /// source replaying after a crash appends nothing twice.
    pub async fn append(&self, events: &[RowEvent]) -> Result<AppendOutcome, Error> {
        let rx = self.submit_append(events, None)?;
        self.core.wait(rx).await
    }

    /// Queues `events` for the next group commit; the receiver answers once durable.
    /// `complete`: the source says every transaction through this commit position is
    /// complete ([`freshen::Batch::committed_through`]).
    pub(crate) fn submit_append(
        &self,
        events: &[RowEvent],
        complete: Option<u64>,
    ) -> Result<oneshot::Receiver<Result<AppendOutcome, Error>>, Error> {
        let now = record::unix_ms(SystemTime::now());
        let mut encoder = Encoder::default();
        let items = events
            .iter()
            .map(|e| Item {
                position: e.tx.map(|t| (t.commit, t.index)),
                parts: self.parts(e, now, &mut encoder),
            })
            .collect();
        let (reply, rx) = oneshot::channel();
        self.core.submit(Request::Append {
            items,
            complete,
            reply,
        })?;
        Ok(rx)
    }

    /// The records of one event: a primary-key change is a DELETE of the old key and
    /// a PUT of the new one; an event with unchanged values waits for the writer, which
    /// fills them from the row's last image.
    fn parts(&self, e: &RowEvent, now: u64, encoder: &mut Encoder) -> Vec<Part> {
        let e = &*self.redact.apply_one(e);
        let mut one = |e: &RowEvent, extra: Extra<'_>, from: Option<String>| -> Part {
            if self.key_index && record::has_unchanged(e) {
                Part::Fill {
                    event: Box::new(e.clone()),
                    from: from.unwrap_or_else(|| record::index_key_of(e)),
                    old_key: extra.old_key.map(str::to_owned),
                    appended_ms: now,
                }
            } else {
                let r = encoder.encode_with(e, now, extra);
                if encoder.partial {
                    metrics::inc(&self.core.metrics().partial);
                }
                Part::Ready(r)
            }
        };
        match freshen_codec::split_key_change(e) {
            None => vec![one(e, Extra::default(), None)],
            Some(moved) => {
                let old_key = record::key_text(&moved.delete);
                let new_key = record::key_text(&moved.insert);
                let delete = one(
                    &moved.delete,
                    Extra {
                        new_key: Some(&new_key),
                        ..Extra::default()
                    },
                    None,
                );
                let insert = one(
                    &moved.insert,
                    Extra {
                        old_key: Some(&old_key),
                        ..Extra::default()
                    },
                    // The row's last image is under its old key.
                    Some(record::index_key_of(&moved.delete)),
                );
                vec![delete, insert]
            }
        }
    }

    /// Up to `limit` events after sequence `after` that match `filter`, in order.
    pub fn read(&self, after: u64, limit: usize, filter: &Filter) -> Result<Vec<Event>, Error> {
        let mut out = Vec::new();
        let mut after = after;
        // Scan in bounded steps so that a selective filter over a long log still ends.
        while out.len() < limit {
            let before = out.len();
            let next =
                self.core
                    .read_json(after, limit - out.len(), 10_000, filter, |seq, r| {
                        out.push(Event {
                            sequence: seq,
                            json: record::event_json(seq, r),
                        })
                    })?;
            if next == after || (out.len() == before && next >= self.core.latest()) {
                break;
            }
            after = next;
        }
        Ok(out)
    }

    /// The last sequence appended (0 before the first append).
    pub fn latest_sequence(&self) -> u64 {
        self.core.latest()
    }

    /// Waits until an event after `after` is durable or `timeout` passes; returns the
    /// latest sequence then.
    pub async fn wait_after(&self, after: u64, timeout: Duration) -> u64 {
        let mut rx = self.core.watch_latest();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|l| *l > after)).await;
        self.core.latest()
    }

    /// The log's size.
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }

    /// Deletes every event before sequence `before`; returns how many were deleted.
    pub async fn delete_before(&self, before: u64) -> Result<u64, Error> {
        let n = self.core.truncate(before).await?;
        metrics::add(&self.core.metrics().retention_deleted, n);
        Ok(n)
    }

    /// Creates a consumer group (the binary can declare groups in its configuration);
    /// an existing group with the same definition is left as it is.
    pub async fn create_group(
        &self,
        name: &str,
        spec: GroupSpec,
        start: Start,
    ) -> Result<GroupInfo, Error> {
        Ok(self.groups.create(name, spec, start).await?.0)
    }

    /// A consumer group's state: committed offset, lag, events in flight, dead letters.
    pub fn group(&self, name: &str) -> Result<GroupInfo, Error> {
        self.groups.info(name)
    }

    /// Every consumer group's state.
    pub fn groups(&self) -> Vec<GroupInfo> {
        self.groups.list()
    }

    /// Deletes a consumer group with its leases and dead letters.
    pub async fn delete_group(&self, name: &str) -> Result<(), Error> {
        self.groups.delete(name).await
    }

    /// The Prometheus text exposition of the changefeed's metrics.
    pub fn metrics_text(&self) -> String {
        let s = self.core.stats();
        let log = LogGauges {
            latest_sequence: s.latest_sequence,
            oldest_sequence: s.oldest_sequence,
            events: s.total_events,
            size_bytes: s.total_size_bytes,
        };
        let groups: Vec<GroupGauges> = self.groups.gauges();
        metrics::render(self.core.metrics(), &log, &groups)
    }

    /// Stops the background tasks and the writer (after it finished what was queued)
    /// and waits for them. Further appends fail with [`Error::Closed`]. The store file
    /// is released when the last clone of this handle (held by servers, streams) is
    /// dropped.
    pub async fn close(&self) {
        self.core.stop.send_replace(true);
        self.core
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let handle = self
            .core
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
}
