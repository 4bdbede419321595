//! Where each table's durable cursor lives between runs: a table (default
//! `freshen_cursors`) in a database freshen may write — by default the source's own,
//! where the derived tables usually are — one row per (source name, table), written
//! after the rebuilds its rows dirtied are done. The position lives with the data it
//! describes: a restored backup brings its cursor along.

use deadpool_postgres::Pool;

use crate::error::ErrorKind;
use crate::pool::client;
use crate::{PgError, TableName};
use freshen::cursor::Position;
use freshen::poller::stored_position;

/// The cursor store of one source.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: Pool,
    table: TableName,
    name: String,
}

impl Store {
    pub(crate) fn new(pool: Pool, table: TableName, name: &str) -> Store {
        Store {
            pool,
            table,
            name: name.to_string(),
        }
    }

    /// Creates the table when missing.
    pub(crate) async fn prepare(&self) -> Result<(), PgError> {
        let c = client(&self.pool).await?;
        // CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the table is
        // there: a user given only a created table must not be asked for more.
        let exists: bool = c
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&self.table.quoted()],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot look for {}", self.table), e))?
            .get(0);
        if exists {
            return Ok(());
        }
        c.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               name text NOT NULL, \
               source_table text NOT NULL, \
               columns text[] NOT NULL, \
               position text[] NOT NULL, \
               updated_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (name, source_table))",
            self.table.quoted()
        ))
        .await
        .map_err(|e| {
            PgError::sql(
                format!(
                    "cannot create the cursor table {} (grant CREATE on its schema, or create it)",
                    self.table
                ),
                e,
            )
        })
    }

    /// The stored position of `table`, read by `columns` (the cursor then the primary
    /// key); a position stored for other columns is an error saying how to start over.
    pub(crate) async fn load(
        &self,
        table: &TableName,
        columns: &[String],
    ) -> Result<Option<Position>, PgError> {
        let c = client(&self.pool).await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT columns, position FROM {} WHERE name = $1 AND source_table = $2",
                    self.table.quoted()
                ),
                &[&self.name, &table.to_string()],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read {}", self.table), e))?;
        let Some(row) = row else { return Ok(None) };
        let stored: Vec<String> = row.get(0);
        let position: Vec<String> = row.get(1);
        stored_position(&self.table, &self.name, table, &stored, position, columns)
            .map(Some)
            .map_err(|m| PgError::new(ErrorKind::Config, m))
    }

    /// Stores `position` for `table`.
    pub(crate) async fn save(
        &self,
        table: &TableName,
        columns: &[String],
        position: &Position,
    ) -> Result<(), PgError> {
        let c = client(&self.pool).await?;
        c.execute(
            &format!(
                "INSERT INTO {} (name, source_table, columns, position) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name, source_table) DO UPDATE \
                 SET columns = EXCLUDED.columns, position = EXCLUDED.position, updated_at = now()",
                self.table.quoted()
            ),
            &[&self.name, &table.to_string(), &columns, position],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot store the cursor in {}", self.table), e))?;
        Ok(())
    }
}
