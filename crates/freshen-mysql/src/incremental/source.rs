//! `MySqlIncrementalSource`: one polling task per table, each reading pages in a
//! consistent-snapshot transaction and handing each page over as a batch; one task
//! storing the cursors the refresher has acknowledged.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::cursor::{Cursor, Handed, Horizon, Position};
use freshen::{
    Ack, Backoff, Batch, BoxFuture, Capabilities, Retry, Source, SourceError, SourceHealth,
    SourceProbe, SourceProblem,
};
use mysql_async::{Pool, TxOpts};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::MySqlError;
use crate::error::ErrorKind;
use crate::incremental::store::Store;
use crate::incremental::table::{self, Described, Read, Statements, TableName};

/// Most pages of new rows one poll reads before it ends (and lets its cursor become
/// final): a poll's snapshot stays short while catching up on a big table.
const PAGES_PER_POLL: usize = 16;

/// One table to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolledTable {
    /// The table.
    pub table: TableName,
    /// The cursor column: a value every insert and update moves forward
    /// (`updated_at`, an AUTO_INCREMENT id for insert-only tables).
    pub cursor: String,
    /// Time between polls once caught up.
    pub poll_interval: Duration,
    /// Rows per page (and most events per batch).
    pub page_size: usize,
}

/// What a [`MySqlIncrementalSource`] polls and where it keeps its cursors.
#[derive(Debug, Clone)]
pub struct IncrementalConfig {
    /// The polled database's URL (`mysql://…/db`; SELECT is all it needs).
    pub url: String,
    /// Where the cursor table lives (the polled database when `None`).
    pub store_url: Option<String>,
    /// The cursor table.
    pub store_table: TableName,
    /// This source's name: the cursor table's rows are keyed by it.
    pub name: String,
    /// How long a read position is held, its range read again at every poll, before it
    /// may become durable: the only cover for rows committed late with an earlier cursor
    /// value (see the module documentation).
    pub lookback: Duration,
    /// The tables.
    pub tables: Vec<PolledTable>,
    /// Batches queued between the pollers and the consumer.
    pub queue_batches: usize,
    /// Backoff between failed polls.
    pub retry: Backoff,
}

/// What a MySQL incremental source guarantees: rows as they are now, replayed after a
/// restart from the stored cursor; late commits found within the lookback only; no
/// deletes, no former rows, no truncates, no transaction boundaries.
pub(crate) fn capabilities() -> Capabilities {
    Capabilities {
        recoverable: true,
        cursor: true,
        lookback_only: true,
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
    problems: Mutex<HashMap<usize, SourceProblem>>,
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
    /// Of those, rows found by re-reading the pending range that no earlier poll had
    /// handed over: late commits, found within the lookback.
    pub reread_events: u64,
    /// Polls that failed (and were retried).
    pub failures: u64,
    /// Cursor writes to the store.
    pub stored: u64,
}

/// A cloneable handle of a running [`MySqlIncrementalSource`].
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
        "mysql-incremental"
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

/// The cursor-incremental MySQL/MariaDB source: polls each table for rows past its
/// cursor. See the [module documentation](crate::incremental) for what it guarantees.
pub struct MySqlIncrementalSource {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    handle: IncrementalHandle,
    stop: watch::Sender<bool>,
    pollers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl fmt::Debug for MySqlIncrementalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlIncrementalSource")
            .field("tables", &self.pollers.len())
            .finish_non_exhaustive()
    }
}

