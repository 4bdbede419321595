//! Snapshots for a sink (Kafka): the rows that already exist, published as READ events
//! among the live changes, with DBLog's watermarks, resumable from the last chunk the
//! sink delivered.
//!
//! The chunk loop is the changefeed's, one driver for both
//! ([`snapshot_table`](crate::snapshot::driver::snapshot_table)): per chunk, a low watermark
//! (non-transactional logical message), a primary-key-ordered SELECT in a REPEATABLE
//! READ transaction whose snapshot is kept, a high watermark (transactional). What
//! differs is where a chunk's rows are checked and where progress lives:
//!
//! - The sink calls [`SinkSnapshots::splice`] on every batch, in stream order, before
//!   publishing it. While a table is being read, the keys the stream carries for it are
//!   remembered ([`StreamedKeys`]); when the chunk's high watermark comes by, the rows
//!   whose key changed in a way the chunk's SELECT may not show ([`ChunkCheck`]) are
//!   dropped — the live change was published before the watermark, and whatever follows
//!   it is published after the chunk — and the rest go to the sink at the watermark's
//!   place in the batch. Transactions published before a table's keys were being
//!   remembered are covered too: the newest [`RECENT_XIDS`](crate::RECENT_XIDS) of
//!   them are kept, and a chunk whose snapshot does not yet see one of them (a commit
//!   already in the WAL, not yet visible — a synchronous standby makes that window
//!   long) publishes nothing and is read again.
//! - Progress lives in the source database (table `freshen_sink_snapshots`, one row per
//!   sink and table, the progress as JSON), written only once the sink reports the
//!   chunk delivered (its [`Spliced::delivered`] acknowledgement). Why there: the sink's
//!   own broker has no transactional place for it short of an extra topic; a local file
//!   would be lost with a container; and the source is where the rows come from, is
//!   already written to (the watermarks), and is backed up with them. A crash between
//!   delivery and the write publishes the chunk again on restart: at least once.
//!
//! At most one chunk is in flight, so memory is bounded by `chunk_rows` (plus the keys
//! streamed while it is in flight), and `pause` spaces chunks out.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use freshen::plug::Redact;
use freshen::{Ack, Backoff, Batch, Jitter, RowEvent, StreamMark};
use tokio::sync::{Notify, oneshot};

use crate::error::ErrorKind;
use crate::pool::client;
use crate::snapshot::driver::{
    ChunkConsumer, ChunkIds, DriverError, HeldChunk, TableEvent, WATERMARK_WAIT, high_mark,
};
use crate::snapshot::window::row_key;
use crate::{
    ChunkCheck, PgError, SnapshotProgress, SnapshotState, StreamedKeys, TableName, WATERMARK_PREFIX,
};

/// The default table of sink snapshot progress.
pub const SINK_SNAPSHOT_TABLE: &str = "freshen_sink_snapshots";

/// How a sink's snapshots run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SinkSnapshotConfig {
    /// The sink's identity in the progress table (e.g. `kafka:<topic>`): a sink with a
    /// new identity starts its snapshots over.
    pub sink: String,
    /// On start, read every table without a completed snapshot (`snapshot =
    /// "initial"`); otherwise only tables asked for.
    pub initial: bool,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Pause between chunks.
    pub pause: Duration,
    /// Where progress is stored.
    pub store: TableName,
    /// The redaction rules the sink applies: where one hides a primary-key column, the
    /// stored progress holds the resume position sealed, never the clear key.
    pub redact: Option<Arc<dyn Redact>>,
}

impl SinkSnapshotConfig {
    /// Settings for sink `sink`: 10 000 rows per chunk, no pause, progress in
    /// `public.freshen_sink_snapshots`.
    pub fn new(sink: impl Into<String>, initial: bool) -> SinkSnapshotConfig {
        SinkSnapshotConfig {
            sink: sink.into(),
            initial,
            chunk_rows: 10_000,
            pause: Duration::ZERO,
            store: TableName::new("public", SINK_SNAPSHOT_TABLE),
            redact: None,
        }
    }

