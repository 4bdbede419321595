//! Where the resume position lives between runs.
//!
//! By default a table in the target database, one row per source `name`, written in a
//! transaction of its own (autocommit): the position then lives with the data it
//! describes — a backup restored, a database moved or (with GTIDs) a failover to a
//! replica brings its position along — and freshen keeps no local state, like the
//! PostgreSQL source whose slot lives on the server. The row is written at most every
//! `position_interval_ms` and only when the position moved past a transaction other than
//! these writes (which the binlog carries too), so a quiet database stays quiet.
//! Alternatively a file, replaced atomically (write, fsync, rename, fsync directory).

use std::io::Write;
use std::path::{Path, PathBuf};

use mysql_async::Pool;
use mysql_async::prelude::Queryable;

use crate::error::ErrorKind;
use crate::{Checkpoint, FilePos, Gtids, MySqlError};

/// The position store of one source.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    Table {
        pool: Pool,
        /// `` `db`.`table` `` or `` `table` ``, quoted.
        quoted: String,
        /// Unquoted `(database, table)`.
        name: (String, String),
        key: String,
    },
    File {
        path: PathBuf,
        key: String,
    },
}

fn quote(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

impl Store {
    /// `table` (or `database.table`) in `database`, the row keyed `key`.
    pub(crate) fn table(pool: Pool, database: &str, table: &str, key: &str) -> Store {
        let (db, t) = match table.split_once('.') {
            Some((d, t)) => (d.to_string(), t.to_string()),
            None => (database.to_string(), table.to_string()),
        };
        let quoted = format!("{}.{}", quote(&db), quote(&t));
        Store::Table {
            pool,
            quoted,
            name: (db, t),
            key: key.to_string(),
        }
    }

    pub(crate) fn file(path: PathBuf, key: &str) -> Store {
        Store::File {
            path,
            key: key.to_string(),
        }
    }

    /// `(database, table)` of the position table, so the reader can recognise its own
    /// writes.
    pub(crate) fn table_name(&self) -> Option<&(String, String)> {
        match self {
            Store::Table { name, .. } => Some(name),
            Store::File { .. } => None,
        }
    }

    /// Creates the table if missing.
    pub(crate) async fn prepare(&self) -> Result<(), MySqlError> {
        if let Store::Table {
            pool,
            quoted,
            name: (db, table),
            ..
        } = self
        {
            let mut c = pool
                .get_conn()
                .await
                .map_err(|e| MySqlError::driver("cannot connect for the position table", e))?;
            // CREATE TABLE IF NOT EXISTS needs CREATE even when the table is there: a
            // user given only a created table must not be asked for more.
            let exists: Option<u8> = c
                .exec_first(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (db, table),
                )
                .await
                .map_err(|e| MySqlError::driver(format!("cannot look for {quoted}"), e))?;
            if exists.is_some() {
                return Ok(());
            }
            c.query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {quoted} (\
                   name VARCHAR(64) NOT NULL PRIMARY KEY, \
                   file VARCHAR(512) NOT NULL, \
                   pos BIGINT UNSIGNED NOT NULL, \
                   gtid TEXT NULL, \
                   updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) \
                     ON UPDATE CURRENT_TIMESTAMP(6)\
                 ) ENGINE=InnoDB"
            ))
            .await
            .map_err(|e| {
                MySqlError::driver(
                    format!("cannot create the position table {quoted} (grant CREATE on it, or create it)"),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// The stored position, if any.
    pub(crate) async fn load(&self, mariadb: bool) -> Result<Option<Checkpoint>, MySqlError> {
        let (file, pos, gtid): (String, u64, Option<String>) = match self {
            Store::Table {
                pool, quoted, key, ..
            } => {
                let mut c = pool
                    .get_conn()
                    .await
                    .map_err(|e| MySqlError::driver("cannot connect for the position table", e))?;
                let row: Option<(String, u64, Option<String>)> = c
                    .exec_first(
                        format!("SELECT file, pos, gtid FROM {quoted} WHERE name = ?"),
                        (key.as_str(),),
                    )
                    .await
                    .map_err(|e| MySqlError::driver(format!("cannot read {quoted}"), e))?;
                match row {
                    Some(r) => r,
                    None => return Ok(None),
                }
            }
            Store::File { path, key } => {
                let text = match std::fs::read_to_string(path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => {
                        return Err(MySqlError::new(
                            ErrorKind::Position,
                            format!("cannot read the position file {}", path.display()),
                        )
                        .with_source(e));
                    }
                };
                match parse_line(&text, key) {
                    Some(r) => r,
                    None => {
                        return Err(MySqlError::new(
                            ErrorKind::Position,
                            format!(
                                "the position file {} does not hold a position for {key:?}",
                                path.display()
                            ),
                        ));
                    }
                }
            }
        };
        let gtids = match gtid.filter(|g| !g.is_empty()) {
            Some(g) => Some(Gtids::parse(&g, mariadb).map_err(|e| {
                MySqlError::new(
                    ErrorKind::Position,
                    format!("the stored GTID position: {e}"),
                )
            })?),
            None => None,
        };
        Ok(Some(Checkpoint {
            file_pos: FilePos::new(file, pos),
            gtids,
        }))
    }

    /// Stores `cp`, replacing what was there.
    pub(crate) async fn save(&self, cp: &Checkpoint) -> Result<(), MySqlError> {
        let gtid = cp.gtids.as_ref().map(ToString::to_string);
        match self {
            Store::Table {
                pool, quoted, key, ..
            } => {
                let mut c = pool
                    .get_conn()
                    .await
                    .map_err(|e| MySqlError::driver("cannot connect for the position table", e))?;
                c.exec_drop(
                    format!(
                        "INSERT INTO {quoted} (name, file, pos, gtid) VALUES (?, ?, ?, ?) \
                         ON DUPLICATE KEY UPDATE file = VALUES(file), pos = VALUES(pos), gtid = VALUES(gtid)"
                    ),
                    (key.as_str(), cp.file_pos.file.as_str(), cp.file_pos.pos, gtid),
                )
                .await
                .map_err(|e| MySqlError::driver(format!("cannot store the position in {quoted}"), e))
            }
            Store::File { path, key } => {
                let line = format!(
                    "{key}\t{}\t{}\t{}\n",
                    cp.file_pos.file,
                    cp.file_pos.pos,
                    gtid.unwrap_or_default()
                );
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_atomically(&path, line.as_bytes()))
                    .await
                    .map_err(|e| MySqlError::new(ErrorKind::Position, e.to_string()))?
            }
        }
    }
}

/// `name \t file \t pos \t gtid` for `key`.
fn parse_line(text: &str, key: &str) -> Option<(String, u64, Option<String>)> {
    let line = text.lines().find(|l| l.split('\t').next() == Some(key))?;
    let mut f = line.split('\t');
    f.next()?;
    let file = f.next()?.to_string();
    let pos = f.next()?.parse().ok()?;
    let gtid = f.next().map(str::to_string);
    Some((file, pos, gtid))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), MySqlError> {
    let fail = |what: &str, e: std::io::Error| {
        MySqlError::new(
            ErrorKind::Position,
            format!("cannot {what} the position file {}", path.display()),
        )
        .with_source(e)
    };
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| fail("create", e))?;
        f.write_all(bytes).map_err(|e| fail("write", e))?;
        f.sync_all().map_err(|e| fail("sync", e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| fail("replace", e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail("sync the directory of", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_store_round_trips() {
        let dir = std::env::temp_dir().join(format!("freshen-mysql-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::file(dir.join("pos"), "r");
        assert_eq!(store.load(true).await.unwrap(), None);
        let cp = Checkpoint {
            file_pos: FilePos::new("binlog.000002", 1234),
            gtids: Some(Gtids::parse("0-1-9", true).unwrap()),
        };
        store.save(&cp).await.unwrap();
        assert_eq!(store.load(true).await.unwrap(), Some(cp));
        let other = Store::file(dir.join("pos"), "someone-else");
        assert!(other.load(true).await.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
