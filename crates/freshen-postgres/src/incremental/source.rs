//! `PgIncrementalSource`: one polling task per table, each reading pages in a
//! REPEATABLE READ snapshot and handing each page over as a batch; one task storing the
//! cursors the refresher has acknowledged.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::{
    Ack, Backoff, Batch, BoxFuture, Capabilities, Retry, Source, SourceError, SourceHealth,
    SourceProbe, SourceProblem,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::IsolationLevel;

use crate::error::ErrorKind;
use crate::incremental::cursor::{Cursor, Horizon, Position};
use crate::incremental::store::Store;
use crate::incremental::table::{self, Described, Read, Statements};
use crate::pool::client;
use crate::{ConnectionConfig, PgError, TableName, connect_pool};

/// Most pages of new rows one poll reads before it ends (and lets its cursor become
/// final): a poll's snapshot stays short while catching up on a big table.
const PAGES_PER_POLL: usize = 16;

/// One table to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolledTable {
    /// The table.
    pub table: TableName,
    /// The cursor column: a value every insert and update moves forward
    /// (`updated_at`, an increasing id).
    pub cursor: String,
    /// Time between polls once caught up.
    pub poll_interval: Duration,
    /// Rows per page (and most events per batch).
    pub page_size: usize,
}

/// What a [`PgIncrementalSource`] polls and where it keeps its cursors.
#[derive(Debug, Clone)]
pub struct IncrementalConfig {
    /// The database polled (SELECT is all it needs).
    pub connection: ConnectionConfig,
    /// Where the cursor table lives (the polled database when `None`).
    pub store_connection: Option<ConnectionConfig>,
    /// The cursor table.
    pub store_table: TableName,
    /// This source's name: the cursor table's rows are keyed by it.
    pub name: String,
    /// How long a read position is held (and its range read again) before it may become
    /// durable: covers cursor values fixed before a transaction's first write and
    /// writers whose clocks lag. See the module documentation.
    pub lookback: Duration,
    /// The tables.
    pub tables: Vec<PolledTable>,
    /// Batches queued between the pollers and the consumer.
    pub queue_batches: usize,
    /// Backoff between failed polls.
    pub retry: Backoff,
}

/// What an incremental source guarantees: rows as they are now, replayed after a
/// restart from the stored cursor; no deletes, no former rows, no truncates, no
/// transaction boundaries.
pub(crate) fn capabilities() -> Capabilities {
    Capabilities {
        recoverable: true,
        cursor: true,
        ..Capabilities::NONE
    }
}

/// Counters shared by the pollers, the store task and the handle.
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

/// A snapshot of the source's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncrementalStats {
    /// Polls completed (every table's).
    pub polls: u64,
    /// Row events handed over.
    pub events: u64,
    /// Of those, rows found by re-reading a pending range (late commits, and rows of
    /// transactions that ended between a poll's `xmin` and `xmax`).
    pub reread_events: u64,
    /// Polls that failed (and were retried).
    pub failures: u64,
    /// Cursor writes to the store.
    pub stored: u64,
}

/// A cloneable handle of a running [`PgIncrementalSource`].
#[derive(Clone)]
pub struct IncrementalHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for IncrementalHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IncrementalHandle").finish_non_exhaustive()
    }
}

impl IncrementalHandle {
    /// The counters now.
    pub fn stats(&self) -> IncrementalStats {
        let s = &self.shared;
        IncrementalStats {
            polls: s.polls.load(Ordering::Relaxed),
            events: s.events.load(Ordering::Relaxed),
            reread_events: s.reread_events.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
            stored: s.stored.load(Ordering::Relaxed),
        }
    }
}

impl SourceProbe for IncrementalHandle {
    fn kind(&self) -> &'static str {
        "postgres-incremental"
    }

    fn health(&self) -> SourceHealth {
        let s = self.stats();
        let mut out = SourceHealth::default();
        out.streaming = self.shared.streaming.load(Ordering::SeqCst);
        out.last_error = lock(&self.shared.last_error).clone();
        out.reconnects = s.failures;
        out.events = s.events;
        let mut problems: Vec<(usize, SourceProblem)> = lock(&self.shared.problems)
            .iter()
            .map(|(i, p)| (*i, p.clone()))
            .collect();
        problems.sort_by_key(|(i, _)| *i);
        out.problems = problems.into_iter().map(|(_, p)| p).collect();
        out
    }
}

