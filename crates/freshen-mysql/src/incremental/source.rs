//! `MySqlIncrementalSource`: the core's cursor poller ([`freshen::poller`]) over
//! MySQL/MariaDB — pages read in a consistent-snapshot transaction (no horizon: late
//! commits are found within the lookback), cursors kept in a table.

use std::fmt;
use std::time::Duration;

use freshen::cursor::{Horizon, Position};
use freshen::poller::{self, Dialect, Level, PollConfig, PollReport, PollingSource, Read};
use freshen::{Backoff, Batch, BoxFuture, Capabilities, Retry, RowEvent, Source, SourceError};
use mysql_async::{Pool, TxOpts};

use crate::MySqlError;
use crate::error::ErrorKind;
use crate::incremental::store::Store;
use crate::incremental::table::{self, Described, Statements, TableName};

/// One table to poll.
pub type PolledTable = poller::PolledTable<TableName>;

/// A cloneable handle of a running [`MySqlIncrementalSource`]: counters and health.
pub type IncrementalHandle = poller::PollingHandle;

/// A snapshot of the source's counters.
pub type IncrementalStats = poller::PollingStats;

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

/// A described table and its keyset statements.
pub(crate) struct Reader {
    described: Described,
    sql: Statements,
}

/// MySQL as the core poller sees it: a pool of the polled database and the cursor
/// store.
pub(crate) struct MySqlDialect {
    pool: Pool,
    store: Store,
}

impl Dialect for MySqlDialect {
    const KIND: &'static str = "mysql-incremental";
    type Table = TableName;
    type Reader = Reader;
    type Conn = mysql_async::Conn;
    type Snapshot<'c> = mysql_async::Transaction<'c>;
    type Error = MySqlError;

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn connect(&self) -> Result<Self::Conn, MySqlError> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect to poll", e))
    }

    async fn describe<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        table: &'a TableName,
        cursor: &'a str,
    ) -> Result<poller::Described<Reader>, MySqlError> {
        let described = table::describe(conn, table, cursor).await?;
        Ok(poller::Described {
            columns: described.position_columns(),
            cursor_nullable: described.cursor_nullable,
            reader: Reader {
                sql: table::statements(&described),
                described,
            },
        })
    }

    async fn begin<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
    ) -> Result<(Self::Snapshot<'c>, Horizon), MySqlError> {
        let mut opts = TxOpts::default();
        opts.with_consistent_snapshot(true)
            .with_isolation_level(mysql_async::IsolationLevel::RepeatableRead)
            .with_readonly(Some(true));
        let tx = conn
            .start_transaction(opts)
            .await
            .map_err(|e| MySqlError::driver("cannot begin a poll", e))?;
        // No transaction ids a reader may see: marks become final on the lookback.
        Ok((tx, Horizon::NONE))
    }

    async fn read_page<'a>(
        &'a self,
        snapshot: &'a mut Self::Snapshot<'_>,
        reader: &'a Reader,
        read: Read<'a>,
        limit: usize,
    ) -> Result<Vec<(RowEvent, Position)>, MySqlError> {
        table::read_page(snapshot, &reader.described, &reader.sql, read, limit).await
    }

    async fn commit(&self, snapshot: Self::Snapshot<'_>) -> Result<(), MySqlError> {
        snapshot
            .commit()
            .await
            .map_err(|e| MySqlError::driver("cannot end a poll", e))
    }

    async fn load_cursor<'a>(
        &'a self,
        table: &'a TableName,
        columns: &'a [String],
    ) -> Result<Option<Position>, MySqlError> {
        self.store.load(table, columns).await
    }

    async fn save_cursor<'a>(
        &'a self,
        table: &'a TableName,
        columns: &'a [String],
        position: &'a Position,
    ) -> Result<(), MySqlError> {
        self.store.save(table, columns, position).await
    }

    fn retry(error: &MySqlError) -> Retry {
        // Classified by server error number: a dropped table or column, a revoked grant.
        error.retry()
    }

    fn problem_table(table: &TableName) -> (String, String) {
        (table.database.clone(), table.table.clone())
    }

    fn report(&self, report: PollReport<'_>) {
        if let PollReport::Polling { resumed, .. } = report {
            // `resume=` is the field operators (and tests) look for after a restart.
            tracing::info!(resume = resumed, "{report}");
            return;
        }
        match report.level() {
            Level::Info => tracing::info!("{report}"),
            Level::Warn => tracing::warn!("{report}"),
            Level::Error => tracing::error!("{report}"),
        }
    }
}

/// The cursor-incremental MySQL/MariaDB source: polls each table for rows past its
/// cursor.
///
/// Started by [`MySqlIncrementalSource::start`]; hand it to a refresher like any
/// [`Source`]. See the [module documentation](crate::incremental) for what it
/// guarantees.
pub struct MySqlIncrementalSource(PollingSource<MySqlDialect>);

impl fmt::Debug for MySqlIncrementalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
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
        let poll = PollConfig {
            lookback: config.lookback,
            tables: config.tables,
            queue_batches: config.queue_batches,
            retry: config.retry,
        };
        let source = PollingSource::start(MySqlDialect { pool, store }, poll).await?;
        Ok(MySqlIncrementalSource(source))
    }

    /// A cloneable handle: counters and health.
    pub fn handle(&self) -> IncrementalHandle {
        self.0.handle()
    }

    /// Stops polling and stores the last acknowledged cursors.
    pub async fn shutdown(&mut self) {
        self.0.shutdown().await;
    }
}

impl Source for MySqlIncrementalSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        self.0.next_batch()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        self.0.close()
    }
}
