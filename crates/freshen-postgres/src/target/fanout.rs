//! `SqlFanOut`: map changed parent rows to view keys with a query.
//!
//! A view over joined tables is dirtied by tables that do not carry its key: a plan's
//! price change dirties every account subscribed to the plan. The *keys* statement
//! (`SELECT account_id FROM subscriptions WHERE plan_id = $1`) maps a parent key to the
//! view keys under it. One call maps a batch of parent keys in one read-only REPEATABLE
//! READ transaction: the statement is bound once per parent key as a portal and the
//! first page of every portal is fetched, all pipelined in one round trip; a parent with
//! more rows than a page goes on page by page. Memory is bounded by
//! `batch × fetch_size` keys whatever the fan-out's size, and keys go to the refresher
//! as they are read.
//!
//! Visibility is proved as for [`SqlRebuild`](crate::SqlRebuild): the transaction's
//! snapshot must see every transaction that changed the parents (or, for a target on
//! another cluster, a new snapshot on the source must), otherwise it would map the
//! parent's rows as they were before the change and miss the keys it moved to.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::{BoxError, BoxFuture, Due, Expand, Key, KeySink, Retry};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{IsolationLevel, Portal};

use crate::PgError;
use crate::error::ErrorKind;
use crate::pool::client;
use crate::quote::quote_ident;
use crate::target::params::{TextParam, check_scalar, element};
use crate::target::rebuild::{
    CancelOnDrop, NOT_VISIBLE, Visibility, not_visible, txids, visible_on_source,
};

/// A [`freshen::Expand`] over a keys statement: `$1..$n` are the parent key's parts,
/// each row returned is one view key (one column per key part, any type: rendered as
/// text by the server, like every other key).
#[derive(Clone)]
pub struct SqlFanOut {
    pool: Pool,
    sql: Arc<str>,
    /// `EXPLAIN (FORMAT JSON)` of the keys statement as written: its row estimate for
    /// a parent key tells how far a fan-out reaches before it runs.
    explain: Arc<str>,
    param_types: Arc<[Type]>,
    columns: usize,
    batch: usize,
    fetch: i32,
    visibility: Visibility,
    visibility_wait: Duration,
}

impl fmt::Debug for SqlFanOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlFanOut")
            .field("sql", &self.sql)
            .field("batch", &self.batch)
            .field("fetch", &self.fetch)
            .field("visibility", &self.visibility)
            .finish_non_exhaustive()
    }
}

/// Configures a [`SqlFanOut`]; from [`SqlFanOut::builder`].
#[derive(Debug)]
pub struct SqlFanOutBuilder {
    pool: Pool,
    sql: String,
    arity: Option<usize>,
    parent_arity: Option<usize>,
    batch: usize,
    fetch: usize,
    visibility: Visibility,
    visibility_wait: Duration,
}

impl SqlFanOutBuilder {
    /// The view's key arity: the statement must return this many columns.
    pub fn arity(mut self, n: usize) -> Self {
        self.arity = Some(n);
        self
    }

    /// The parent key's arity: the statement may use `$1` up to this.
    pub fn parent_arity(mut self, n: usize) -> Self {
        self.parent_arity = Some(n);
        self
    }

    /// Parent keys mapped per call (default 64).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    /// Rows fetched per portal per round trip (default 1024).
    pub fn fetch_size(mut self, rows: usize) -> Self {
        self.fetch = rows;
        self
    }

    /// Where visibility is proved (default [`Visibility::InSnapshot`]).
    pub fn visibility(mut self, v: Visibility) -> Self {
        self.visibility = v;
        self
    }

    /// How long to retry a snapshot that does not yet see the changes (default 2 s).
    pub fn visibility_wait(mut self, d: Duration) -> Self {
        self.visibility_wait = d;
        self
    }