/// The cursor-incremental PostgreSQL source: polls each table for rows past its cursor.
///
/// Started by [`PgIncrementalSource::start`]; hand it to a refresher like any
/// [`Source`]. See the [module documentation](crate::incremental) for what it
/// guarantees.
pub struct PgIncrementalSource {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    handle: IncrementalHandle,
    stop: watch::Sender<bool>,
    pollers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl fmt::Debug for PgIncrementalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgIncrementalSource")
            .field("tables", &self.pollers.len())
            .finish_non_exhaustive()
    }
}

impl PgIncrementalSource {
    /// Describes every table (cursor column and primary key must exist), prepares the
    /// cursor table, loads the stored cursors and starts polling.
    pub async fn start(config: IncrementalConfig) -> Result<PgIncrementalSource, PgError> {
        if config.tables.is_empty() {
            return Err(PgError::new(
                ErrorKind::Config,
                "an incremental source needs at least one table to poll",
            ));
        }
        let pool = connect_pool(&config.connection, config.tables.len() + 1)?;
        let store_pool = match &config.store_connection {
            Some(c) => connect_pool(c, 2)?,
            None => pool.clone(),
        };
        let store = Store::new(store_pool, config.store_table.clone(), &config.name);
        store.prepare().await?;
        let mut tables = Vec::with_capacity(config.tables.len());
        {
            let c = client(&pool).await?;
            for t in &config.tables {
                let d = table::describe(&c, &t.table, &t.cursor).await?;
                if d.cursor_nullable {
                    tracing::warn!(
                        table = %t.table,
                        "cursor column {} may be NULL: rows where it is NULL are never read",
                        t.cursor
                    );
                }
                let columns: Vec<String> = d.position.iter().map(|(c, _)| c.clone()).collect();
                let stored = store.load(&t.table, &columns).await?;
                tables.push((t.clone(), d, columns, stored));
            }
        }
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(config.queue_batches.max(1));
        let (stop, stop_rx) = watch::channel(false);
        let started = Instant::now();
        let mut pollers = Vec::new();
        let mut names = Vec::new();
        for (index, (t, d, columns, stored)) in tables.into_iter().enumerate() {
            tracing::info!(
                table = %t.table,
                cursor = %t.cursor,
                resume = stored.is_some(),
                "polling {} by ({})",
                t.table,
                columns.join(", ")
            );
            names.push((t.table.clone(), columns));
            let poller = Poller {
                index,
                sql: table::statements(&d),
                described: d,
                cursor: Cursor::resume(stored, config.lookback),
                settings: t,
                pool: pool.clone(),
                shared: Arc::clone(&shared),
                tx: tx.clone(),
                started,
                retry: config.retry,
                last_reread: None,
            };
            pollers.push(tokio::spawn(poller.run(stop_rx.clone())));
        }
        let writer = tokio::spawn(write_cursors(
            store,
            names,
            Arc::clone(&shared),
            stop_rx,
            config.retry,
        ));
        Ok(PgIncrementalSource {
            rx,
            handle: IncrementalHandle { shared },
            stop,
            pollers,
            writer: Some(writer),
        })
    }

    /// A cloneable handle: counters and health.
    pub fn handle(&self) -> IncrementalHandle {
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

impl Drop for PgIncrementalSource {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for p in &self.pollers {
            p.abort();
        }
    }
}

impl Source for PgIncrementalSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.rx.recv())
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
}

