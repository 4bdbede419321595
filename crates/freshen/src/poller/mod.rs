//! The cursor poller: the running half of the incremental sources
//! (`postgres-incremental`, `mysql-incremental`). One task per table reads pages past
//! its [`Cursor`] in one snapshot per poll and hands each page over as a batch; one task
//! stores the cursors the refresher has acknowledged. What differs per database — the
//! page statements, the snapshot and its transaction horizon, the cursor table, how an
//! error is classified — is a [`Dialect`]; everything else is here, once.
//!
//! ```text
//!   poller (one per table)                         the refresher
//!   ──────────────────────                         ─────────────
//!   begin snapshot ──► horizon
//!   re-read (safe, high] ── pages ──► Batch(rows, Ack::none) ──►  rebuilds
//!   new rows after high  ── pages ──► Batch(rows, Ack::none) ──►  rebuilds
//!   commit; cursor.end_poll ───────► Batch([], Ack(safe))    ──►  acknowledged once
//!                                                                 every batch before it
//!   cursor writer ◄── acked[table] = safe ◄───────────────────────  is rebuilt
//!   └─► Dialect::save_cursor
//! ```
//!
//! | the dialect's capability | re-read of the pending range                     |
//! |--------------------------|--------------------------------------------------|
//! | a horizon (PostgreSQL)   | rows written since the previous poll's `xmin`    |
//! | `lookback_only` (MySQL)  | every row, minus those handed over ([`Handed`])  |
//!
//! A database's crate supplies a [`Dialect`] and how it [`Open`]s from an
//! [`IncrementalConfig`]; its source is `PollingSource<ItsDialect>`, started by
//! [`PollingSource::start`]. What its `[source]` table shares with every polling source —
//! the tables to poll and their limits — is decided by [`PollSettings`], over the
//! crate's own serde type (the core reads no files).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod settings;

pub use settings::{OwnTable, PollSettings, TABLE_REFERENCE};

use crate::cursor::{Cursor, Handed, Horizon, Position, Reread};
use crate::{
    Ack, Backoff, Batch, BoxFuture, Capabilities, Jitter, Retry, RowEvent, Source, SourceError,
    SourceHealth, SourceProbe, SourceProblem,
};

/// Most pages of new rows one poll reads before it ends (and lets its cursor become
/// final): a poll's snapshot stays short while catching up on a big table.
const PAGES_PER_POLL: usize = 16;