impl MySqlIncrementalSource {
    /// Describes every table (cursor column and primary key must exist), prepares the
    /// cursor table, loads the stored cursors and starts polling.
    pub async fn start(config: IncrementalConfig) -> Result<MySqlIncrementalSource, MySqlError> {
        if config.tables.is_empty() {
            return Err(MySqlError::new(
                ErrorKind::Config,
                "an incremental source needs at least one table to poll",
            ));
        }
        let pool = crate::connect_pool(&config.url, config.tables.len() + 1)?;
        let store_pool = match &config.store_url {
            Some(u) => crate::connect_pool(u, 2)?,
            None => pool.clone(),
        };
        let store = Store::new(store_pool, config.store_table.clone(), &config.name);
        store.prepare().await?;
        let mut tables = Vec::with_capacity(config.tables.len());
        {
            let mut c = pool
                .get_conn()
                .await
                .map_err(|e| MySqlError::driver("cannot connect to poll", e))?;
            for t in &config.tables {
                let d = table::describe(&mut c, &t.table, &t.cursor).await?;
                if d.cursor_nullable {
                    tracing::warn!(
                        table = %t.table,
                        "cursor column {} may be NULL: rows where it is NULL are never read",
                        t.cursor
                    );
                }
                let columns = d.position_columns();
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
                lookback = ?config.lookback,
                "polling {} by ({}); late commits are found within the lookback only",
                t.table,
                columns.join(", ")
            );
            names.push((t.table.clone(), columns));
            let poller = Poller {
                index,
                sql: table::statements(&d),
                described: d,
                cursor: Cursor::resume(stored, config.lookback),
                handed: Handed::new(),
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
        Ok(MySqlIncrementalSource {
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

impl Drop for MySqlIncrementalSource {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for p in &self.pollers {
            p.abort();
        }
    }
}

impl Source for MySqlIncrementalSource {
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
    /// What the pending range's re-reads must not hand over again.
    handed: Handed,
    pool: Pool,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    started: Instant,
    retry: Backoff,
    last_reread: Option<Instant>,
}

enum Polled {
    CaughtUp,
    More,
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
                    // Classified by server error number: a person must act (a dropped
                    // table or column, a revoked grant); reported until a poll works.
                    if e.retry() == Retry::Fix {
                        let problem = SourceProblem {
                            table: Some((table.database.clone(), table.table.clone())),
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

    async fn send(&self, batch: Batch) -> bool {
        self.tx.send(Ok(batch)).await.is_ok()
    }

    /// One poll: the pending range again (only rows not handed over before), then up
    /// to [`PAGES_PER_POLL`] pages of new rows, in one consistent snapshot; then the
    /// cursor's marks, and an acknowledgement that stores the cursor when it moved.
    async fn poll(&mut self) -> Result<Polled, MySqlError> {
        let limit = self.settings.page_size;
        let mut c = self
            .pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect to poll", e))?;
        let mut opts = TxOpts::default();
        opts.with_consistent_snapshot(true)
            .with_isolation_level(mysql_async::IsolationLevel::RepeatableRead)
            .with_readonly(Some(true));
        let mut tx = c
            .start_transaction(opts)
            .await
            .map_err(|e| MySqlError::driver("cannot begin a poll", e))?;
        let at = self.started.elapsed();
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
                };
                let page =
                    table::read_page(&mut tx, &self.described, &self.sql, read, limit).await?;
                let full = page.rows.len() >= limit;
                let last = page.last().cloned();
                let fresh: Vec<_> = page
                    .rows
                    .into_iter()
                    .filter(|(_, p)| self.handed.first_time(p))
                    .map(|(e, _)| e)
                    .collect();
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
            let page = table::read_page(&mut tx, &self.described, &self.sql, read, limit).await?;
            let full = page.rows.len() >= limit;
            if let Some(last) = page.last() {
                self.cursor.advance(last.clone());
            }
            let events: Vec<_> = page
                .rows
                .into_iter()
                .map(|(e, p)| {
                    self.handed.first_time(&p);
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
        tx.commit()
            .await
            .map_err(|e| MySqlError::driver("cannot end a poll", e))?;
        drop(c);
        self.shared.polls.fetch_add(1, Ordering::Relaxed);
        self.shared.streaming.store(true, Ordering::SeqCst);
        // No transaction horizon: marks become final on the lookback alone.
        if skipped {
            self.cursor.end_catch_up(Horizon::NONE, at);
            self.handed.end_poll(self.cursor.high(), None);
        } else {
            let safe = self.cursor.end_poll(Horizon::NONE, at);
            self.handed.end_poll(self.cursor.high(), safe.as_ref());
            if let Some(safe) = safe {
                // Acknowledged once every batch before it is rebuilt: then every row at
                // or before `safe` is, and the cursor may be stored.
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
        }
        Ok(if more { Polled::More } else { Polled::CaughtUp })
    }
}

/// Stores acknowledged cursors as they come (each write replaces the table's row); on
/// stop, stores what was acknowledged last.
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
