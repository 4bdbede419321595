//! Views' unhealed gaps, kept across restarts in the target database
//! ([`freshen::plug::GapLedger`]): table `freshen_gaps` (one row per view and table,
//! with what the stream left out), created when the first gap is recorded — a
//! deployment that never has one leaves no table behind, and needs no CREATE for it.

use deadpool_postgres::Pool;
use freshen::plug::GapLedger;
use freshen::{BoxError, BoxFuture, Gap};

use crate::pool::client;
use crate::{PgError, TableName};

/// The table views' unhealed gaps are kept in, in the target's `public` schema.
pub const GAP_TABLE: &str = "freshen_gaps";

/// A [`GapLedger`] in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgGapLedger {
    pool: Pool,
    table: TableName,
}

impl PgGapLedger {
    /// Gaps kept in `public.freshen_gaps` of the database `pool` connects to.
    pub fn new(pool: Pool) -> PgGapLedger {
        PgGapLedger {
            pool,
            table: TableName::new("public", GAP_TABLE),
        }
    }

    async fn exists(&self) -> Result<bool, PgError> {
        let c = client(&self.pool).await?;
        Ok(c.query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&self.table.quoted()],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot look for {}", self.table), e))?
        .get(0))
    }

    async fn load_gaps(&self, view: &str) -> Result<Vec<Gap>, PgError> {
        if !self.exists().await? {
            return Ok(Vec::new());
        }
        let c = client(&self.pool).await?;
        let rows = c
            .query(
                &format!(
                    "SELECT source_schema, source_table, reason FROM {} WHERE view = $1 \
                     ORDER BY source_schema, source_table",
                    self.table.quoted()
                ),
                &[&view],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read {}", self.table), e))?;
        Ok(rows
            .iter()
            .map(|r| {
                Gap::new(
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                )
            })
            .collect())
    }

    async fn record_gaps(&self, view: &str, gaps: &[Gap]) -> Result<(), PgError> {
        if !self.exists().await? {
            let c = client(&self.pool).await?;
            c.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {} (\
                   view text NOT NULL, \
                   source_schema text NOT NULL, \
                   source_table text NOT NULL, \
                   reason text NOT NULL, \
                   since timestamptz NOT NULL DEFAULT now(), \
                   PRIMARY KEY (view, source_schema, source_table))",
                self.table.quoted()
            ))
            .await
            .map_err(|e| {
                PgError::sql(
                    format!(
                        "cannot create {} to keep an unhealed gap (grant CREATE on its schema, or create it)",
                        self.table
                    ),
                    e,
                )
            })?;
        }
        let c = client(&self.pool).await?;
        for g in gaps {
            c.execute(
                &format!(
                    "INSERT INTO {} (view, source_schema, source_table, reason) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (view, source_schema, source_table) DO UPDATE SET reason = EXCLUDED.reason",
                    self.table.quoted()
                ),
                &[&view, &&*g.schema, &&*g.table, &&*g.reason],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot keep an unhealed gap in {}", self.table), e))?;
        }
        Ok(())
    }

    async fn remove_gaps(&self, view: &str, gone: &[Gap]) -> Result<(), PgError> {
        let c = client(&self.pool).await?;
        for g in gone {
            c.execute(
                &format!(
                    "DELETE FROM {} WHERE view = $1 AND source_schema = $2 AND source_table = $3 AND reason = $4",
                    self.table.quoted()
                ),
                &[&view, &&*g.schema, &&*g.table, &&*g.reason],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot forget a gap in {}", self.table), e))?;
        }
        Ok(())
    }
}

impl GapLedger for PgGapLedger {
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
