//! Views' unhealed gaps, kept across restarts in a MySQL/MariaDB target
//! ([`freshen::plug::GapLedger`]): table `freshen_gaps` of the target URL's database (one
//! row per view and table, with what the stream left out), created when the first gap is
//! recorded — a deployment that never has one leaves no table behind, and needs no
//! CREATE for it. The same table, by name and columns, as on a PostgreSQL target.

use freshen::plug::GapLedger;
use freshen::{BoxError, BoxFuture, Gap};
use mysql_async::Pool;
use mysql_async::prelude::Queryable;

use crate::MySqlError;

/// The table views' unhealed gaps are kept in, in the target URL's database.
pub const GAP_TABLE: &str = "freshen_gaps";

/// A [`GapLedger`] in a MySQL/MariaDB database.
#[derive(Debug, Clone)]
pub struct MySqlGapLedger {
    pool: Pool,
}

impl MySqlGapLedger {
    /// Gaps kept in `freshen_gaps` of the database `pool` connects to (its URL's).
    pub fn new(pool: Pool) -> MySqlGapLedger {
        MySqlGapLedger { pool }
    }

    async fn conn(&self) -> Result<mysql_async::Conn, MySqlError> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect to keep unhealed gaps", e))
    }

    async fn exists(&self, c: &mut mysql_async::Conn) -> Result<bool, MySqlError> {
        let found: Option<u8> = c
            .exec_first(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (GAP_TABLE,),
            )
            .await
            .map_err(|e| MySqlError::driver(format!("cannot look for {GAP_TABLE}"), e))?;
        Ok(found.is_some())
    }

    async fn load_gaps(&self, view: &str) -> Result<Vec<Gap>, MySqlError> {
        let mut c = self.conn().await?;
        if !self.exists(&mut c).await? {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, String, String)> = c
            .exec(
                format!(
                    "SELECT source_schema, source_table, reason FROM {GAP_TABLE} WHERE `view` = ? \
                     ORDER BY source_schema, source_table"
                ),
                (view,),
            )
            .await
            .map_err(|e| MySqlError::driver(format!("cannot read {GAP_TABLE}"), e))?;
        Ok(rows
            .into_iter()
            .map(|(schema, table, reason)| Gap::new(schema, table, reason))
            .collect())
    }

    async fn record_gaps(&self, view: &str, gaps: &[Gap]) -> Result<(), MySqlError> {
        let mut c = self.conn().await?;
        // CREATE TABLE IF NOT EXISTS needs CREATE even when the table is there: a user
        // given only a created table must not be asked for more.
        if !self.exists(&mut c).await? {
            // `view` is a reserved word in MySQL; names fit any server's key length
            // limit (an identifier is at most 64 characters).
            c.query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {GAP_TABLE} (\
                   `view` VARCHAR(255) NOT NULL, \
                   source_schema VARCHAR(64) NOT NULL, \
                   source_table VARCHAR(64) NOT NULL, \
                   reason TEXT NOT NULL, \
                   since TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                   PRIMARY KEY (`view`, source_schema, source_table)\
                 ) ENGINE=InnoDB"
            ))
            .await
            .map_err(|e| {
                MySqlError::driver(
                    format!(
                        "cannot create {GAP_TABLE} to keep an unhealed gap (grant CREATE on the target's database, or create it)"
                    ),
                    e,
                )
            })?;
        }
        for g in gaps {
            c.exec_drop(
                format!(
                    "INSERT INTO {GAP_TABLE} (`view`, source_schema, source_table, reason) VALUES (?, ?, ?, ?) \
                     ON DUPLICATE KEY UPDATE reason = VALUES(reason)"
                ),
                (view, &*g.schema, &*g.table, &*g.reason),
            )
            .await
            .map_err(|e| {
                MySqlError::driver(format!("cannot keep an unhealed gap in {GAP_TABLE}"), e)
            })?;
        }
        Ok(())
    }

    async fn remove_gaps(&self, view: &str, gone: &[Gap]) -> Result<(), MySqlError> {
        let mut c = self.conn().await?;
        for g in gone {
            c.exec_drop(
                format!(
                    "DELETE FROM {GAP_TABLE} WHERE `view` = ? AND source_schema = ? AND source_table = ? AND reason = ?"
                ),
                (view, &*g.schema, &*g.table, &*g.reason),
            )
            .await
            .map_err(|e| MySqlError::driver(format!("cannot forget a gap in {GAP_TABLE}"), e))?;
        }
        Ok(())
    }
}

impl GapLedger for MySqlGapLedger {
    fn load<'a>(&'a self, view: &'a str) -> BoxFuture<'a, Result<Vec<Gap>, BoxError>> {
        Box::pin(async move { self.load_gaps(view).await.map_err(Into::into) })
    }

    fn record<'a>(&'a self, view: &'a str, gaps: &'a [Gap]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move { self.record_gaps(view, gaps).await.map_err(Into::into) })
    }

    fn remove<'a>(&'a self, view: &'a str, gaps: &'a [Gap]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move { self.remove_gaps(view, gaps).await.map_err(Into::into) })
    }
}