/// What a database supplies to be polled: connections, a snapshot with its horizon,
/// one table's pages, and the cursor table. Implemented by each incremental source's
/// crate; the [`PollingSource`] drives it.
pub trait Dialect: Send + Sync + 'static {
    /// The source kind (`postgres-incremental`), for health and logs.
    const KIND: &'static str;
    /// A table's name.
    type Table: Clone + fmt::Display + Send + Sync + 'static;
    /// A described table with its page statements.
    type Reader: Send + Sync + 'static;
    /// A connection to the polled database.
    type Conn: Send + 'static;
    /// A read-only snapshot on a connection: every page of one poll reads in it.
    type Snapshot<'c>: Send
    where
        Self: 'c;
    /// The database's error.
    type Error: fmt::Display + Send + Sync + 'static;

    /// What the source guarantees; `lookback_only` says [`Dialect::begin`] reports no
    /// horizon, so re-reads return every row of the pending range.
    fn capabilities(&self) -> Capabilities;

    /// A connection from the pool.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send;

    /// Reads `table`'s description: its cursor column (`cursor`) and primary key must
    /// exist, else an error naming what is missing.
    fn describe<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        table: &'a Self::Table,
        cursor: &'a str,
    ) -> impl Future<Output = Result<Described<Self::Reader>, Self::Error>> + Send + 'a;

    /// Begins a poll's snapshot and reads its horizon ([`Horizon::NONE`] when the
    /// database reports none).
    fn begin<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
    ) -> impl Future<Output = Result<(Self::Snapshot<'c>, Horizon), Self::Error>> + Send + 'c;

    /// Reads one page of at most `limit` rows, each with its position, in position
    /// order.
    fn read_page<'a>(
        &'a self,
        snapshot: &'a mut Self::Snapshot<'_>,
        reader: &'a Self::Reader,
        read: Read<'a>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(RowEvent, Position)>, Self::Error>> + Send + 'a;

    /// Ends a poll's snapshot.
    fn commit(
        &self,
        snapshot: Self::Snapshot<'_>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The position stored for `table`, read by `columns` (the cursor then the primary
    /// key); a position stored for other columns is an error saying how to start over
    /// (see [`stored_position`]).
    fn load_cursor<'a>(
        &'a self,
        table: &'a Self::Table,
        columns: &'a [String],
    ) -> impl Future<Output = Result<Option<Position>, Self::Error>> + Send + 'a;

    /// Stores `position` for `table` (replacing what was stored).
    fn save_cursor<'a>(
        &'a self,
        table: &'a Self::Table,
        columns: &'a [String],
        position: &'a Position,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'a;

    /// Whether a failed poll needs a person ([`Retry::Fix`]: a dropped table, a revoked
    /// grant), classified from the database's error code.
    fn retry(error: &Self::Error) -> Retry;

    /// The `(schema, table)` a problem with `table` names.
    fn problem_table(table: &Self::Table) -> (String, String);

    /// Tells a person what the poller does (the core logs through no framework: the
    /// dialect's crate logs it, at [`PollReport::level`]).
    fn report(&self, report: PollReport<'_>);
}

/// Something a [`PollingSource`] wants a person to know; passed to
/// [`Dialect::report`]. Its `Display` is the log line.
#[non_exhaustive]
#[derive(Clone, Copy)]
pub enum PollReport<'a> {
    /// A table's poller starts.
    Polling {
        /// The table.
        table: &'a dyn fmt::Display,
        /// The position's columns.
        columns: &'a [String],
        /// Whether it resumes from a stored cursor.
        resumed: bool,
        /// `Some(lookback)` when late commits are found within the lookback only.
        lookback_only: Option<Duration>,
    },
    /// A table's cursor column may hold NULL: such rows are never read.
    NullableCursor {
        /// The table.
        table: &'a dyn fmt::Display,
        /// The cursor column.
        cursor: &'a str,
    },
    /// A poll failed; it is retried.
    Failed {
        /// The table.
        table: &'a dyn fmt::Display,
        /// What went wrong.
        error: &'a dyn fmt::Display,
        /// Whether a person must act ([`Retry::Fix`]); reported once until a poll works.
        fix: bool,
    },
    /// A table whose polls needed a person polls again.
    Recovered {
        /// The table.
        table: &'a dyn fmt::Display,
    },
    /// An acknowledged cursor could not be stored; it is retried.
    StoreFailed {
        /// The table.
        table: &'a dyn fmt::Display,
        /// What went wrong.
        error: &'a dyn fmt::Display,
    },
}

/// How loud a [`PollReport`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal operation.
    Info,
    /// Retried by itself.
    Warn,
    /// A person must act.
    Error,
}

impl PollReport<'_> {
    /// How loud it is.
    pub fn level(&self) -> Level {
        match self {
            PollReport::Polling { .. } | PollReport::Recovered { .. } => Level::Info,
            PollReport::Failed { fix: true, .. } => Level::Error,
            PollReport::NullableCursor { .. }
            | PollReport::Failed { .. }
            | PollReport::StoreFailed { .. } => Level::Warn,
        }
    }
}

impl fmt::Debug for PollReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PollReport({self})")
    }
}

impl fmt::Display for PollReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PollReport::Polling {
                table,
                columns,
                resumed,
                lookback_only,
            } => {
                write!(f, "polling {table} by ({})", columns.join(", "))?;
                if *resumed {
                    f.write_str(" from its stored cursor")?;
                }
                if let Some(lookback) = lookback_only {
                    write!(
                        f,
                        "; late commits are found within the lookback ({lookback:?}) only"
                    )?;
                }
                Ok(())
            }
            PollReport::NullableCursor { table, cursor } => write!(
                f,
                "cursor column {cursor} of {table} may be NULL: rows where it is NULL are never read"
            ),
            PollReport::Failed {
                table,
                error,
                fix: true,
            } => write!(f, "cannot poll {table}: {error} (retrying)"),
            PollReport::Failed { table, error, .. } => {
                write!(f, "poll of {table} failed (retrying): {error}")
            }
            PollReport::Recovered { table } => write!(f, "polling {table} again"),
            PollReport::StoreFailed { table, error } => {
                write!(f, "cannot store the cursor of {table} (retrying): {error}")
            }
        }
    }
}

