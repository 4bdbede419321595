//! `Changefeed`: the handle to the log — append, read, wait, retention, close.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use freshen::RowEvent;
use tokio::sync::oneshot;

use crate::groups::{GroupInfo, GroupSpec, Groups, Start};
use crate::metrics::{self, GroupGauges, LogGauges};
use crate::record::{self, Encoder, Extra};
use crate::shared::{Core, Published, Stats};
use crate::store;
use crate::writer::{self, AppendOutcome, Item, Part, Request};
use crate::{ChangefeedConfig, Error, Filter, RetentionConfig};

/// One event as the log serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Its position in the log.
    pub sequence: u64,
    /// Its JSON (ThemisDB's fields plus ours).
    pub json: String,
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
        let published = Arc::new(Published::new(&state));
        let settings = writer::WriterConfig {
            durability: config.durability,
            commit_delay: Duration::from_millis(config.commit_delay_ms),
            max_commit_events: config.max_commit_events,
            key_index: config.key_index,
        };
        let (requests, handle) = writer::spawn(db.clone(), state, settings, published.clone())
            .map_err(|e| Error::Store(redb::Error::Io(e)))?;
        let core = Arc::new(Core::new(db, requests, published, handle));
        let groups = Arc::new(Groups::load(core.clone(), config.groups.clone())?);
        let cf = Changefeed {
            core,
            groups,
            snapshots,
            key_index: config.key_index,
            redact: freshen_codec::Redactor::default(),
        };
        crate::retention::spawn(&cf.core, &cf.groups, config.retention.clone());
        crate::groups::spawn_sweeper(&cf.core, &cf.groups);
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

    /// Applies a retention policy now (the configured one runs on its own every
    /// `interval_secs`); returns how many events were deleted (truncated or compacted).
    pub async fn enforce_retention(&self, policy: &RetentionConfig) -> Result<u64, Error> {
        crate::retention::enforce(&self.core, &self.groups, policy).await
    }

    /// Stops the background tasks and the writer (after it finished what was queued)
    /// and waits for them. Further appends fail with [`Error::Closed`]. The store file
    /// is released when the last clone of this handle (held by servers, streams) is
    /// dropped.
    pub async fn close(&self) {
        self.core.close().await;
    }
}
