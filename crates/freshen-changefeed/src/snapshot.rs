//! Snapshots: the rows that already exist, read into the log as `read` events while
//! changes keep streaming (DBLog's watermark algorithm), resumable, one chunk at a time.
//!
//! For each chunk of a table, in primary-key order:
//!
//! 1. a *low watermark* is written into the WAL (a non-transactional logical decoding
//!    message; its position is `low`);
//! 2. the chunk is read: `WHERE (pk) > (last key) ORDER BY pk LIMIT n` in a
//!    REPEATABLE READ transaction whose snapshot (`xmin`, `xmax`, running xids) is
//!    kept with the rows;
//! 3. the chunk is registered here and a *high watermark* is written (a transactional
//!    message: streamed in commit order with every other transaction).
//!
//! The capture loop appends the stream's events as usual; when the high watermark comes
//! by, every event before it is queued for the writer, and the chunk goes to the writer
//! right behind them. There each row is checked against its row's latest event in the
//! log (the latest-per-key index): if that event committed after `low` (DBLog's window)
//! or in a transaction the chunk's snapshot did not see (WAL order is not visibility
//! order: a transaction can be in the WAL before `low` and still invisible), the row is
//! dropped — the live event is already in the log, and whatever follows it streams
//! after. The other rows are appended as `read` events, and the table's progress (the
//! chunk's last key) is recorded in the same commit. So a row never appears with a value
//! older than a change already in the log, and a crash resumes after the last committed
//! chunk (a chunk in flight is read again: at-least-once).
//!
//! A TRUNCATE of the table while a chunk is in flight ends the table's snapshot: every
//! row that exists after it streams as a live event.
//!
//! At most one chunk is in flight, so memory is bounded by `snapshot_chunk_rows`, and
//! `snapshot_pause_ms` spaces chunks out to bound the load on the source.
//!
//! The chunk loop (watermarks, SELECT, waiting for the high watermark) is the source's:
//! its plug hands out a [`ChunkReader`] (PostgreSQL's shares the loop with the sinks'
//! snapshots). This module holds each chunk for the capture loop and puts it into the
//! log, so a changefeed over any source whose plug reads chunks can snapshot.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use freshen::plug::{
    Chunk, ChunkAnswer, ChunkEvent, ChunkHolder, ChunkReader, ChunkView, ReadError, Redact,
    TableSnapshot, WATERMARK_PREFIX, resolve_tables,
};
use freshen::{Backoff, BoxError, BoxFuture, Jitter, Op, RowEvent, StreamMark};
use tokio::sync::{Notify, oneshot};

use crate::record::unix_ms;
use crate::store::{SnapshotRecord, store_key};
use crate::writer::{Request, WriteOp};
use crate::{Changefeed, Error, SnapshotMode};
pub use freshen_codec::{SnapshotProgress, SnapshotState};

/// A chunk read and waiting for its high watermark.
struct InFlight {
    /// The content of the high watermark that ends it.
    high: Box<[u8]>,
    rows: Vec<RowEvent>,
    check: Arc<dyn ChunkView>,
    /// The table's progress once the chunk is in the log (counts added by the writer).
    next: SnapshotProgress,
    /// A TRUNCATE of the table came by meanwhile.
    truncated: bool,
    reply: oneshot::Sender<Result<SnapshotProgress, Error>>,
}

/// The snapshot state a changefeed shares between its capture loop, the snapshot
/// driver and the HTTP API.
pub(crate) struct Snapshots {
    mode: SnapshotMode,
    chunk_rows: usize,
    pause: Duration,
    in_flight: Mutex<Option<InFlight>>,
    progress: Mutex<BTreeMap<String, SnapshotProgress>>,
    /// Records changed at open (a finished snapshot's position dropped), to store again.
    scrubbed: Mutex<Vec<String>>,
    /// The tables the driver may read (the source's), once it runs.
    tables: Mutex<Option<Vec<Table>>>,
    wake: Notify,
}

/// A table as the source names it: `(schema, table)`.
type Table = (String, String);