/// A table as [`Dialect::describe`] found it.
#[derive(Debug, Clone)]
pub struct Described<R> {
    /// The dialect's reader of the table.
    pub reader: R,
    /// The position's columns: the cursor, then the primary key's.
    pub columns: Vec<String>,
    /// Whether the cursor column may hold NULL (such rows are never read).
    pub cursor_nullable: bool,
}

/// What a page reads.
#[derive(Debug, Clone, Copy)]
pub enum Read<'a> {
    /// Rows after a position (from the start when `None`).
    New(Option<&'a Position>),
    /// A re-read of `range`, continuing after `from` (the range's own start when
    /// `None`), in a snapshot whose horizon is `snapshot`.
    Again {
        /// The pending range.
        range: &'a Reread,
        /// Where the previous page of this re-read ended.
        from: Option<&'a Position>,
        /// The poll's horizon (its `xmax` bounds the writer filter).
        snapshot: Horizon,
    },
}

/// Checks a stored cursor against the columns the configuration pages by: the position
/// when they agree, else the message that says how to start over.
pub fn stored_position(
    store: &dyn fmt::Display,
    name: &str,
    table: &dyn fmt::Display,
    stored: &[String],
    position: Vec<String>,
    columns: &[String],
) -> Result<Position, String> {
    if stored != columns || position.len() != columns.len() {
        return Err(format!(
            "the cursor stored in {store} for {table} is by ({}), the configuration pages by ({}): \
             delete its row (name {name:?}) to read the table from its start",
            stored.join(", "),
            columns.join(", "),
        ));
    }
    Ok(position)
}

/// One table to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolledTable<T> {
    /// The table.
    pub table: T,
    /// The cursor column: a value every insert and update moves forward
    /// (`updated_at`, an increasing id).
    pub cursor: String,
    /// Time between polls once caught up.
    pub poll_interval: Duration,
    /// Rows per page (and most events per batch).
    pub page_size: usize,
}

/// How a [`PollingSource`] polls.
#[derive(Debug, Clone)]
pub struct PollConfig<T> {
    /// How long a read position is held (and its range read again) before it may become
    /// durable: see [`crate::cursor`].
    pub lookback: Duration,
    /// The tables.
    pub tables: Vec<PolledTable<T>>,
    /// Batches queued between the pollers and the consumer.
    pub queue_batches: usize,
    /// Backoff between failed polls.
    pub retry: Backoff,
}

/// What an incremental source polls and where it keeps its cursors: `C` says where a
/// database is (a connection's settings, a URL), `T` names a table.
#[derive(Debug, Clone)]
pub struct IncrementalConfig<C, T> {
    /// The polled database (SELECT is all it needs).
    pub connection: C,
    /// Where the cursor table lives (the polled database when `None`).
    pub store_connection: Option<C>,
    /// The cursor table.
    pub store_table: T,
    /// This source's name: the cursor table's rows are keyed by it.
    pub name: String,
    /// How long a read position is held, its range read again at every poll, before
    /// it may become durable (see [`crate::cursor`] and the dialect's crate).
    pub lookback: Duration,
    /// The tables.
    pub tables: Vec<PolledTable<T>>,
    /// Batches queued between the pollers and the consumer.
    pub queue_batches: usize,
    /// Backoff between failed polls.
    pub retry: Backoff,
}

/// How a [`Dialect`] comes to be from an [`IncrementalConfig`]: its connections and its
/// cursor table.
pub trait Open: Dialect + Sized {
    /// Where a database is, as [`IncrementalConfig::connection`] says it.
    type Connection: Send + Sync;

    /// Opens the polled database (a connection for each table's poller and one more)
    /// and the cursor store, and prepares the cursor table.
    fn open(
        config: &IncrementalConfig<Self::Connection, Self::Table>,
    ) -> impl Future<Output = Result<Self, Self::Error>> + Send + '_;

