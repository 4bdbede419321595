//! `SqlEnumerate`: the live key universe from a query, streamed.

use std::fmt;

use deadpool_postgres::Pool;
use freshen::{BoxError, BoxFuture, Enumerate, Key, KeySink};
use tokio_postgres::IsolationLevel;

use crate::PgError;
use crate::error::ErrorKind;
use crate::pool::client;
use crate::quote::quote_ident;

/// Lists keys for a reconcile sweep from a query whose columns are the key parts
/// (`SELECT DISTINCT device FROM readings UNION SELECT device FROM rollup`).
///
/// Every column is rendered as text by the server (`::text`), the same form the
/// replication stream gives, so swept keys equal streamed ones. Rows are fetched in
/// chunks through a portal in one read-only REPEATABLE READ transaction (a consistent
/// universe, never buffered whole).
#[derive(Clone)]
pub struct SqlEnumerate {
    pool: Pool,
    sql: String,
    fetch: i32,
}

impl fmt::Debug for SqlEnumerate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlEnumerate")
            .field("sql", &self.sql)
            .field("fetch", &self.fetch)
            .finish_non_exhaustive()
    }
}

impl SqlEnumerate {
    /// Keys from `sql` (no parameters; a trailing `;` is ignored).
    pub fn new(pool: Pool, sql: impl Into<String>) -> SqlEnumerate {
        let sql = sql.into();
        let sql = sql.trim().trim_end_matches(';').trim_end().to_owned();
        SqlEnumerate {
            pool,
            sql,
            fetch: 1024,
        }
    }

    /// Rows fetched per round trip (default 1024).
    pub fn fetch_size(mut self, rows: usize) -> SqlEnumerate {
        self.fetch = rows.clamp(1, i32::MAX as usize) as i32;
        self
    }

    /// Every key, collected (for tests and small universes; a sweep streams instead).
    pub async fn collect(&self) -> Result<Vec<Key>, PgError> {
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
    pub async fn for_each<F, Fut>(&self, mut send: F) -> Result<(u64, bool), PgError>
    where
        F: FnMut(Key) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut c = client(&self.pool).await?;
        let columns = c
            .prepare(&self.sql)
            .await
            .map_err(|e| PgError::sql("the enumerate query does not prepare", e))?
            .columns()
            .len();
        if columns == 0 {
            return Err(PgError::new(
                ErrorKind::Config,
                "the enumerate query returns no columns; select the key parts",
            ));
        }
        let aliases: Vec<String> = (1..=columns).map(|i| format!("k{i}")).collect();
        let wrapped = format!(
            "SELECT {} FROM ({}) AS freshen_keys({})",
            aliases
                .iter()
                .map(|a| format!("{}::text", quote_ident(a)))
                .collect::<Vec<_>>()
                .join(", "),
            self.sql,
            aliases
                .iter()
                .map(|a| quote_ident(a))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let tx = c
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| PgError::sql("cannot begin the enumerate transaction", e))?;
        let stmt = tx
            .prepare(&wrapped)
            .await
            .map_err(|e| PgError::sql("the enumerate query does not prepare", e))?;
        let portal = tx
            .bind(&stmt, &[])
            .await
            .map_err(|e| PgError::sql("the enumerate query failed", e))?;
        let mut n = 0u64;
        loop {
            let rows = tx
                .query_portal(&portal, self.fetch)
                .await
                .map_err(|e| PgError::sql("the enumerate query failed", e))?;
            let last = rows.len() < self.fetch as usize;
            for r in &rows {
                let parts = (0..columns).map(|i| r.get::<_, Option<&str>>(i));
                n += 1;
                if !send(Key::from_parts(parts)).await {
                    return Ok((n, false));
                }
            }
            if last {
                break;
            }
        }
        tx.commit()
            .await
            .map_err(|e| PgError::sql("cannot end the enumerate transaction", e))?;
        Ok((n, true))
    }
}

impl Enumerate for SqlEnumerate {
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