/// The polling task of one table.
struct Poller {
    index: usize,
    settings: PolledTable,
    described: Described,
    sql: Statements,
    cursor: Cursor,
    pool: Pool,
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

impl Poller {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0u32;
        let mut jitter = freshen::Jitter::from_clock();
        loop {
            if *stop.borrow() {
                return;
            }
            let wait = match self.poll().await {
                Ok(Polled::Closed) => return,
                Ok(polled) => {
                    failures = 0;
                    if lock(&self.shared.problems).remove(&self.index).is_some() {
                        tracing::info!(table = %self.settings.table, "polling again");
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
                    if e.retry() == Retry::Fix {
                        // Classified by SQLSTATE: a person must act (undefined table or
                        // column, insufficient privilege); reported until a poll works.
                        let problem = SourceProblem {
                            table: Some((table.schema.clone(), table.name.clone())),
                            message: format!("cannot poll {table}: {e}"),
                        };
                        let mut problems = lock(&self.shared.problems);
                        if problems.get(&self.index) != Some(&problem) {
                            tracing::error!("{} (retrying)", problem.message);
                        }
                        problems.insert(self.index, problem);
                    } else {
                        tracing::warn!(table = %table, "poll failed (retrying): {e}");
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
    async fn poll(&mut self) -> Result<Polled, PgError> {
        let limit = self.settings.page_size;
        let mut c = client(&self.pool).await?;
        let tx = c
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| PgError::sql("cannot begin a poll", e))?;
        // The first statement fixes the snapshot every page of this poll reads.
        let s = tx
            .query_one(
                "SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text \
                   FROM pg_current_snapshot() s",
                &[],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the poll's snapshot", e))?;
        let at = self.started.elapsed();
        let xid = |t: &str| {
            t.parse::<u64>().map_err(|_| {
                PgError::new(ErrorKind::Server, format!("not a transaction id: {t:?}"))
            })
        };
        let horizon = Horizon {
            xmin: xid(s.get(0))?,
            xmax: xid(s.get(1))?,
        };
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
                    xmax: horizon.xmax,
                };
                let page = table::read_page(&tx, &self.described, &self.sql, read, limit).await?;
                let full = page.events.len() >= limit;
                let n = page.events.len() as u64;
                if n > 0 {
                    self.shared.reread_events.fetch_add(n, Ordering::Relaxed);
                    self.shared.events.fetch_add(n, Ordering::Relaxed);
                    if !self.send(Batch::new(page.events, Ack::none())).await {
                        return Ok(Polled::Closed);
                    }
                }
                match page.last {
                    Some(last) if full => from = Some(last),
                    _ => break,
                }
            }
        }
        let mut more = false;
        for _ in 0..PAGES_PER_POLL {
            let read = Read::New(self.cursor.high());
            let page = table::read_page(&tx, &self.described, &self.sql, read, limit).await?;
            let full = page.events.len() >= limit;
            if let Some(last) = page.last {
                self.cursor.advance(last);
            }
            if !page.events.is_empty() {
                self.shared
                    .events
                    .fetch_add(page.events.len() as u64, Ordering::Relaxed);
                if !self.send(Batch::new(page.events, Ack::none())).await {
                    return Ok(Polled::Closed);
                }
            }
            more = full;
            if !full {
                break;
            }
        }
        tx.commit()
            .await
            .map_err(|e| PgError::sql("cannot end a poll", e))?;
        drop(c);
        self.shared.polls.fetch_add(1, Ordering::Relaxed);
        self.shared.streaming.store(true, Ordering::SeqCst);
        if skipped {
            self.cursor.end_catch_up(horizon, at);
        } else if let Some(safe) = self.cursor.end_poll(horizon, at) {
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

/// Stores acknowledged cursors as they come (each write replaces the table's row);
/// on stop, stores what was acknowledged last.
async fn write_cursors(
    store: Store,
    tables: Vec<(TableName, Vec<String>)>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    retry: Backoff,
) {
    let mut jitter = freshen::Jitter::from_clock();
    let mut failures = 0u32;
    loop {
        let stopping = tokio::select! {
            _ = shared.ack_notify.notified() => false,
            _ = stop.changed() => true,
        };
        let pending: Vec<(usize, Position)> = lock(&shared.acked).drain().collect();
        for (index, position) in pending {
            let (table, columns) = &tables[index];
            match store.save(table, columns, &position).await {
                Ok(()) => {
                    failures = 0;
                    shared.stored.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(table = %table, "cannot store the cursor (retrying): {e}");
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
