//! `MySqlIncrementalSource`: the core's cursor poller ([`freshen::poller`]) over
//! MySQL/MariaDB — pages read in a consistent-snapshot transaction (no horizon: late
//! commits are found within the lookback), cursors kept in a table. This file is the
//! MySQL dialect; the source, its start and its handle are the core's.

use freshen::cursor::{Horizon, Position};
use freshen::poller::{self, Dialect, Level, Open, PollReport, PollingSource, Read};
use freshen::{Capabilities, Retry, RowEvent};
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

/// What a [`MySqlIncrementalSource`] polls and where it keeps its cursors: the
/// databases' URLs (`mysql://…/db`; SELECT is all polling needs), the cursor table,
/// the tables. The lookback is the only cover for rows committed late with an earlier
/// cursor value (see the module documentation).
pub type IncrementalConfig = poller::IncrementalConfig<String, TableName>;

/// The cursor-incremental MySQL/MariaDB source: polls each table for rows past its
/// cursor.
///
/// Started by `MySqlIncrementalSource::start` ([`PollingSource::start`]); hand it to a
/// refresher like any [`freshen::Source`]. See the [module
/// documentation](crate::incremental) for what it guarantees.
pub type MySqlIncrementalSource = PollingSource<MySqlDialect>;

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

/// A polled table as the dialect reads it: its description and keyset statements.
#[derive(Debug)]
pub struct TableReader {
    described: Described,
    sql: Statements,
}

/// MySQL as the core poller sees it: a pool of the polled database and the cursor
/// store.
#[derive(Debug)]
pub struct MySqlDialect {
    pool: Pool,
    store: Store,
}

impl Dialect for MySqlDialect {
    const KIND: &'static str = "mysql-incremental";
    type Table = TableName;
    type Reader = TableReader;
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
    ) -> Result<poller::Described<TableReader>, MySqlError> {
        let described = table::describe(conn, table, cursor).await?;
        Ok(poller::Described {
            columns: described.position_columns(),
            cursor_nullable: described.cursor_nullable,
            reader: TableReader {
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
        reader: &'a TableReader,
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

impl Open for MySqlDialect {
    type Connection = String;

    async fn open(config: &IncrementalConfig) -> Result<MySqlDialect, MySqlError> {
        let pool = crate::connect_pool(&config.connection, config.tables.len() + 1)?;
        let store_pool = match &config.store_connection {
            Some(u) => crate::connect_pool(u, 2)?,
            None => pool.clone(),
        };
        let store = Store::new(store_pool, config.store_table.clone(), &config.name);
        store.prepare().await?;
        Ok(MySqlDialect { pool, store })
    }

    fn refuse(message: &'static str) -> MySqlError {
        MySqlError::new(ErrorKind::Config, message)
    }
}