    /// The error for a configuration that cannot be polled, saying why.
    fn refuse(message: &'static str) -> Self::Error;
}

/// Counters shared by the pollers, the cursor writer and the handle.
#[derive(Debug, Default)]
struct Shared {
    streaming: AtomicBool,
    last_error: Mutex<Option<String>>,
    polls: AtomicU64,
    events: AtomicU64,
    reread_events: AtomicU64,
    failures: AtomicU64,
    stored: AtomicU64,
    /// What a person must fix, by table index (a dropped table, a revoked grant): the
    /// poller retries meanwhile, and the pipeline reports itself unhealthy.
    problems: Mutex<HashMap<usize, SourceProblem>>,
    /// Positions acknowledged and not yet stored, by table index.
    acked: Mutex<HashMap<usize, Position>>,
    ack_notify: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A snapshot of a polling source's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollingStats {
    /// Polls completed (every table's).
    pub polls: u64,
    /// Row events handed over.
    pub events: u64,
    /// Of those, rows found by re-reading a pending range that no earlier poll had
    /// handed over as far as the dialect can tell: late commits (and, with a horizon,
    /// rows of transactions that ended between a poll's `xmin` and `xmax`).
    pub reread_events: u64,
    /// Polls that failed (and were retried).
    pub failures: u64,
    /// Cursor writes to the store.
    pub stored: u64,
}

/// A cloneable handle of a running [`PollingSource`]: counters and health.
#[derive(Clone)]
pub struct PollingHandle {
    kind: &'static str,
    shared: Arc<Shared>,
}

impl fmt::Debug for PollingHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollingHandle")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl PollingHandle {
    /// The counters now.
    pub fn stats(&self) -> PollingStats {
        let s = &self.shared;
        PollingStats {
            polls: s.polls.load(Ordering::Relaxed),
            events: s.events.load(Ordering::Relaxed),
            reread_events: s.reread_events.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
            stored: s.stored.load(Ordering::Relaxed),
        }
    }
}

impl SourceProbe for PollingHandle {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn health(&self) -> SourceHealth {
        let s = self.stats();
        let mut problems: Vec<(usize, SourceProblem)> = lock(&self.shared.problems)
            .iter()
            .map(|(i, p)| (*i, p.clone()))
            .collect();
        problems.sort_by_key(|(i, _)| *i);
        SourceHealth {
            streaming: self.shared.streaming.load(Ordering::SeqCst),
            last_error: lock(&self.shared.last_error).clone(),
            reconnects: s.failures,
            events: s.events,
            problems: problems.into_iter().map(|(_, p)| p).collect(),
            ..SourceHealth::default()
        }
    }
}

/// A cursor-polling source over a [`Dialect`]: polls each table for rows past its
/// cursor. Hand it to a refresher like any [`Source`].
pub struct PollingSource<D: Dialect> {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    capabilities: Capabilities,
    handle: PollingHandle,
    stop: watch::Sender<bool>,
    pollers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    _dialect: std::marker::PhantomData<fn() -> D>,
}

impl<D: Dialect> fmt::Debug for PollingSource<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollingSource")
            .field("kind", &D::KIND)
            .field("tables", &self.pollers.len())
            .finish_non_exhaustive()
    }
}

impl<D: Open> PollingSource<D> {
    /// Opens the database and prepares the cursor table ([`Open::open`]), describes
    /// every table (its cursor column and primary key must exist), loads the stored
    /// cursors and starts polling.
    pub async fn start(
        config: IncrementalConfig<D::Connection, D::Table>,
    ) -> Result<Self, D::Error> {
        if config.tables.is_empty() {
            return Err(D::refuse(
                "an incremental source needs at least one table to poll",
            ));
        }
        let dialect = D::open(&config).await?;
        let poll = PollConfig {
            lookback: config.lookback,
            tables: config.tables,
            queue_batches: config.queue_batches,
            retry: config.retry,
        };
        PollingSource::with_dialect(dialect, poll).await
    }
}