    /// The redaction rules the sink applies to what it publishes (`[[redact]]`).
    pub fn redact(mut self, redact: Arc<dyn Redact>) -> SinkSnapshotConfig {
        self.redact = Some(redact);
        self
    }

    /// Rows per chunk.
    pub fn chunk_rows(mut self, n: usize) -> SinkSnapshotConfig {
        self.chunk_rows = n.max(1);
        self
    }

    /// Pause between chunks.
    pub fn pause(mut self, pause: Duration) -> SinkSnapshotConfig {
        self.pause = pause;
        self
    }
}

/// Rows of a chunk to publish at a place in a batch.
#[derive(Debug)]
#[non_exhaustive]
pub struct Spliced {
    /// Index in the batch's events before which the rows go (the high watermark's
    /// place).
    pub at: usize,
    /// The rows, as inserts: publish them as READ events.
    pub rows: Vec<RowEvent>,
    /// Call once the rows are delivered (and every event of the batch before them):
    /// the table's progress is stored then. Dropping it unacknowledged reads the chunk
    /// again.
    pub delivered: Ack,
}

/// A chunk read and waiting for its high watermark in the sink's stream.
struct InFlight {
    id: String,
    rows: Vec<RowEvent>,
    check: ChunkCheck,
    /// The table's progress before this chunk (what a re-read starts from).
    prev: SnapshotProgress,
    next: SnapshotProgress,
    reply: oneshot::Sender<Result<SnapshotProgress, Infallible>>,
}

#[derive(Default)]
struct State {
    in_flight: Option<InFlight>,
    /// The table being read and the keys the stream carried for it meanwhile.
    recording: Option<TableName>,
    keys: StreamedKeys,
    progress: BTreeMap<TableName, SnapshotProgress>,
    /// Where snapshots read from, once [`SinkSnapshots::run`] runs.
    source: Option<(Pool, Vec<TableName>)>,
}

struct Inner {
    settings: SinkSnapshotConfig,
    state: Mutex<State>,
    wake: Notify,
    ids: ChunkIds,
}

/// One sink's snapshots: the driver ([`run`](Self::run)), the splice the sink calls on
/// every batch ([`splice`](Self::splice)), requests and progress. Cheap to clone.
#[derive(Clone)]
pub struct SinkSnapshots {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SinkSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkSnapshots")
            .field("sink", &self.inner.settings.sink)
            .finish_non_exhaustive()
    }
}

/// Why one chunk did not make it to the sink.
enum ChunkError {
    Stopped,
    Source(PgError),
}

