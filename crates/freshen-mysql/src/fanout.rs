//! `MySqlFanOut`: map changed parent rows to view keys with a query on MySQL/MariaDB —
//! the MySQL form of `freshen_postgres::SqlFanOut`.
//!
//! A plan's price change dirties every account subscribed to it: the *keys* statement
//! (`SELECT account_id FROM subscriptions WHERE plan_id = $1`) maps a parent key to the
//! view keys under it. One call maps a batch of parent keys in one read-only consistent
//! snapshot. Rows stream from the server as the refresher takes the keys (a full
//! refresher stops reading the socket), so memory stays bounded whatever the fan-out's
//! size. On MariaDB the snapshot is first proven to see the transactions that changed
//! the parents (as [`MySqlRebuild`](crate::MySqlRebuild) does), else it would map the
//! rows as they were before the change.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use freshen::{BoxError, BoxFuture, Due, Expand, Key, KeySink, Retry};
use mysql_async::Pool;
use mysql_async::prelude::Queryable;

use crate::MySqlError;
use crate::enumerate::{is_binary, part};
use crate::error::ErrorKind;
use crate::params::{self, KeyType, Rewritten};
use crate::rebuild::{is_mariadb, query, wait_visible};

/// Parent keys one call maps.
const BATCH: usize = 64;

/// A [`freshen::Expand`] over a keys statement: `$1..$n` are the parent key's parts,
/// each row one view key (one column per part).
#[derive(Clone)]
pub struct MySqlFanOut {
    pool: Pool,
    sql: Arc<Rewritten>,
    parent_types: Arc<[KeyType]>,
    columns: usize,
    check_visibility: bool,
    visibility_wait: Duration,
}

impl fmt::Debug for MySqlFanOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlFanOut")
            .field("sql", &self.sql.sql)
            .field("columns", &self.columns)
            .field("check_visibility", &self.check_visibility)
            .finish_non_exhaustive()
    }
}

impl MySqlFanOut {
    /// A fan-out running `sql` (with `$n` for parent key part n, bound as
    /// `parent_types`) that returns view keys of `columns` parts. Checks the
    /// placeholders and that the statement prepares and returns `columns` columns.
    /// `check_visibility`: the pool is the source server's (only then can a snapshot
    /// be proven to see the parents' changes).
    pub async fn new(
        pool: Pool,
        sql: &str,
        parent_types: Vec<KeyType>,
        columns: usize,
        check_visibility: bool,
    ) -> Result<MySqlFanOut, MySqlError> {
        let rewritten = params::rewrite(sql).map_err(|why| {
            MySqlError::new(ErrorKind::Config, format!("the keys statement: {why}"))
        })?;
        let mut c = pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect for the keys statement", e))?;
        let stmt = c
            .prep(rewritten.sql.as_str())
            .await
            .map_err(|e| MySqlError::driver("the keys statement does not prepare", e))?;
        if stmt.num_columns() as usize != columns {
            return Err(MySqlError::new(
                ErrorKind::Config,
                format!(
                    "the keys statement returns {} column(s) but the view's key has {columns} part(s)",
                    stmt.num_columns()
                ),
            ));
        }
        drop(c);
        let check_visibility = check_visibility && is_mariadb(&pool).await?;
        Ok(MySqlFanOut {
            pool,
            sql: Arc::new(rewritten),
            parent_types: parent_types.into(),
            columns,
            check_visibility,
            visibility_wait: Duration::from_secs(2),
        })
    }

    /// Maps `due`'s parent keys, sending every view key into `sink`.
    pub async fn run(&self, due: &[Due], sink: &KeySink) -> Result<(), MySqlError> {
        let mut bound = Vec::with_capacity(due.len());
        for d in due {
            let values: Result<Vec<_>, _> = self
                .sql
                .parts
                .iter()
                .map(|&p| {
                    let ty = self.parent_types.get(p).copied().unwrap_or_default();
                    params::bind(&d.key, p, ty).map_err(|why| {
                        MySqlError::new(ErrorKind::Key, format!("the keys statement: {why}"))
                    })
                })
                .collect();
            bound.push(values?);
        }
        let mut c = self
            .pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect for the fan-out", e))?;
        let needed = due.iter().flat_map(|d| d.txids.iter().copied()).max();
        if let (true, Some(needed)) = (self.check_visibility, needed) {
            wait_visible(&mut c, needed, self.visibility_wait).await?;
        }
        let stmt = c
            .prep(self.sql.sql.as_str())
            .await
            .map_err(|e| MySqlError::driver("the keys statement does not prepare", e))?;
        query(
            &mut c,
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "cannot set the isolation level",
        )
        .await?;
        query(
            &mut c,
            "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
            "cannot begin the fan-out transaction",
        )
        .await?;
        let mut closed = false;
        for values in bound {
            let mut result = c
                .exec_iter(&stmt, values)
                .await
                .map_err(|e| MySqlError::driver("the keys statement failed", e))?;
            let binary: Vec<bool> = result
                .columns()
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(is_binary)
                .collect();
            while let Some(row) = result
                .next()
                .await
                .map_err(|e| MySqlError::driver("the keys statement failed", e))?
            {
                if closed {
                    continue; // drain the result so the connection stays usable
                }
                let parts =
                    (0..binary.len()).map(|i| row.as_ref(i).and_then(|v| part(v, binary[i])));
                if sink.send(Key::from_parts(parts)).await.is_err() {
                    closed = true;
                }
            }
            if closed {
                break;
            }
        }
        query(&mut c, "COMMIT", "cannot end the fan-out transaction").await
    }
}

impl Expand for MySqlFanOut {
    fn expand<'a>(
        &'a self,
        due: &'a [Due],
        sink: &'a KeySink,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move { self.run(due, sink).await.map_err(Into::into) })
    }

    fn max_batch(&self) -> usize {
        BATCH
    }

    fn classify(&self, error: &BoxError) -> Retry {
        match error.downcast_ref::<MySqlError>() {
            Some(e) => e.retry(),
            None => Retry::Key,
        }
    }
}