impl<D: Dialect> PollingSource<D> {
    /// Describes every table, loads the stored cursors and starts polling. The caller
    /// has prepared the cursor table and checked there is a table to poll.
    pub async fn with_dialect(dialect: D, config: PollConfig<D::Table>) -> Result<Self, D::Error> {
        let dialect = Arc::new(dialect);
        let mut tables = Vec::with_capacity(config.tables.len());
        {
            let mut c = dialect.connect().await?;
            for t in config.tables {
                let d = dialect.describe(&mut c, &t.table, &t.cursor).await?;
                if d.cursor_nullable {
                    dialect.report(PollReport::NullableCursor {
                        table: &t.table,
                        cursor: &t.cursor,
                    });
                }
                let stored = dialect.load_cursor(&t.table, &d.columns).await?;
                tables.push((t, d, stored));
            }
        }
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(config.queue_batches.max(1));
        let (stop, stop_rx) = watch::channel(false);
        let started = Instant::now();
        let dedup = dialect.capabilities().lookback_only;
        let mut pollers = Vec::new();
        let mut names = Vec::new();
        for (index, (t, d, stored)) in tables.into_iter().enumerate() {
            dialect.report(PollReport::Polling {
                table: &t.table,
                columns: &d.columns,
                resumed: stored.is_some(),
                lookback_only: dedup.then_some(config.lookback),
            });
            names.push((t.table.clone(), d.columns));
            let poller = Poller {
                index,
                reader: d.reader,
                cursor: Cursor::resume(stored, config.lookback),
                handed: dedup.then(Handed::new),
                settings: t,
                dialect: Arc::clone(&dialect),
                shared: Arc::clone(&shared),
                tx: tx.clone(),
                started,
                retry: config.retry,
                last_reread: None,
            };
            pollers.push(tokio::spawn(poller.run(stop_rx.clone())));
        }
        let capabilities = dialect.capabilities();
        let writer = tokio::spawn(write_cursors(
            dialect,
            names,
            Arc::clone(&shared),
            stop_rx,
            config.retry,
        ));
        Ok(PollingSource {
            rx,
            capabilities,
            handle: PollingHandle {
                kind: D::KIND,
                shared,
            },
            stop,
            pollers,
            writer: Some(writer),
            _dialect: std::marker::PhantomData,
        })
    }

    /// A cloneable handle: counters and health.
    pub fn handle(&self) -> PollingHandle {
        self.handle.clone()
    }

    /// Stops polling and stores the last acknowledged cursors.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        for p in self.pollers.drain(..) {
            p.abort();
        }
        if let Some(w) = self.writer.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
        }
    }
}

impl<D: Dialect> Drop for PollingSource<D> {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for p in &self.pollers {
            p.abort();
        }
    }
}

impl<D: Dialect> Source for PollingSource<D> {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.rx.recv())
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
}

/// The polling task of one table.
struct Poller<D: Dialect> {
    index: usize,
    settings: PolledTable<D::Table>,
    reader: D::Reader,
    cursor: Cursor,
    /// Without a horizon: what the pending range's re-reads must not hand over again.
    handed: Option<Handed>,
    dialect: Arc<D>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    started: Instant,
    retry: Backoff,
    /// When the pending range was last read again.
    last_reread: Option<Instant>,
}

/// How a poll ended.
enum Polled {
    /// Caught up: wait a poll interval.
    CaughtUp,
    /// More new rows wait: poll again at once.
    More,
    /// The consumer is gone.
    Closed,
}