impl From<PgError> for ChunkError {
    fn from(e: PgError) -> ChunkError {
        ChunkError::Source(e)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SinkSnapshots {
    /// Snapshots as `settings` say; nothing runs until [`run`](Self::run).
    pub fn new(settings: SinkSnapshotConfig) -> SinkSnapshots {
        SinkSnapshots {
            inner: Arc::new(Inner {
                settings,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                ids: ChunkIds::new("sink:"),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sink's identity.
    pub fn sink(&self) -> &str {
        &self.inner.settings.sink
    }

    /// Each table's progress, by name.
    pub fn status(&self) -> Vec<SnapshotProgress> {
        self.lock().progress.values().cloned().collect()
    }

    /// Called by the sink on every batch, in stream order, before publishing it:
    /// remembers the keys of the table being read, and returns the chunk whose high
    /// watermark is in the batch (its rows checked) to publish at its place.
    pub fn splice(&self, batch: &Batch) -> Vec<Spliced> {
        let mut st = self.lock();
        if st.recording.is_none() && st.in_flight.is_none() {
            for e in batch.events() {
                st.keys.note(e);
            }
            return Vec::new();
        }
        let marks = batch.marks();
        let mut out = Vec::new();
        let mut m = 0;
        for (i, e) in batch.events().iter().enumerate() {
            while let Some(mark) = marks.get(m).filter(|k| k.at <= i) {
                self.at_mark(&mut st, mark, &mut out);
                m += 1;
            }
            st.record(e);
        }
        for mark in &marks[m.min(marks.len())..] {
            self.at_mark(&mut st, mark, &mut out);
        }
        out
    }

    fn at_mark(&self, st: &mut State, mark: &StreamMark, out: &mut Vec<Spliced>) {
        if &*mark.prefix != WATERMARK_PREFIX {
            return;
        }
        let ours = st
            .in_flight
            .as_ref()
            .is_some_and(|f| high_mark(&f.id).as_bytes() == &*mark.content);
        if !ours {
            return;
        }
        let Some(f) = st.in_flight.take() else {
            return;
        };
        if !st.keys.trusts(&f.check) {
            // A transaction published before this table's keys were remembered is not
            // visible to the chunk: any of its rows may be older than that change.
            // Publish none; the driver reads the chunk again.
            st.keys.forget_seen(&f.check);
            tracing::debug!(sink = %self.sink(), "sink snapshot chunk read again: a transaction already published was not yet visible to it");
            let (reply, prev) = (f.reply, f.prev);
            out.push(Spliced {
                at: mark.at,
                rows: Vec::new(),
                delivered: Ack::new(move || {
                    let _ = reply.send(Ok(prev));
                }),
            });
            return;
        }
        let mut next = f.next;
        let total = f.rows.len();
        // A TRUNCATE the chunk did not see drops every row (rows inserted after it
        // stream live, or come with a later chunk).
        let rows: Vec<RowEvent> = f
            .rows
            .into_iter()
            .filter(|r| row_key(r).is_none_or(|k| !st.keys.stale(&k, &f.check)))
            .collect();
        next.dropped += (total - rows.len()) as u64;
        st.keys.forget_seen(&f.check);
        next.rows += rows.len() as u64;
        next.chunks += 1;
        let reply = f.reply;
        out.push(Spliced {
            at: mark.at,
            rows,
            delivered: Ack::new(move || {
                let _ = reply.send(Ok(next));
            }),
        });
    }

    /// Asks for snapshots of `tables` (`schema.table`, or a table name the sink's
    /// tables hold once): each one not already under way starts over from its first
    /// row. Needs [`run`](Self::run) running; unknown tables are an error naming them.
    pub async fn request(&self, tables: &[String]) -> Result<Vec<SnapshotProgress>, PgError> {
        let (pool, known) = self.lock().source.clone().ok_or_else(|| {
            PgError::new(
                ErrorKind::Config,
                "this sink's snapshots are not running (they read from a PostgreSQL source)",
            )
        })?;
        let resolved = crate::snapshot::resolve_tables(&known, tables)
            .map_err(|e| PgError::new(ErrorKind::Config, e))?;
        self.begin(&pool, &resolved).await?;
        let st = self.lock();
        Ok(resolved
            .iter()
            .filter_map(|t| st.progress.get(t).cloned())
            .collect())
    }

    /// Records `tables` as pending (unless under way) and wakes the driver.
    async fn begin(&self, pool: &Pool, tables: &[TableName]) -> Result<(), PgError> {
        let fresh: Vec<SnapshotProgress> = {
            let st = self.lock();
            tables
                .iter()
                .filter(|t| {
                    !st.progress
                        .get(t)
                        .is_some_and(|p| p.state != SnapshotState::Done)
                })
                .map(|t| SnapshotProgress::new(&t.schema, &t.name, now_ms()))
                .collect()
        };
        if !fresh.is_empty() {
            // Created on first use: a sink that never snapshots leaves no table behind.
            self.prepare(pool).await?;
        }
        for p in &fresh {
            self.save(pool, p).await?;
        }
        let mut st = self.lock();
        for p in fresh {
            tracing::info!(sink = %self.sink(), table = %TableName::of(&p), "sink snapshot requested");
            st.progress.insert(TableName::of(&p), p);
        }
        drop(st);
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Runs snapshots from `pool` (the source database; its WAL must be the stream the
    /// sink publishes) over `tables` until `shutdown` completes: with `initial`, first
    /// every table without a completed snapshot; unfinished ones resume after their last
    /// delivered chunk; then those asked for ([`request`](Self::request)). Failures
    /// reading the source are retried with backoff and shown in the progress
    /// (`last_error`).
    pub async fn run(
        &self,
        pool: Pool,
        tables: Vec<TableName>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), PgError> {
        tokio::pin!(shutdown);
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        let mut jitter = Jitter::from_clock();
        let mut failures = 0u32;
        // Load the stored progress and, with `initial`, record the tables without one
        // as pending (retried: the source may be down at start).
        loop {
            let r = tokio::select! {
                () = &mut shutdown => return Ok(()),
                r = self.start(&pool, &tables) => r,
            };
            match r {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Config => return Err(e),
                Err(e) => {
                    tracing::warn!(sink = %self.sink(), error = %e, "sink snapshot: cannot read or store progress; retrying");
                    let delay = backoff.delay(failures, jitter.unit());
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        failures = 0;
        loop {
            let next = self
                .lock()
                .progress
                .values()
                .find(|p| p.state != SnapshotState::Done)
                .cloned();
            let Some(progress) = next else {
                let woken = self.inner.wake.notified();
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = woken => continue,
                }
            };
            let table = TableName::of(&progress);
            let result = tokio::select! {
                () = &mut shutdown => Err(ChunkError::Stopped),
                r = self.snapshot_table(&pool, progress) => r,
            };
            match result {
                Ok(()) => failures = 0,
                Err(ChunkError::Stopped) => {
                    self.stop_recording();
                    return Ok(());
                }
                Err(ChunkError::Source(e)) => {
                    self.stop_recording();
                    tracing::warn!(sink = %self.sink(), table = %table, error = %e, "sink snapshot: reading the source failed; retrying");
                    if let Some(p) = self.lock().progress.get_mut(&table) {
                        p.last_error = Some(e.to_string());
                    }
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

    /// Loads the stored progress of `tables` and, with `initial`, begins those without.
    async fn start(&self, pool: &Pool, tables: &[TableName]) -> Result<(), PgError> {
        let mut stored = self.load(pool).await?;
        // Records from before a rule (or an earlier version) are made fit to keep first.
        for p in &mut stored {
            if crate::snapshot::driver::seal_stored(pool, self.inner.settings.redact.as_deref(), p)
                .await?
            {
                self.save(pool, p).await?;
            }
        }
        let missing: Vec<TableName> = {
            let mut st = self.lock();
            st.progress = stored
                .into_iter()
                .filter(|p| tables.contains(&TableName::of(p)))
                .map(|p| (TableName::of(&p), p))
                .collect();
            st.source = Some((pool.clone(), tables.to_vec()));
            tables
                .iter()
                .filter(|t| !st.progress.contains_key(t))
                .cloned()
                .collect()
        };
        if self.inner.settings.initial {
            self.begin(pool, &missing).await?;
        }
        Ok(())
    }

    fn stop_recording(&self) {
        let mut st = self.lock();
        st.in_flight = None;
        st.recording = None;
        st.keys.clear();
    }

    /// Reads one table to its end, chunk by chunk ([`snapshot_table`](crate::snapshot::driver::snapshot_table)).
    async fn snapshot_table(
        &self,
        pool: &Pool,
        progress: SnapshotProgress,
    ) -> Result<(), ChunkError> {
        {
            // Remember the table's streamed keys from before its first low watermark.
            let mut st = self.lock();
            st.recording = Some(TableName::of(&progress));
            st.keys.begin();
        }
        let settings = &self.inner.settings;
        let run = Run {
            snapshots: self,
            pool,
        };
        crate::snapshot::driver::snapshot_table(&run, pool, progress, settings.chunk_rows, settings.pause)
            .await
            .map_err(|e| match e {
                DriverError::Stopped => ChunkError::Stopped,
                DriverError::Source(e) => ChunkError::Source(e),
                DriverError::Unseen => ChunkError::Source(PgError::new(ErrorKind::Server, format!(
                    "the high watermark did not come through the sink within {}s; is the sink running?",
                    WATERMARK_WAIT.as_secs()
                ))),
                DriverError::Consumer(never) => match never {},
            })
    }

    /// Creates the progress table when missing.
    async fn prepare(&self, pool: &Pool) -> Result<(), PgError> {
        let store = &self.inner.settings.store;
        let c = client(pool).await?;
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&store.quoted()])
            .await
            .map_err(|e| PgError::sql(format!("cannot look for {store}"), e))?
            .get(0);
        if exists {
            return Ok(());
        }
        c.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               sink text NOT NULL, \
               source_table text NOT NULL, \
               progress jsonb NOT NULL, \
               updated_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (sink, source_table))",
            store.quoted()
        ))
        .await
        .map_err(|e| {
            PgError::sql(
                format!("cannot create the sink snapshot table {store} (grant CREATE on its schema, or create it)"),
                e,
            )
        })
    }

    async fn load(&self, pool: &Pool) -> Result<Vec<SnapshotProgress>, PgError> {
        let store = &self.inner.settings.store;
        let c = client(pool).await?;
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&store.quoted()])
            .await
            .map_err(|e| PgError::sql(format!("cannot look for {store}"), e))?
            .get(0);
        if !exists {
            return Ok(Vec::new());
        }
        let rows = c
            .query(
                &format!(
                    "SELECT progress::text FROM {} WHERE sink = $1",
                    store.quoted()
                ),
                &[&self.inner.settings.sink],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read {store}"), e))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let text: String = r.get(0);
                let p = serde_json::from_str::<SnapshotProgress>(&text);
                if let Err(e) = &p {
                    tracing::warn!(sink = %self.sink(), error = %e, "sink snapshot: unreadable progress ignored");
                }
                p.ok()
            })
            .collect())
    }

    async fn save(&self, pool: &Pool, p: &SnapshotProgress) -> Result<(), PgError> {
        let store = &self.inner.settings.store;
        let mut stored = p.clone();
        // Failures are for the status, not for the next run.
        stored.last_error = None;
        let json = serde_json::to_string(&stored).unwrap_or_default();
        let c = client(pool).await?;
        c.execute(
            &format!(
                "INSERT INTO {} (sink, source_table, progress) VALUES ($1, $2, $3::text::jsonb) \
                 ON CONFLICT (sink, source_table) DO UPDATE \
                 SET progress = EXCLUDED.progress, updated_at = now()",
                store.quoted()
            ),
            &[
                &self.inner.settings.sink,
                &TableName::of(p).to_string(),
                &json,
            ],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot store sink snapshot progress in {store}"), e))?;
        Ok(())
    }
}

impl State {
    /// Remembers a streamed event of the table being read.
    fn record(&mut self, e: &RowEvent) {
        self.keys.note(e);
        let Some(t) = &self.recording else {
            return;
        };
        if *e.schema == *t.schema && *e.table == *t.name {
            self.keys.record(e);
        }
    }
}

/// A sink's snapshots running from `pool`: the consumer of the driver's chunks.
struct Run<'a> {
    snapshots: &'a SinkSnapshots,
    pool: &'a Pool,
}

impl ChunkConsumer for Run<'_> {
    type Error = Infallible;

    fn chunk_ids(&self) -> &ChunkIds {
        &self.snapshots.inner.ids
    }

    fn redact(&self) -> Option<&dyn Redact> {
        self.snapshots.inner.settings.redact.as_deref()
    }

    fn hold(
        &self,
        chunk: HeldChunk,
    ) -> impl Future<Output = Option<Result<SnapshotProgress, Infallible>>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        self.snapshots.lock().in_flight = Some(InFlight {
            id: chunk.id,
            rows: chunk.rows,
            check: chunk.check,
            prev: chunk.prev,
            next: chunk.next,
            reply,
        });
        async move { rx.await.ok() }
    }

    fn release(&self, id: &str) {
        let mut st = self.snapshots.lock();
        if st.in_flight.as_ref().is_some_and(|f| f.id == id) {
            st.in_flight = None;
        }
    }

    /// The sink stops by dropping the chunk undelivered (it failed or stopped).
    fn stopping(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    async fn committed(&self, p: &SnapshotProgress) -> Result<(), PgError> {
        self.snapshots.save(self.pool, p).await?;
        self.snapshots
            .lock()
            .progress
            .insert(TableName::of(p), p.clone());
        Ok(())
    }

    fn on(&self, event: TableEvent<'_>) {
        let sink = self.snapshots.sink();
        match event {
            // The position is never logged: it is a row's key, in clear where no rule
            // hides it.
            TableEvent::Started(p) if p.after.is_none() && p.after_sealed.is_none() => {
                tracing::info!(sink = %sink, table = %TableName::of(p), "sink snapshot starting")
            }
            TableEvent::Started(p) => tracing::info!(
                sink = %sink, table = %TableName::of(p), rows = p.rows, chunks = p.chunks,
                "sink snapshot resuming after its last delivered chunk"
            ),
            TableEvent::Chunk(p) => tracing::debug!(
                sink = %sink, table = %TableName::of(p), rows = p.rows,
                dropped = p.dropped, chunks = p.chunks,
                "sink snapshot chunk delivered"
            ),
            TableEvent::Done(p) => {
                self.snapshots.stop_recording();
                tracing::info!(
                    sink = %sink, table = %TableName::of(p), rows = p.rows,
                    dropped = p.dropped, chunks = p.chunks, "sink snapshot done"
                );
            }
        }
    }
}

/// A sink's snapshots as the plug hands them out ([`freshen::plug::SinkSnapshots`]):
/// the snapshots, and the source database and tables they read.
struct Plugged {
    snapshots: SinkSnapshots,
    pool: Pool,
    tables: Vec<TableName>,
}

/// The snapshots of the sink `spec` names, reading from the database at `url` (the
/// source's: its WAL carries the watermarks the sink's stream brings back).
pub(crate) fn plugged(
    url: &str,
    spec: freshen::plug::SinkSnapshotSpec,
) -> Result<Arc<dyn freshen::plug::SinkSnapshots>, freshen::BoxError> {
    use freshen::plug::TargetError;
    let conn = crate::ConnectionConfig::from_url(url)
        .map_err(|e| TargetError::new("the source URL is not usable", e))?;
    let pool = crate::connect_pool(&conn, 1)
        .map_err(|e| TargetError::new("cannot set up the sink snapshot connection", e))?;
    let mut settings = SinkSnapshotConfig::new(spec.identity, spec.initial)
        .chunk_rows(spec.chunk_rows)
        .pause(spec.pause);
    if let Some(redact) = spec.redact {
        // The progress it stores holds a hidden key column's position sealed.
        settings = settings.redact(redact);
    }
    Ok(Arc::new(Plugged {
        snapshots: SinkSnapshots::new(settings),
        pool,
        tables: spec
            .tables
            .into_iter()
            .map(|(schema, table)| TableName::new(schema, table))
            .collect(),
    }))
}

impl freshen::plug::SinkSnapshots for Plugged {
    fn identity(&self) -> &str {
        self.snapshots.sink()
    }

    fn splice(&self) -> freshen::plug::Splice {
        let s = self.snapshots.clone();
        Box::new(move |b| {
            s.splice(b)
                .into_iter()
                .map(|x| (x.at, x.rows, x.delivered))
                .collect()
        })
    }

    fn run(
        &self,
        stop: freshen::BoxFuture<'static, ()>,
    ) -> freshen::BoxFuture<'static, Result<(), freshen::BoxError>> {
        let (s, pool, tables) = (
            self.snapshots.clone(),
            self.pool.clone(),
            self.tables.clone(),
        );
        Box::pin(async move { s.run(pool, tables, stop).await.map_err(Into::into) })
    }

    fn request<'a>(
        &'a self,
        tables: &'a [String],
    ) -> freshen::BoxFuture<'a, Result<Vec<freshen::plug::TableSnapshot>, freshen::BoxError>> {
        Box::pin(async move {
            let progress = self.snapshots.request(tables).await?;
            Ok(progress.into_iter().map(Into::into).collect())
        })
    }

    fn status(&self) -> Vec<freshen::plug::TableSnapshot> {
        self.snapshots
            .status()
            .into_iter()
            .map(Into::into)
            .collect()
    }
}
