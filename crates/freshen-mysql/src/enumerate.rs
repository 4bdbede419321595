//! `MySqlEnumerate`: the live key universe from a query, streamed; and the pool
//! helper every SQL part of this crate uses.

use std::fmt;

use freshen::{BoxError, BoxFuture, Enumerate, Key, KeySink};
use mysql_async::consts::ColumnType;
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, PoolConstraints, PoolOpts};

use crate::error::ErrorKind;
use crate::{MySqlError, server};

/// A connection pool of at most `max` connections to `url` (`mysql://…`), whose
/// sessions use UTC (`time_zone = '+00:00'`) and utf8mb4, so TIMESTAMP keys read the
/// same as the binlog's.
pub fn connect_pool(url: &str, max: usize) -> Result<Pool, MySqlError> {
    connect_pool_limited(url, max, None)
}

/// [`connect_pool`], with every statement of its sessions bounded by `statement_timeout`
/// (`None`: unbounded), the way a view's `statement_timeout` bounds its rebuilds on
/// PostgreSQL. Each new session asks the server what it is and sets:
///
/// - MariaDB: `max_statement_time`, which interrupts any statement (reads and writes,
///   waits on locks included) with error 1969;
/// - MySQL: `max_execution_time`, which covers read-only `SELECT`s only (error 3024);
///   writes are bounded by the lock waits below, which is where a write waits for long;
/// - both: `lock_wait_timeout` (metadata and table locks, `LOCK TABLES`) and
///   `innodb_lock_wait_timeout` (row locks), in whole seconds, at least 1 (error 1205).
///
/// Each failure is one of the path (`retry_for`): the view waits and reports, and no key
/// is quarantined for it. The settings live in the session, so such a pool does not reset
/// sessions it takes back (as a PostgreSQL pool does not).
pub fn connect_pool_limited(
    url: &str,
    max: usize,
    statement_timeout: Option<std::time::Duration>,
) -> Result<Pool, MySqlError> {
    let opts = server::opts(url)?;
    let constraints = PoolConstraints::new(0, max.max(1))
        .ok_or_else(|| MySqlError::new(ErrorKind::Config, "pool size must be at least 1"))?;
    let mut pool_opts = PoolOpts::default().with_constraints(constraints);
    let mut builder = mysql_async::OptsBuilder::from_opts(opts);
    if let Some(limit) = statement_timeout {
        pool_opts = pool_opts.with_reset_connection(false);
        builder = builder.after_connect(move |conn| {
            Box::pin(async move {
                let version: Option<String> = conn.query_first("SELECT @@version").await?;
                let mariadb = version.is_some_and(|v| v.to_ascii_lowercase().contains("mariadb"));
                conn.query_drop(session_limits(mariadb, limit)).await
            })
        });
    }
    Ok(Pool::new(builder.pool_opts(pool_opts)))
}

/// The `SET` statement that bounds a session's statements by `limit`.
fn session_limits(mariadb: bool, limit: std::time::Duration) -> String {
    let seconds = limit.as_secs_f64();
    let whole = limit.as_secs() + u64::from(limit.subsec_nanos() > 0);
    let whole = whole.max(1);
    let statement = if mariadb {
        format!("max_statement_time = {seconds:.3}")
    } else {
        format!("max_execution_time = {}", limit.as_millis().max(1))
    };
    format!(
        "SET SESSION {statement}, lock_wait_timeout = {whole}, innodb_lock_wait_timeout = {whole}"
    )
}

/// Lists keys for a reconcile sweep from a query whose columns are the key parts
/// (`SELECT DISTINCT device FROM readings UNION SELECT device FROM rollup`).
///
/// Rows are read with the text protocol, streamed (never buffered whole), in one
/// read-only consistent-snapshot transaction. Each value becomes its key part the way
/// the binlog's values do: text as the server prints it, binary strings as `\x` hex,
/// NULL as a NULL part — so swept keys equal streamed ones.
#[derive(Clone)]
pub struct MySqlEnumerate {
    pool: Pool,
    sql: String,
}

impl fmt::Debug for MySqlEnumerate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlEnumerate")
            .field("sql", &self.sql)
            .finish_non_exhaustive()
    }
}