    /// Prepares the statement, checks its columns and parameters, and builds.
    pub async fn build(self) -> Result<SqlFanOut, PgError> {
        let mut problems = Vec::new();
        if self.batch == 0 {
            problems.push("a fan-out's batch must be at least 1".to_string());
        }
        if self.fetch == 0 {
            problems.push("a fan-out's fetch size must be at least 1".to_string());
        }
        let sql = self.sql.trim().trim_end_matches(';').trim_end().to_owned();
        if sql.is_empty() {
            problems.push("the keys statement is empty".to_string());
        }
        if !problems.is_empty() {
            return Err(PgError::config(&problems));
        }
        let c = client(&self.pool).await?;
        let stmt = c
            .prepare(&sql)
            .await
            .map_err(|e| PgError::sql("the keys statement does not prepare", e))?;
        let columns = stmt.columns().len();
        if columns == 0 {
            problems
                .push("the keys statement returns no columns; select the view's key parts".into());
        }
        if let Some(n) = self.arity
            && columns != n
        {
            problems.push(format!(
                "the keys statement returns {columns} column(s) but the view's key has {n} part(s)"
            ));
        }
        if let Some(n) = self.parent_arity
            && stmt.params().len() > n
        {
            problems.push(format!(
                "the keys statement uses ${} but the watched table's `key` names {n} column(s)",
                stmt.params().len()
            ));
        }
        for (j, ty) in stmt.params().iter().enumerate() {
            if element(ty).is_some() && *ty != Type::TEXT_ARRAY {
                problems.push(format!(
                    "the keys statement's ${} is an array ({}); it is bound once per changed row, to that row's key column",
                    j + 1,
                    ty.name()
                ));
            }
        }
        if !problems.is_empty() {
            return Err(PgError::config(&problems));
        }
        let param_types: Arc<[Type]> = stmt.params().to_vec().into();
        let aliases: Vec<String> = (1..=columns)
            .map(|i| quote_ident(&format!("k{i}")))
            .collect();
        let wrapped = format!(
            "SELECT {} FROM ({sql}) AS freshen_keys({})",
            aliases
                .iter()
                .map(|a| format!("{a}::text"))
                .collect::<Vec<_>>()
                .join(", "),
            aliases.join(", ")
        );
        c.prepare(&wrapped)
            .await
            .map_err(|e| PgError::sql("the keys statement does not prepare", e))?;
        let explain = format!("EXPLAIN (FORMAT JSON) {sql}");
        Ok(SqlFanOut {
            pool: self.pool,
            sql: wrapped.into(),
            explain: explain.into(),
            param_types,
            columns,
            batch: self.batch,
            fetch: self.fetch.min(i32::MAX as usize) as i32,
            visibility: self.visibility,
            visibility_wait: self.visibility_wait,
        })
    }
}

impl SqlFanOut {
    /// A builder for `sql` over a connection pool.
    pub fn builder(pool: Pool, sql: impl Into<String>) -> SqlFanOutBuilder {
        SqlFanOutBuilder {
            pool,
            sql: sql.into(),
            arity: None,
            parent_arity: None,
            batch: 64,
            fetch: 1024,
            visibility: Visibility::InSnapshot,
            visibility_wait: Duration::from_secs(2),
        }
    }