impl Snapshots {
    pub(crate) fn new(
        mode: SnapshotMode,
        chunk_rows: usize,
        pause: Duration,
        stored: Vec<(String, Vec<u8>)>,
    ) -> Snapshots {
        let mut scrubbed = Vec::new();
        let progress = stored
            .into_iter()
            .filter_map(|(k, v)| {
                let p = serde_json::from_slice::<SnapshotProgress>(&v);
                if let Err(e) = &p {
                    tracing::warn!(error = %e, "changefeed: unreadable snapshot progress ignored");
                }
                let mut p = p.ok()?;
                // A finished snapshot keeps no position (an earlier version kept the last
                // key read): never served; stored again once the snapshots run.
                if p.scrub_finished() {
                    scrubbed.push(k.clone());
                }
                Some((k, p))
            })
            .collect();
        Snapshots {
            mode,
            chunk_rows,
            pause,
            in_flight: Mutex::new(None),
            progress: Mutex::new(progress),
            scrubbed: Mutex::new(scrubbed),
            tables: Mutex::new(None),
            wake: Notify::new(),
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, Option<InFlight>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_progress(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SnapshotProgress>> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a mark is one of ours (cheap: the capture loop asks for every mark).
    pub(crate) fn is_watermark(mark: &StreamMark) -> bool {
        &*mark.prefix == WATERMARK_PREFIX
    }

    /// Notes TRUNCATEs of the table whose chunk is in flight.
    pub(crate) fn note_truncates(&self, events: &[RowEvent]) {
        let mut g = self.lock_in_flight();
        if let Some(f) = g.as_mut() {
            f.truncated |= events.iter().any(|e| {
                e.op == Op::Truncate && *e.schema == *f.next.schema && *e.table == *f.next.table
            });
        }
    }

    /// The in-flight chunk whose high watermark `mark` is, taken.
    fn take_at(&self, mark: &StreamMark) -> Option<InFlight> {
        let mut g = self.lock_in_flight();
        if g.as_ref().is_some_and(|f| f.high == mark.content) {
            g.take()
        } else {
            None
        }
    }

    fn unregister(&self, high: &[u8]) {
        let mut g = self.lock_in_flight();
        if g.as_ref().is_some_and(|f| *f.high == *high) {
            *g = None;
        }
    }

    fn set(&self, p: SnapshotProgress) {
        self.lock_progress().insert(p.store_key(), p);
    }

    /// The next table to read: unfinished ones, by name.
    fn next_table(&self) -> Option<SnapshotProgress> {
        self.lock_progress()
            .values()
            .find(|p| p.state != SnapshotState::Done)
            .cloned()
    }

    fn set_error(&self, key: &str, error: String) {
        if let Some(p) = self.lock_progress().get_mut(key) {
            p.last_error = Some(error);
        }
    }
}

/// Where snapshots read from: the source's chunk reader
/// ([`freshen::plug::SourcePlug::chunk_reader`]) and the tables the changefeed captures
/// (only those: a table the stream does not carry could not be checked against its
/// changes).
#[derive(Debug, Clone)]
pub struct SnapshotSource {
    reader: Arc<dyn ChunkReader>,
    tables: Vec<Table>,
    /// The source's `[source] tables` patterns: their tables are looked up in the
    /// catalog at start and every `discover_every`.
    patterns: Vec<String>,
    discover_every: Duration,
}

/// How often the catalog is read for tables the patterns select, by default.
pub const DISCOVER_EVERY: Duration = Duration::from_secs(10);

impl SnapshotSource {
    /// Reads with `reader` — the source's, whose stream the capture carries — for
    /// `tables` (`(schema, table)`).
    pub fn new(reader: Arc<dyn ChunkReader>, tables: Vec<(String, String)>) -> SnapshotSource {
        SnapshotSource {
            reader,
            tables,
            patterns: Vec::new(),
            discover_every: DISCOVER_EVERY,
        }
    }

    /// Also every table `patterns` select (the source's `"all"`, `"schema.*"`,
    /// `"schema.prefix_*"` entries, which its publication follows), read from the catalog
    /// at start and every `every`: a table that appears later — created, renamed or
    /// moved into a captured schema with rows in it (`ALTER TABLE … SET SCHEMA`) — is
    /// logged as discovered and, with `snapshot = "initial"`, snapshotted, which the
    /// stream alone cannot do for rows that were there before it was captured.
    pub fn discovering(mut self, patterns: Vec<String>, every: Duration) -> SnapshotSource {
        self.patterns = patterns;
        self.discover_every = every.max(Duration::from_millis(10));
        self
    }
}

/// Why one chunk did not make it into the log.
enum ChunkError {
    Stopped,
    Source(String),
    Log(Error),
}

impl Changefeed {
    /// Each table's snapshot progress, by name.
    pub fn snapshot_status(&self) -> Vec<SnapshotProgress> {
        self.snapshots.lock_progress().values().cloned().collect()
    }

    /// Asks for snapshots of `tables` (`schema.table`, or a table name the captured
    /// tables hold once): each one not already pending or running starts over from
    /// its first row. Answers every named table's progress. Needs
    /// [`Changefeed::run_snapshots`] running; unknown tables are an error naming them
    /// all.
    pub async fn request_snapshot(
        &self,
        tables: &[String],
    ) -> Result<Vec<SnapshotProgress>, Error> {
        let known = self
            .snapshots
            .tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                Error::Invalid(
                    "snapshots need the changefeed to capture from PostgreSQL".to_owned(),
                )
            })?;
        let resolved = resolve_tables(&known, tables).map_err(Error::Invalid)?;
        self.begin_snapshots(&resolved).await?;
        let p = self.snapshots.lock_progress();
        Ok(resolved
            .iter()
            .filter_map(|(schema, table)| p.get(&store_key(schema, table)).cloned())
            .collect())
    }

    /// Stores `records` with the log (durably, before they are shown or acted on).
    async fn store_progress(&self, records: &[SnapshotProgress]) -> Result<(), Error> {
        let ops = records
            .iter()
            .map(|p| WriteOp::PutSnapshot {
                key: p.store_key(),
                value: p.to_json(),
            })
            .collect();
        let rx = self.core.write_submit(ops)?;
        self.core.wait(rx).await
    }

    /// Records `tables` as pending (unless already under way) and wakes the driver.
    async fn begin_snapshots(&self, tables: &[Table]) -> Result<(), Error> {
        let now = unix_ms(SystemTime::now());
        let mut fresh = Vec::new();
        {
            let p = self.snapshots.lock_progress();
            for t in tables {
                let under_way = p
                    .get(&store_key(&t.0, &t.1))
                    .is_some_and(|p| p.state != SnapshotState::Done);
                if !under_way {
                    fresh.push(SnapshotProgress::new(&t.0, &t.1, now));
                }
            }
        }
        if fresh.is_empty() {
            return Ok(());
        }
        self.store_progress(&fresh).await?;
        for p in fresh {
            tracing::info!(table = %p.table_name(), "changefeed snapshot requested");
            self.snapshots.set(p);
        }
        self.snapshots.wake.notify_one();
        Ok(())
    }

    /// Runs snapshots until `shutdown` completes: with `snapshot = "initial"`, first
    /// every table of `source` that has no snapshot yet; unfinished ones resume after
    /// their last committed chunk; then those asked for
    /// ([`Changefeed::request_snapshot`], `POST /changefeed/snapshot`). With
    /// [`SnapshotSource::discovering`], the catalog is read at start and every period
    /// for tables the source's patterns select: new ones are logged and captured, and
    /// snapshotted with `snapshot = "initial"`.
    ///
    /// Needs [`Changefeed::capture`] running on the PostgreSQL source that streams these
    /// tables: a chunk goes into the log when its high watermark comes through that
    /// stream. Failures reading the source are retried with backoff and shown in the
    /// progress (`last_error`); only the log failing ends the run.
    pub async fn run_snapshots(
        &self,
        source: SnapshotSource,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        tokio::pin!(shutdown);
        *self
            .snapshots
            .tables
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(source.tables.clone());
        self.seal_stored(&source).await?;
        if self.snapshots.mode == SnapshotMode::Initial {
            let missing: Vec<Table> = {
                let p = self.snapshots.lock_progress();
                source
                    .tables
                    .iter()
                    .filter(|(schema, table)| !p.contains_key(&store_key(schema, table)))
                    .cloned()
                    .collect()
            };
            self.begin_snapshots(&missing).await?;
        }
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        let mut jitter = Jitter::from_clock();
        let mut failures = 0u32;
        let mut discovered: Option<Vec<Table>> = None;
        let mut next_discovery = tokio::time::Instant::now();
        loop {
            if !source.patterns.is_empty() && tokio::time::Instant::now() >= next_discovery {
                self.discover(&source, &mut discovered).await?;
                next_discovery = tokio::time::Instant::now() + source.discover_every;
            }
            let Some(progress) = self.snapshots.next_table() else {
                let woken = self.snapshots.wake.notified();
                let discovery = async {
                    if source.patterns.is_empty() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep_until(next_discovery).await;
                };
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = woken => continue,
                    () = discovery => continue,
                }
            };
            let key = progress.store_key();
            let result = tokio::select! {
                () = &mut shutdown => return Ok(()),
                r = self.snapshot_table(&source, progress) => r,
            };
            match result {
                Ok(()) => failures = 0,
                Err(ChunkError::Stopped) => return Ok(()),
                Err(ChunkError::Log(e)) => return Err(e),
                Err(ChunkError::Source(e)) => {
                    tracing::warn!(error = %e, "changefeed snapshot: reading the source failed; retrying");
                    self.snapshots.set_error(&key, e);
                    crate::metrics::inc(&self.core.metrics().snapshot_errors);
                    let delay = backoff.delay(failures, jitter.unit());
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Makes the stored progress fit to keep: a record stored before a `[[redact]]` rule
    /// hid its table's key (or by an earlier version) holds the key in clear; it is
    /// sealed and stored again, as are the finished ones whose position the open dropped.
    async fn seal_stored(&self, source: &SnapshotSource) -> Result<(), Error> {
        let stored: Vec<SnapshotProgress> =
            self.snapshots.lock_progress().values().cloned().collect();
        let redact = (!self.redactor().is_empty()).then(|| self.redactor() as &dyn Redact);
        let scrubbed = std::mem::take(
            &mut *self
                .snapshots
                .scrubbed
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let mut changed = Vec::new();
        for p in stored {
            // A failure (the source unreachable) leaves the record to the driver, which
            // seals it before it reads the table.
            let mut t = TableSnapshot::from(p);
            let sealed = source
                .reader
                .seal_stored(redact, &mut t)
                .await
                .unwrap_or(false);
            let p = SnapshotProgress::from(t);
            if sealed || scrubbed.contains(&p.store_key()) {
                changed.push(p);
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        self.store_progress(&changed).await?;
        for p in changed {
            self.snapshots.set(p);
        }
        Ok(())
    }

    /// Reads the tables the source's patterns select now: each new one joins the
    /// captured tables (logged, and snapshotted with `snapshot = "initial"` unless it
    /// has been); an unfinished snapshot of one that left the selection (dropped,
    /// renamed, moved away) ends, so it cannot hold the others up. `discovered`: the
    /// tables found so far (`None` before the first round, whose tables are not news).
    /// A catalog failure is logged and tried at the next round.
    async fn discover(
        &self,
        source: &SnapshotSource,
        discovered: &mut Option<Vec<Table>>,
    ) -> Result<(), Error> {
        let found = match source.reader.selected(&source.patterns).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "changefeed: cannot read the tables the source's patterns select; trying again later");
                return Ok(());
            }
        };
        let at_start = discovered.is_none();
        let discovered = discovered.get_or_insert_with(Vec::new);
        let fresh: Vec<Table> = found
            .iter()
            .filter(|t| !discovered.contains(t) && !source.tables.contains(t))
            .cloned()
            .collect();
        let gone: Vec<Table> = discovered
            .iter()
            .filter(|t| !found.contains(t))
            .cloned()
            .collect();
        discovered.retain(|t| found.contains(t));
        discovered.extend(fresh.iter().cloned());
        {
            let mut known = self
                .snapshots
                .tables
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let known = known.get_or_insert_with(Vec::new);
            known.retain(|t| !gone.contains(t));
            known.extend(fresh.iter().cloned());
        }
        self.abandon(&gone).await?;
        if fresh.is_empty() {
            return Ok(());
        }
        let mut wanted = Vec::new();
        for t in &fresh {
            let name = format!("{}.{}", t.0, t.1);
            if at_start {
                tracing::debug!(table = %name, "changefeed: captured through a [source] tables pattern");
            } else {
                tracing::info!(table = %name, "changefeed: discovered a table (by a [source] tables pattern); it is captured from now on");
            }
            if self.snapshots.mode != SnapshotMode::Initial {
                continue;
            }
            if self
                .snapshots
                .lock_progress()
                .contains_key(&store_key(&t.0, &t.1))
            {
                continue;
            }
            // A table the snapshot cannot read (no primary key) would retry forever
            // ahead of the others: said once and left out.
            match source.reader.readable(t).await {
                Ok(()) => wanted.push(t.clone()),
                Err(e) => {
                    tracing::error!(table = %name, error = %e, "changefeed: cannot snapshot a discovered table; its rows that were there before stay out of the log (its changes stream)")
                }
            }
        }
        self.begin_snapshots(&wanted).await
    }

    /// Ends the unfinished snapshots of `tables` (which left the selection).
    async fn abandon(&self, tables: &[Table]) -> Result<(), Error> {
        let now = unix_ms(SystemTime::now());
        let ended: Vec<SnapshotProgress> = {
            let p = self.snapshots.lock_progress();
            tables
                .iter()
                .filter_map(|(schema, table)| p.get(&store_key(schema, table)))
                .filter(|p| p.state != SnapshotState::Done)
                .map(|p| {
                    let mut p = p.clone();
                    p.finish(now);
                    p
                })
                .collect()
        };
        if ended.is_empty() {
            return Ok(());
        }
        self.store_progress(&ended).await?;
        for p in ended {
            tracing::warn!(table = %p.table_name(), rows = p.rows, "changefeed snapshot ended early: the table left the source's patterns (dropped, renamed or moved)");
            self.snapshots.set(p);
        }
        Ok(())
    }

    /// Reads one table to its end, chunk by chunk ([`ChunkReader::read_table`]).
    async fn snapshot_table(
        &self,
        source: &SnapshotSource,
        progress: SnapshotProgress,
    ) -> Result<(), ChunkError> {
        let s = &self.snapshots;
        source
            .reader
            .read_table(&Feed(self), progress.into(), s.chunk_rows, s.pause)
            .await
            .map_err(|e| match e {
                ReadError::Stopped => ChunkError::Stopped,
                ReadError::Source(e) => ChunkError::Source(e.to_string()),
                ReadError::Unseen(wait) => ChunkError::Source(format!(
                    "the high watermark did not come through the stream within {}s; is the capture running?",
                    wait.as_secs()
                )),
                // The log's own error, boxed by `Feed::hold`.
                ReadError::Holder(e) => ChunkError::Log(match e.downcast::<Error>() {
                    Ok(e) => *e,
                    Err(e) => Error::Closed {
                        reason: Some(e.to_string()),
                    },
                }),
            })
    }

    /// Queues the chunk whose high watermark `mark` is (if it is one of this process's
    /// chunks) for the writer, behind every event queued before it.
    pub(crate) fn submit_chunk_at(&self, mark: &StreamMark) -> Result<(), Error> {
        let Some(f) = self.snapshots.take_at(mark) else {
            return Ok(());
        };
        let (rows, progress) = if f.truncated {
            let mut p = f.next;
            p.finish(unix_ms(SystemTime::now()));
            tracing::info!(table = %p.table_name(), "changefeed snapshot: the table was truncated meanwhile; every row from now on streams live");
            (Vec::new(), p)
        } else {
            let rows = match self.redactor().apply_all(&f.rows) {
                std::borrow::Cow::Borrowed(_) => f.rows,
                std::borrow::Cow::Owned(redacted) => redacted,
            };
            (rows, f.next)
        };
        self.core.submit(Request::Chunk {
            rows,
            check: f.check,
            progress: Box::new(progress),
            reply: f.reply,
        })
    }
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// A changefeed's snapshots: the holder of the reader's chunks, which go into the log
/// when their high watermark comes through the capture loop ([`Changefeed::submit_chunk_at`]).
struct Feed<'a>(&'a Changefeed);

impl ChunkHolder for Feed<'_> {
    fn redact(&self) -> Option<&dyn Redact> {
        let r = self.0.redactor();
        (!r.is_empty()).then_some(r as &dyn Redact)
    }

    fn hold(&self, chunk: Chunk) -> BoxFuture<'static, ChunkAnswer> {
        let (reply, rx) = oneshot::channel();
        *self.0.snapshots.lock_in_flight() = Some(InFlight {
            high: chunk.high,
            rows: chunk.rows,
            check: chunk.check,
            next: chunk.next.into(),
            truncated: false,
            reply,
        });
        Box::pin(async move {
            let answer = rx.await.ok()?;
            Some(
                answer
                    .map(TableSnapshot::from)
                    .map_err(|e| Box::new(e) as BoxError),
            )
        })
    }

    fn release(&self, high: &[u8]) {
        self.0.snapshots.unregister(high);
    }

    fn stopping(&self) -> BoxFuture<'static, ()> {
        Box::pin(stopped(self.0.core.stopping()))
    }

    fn committed(&self, p: &TableSnapshot) {
        self.0.snapshots.set(p.clone().into());
    }

    fn on(&self, event: ChunkEvent<'_>) {
        match event {
            // The position is never logged: it is a row's key, in clear where no rule
            // hides it.
            ChunkEvent::Started(p) if p.after.is_none() && p.after_sealed.is_none() => {
                tracing::info!(table = %format_args!("{}.{}", p.schema, p.table), "changefeed snapshot starting")
            }
            ChunkEvent::Started(p) => tracing::info!(
                table = %format_args!("{}.{}", p.schema, p.table), rows = p.rows, chunks = p.chunks,
                "changefeed snapshot resuming after its last committed chunk"
            ),
            ChunkEvent::Chunk(p) => tracing::debug!(
                table = %format_args!("{}.{}", p.schema, p.table), rows = p.rows, dropped = p.dropped,
                chunks = p.chunks, "changefeed snapshot chunk committed"
            ),
            ChunkEvent::Done(p) => tracing::info!(
                table = %format_args!("{}.{}", p.schema, p.table), rows = p.rows, dropped = p.dropped,
                chunks = p.chunks, "changefeed snapshot done"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use freshen::{Row, Tx, Value};

    use freshen_postgres::{ChunkCheck, XidSnapshot};

    use super::*;
    use crate::{ChangefeedConfig, Filter};

    fn row(id: i64, v: &str) -> RowEvent {
        RowEvent::new("public", "t", Op::Insert)
            .with_pk(["id"])
            .with_new(Row::from_pairs([
                ("id", Value::Int(id)),
                ("v", Value::text(v)),
            ]))
    }

    /// The writer's check, one row per case: what the log's latest event for the row says
    /// decides whether the chunk's row goes in.
    #[tokio::test]
    async fn a_chunk_row_goes_in_only_when_its_latest_event_was_seen() {
        let dir = tempfile::tempdir().unwrap();
        let cf = Changefeed::open(&ChangefeedConfig::new(dir.path().join("f.redb")))
            .await
            .unwrap();
        let live = |id: i64, xid: u64, commit: u64| {
            row(id, "live").with_tx(Tx {
                id: xid,
                commit,
                index: 0,
            })
        };
        cf.append(&[
            // Before the low watermark (1000), seen by the snapshot: the chunk has it.
            live(1, 10, 500),
            // Before the low watermark in the WAL, but still running for the snapshot.
            live(2, 12, 600),
            // After the low watermark (DBLog's window).
            live(3, 11, 1000),
        ])
        .await
        .unwrap();
        let snapshot = XidSnapshot {
            xmin: 11,
            xmax: 20,
            xip: vec![12],
        };
        let (reply, rx) = oneshot::channel();
        let progress = SnapshotProgress::new("public", "t", 0);
        cf.core
            .submit(Request::Chunk {
                rows: (1..=4).map(|id| row(id, "chunk")).collect(),
                check: Arc::new(ChunkCheck {
                    snapshot,
                    low: 1000,
                }),
                progress: Box::new(progress),
                reply,
            })
            .unwrap();
        let p = cf.core.wait(rx).await.unwrap();
        assert_eq!((p.rows, p.dropped, p.chunks), (2, 2, 1));
        let reads: Vec<String> = cf
            .read(0, 100, &Filter::default())
            .unwrap()
            .into_iter()
            .filter(|e| e.json.contains(r#""op":"read""#))
            .map(|e| {
                let j: serde_json::Value = serde_json::from_str(&e.json).unwrap();
                j["key"].as_str().unwrap().to_owned()
            })
            .collect();
        // Row 1: its latest event is in the chunk's view; row 4: no event at all.
        assert_eq!(reads, ["t:1", "t:4"]);
        // Stored with the log: a reopened changefeed resumes from it.
        cf.close().await;
        drop(cf);
        let cf = Changefeed::open(&ChangefeedConfig::new(dir.path().join("f.redb")))
            .await
            .unwrap();
        let stored = cf.snapshot_status();
        assert_eq!(stored.len(), 1);
        assert_eq!((stored[0].rows, stored[0].dropped), (2, 2));
        cf.close().await;
    }
}
