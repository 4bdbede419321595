//! `PgIncrementalSource`: the core's cursor poller ([`freshen::poller`]) over
//! PostgreSQL — pages read in a REPEATABLE READ READ ONLY snapshot whose
//! `pg_current_snapshot()` is the horizon, cursors kept in a table. This file is the
//! PostgreSQL dialect; the source, its start and its handle are the core's.

use deadpool_postgres::Pool;
use freshen::cursor::{Horizon, Position};
use freshen::poller::{self, Dialect, Level, Open, PollReport, PollingSource, Read};
use freshen::{Capabilities, Retry, RowEvent};
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

/// What a [`PgIncrementalSource`] polls and where it keeps its cursors: the databases'
/// connection settings, the cursor table, the tables. The lookback covers cursor
/// values fixed before a transaction's first write and writers whose clocks lag (see
/// the module documentation).
pub type IncrementalConfig = poller::IncrementalConfig<ConnectionConfig, TableName>;

/// The cursor-incremental PostgreSQL source: polls each table for rows past its cursor.
///
/// Started by `PgIncrementalSource::start` ([`PollingSource::start`]); hand it to a
/// refresher like any [`freshen::Source`]. See the [module documentation](crate::polling)
/// for what it guarantees.
pub type PgIncrementalSource = PollingSource<PgDialect>;

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

/// A polled table as the dialect reads it: its description and keyset statements.
#[derive(Debug)]
pub struct TableReader {
    described: Described,
    sql: Statements,
}

/// PostgreSQL as the core poller sees it: a pool of the polled database and the cursor
/// store.
#[derive(Debug)]
pub struct PgDialect {
    pool: Pool,
    store: Store,
}

impl Dialect for PgDialect {
    const KIND: &'static str = "postgres-incremental";
    type Table = TableName;
    type Reader = TableReader;
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
    ) -> Result<poller::Described<TableReader>, PgError> {
        let described = table::describe(conn, table, cursor).await?;
        Ok(poller::Described {
            columns: described.position.iter().map(|(c, _)| c.clone()).collect(),
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
        reader: &'a TableReader,
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

impl Open for PgDialect {
    type Connection = ConnectionConfig;

    async fn open(config: &IncrementalConfig) -> Result<PgDialect, PgError> {
        let pool = connect_pool(&config.connection, config.tables.len() + 1)?;
        let store_pool = match &config.store_connection {
            Some(c) => connect_pool(c, 2)?,
            None => pool.clone(),
        };
        let store = Store::new(store_pool, config.store_table.clone(), &config.name);
        store.prepare().await?;
        Ok(PgDialect { pool, store })
    }

    fn refuse(message: &'static str) -> PgError {
        PgError::new(ErrorKind::Config, message)
    }
}