    /// Maps `due`'s parent keys, sending every view key to `send` (which returns
    /// `false` to stop: the refresher is shutting down). Returns whether all were sent.
    pub async fn run<F, Fut>(&self, due: &[Due], mut send: F) -> Result<bool, PgError>
    where
        F: FnMut(Key) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let params = self.params(due)?;
        let ids = txids(due);
        let mut in_snapshot: &[String] = &[];
        match &self.visibility {
            Visibility::InSnapshot => in_snapshot = &ids,
            Visibility::OnSource(source) if !ids.is_empty() => {
                visible_on_source(source, &ids, self.visibility_wait).await?
            }
            _ => {}
        }
        let mut guard = CancelOnDrop::new(client(&self.pool).await?);
        let outcome = self
            .transaction(guard.client(), &params, in_snapshot, &mut send)
            .await;
        guard.disarm();
        outcome
    }

    /// About how many view keys `due`'s parent keys map to: the planner's row estimate
    /// of the keys statement for each (a custom plan: the parent's value is known, so a
    /// common one is weighed by the column's statistics).
    pub async fn estimate(&self, due: &[Due]) -> Result<u64, PgError> {
        let params = self.params(due)?;
        let c = client(&self.pool).await?;
        let stmt = c
            .prepare_cached(&self.explain)
            .await
            .map_err(|e| PgError::sql("the keys statement cannot be explained", e))?;
        let mut total = 0u64;
        for p in &params {
            let refs: Vec<&(dyn ToSql + Sync)> =
                p.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            let row = c
                .query_one(&stmt, &refs)
                .await
                .map_err(|e| PgError::sql("the keys statement cannot be explained", e))?;
            let Json(text) = row
                .try_get(0)
                .map_err(|e| PgError::sql("cannot read the keys statement's plan", e))?;
            let plan: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let rows = plan
                .get(0)
                .and_then(|p| p.get("Plan"))
                .and_then(|p| p.get("Plan Rows"))
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
            total = total.saturating_add(rows.max(0.0) as u64);
        }
        Ok(total)
    }

    fn params(&self, due: &[Due]) -> Result<Vec<Vec<TextParam>>, PgError> {
        due.iter()
            .map(|d| {
                let parts: Vec<Option<&str>> = d.key.parts().collect();
                self.param_types
                    .iter()
                    .enumerate()
                    .map(|(j, ty)| {
                        let part = parts.get(j).copied().ok_or_else(|| {
                            PgError::new(
                                ErrorKind::Config,
                                format!(
                                    "the keys statement uses ${} but a parent key has {} part(s)",
                                    j + 1,
                                    parts.len()
                                ),
                            )
                        })?;
                        if let Some(text) = part {
                            check_scalar(ty, text).map_err(|why| {
                                PgError::new(
                                    ErrorKind::Config,
                                    format!("a parent key's part {} for ${}: {why}", j + 1, j + 1),
                                )
                            })?;
                        }
                        Ok(TextParam(part.map(str::to_owned)))
                    })
                    .collect()
            })
            .collect()
    }

    async fn transaction<F, Fut>(
        &self,
        c: &mut deadpool_postgres::Object,
        params: &[Vec<TextParam>],
        txids: &[String],
        send: &mut F,
    ) -> Result<bool, PgError>
    where
        F: FnMut(Key) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let stmt = c
            .prepare_cached(&self.sql)
            .await
            .map_err(|e| PgError::sql("the keys statement does not prepare", e))?;
        let check = c
            .prepare_cached(NOT_VISIBLE)
            .await
            .map_err(|e| PgError::sql("the visibility check does not prepare", e))?;
        let deadline = tokio::time::Instant::now() + self.visibility_wait;
        let mut pause = Duration::from_millis(2);
        loop {
            let tx = c
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| PgError::sql("cannot begin the fan-out transaction", e))?;
            if !txids.is_empty() {
                let unseen = tx
                    .query(&check, &[&txids])
                    .await
                    .map_err(|e| PgError::sql("visibility check failed", e))?;
                if !unseen.is_empty() {
                    let _ = tx.rollback().await;
                    if tokio::time::Instant::now() >= deadline {
                        let ids: Vec<String> = unseen.iter().map(|r| r.get(0)).collect();
                        return Err(not_visible(&ids, self.visibility_wait));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                    continue;
                }
            }
            let tx_ref = &tx;
            let binds = params.iter().map(|p| {
                let stmt = &stmt;
                async move {
                    let refs: Vec<&(dyn ToSql + Sync)> =
                        p.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                    tx_ref
                        .bind(stmt, &refs)
                        .await
                        .map_err(|e| PgError::sql("the keys statement failed", e))
                }
            });
            let portals: Vec<Portal> = futures_util::future::try_join_all(binds).await?;
            let firsts = portals.iter().map(|p| async move {
                tx_ref
                    .query_portal(p, self.fetch)
                    .await
                    .map_err(|e| PgError::sql("the keys statement failed", e))
            });
            let firsts = futures_util::future::try_join_all(firsts).await?;
            for (portal, mut rows) in portals.iter().zip(firsts) {
                loop {
                    let more = rows.len() >= self.fetch as usize;
                    for r in &rows {
                        let parts = (0..self.columns).map(|i| r.get::<_, Option<&str>>(i));
                        if !send(Key::from_parts(parts)).await {
                            return Ok(false);
                        }
                    }
                    if !more {
                        break;
                    }
                    rows = tx
                        .query_portal(portal, self.fetch)
                        .await
                        .map_err(|e| PgError::sql("the keys statement failed", e))?;
                }
            }
            tx.commit()
                .await
                .map_err(|e| PgError::sql("cannot end the fan-out transaction", e))?;
            return Ok(true);
        }
    }
}

/// A `json` value's text (what `EXPLAIN (FORMAT JSON)` returns).
struct Json(String);

impl<'a> tokio_postgres::types::FromSql<'a> for Json {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Json, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Json(String::from_utf8(raw.to_vec())?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON || *ty == Type::TEXT
    }
}

impl Expand for SqlFanOut {
    fn expand<'a>(
        &'a self,
        due: &'a [Due],
        sink: &'a KeySink,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let complete = self
                .run(due, |k| async move { sink.send(k).await.is_ok() })
                .await?;
            if !complete {
                return Err(freshen::SinkClosed.into());
            }
            Ok(())
        })
    }

    fn max_batch(&self) -> usize {
        self.batch
    }

    fn classify(&self, error: &BoxError) -> Retry {
        error
            .downcast_ref::<PgError>()
            .map_or(Retry::Key, PgError::retry)
    }

    fn estimate<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<Option<u64>, BoxError>> {
        Box::pin(async move { Ok(Some(self.estimate(due).await?)) })
    }
}