/// Whether a text-protocol column carries raw bytes (a binary string), not text.
pub(crate) fn is_binary(col: &mysql_async::Column) -> bool {
    use ColumnType::*;
    col.character_set() == 63
        && matches!(
            col.column_type(),
            MYSQL_TYPE_STRING
                | MYSQL_TYPE_VAR_STRING
                | MYSQL_TYPE_VARCHAR
                | MYSQL_TYPE_BLOB
                | MYSQL_TYPE_TINY_BLOB
                | MYSQL_TYPE_MEDIUM_BLOB
                | MYSQL_TYPE_LONG_BLOB
                | MYSQL_TYPE_BIT
                | MYSQL_TYPE_GEOMETRY
        )
}

/// One text-protocol value as a key part.
pub(crate) fn part(v: &mysql_async::Value, binary: bool) -> Option<String> {
    match v {
        mysql_async::Value::NULL => None,
        mysql_async::Value::Bytes(b) if binary => Some(
            freshen::Value::Bytes(b.clone().into())
                .to_text()?
                .into_owned(),
        ),
        mysql_async::Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        other => Some(other.as_sql(true).trim_matches('\'').to_string()),
    }
}

impl MySqlEnumerate {
    /// Keys from `sql` (no parameters; a trailing `;` is ignored).
    pub fn new(pool: Pool, sql: impl Into<String>) -> MySqlEnumerate {
        let sql = sql.into();
        let sql = sql.trim().trim_end_matches(';').trim_end().to_owned();
        MySqlEnumerate { pool, sql }
    }

    /// Every key, collected (for tests and small universes; a sweep streams instead).
    pub async fn collect(&self) -> Result<Vec<Key>, MySqlError> {
        let mut keys = Vec::new();
        let out = &mut keys;
        self.for_each(|k| {
            out.push(k);
            std::future::ready(true)
        })
        .await?;
        Ok(keys)
    }

    /// Streams every key into `send`; stops early when it returns `false`. Returns how
    /// many keys were sent and whether all were.
    pub async fn for_each<F, Fut>(&self, mut send: F) -> Result<(u64, bool), MySqlError>
    where
        F: FnMut(Key) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut c = self
            .pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect for the enumerate query", e))?;
        c.query_drop("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await
            .map_err(|e| MySqlError::driver("cannot set the isolation level", e))?;
        c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await
            .map_err(|e| MySqlError::driver("cannot begin the enumerate transaction", e))?;
        let mut n = 0u64;
        let mut complete = true;
        {
            let mut result = c
                .query_iter(self.sql.as_str())
                .await
                .map_err(|e| MySqlError::driver("the enumerate query failed", e))?;
            let columns = result.columns();
            let binary: Vec<bool> = columns
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(is_binary)
                .collect();
            if binary.is_empty() {
                return Err(MySqlError::new(
                    ErrorKind::Config,
                    "the enumerate query returns no columns; select the key parts",
                ));
            }
            while let Some(row) = result
                .next()
                .await
                .map_err(|e| MySqlError::driver("the enumerate query failed", e))?
            {
                if !complete {
                    continue; // drain the result so the connection stays usable
                }
                let parts =
                    (0..binary.len()).map(|i| row.as_ref(i).and_then(|v| part(v, binary[i])));
                n += 1;
                if !send(Key::from_parts(parts)).await {
                    complete = false;
                }
            }
        }
        c.query_drop("COMMIT")
            .await
            .map_err(|e| MySqlError::driver("cannot end the enumerate transaction", e))?;
        Ok((n, complete))
    }
}

impl Enumerate for MySqlEnumerate {
    fn enumerate(&self, sink: KeySink) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(async move {
            let (_, complete) = self
                .for_each(|k| {
                    let sink = sink.clone();
                    async move { sink.send(k).await.is_ok() }
                })
                .await?;
            if !complete {
                return Err(freshen::SinkClosed.into());
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod limits_tests {
    use super::session_limits;
    use std::time::Duration;

    #[test]
    fn each_flavor_gets_its_own_statement_bound_and_both_bound_lock_waits() {
        assert_eq!(
            session_limits(true, Duration::from_millis(2500)),
            "SET SESSION max_statement_time = 2.500, lock_wait_timeout = 3, innodb_lock_wait_timeout = 3"
        );
        assert_eq!(
            session_limits(false, Duration::from_millis(300)),
            "SET SESSION max_execution_time = 300, lock_wait_timeout = 1, innodb_lock_wait_timeout = 1"
        );
    }
}
