//! Where each table's durable cursor lives between runs: a table (default
//! `freshen_cursors`) in a database freshen may write — by default the polled one — one
//! row per (source name, table), written after the rebuilds its rows dirtied are done.
//! A position is a list of texts; it is stored as one string, each part prefixed by its
//! length (`5:hello3:abc`), which no value can break.

use mysql_async::Pool;
use mysql_async::prelude::Queryable;

use crate::MySqlError;
use crate::error::ErrorKind;
use crate::incremental::table::TableName;
use freshen::cursor::Position;
use freshen::poller::stored_position;

/// Encodes a list of texts as one string.
pub(crate) fn encode(parts: &[String]) -> String {
    let mut out = String::new();
    for p in parts {
        out.push_str(&p.len().to_string());
        out.push(':');
        out.push_str(p);
    }
    out
}

/// Decodes what [`encode`] wrote; `None` for anything else.
pub(crate) fn decode(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (len, tail) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let part = tail.get(..len)?;
        out.push(part.to_string());
        rest = &tail[len..];
    }
    Some(out)
}

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

    async fn conn(&self) -> Result<mysql_async::Conn, MySqlError> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect for the cursor table", e))
    }

    /// Creates the table when missing.
    pub(crate) async fn prepare(&self) -> Result<(), MySqlError> {
        let mut c = self.conn().await?;
        // CREATE TABLE IF NOT EXISTS needs CREATE even when the table is there: a user
        // given only a created table must not be asked for more.
        let exists: Option<u8> = c
            .exec_first(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&self.table.database, &self.table.table),
            )
            .await
            .map_err(|e| MySqlError::driver(format!("cannot look for {}", self.table), e))?;
        if exists.is_some() {
            return Ok(());
        }
        c.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               name VARCHAR(64) NOT NULL, \
               source_table VARCHAR(300) NOT NULL, \
               columns TEXT NOT NULL, \
               position TEXT NOT NULL, \
               updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), \
               PRIMARY KEY (name, source_table)) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            self.table.quoted()
        ))
        .await
        .map_err(|e| {
            MySqlError::driver(
                format!(
                    "cannot create the cursor table {} (grant CREATE on its database, or create it)",
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
    ) -> Result<Option<Position>, MySqlError> {
        let mut c = self.conn().await?;
        let row: Option<(String, String)> = c
            .exec_first(
                format!(
                    "SELECT columns, position FROM {} WHERE name = ? AND source_table = ?",
                    self.table.quoted()
                ),
                (&self.name, table.to_string()),
            )
            .await
            .map_err(|e| MySqlError::driver(format!("cannot read {}", self.table), e))?;
        let Some((stored, position)) = row else {
            return Ok(None);
        };
        let stored = decode(&stored).unwrap_or_default();
        let position = decode(&position).unwrap_or_default();
        stored_position(&self.table, &self.name, table, &stored, position, columns)
            .map(Some)
            .map_err(|m| MySqlError::new(ErrorKind::Config, m))
    }

    /// Stores `position` for `table`.
    pub(crate) async fn save(
        &self,
        table: &TableName,
        columns: &[String],
        position: &Position,
    ) -> Result<(), MySqlError> {
        let mut c = self.conn().await?;
        c.exec_drop(
            format!(
                "INSERT INTO {} (name, source_table, columns, position) VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE columns = VALUES(columns), position = VALUES(position)",
                self.table.quoted()
            ),
            (
                &self.name,
                table.to_string(),
                encode(columns),
                encode(position),
            ),
        )
        .await
        .map_err(|e| MySqlError::driver(format!("cannot store the cursor in {}", self.table), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_whatever_they_hold() {
        let parts = vec![
            "2024-01-01 00:00:00.000001".to_string(),
            "a:b3:c".to_string(),
            String::new(),
            "é".to_string(),
        ];
        assert_eq!(decode(&encode(&parts)).unwrap(), parts);
        assert_eq!(decode("").unwrap(), Vec::<String>::new());
        assert_eq!(decode("5:ab"), None);
        assert_eq!(decode("x:ab"), None);
    }
}