impl<D: Dialect> Poller<D> {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0u32;
        let mut jitter = Jitter::from_clock();
        loop {
            if *stop.borrow() {
                return;
            }
            let wait = match self.poll().await {
                Ok(Polled::Closed) => return,
                Ok(polled) => {
                    failures = 0;
                    if lock(&self.shared.problems).remove(&self.index).is_some() {
                        let table = &self.settings.table;
                        self.dialect.report(PollReport::Recovered { table });
                    }
                    match polled {
                        Polled::More => Duration::ZERO,
                        _ => self.settings.poll_interval,
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.shared.failures.fetch_add(1, Ordering::Relaxed);
                    self.shared.streaming.store(false, Ordering::SeqCst);
                    let table = &self.settings.table;
                    let fix = D::retry(&e) == Retry::Fix;
                    let mut first = true;
                    if fix {
                        // Classified from the database's error code: a person must act
                        // (a dropped table or column, a revoked grant); reported until a
                        // poll works.
                        let problem = SourceProblem {
                            table: Some(D::problem_table(table)),
                            message: format!("cannot poll {table}: {e}"),
                        };
                        let mut problems = lock(&self.shared.problems);
                        first = problems.get(&self.index) != Some(&problem);
                        problems.insert(self.index, problem);
                    }
                    if first {
                        let report = PollReport::Failed {
                            table,
                            error: &e,
                            fix,
                        };
                        self.dialect.report(report);
                    }
                    *lock(&self.shared.last_error) = Some(e.to_string());
                    self.retry.delay(failures, jitter.unit())
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }

    /// Hands a batch over; false when the consumer is gone.
    async fn send(&self, batch: Batch) -> bool {
        self.tx.send(Ok(batch)).await.is_ok()
    }

    /// One poll: the pending range again, then up to [`PAGES_PER_POLL`] pages of new
    /// rows, in one snapshot; then the cursor's marks, and an acknowledgement that
    /// stores the cursor when it moved.
    async fn poll(&mut self) -> Result<Polled, D::Error> {
        let limit = self.settings.page_size;
        let dialect = Arc::clone(&self.dialect);
        let mut c = dialect.connect().await?;
        // The snapshot is fixed by its first statement: every page of this poll reads it.
        let (mut snapshot, horizon) = dialect.begin(&mut c).await?;
        let at = self.started.elapsed();
        // While catching up (polls back to back), the pending range is read again at
        // most once a poll interval: each re-read scans all of it.
        let reread = self.cursor.reread().filter(|_| {
            self.last_reread
                .is_none_or(|t| t.elapsed() >= self.settings.poll_interval)
        });
        let skipped = reread.is_none() && self.cursor.reread().is_some();
        if reread.is_some() {
            self.last_reread = Some(Instant::now());
        }
        if let Some(range) = reread {
            let mut from: Option<Position> = None;
            loop {
                let read = Read::Again {
                    range: &range,
                    from: from.as_ref(),
                    snapshot: horizon,
                };
                let rows = dialect
                    .read_page(&mut snapshot, &self.reader, read, limit)
                    .await?;
                let full = rows.len() >= limit;
                let last = rows.last().map(|(_, p)| p.clone());
                let fresh: Vec<RowEvent> = match &mut self.handed {
                    Some(handed) => rows
                        .into_iter()
                        .filter(|(_, p)| handed.first_time(p))
                        .map(|(e, _)| e)
                        .collect(),
                    None => rows.into_iter().map(|(e, _)| e).collect(),
                };
                if !fresh.is_empty() {
                    let n = fresh.len() as u64;
                    self.shared.reread_events.fetch_add(n, Ordering::Relaxed);
                    self.shared.events.fetch_add(n, Ordering::Relaxed);
                    if !self.send(Batch::new(fresh, Ack::none())).await {
                        return Ok(Polled::Closed);
                    }
                }
                match last {
                    Some(last) if full => from = Some(last),
                    _ => break,
                }
            }
        }
        let mut more = false;
        for _ in 0..PAGES_PER_POLL {
            let read = Read::New(self.cursor.high());
            let rows = dialect
                .read_page(&mut snapshot, &self.reader, read, limit)
                .await?;
            let full = rows.len() >= limit;
            if let Some((_, last)) = rows.last() {
                self.cursor.advance(last.clone());
            }
            let events: Vec<RowEvent> = rows
                .into_iter()
                .map(|(e, p)| {
                    if let Some(handed) = &mut self.handed {
                        handed.first_time(&p);
                    }
                    e
                })
                .collect();
            if !events.is_empty() {
                self.shared
                    .events
                    .fetch_add(events.len() as u64, Ordering::Relaxed);
                if !self.send(Batch::new(events, Ack::none())).await {
                    return Ok(Polled::Closed);
                }
            }
            more = full;
            if !full {
                break;
            }
        }
        dialect.commit(snapshot).await?;
        drop(c);
        self.shared.polls.fetch_add(1, Ordering::Relaxed);
        self.shared.streaming.store(true, Ordering::SeqCst);
        let safe = if skipped {
            self.cursor.end_catch_up(horizon, at);
            None
        } else {
            self.cursor.end_poll(horizon, at)
        };
        if let Some(handed) = &mut self.handed {
            handed.end_poll(self.cursor.high(), safe.as_ref());
        }
        if let Some(safe) = safe {
            // Acknowledged once every batch before it is rebuilt: then every row at or
            // before `safe` is, and the cursor may be stored.
            let shared = Arc::clone(&self.shared);
            let index = self.index;
            let ack = Ack::new(move || {
                lock(&shared.acked).insert(index, safe);
                shared.ack_notify.notify_one();
            });
            if !self.send(Batch::new(Vec::new(), ack)).await {
                return Ok(Polled::Closed);
            }
        }
        Ok(if more { Polled::More } else { Polled::CaughtUp })
    }
}

/// Stores acknowledged cursors as they come (each write replaces the table's row); on
/// stop, stores what was acknowledged last.
async fn write_cursors<D: Dialect>(
    dialect: Arc<D>,
    tables: Vec<(D::Table, Vec<String>)>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    retry: Backoff,
) {
    let mut jitter = Jitter::from_clock();
    let mut failures = 0u32;
    loop {
        let stopping = tokio::select! {
            _ = shared.ack_notify.notified() => false,
            _ = stop.changed() => true,
        };
        let pending: Vec<(usize, Position)> = lock(&shared.acked).drain().collect();
        for (index, position) in pending {
            let (table, columns) = &tables[index];
            match dialect.save_cursor(table, columns, &position).await {
                Ok(()) => {
                    failures = 0;
                    shared.stored.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    dialect.report(PollReport::StoreFailed { table, error: &e });
                    *lock(&shared.last_error) = Some(e.to_string());
                    // Kept unless a newer acknowledgement replaced it meanwhile.
                    lock(&shared.acked).entry(index).or_insert(position);
                    shared.ack_notify.notify_one();
                    if !stopping {
                        tokio::time::sleep(retry.delay(failures, jitter.unit())).await;
                    }
                }
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, Row, Value};

    /// A table in memory: `(cursor, id)` per row, positions as zero-padded text so they
    /// order as the numbers do. `fail` makes the next polls fail with a `Fix` error.
    #[derive(Default)]
    struct Memory {
        rows: Mutex<Vec<(u32, u32)>>,
        fail: AtomicBool,
        saved: Mutex<Vec<Position>>,
    }

    #[derive(Debug)]
    struct Gone;

    impl fmt::Display for Gone {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the table is gone")
        }
    }

    fn position(cursor: u32, id: u32) -> Position {
        vec![format!("{cursor:08}"), format!("{id:08}")]
    }

    impl Dialect for Arc<Memory> {
        const KIND: &'static str = "memory";
        type Table = String;
        type Reader = ();
        type Conn = ();
        // Borrows the connection, as a database's transaction does.
        type Snapshot<'c> = &'c mut ();
        type Error = Gone;

        fn capabilities(&self) -> Capabilities {
            Capabilities {
                lookback_only: true,
                ..Capabilities::NONE
            }
        }
        async fn connect(&self) -> Result<(), Gone> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(Gone);
            }
            Ok(())
        }
        async fn describe<'a>(
            &'a self,
            _: &'a mut (),
            _: &'a String,
            cursor: &'a str,
        ) -> Result<Described<()>, Gone> {
            Ok(Described {
                reader: (),
                columns: vec![cursor.to_string(), "id".into()],
                cursor_nullable: false,
            })
        }
        async fn begin<'c>(&'c self, conn: &'c mut ()) -> Result<(&'c mut (), Horizon), Gone> {
            Ok((conn, Horizon::NONE))
        }
        async fn read_page<'a>(
            &'a self,
            _: &'a mut Self::Snapshot<'_>,
            _: &'a (),
            read: Read<'a>,
            limit: usize,
        ) -> Result<Vec<(RowEvent, Position)>, Gone> {
            let (after, upto) = match read {
                Read::New(after) => (after.cloned(), None),
                Read::Again { range, from, .. } => (
                    from.or(range.after.as_ref()).cloned(),
                    Some(range.upto.clone()),
                ),
            };
            let mut rows: Vec<(u32, u32)> = lock(&self.rows).clone();
            rows.sort();
            let columns: crate::Columns = vec![Box::from("id")].into();
            Ok(rows
                .into_iter()
                .map(|(c, id)| (c, id, position(c, id)))
                .filter(|(.., p)| after.as_ref().is_none_or(|a| p > a))
                .filter(|(.., p)| upto.as_ref().is_none_or(|u| p <= u))
                .take(limit)
                .map(|(_, id, p)| {
                    let row = Row::new(columns.clone(), vec![Value::Int(id.into())]);
                    (RowEvent::new("s", "t", Op::Update).with_new(row), p)
                })
                .collect())
        }
        async fn commit(&self, _: Self::Snapshot<'_>) -> Result<(), Gone> {
            Ok(())
        }
        async fn load_cursor<'a>(
            &'a self,
            _: &'a String,
            _: &'a [String],
        ) -> Result<Option<Position>, Gone> {
            Ok(None)
        }
        async fn save_cursor<'a>(
            &'a self,
            _: &'a String,
            _: &'a [String],
            position: &'a Position,
        ) -> Result<(), Gone> {
            lock(&self.saved).push(position.clone());
            Ok(())
        }
        fn retry(_: &Gone) -> Retry {
            Retry::Fix
        }
        fn problem_table(table: &String) -> (String, String) {
            ("s".into(), table.clone())
        }
        fn report(&self, _: PollReport<'_>) {}
    }

    fn config() -> PollConfig<String> {
        PollConfig {
            lookback: Duration::ZERO,
            tables: vec![PolledTable {
                table: "t".into(),
                cursor: "c".into(),
                poll_interval: Duration::from_millis(5),
                page_size: 2,
            }],
            queue_batches: 4,
            retry: Backoff::new(Duration::from_millis(5), Duration::from_millis(20)),
        }
    }

    fn ids(batch: &Batch) -> Vec<i64> {
        batch
            .events()
            .iter()
            .map(|e| match e.new.as_ref().and_then(|r| r.get("id")) {
                Some(Value::Int(i)) => *i,
                other => panic!("no id: {other:?}"),
            })
            .collect()
    }

    /// Takes batches, acknowledging each, until `seen` holds `want` ids.
    async fn take(src: &mut PollingSource<Arc<Memory>>, seen: &mut Vec<i64>, want: usize) {
        while seen.len() < want {
            let batch = tokio::time::timeout(Duration::from_secs(10), src.next_batch())
                .await
                .expect("a batch within 10 s")
                .expect("the source runs")
                .expect("no error");
            seen.extend(ids(&batch));
            batch.into_parts().2.ack();
        }
    }

    #[tokio::test]
    async fn every_row_is_handed_over_once_and_its_acknowledged_cursor_stored() {
        let memory = Arc::new(Memory::default());
        lock(&memory.rows).extend((1..=5).map(|i| (i, i)));
        let mut src = PollingSource::with_dialect(Arc::clone(&memory), config())
            .await
            .unwrap();
        let mut seen = Vec::new();
        take(&mut src, &mut seen, 5).await;
        // A row written later, and a row moved forward: each handed over once more.
        lock(&memory.rows).push((9, 6));
        lock(&memory.rows)[0] = (10, 1);
        take(&mut src, &mut seen, 7).await;
        assert_eq!(seen, vec![1, 2, 3, 4, 5, 6, 1]);
        let stored = crate::cursor::Position::from(position(10, 1));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lock(&memory.saved).contains(&stored) {
            assert!(Instant::now() < deadline, "{:?}", lock(&memory.saved));
            // Empty batches carry the acknowledgements that store the cursor.
            if let Ok(Some(Ok(b))) =
                tokio::time::timeout(Duration::from_millis(50), src.next_batch()).await
            {
                assert!(ids(&b).is_empty(), "no row twice: {:?}", ids(&b));
                b.into_parts().2.ack();
            }
        }
        assert_eq!(src.handle().stats().events, 7);
        src.shutdown().await;
    }

    #[tokio::test]
    async fn a_poll_that_needs_a_person_is_a_problem_until_it_works() {
        let memory = Arc::new(Memory::default());
        lock(&memory.rows).push((1, 1));
        let mut src = PollingSource::with_dialect(Arc::clone(&memory), config())
            .await
            .unwrap();
        let mut seen = Vec::new();
        take(&mut src, &mut seen, 1).await;
        memory.fail.store(true, Ordering::SeqCst);
        let handle = src.handle();
        let deadline = Instant::now() + Duration::from_secs(10);
        while handle.health().problems.is_empty() {
            assert!(Instant::now() < deadline, "no problem reported");
            let _ = tokio::time::timeout(Duration::from_millis(20), src.next_batch()).await;
        }
        let health = handle.health();
        assert!(!health.streaming);
        assert_eq!(health.problems[0].table, Some(("s".into(), "t".into())));
        assert!(health.problems[0].message.contains("the table is gone"));
        memory.fail.store(false, Ordering::SeqCst);
        lock(&memory.rows).push((2, 2));
        take(&mut src, &mut seen, 2).await;
        assert_eq!(seen, vec![1, 2]);
        assert!(
            handle.health().problems.is_empty(),
            "cleared once a poll works"
        );
        src.shutdown().await;
    }
}
