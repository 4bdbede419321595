//! `PgIncrementalSource`: the core's cursor poller ([`freshen::poller`]) over
//! PostgreSQL — pages read in a REPEATABLE READ READ ONLY snapshot whose
//! `pg_current_snapshot()` is the horizon, cursors kept in a table.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::cursor::{Horizon, Position};
use freshen::poller::{self, Dialect, Level, PollConfig, PollReport, PollingSource, Read};
use freshen::{Backoff, Batch, BoxFuture, Capabilities, Retry, RowEvent, Source, SourceError};
use tokio_postgres::IsolationLevel;

use crate::error::ErrorKind;
use crate::polling::store::Store;
use crate::polling::table::{self, Described, Statements};
use crate::pool::client;
use crate::{ConnectionConfig, PgError, TableName, connect_pool};

/// One table to poll.
pub type PolledTable = poller::PolledTable<TableName>;

/// A cloneable handle of a running [`PgIncrementalSource`]: counters and health.
pub type IncrementalHandle = poller::PollingHandle;

/// A snapshot of the source's counters.
pub type IncrementalStats = poller::PollingStats;

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

/// A described table and its keyset statements.
pub(crate) struct Reader {
    described: Described,
    sql: Statements,
}

/// PostgreSQL as the core poller sees it: a pool of the polled database and the cursor
/// store.
pub(crate) struct PgDialect {
    pool: Pool,
    store: Store,
}

impl Dialect for PgDialect {
    const KIND: &'static str = "postgres-incremental";
    type Table = TableName;
    type Reader = Reader;
    type Conn = deadpool_postgres::Object;
    type Snapshot<'c> = deadpool_postgres::Transaction<'c>;
    type Error = PgError;

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn connect(&self) -> Result<Self::Conn, PgError> {
        client(&self.pool).await
    }

    async fn describe<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        table: &'a TableName,
        cursor: &'a str,
    ) -> Result<poller::Described<Reader>, PgError> {
        let described = table::describe(conn, table, cursor).await?;
        Ok(poller::Described {
            columns: described.position.iter().map(|(c, _)| c.clone()).collect(),
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
    ) -> Result<(Self::Snapshot<'c>, Horizon), PgError> {
        let tx = conn
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
        let xid = |t: &str| {
            t.parse::<u64>().map_err(|_| {
                PgError::new(ErrorKind::Server, format!("not a transaction id: {t:?}"))
            })
        };
        let horizon = Horizon {
            xmin: xid(s.get(0))?,
            xmax: xid(s.get(1))?,
        };
        Ok((tx, horizon))
    }

    async fn read_page<'a>(
        &'a self,
        snapshot: &'a mut Self::Snapshot<'_>,
        reader: &'a Reader,
        read: Read<'a>,
        limit: usize,
    ) -> Result<Vec<(RowEvent, Position)>, PgError> {
        table::read_page(snapshot, &reader.described, &reader.sql, read, limit).await
    }

    async fn commit(&self, snapshot: Self::Snapshot<'_>) -> Result<(), PgError> {
        snapshot
            .commit()
            .await
            .map_err(|e| PgError::sql("cannot end a poll", e))
    }

    async fn load_cursor<'a>(
        &'a self,
        table: &'a TableName,
        columns: &'a [String],
    ) -> Result<Option<Position>, PgError> {
        self.store.load(table, columns).await
    }

    async fn save_cursor<'a>(
        &'a self,
        table: &'a TableName,
        columns: &'a [String],
        position: &'a Position,
    ) -> Result<(), PgError> {
        self.store.save(table, columns, position).await
    }

    fn retry(error: &PgError) -> Retry {
        // Classified by SQLSTATE: undefined table or column, insufficient privilege.
        error.retry()
    }

    fn problem_table(table: &TableName) -> (String, String) {
        (table.schema.clone(), table.name.clone())
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

/// The cursor-incremental PostgreSQL source: polls each table for rows past its cursor.
///
/// Started by [`PgIncrementalSource::start`]; hand it to a refresher like any
/// [`Source`]. See the [module documentation](crate::polling) for what it
/// guarantees.
pub struct PgIncrementalSource(PollingSource<PgDialect>);

impl fmt::Debug for PgIncrementalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
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
        let poll = PollConfig {
            lookback: config.lookback,
            tables: config.tables,
            queue_batches: config.queue_batches,
            retry: config.retry,
        };
        let source = PollingSource::start(PgDialect { pool, store }, poll).await?;
        Ok(PgIncrementalSource(source))
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

impl Source for PgIncrementalSource {
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
