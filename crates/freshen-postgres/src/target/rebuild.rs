//! `SqlRebuild`: rebuild a key by running your statements in one transaction.
//!
//! Visibility. PostgreSQL can ship a commit through logical decoding a moment before
//! the committing transaction is visible to new snapshots (the WAL flush precedes the
//! proc-array update; a descheduled backend or a synchronous standby widens the gap).
//! A rebuild in that moment would recompute the scope without the change that dirtied
//! it — and nothing would dirty it again. So the rebuild runs REPEATABLE READ, first
//! checks with `pg_visible_in_snapshot` that its snapshot sees every transaction that
//! dirtied its keys ([`Due::txids`](freshen::Due)), and if not rolls back and retries
//! briefly; past `visibility_wait` it fails and the refresher's backoff takes over.
//!
//! Transaction ids mean something only on the cluster that assigned them, so where the
//! rebuild runs decides how visibility is proved ([`Visibility`]): in the rebuild's own
//! snapshot on the source cluster or a physical standby of it (same system identifier:
//! the standby replays the source's ids), or — for a target on another cluster — on the
//! source, before the rebuild starts: once a new snapshot there sees the change, every
//! later read of the source sees it (directly, or through a foreign table). A copy of
//! the source made by logical replication is not covered: its lag is its own.
//!
//! Cancellation: a rebuild future dropped mid-flight (a shutdown past its grace)
//! cancels its statement on the server, so abandoned work does not keep running there.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::{BoxError, BoxFuture, Due, Rebuild, Retry};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{CancelToken, IsolationLevel, NoTls};

use crate::PgError;
use crate::error::ErrorKind;
use crate::pool::client;
use crate::target::params::{TextParam, array_literal, check_scalar, element};

/// Keys one batch-mode call may take while a backlog waits (see
/// [`freshen::Rebuild::bulk_batch`]) when nothing else is said. Chosen by measurement
/// (BENCHMARKS.md, "fanout"): one statement over 10 000 keys did the work of ten over
/// 1000 in about two thirds of the time; at 50 000 the planner's work on the array and
/// the plans it picks gave that back.
pub const DEFAULT_BULK_BATCH: usize = 10_000;

pub(crate) const NOT_VISIBLE: &str = "SELECT x FROM unnest($1::text[]) AS x \
                           WHERE NOT pg_visible_in_snapshot(x::xid8, pg_current_snapshot())";

/// Rebuilds keys with SQL: the statements run in order in one REPEATABLE READ
/// transaction per call, `$1`, `$2`, … bound to the key's parts.
///
/// Per key (the default), each parameter has the column's type (`WHERE device = $1`);
/// one call takes up to [`keys_per_transaction`](SqlRebuildBuilder::keys_per_transaction)
/// keys and runs every statement for each of them, pipelined.
/// In batch mode ([`SqlRebuildBuilder::batch`]) one call rebuilds up to N keys and the
/// statements are written over arrays, one array per key part
/// (`WHERE device = ANY($1)`, or `WHERE (a, b) IN (SELECT * FROM unnest($1::int[], $2::text[]))`).
/// A NULL key part binds NULL.
#[derive(Clone)]
pub struct SqlRebuild {
    pool: Pool,
    statements: Arc<[String]>,
    /// Parameter types of each statement, read when it was prepared.
    param_types: Arc<[Vec<Type>]>,
    batch: usize,
    /// Keys per call while a backlog waits (batch mode only).
    bulk: usize,
    /// Whether parameters are arrays of key parts (batch mode, even for a batch of one).
    arrays: bool,
    keys_per_transaction: usize,
    visibility: Visibility,
    visibility_wait: Duration,
    /// What runs instead for a call larger than a batch (a backlog's set call), if the
    /// view gave set statements: a rebuild over arrays of keys.
    set: Option<Arc<SqlRebuild>>,
    /// The configuration key its statements came from, as errors name them: `rebuild`,
    /// or `rebuild_set` for the set statements.
    name: &'static str,
}

/// How a rebuild proves it sees the transactions that dirtied its keys (see the module
/// docs).
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Visibility {
    /// In the rebuild's own snapshot: the rebuild runs on the source cluster or on a
    /// physical standby of it. The default.
    #[default]
    InSnapshot,
    /// On the source, before the rebuild starts: the rebuild runs on another cluster.
    OnSource(Pool),
    /// No check (a source without PostgreSQL transaction ids).
    Off,
}

impl fmt::Debug for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Visibility::InSnapshot => "InSnapshot",
            Visibility::OnSource(_) => "OnSource",
            Visibility::Off => "Off",
        })
    }
}

impl fmt::Debug for SqlRebuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlRebuild")
            .field("statements", &self.statements)
            .field("batch", &self.batch)
            .field("bulk", &self.bulk)
            .field("keys_per_transaction", &self.keys_per_transaction)
            .field("visibility", &self.visibility)
            .field("visibility_wait", &self.visibility_wait)
            .field("set", &self.set.as_ref().map(|s| &s.statements))
            .finish_non_exhaustive()
    }
}

/// Configures a [`SqlRebuild`]; from [`SqlRebuild::builder`].
#[derive(Debug)]
pub struct SqlRebuildBuilder {
    pool: Pool,
    statements: Vec<String>,
    batch: usize,
    bulk: usize,
    arrays: bool,
    keys_per_transaction: usize,
    visibility: Visibility,
    visibility_wait: Duration,
    set: Vec<String>,
}

impl SqlRebuildBuilder {
    /// Adds a statement (run in the order added).
    pub fn statement(mut self, sql: impl Into<String>) -> Self {
        self.statements.push(sql.into());
        self
    }

    /// Adds statements.
    pub fn statements<I, S>(mut self, sqls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.statements.extend(sqls.into_iter().map(Into::into));
        self
    }

    /// Rebuild up to `max_keys` keys per call with statements written over arrays
    /// (`1`, the default, is per key with scalar parameters).
    pub fn batch(mut self, max_keys: usize) -> Self {
        self.batch = max_keys;
        self
    }

    /// Statements that rebuild a set of keys at once, run instead of the others for a
    /// call larger than a batch (a backlog, a large fan-out, a sweep): written over
    /// arrays, one per key part, as in batch mode (`WHERE device = ANY($1)`), up to
    /// [`bulk_batch`](Self::bulk_batch) keys a call. Most keys of a large set have not
    /// changed, so they are best written to change only the rows that differ (an
    /// `INSERT … ON CONFLICT DO UPDATE … WHERE … IS DISTINCT FROM …` and a `DELETE` of
    /// the rows no longer produced) rather than to delete and insert every row. A call
    /// that fails is split as any other, so a small one runs the per-key statements.
    /// None (the default): every call runs the statements above.
    pub fn set_statements<I, S>(mut self, sqls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.set.extend(sqls.into_iter().map(Into::into));
        self
    }

    /// In batch mode, how many keys one call may take while a backlog waits (a large
    /// fan-out): default [`DEFAULT_BULK_BATCH`]; never less than `batch` (a value
    /// below it turns growing off). See [`freshen::Rebuild::bulk_batch`].
    pub fn bulk_batch(mut self, max_keys: usize) -> Self {
        self.bulk = max_keys;
        self
    }

    /// Batch mode (parameters are arrays of key parts) even when `batch` is 1: the
    /// statements of a query-mode rebuild are always written over arrays.
    pub(crate) fn arrays(mut self) -> Self {
        self.arrays = true;
        self
    }

    /// Per-key mode: rebuild up to `n` keys in one transaction (default 16), each key
    /// running the statements with its own scalar parameters, all pipelined in one round
    /// trip. A failure fails them all; the refresher then retries the keys in halves
    /// until the failing one is alone.
    pub fn keys_per_transaction(mut self, n: usize) -> Self {
        self.keys_per_transaction = n;
        self
    }

    /// Whether to check that the snapshot sees the dirtying transactions (default on,
    /// in the rebuild's own snapshot).
    pub fn check_visibility(mut self, on: bool) -> Self {
        self.visibility = if on {
            Visibility::InSnapshot
        } else {
            Visibility::Off
        };
        self
    }

    /// Where visibility is proved (default [`Visibility::InSnapshot`]).
    pub fn visibility(mut self, v: Visibility) -> Self {
        self.visibility = v;
        self
    }

    /// How long to retry a snapshot that does not yet see them (default 2 s).
    pub fn visibility_wait(mut self, d: Duration) -> Self {
        self.visibility_wait = d;
        self
    }

    /// Validates the statements against the database (prepares each and checks its
    /// parameters suit the mode) and builds the rebuild.
    pub async fn build(mut self) -> Result<SqlRebuild, PgError> {
        let set_statements = std::mem::take(&mut self.set);
        let set = if set_statements.is_empty() {
            None
        } else {
            let bulk = self.bulk.max(self.batch);
            let set = SqlRebuild::builder(self.pool.clone())
                .statements(set_statements)
                .arrays()
                .batch(bulk)
                .bulk_batch(bulk)
                .visibility(self.visibility.clone())
                .visibility_wait(self.visibility_wait)
                .build_own()
                .await
                .map_err(|e| PgError::new(e.kind(), format!("the set statements: {e}")));
            Some(set)
        };
        let own = self.build_own().await;
        match (own, set) {
            (Ok(own), None) => Ok(own),
            (Ok(own), Some(Ok(set))) => Ok(SqlRebuild {
                set: Some(Arc::new(SqlRebuild {
                    name: "rebuild_set",
                    ..set
                })),
                ..own
            }),
            (Err(e), None | Some(Ok(_))) | (Ok(_), Some(Err(e))) => Err(e),
            // Every problem at once: both lists.
            (Err(own), Some(Err(set))) => Err(PgError::new(own.kind(), format!("{own}; {set}"))),
        }
    }

    async fn build_own(self) -> Result<SqlRebuild, PgError> {
        let mut problems = Vec::new();
        if self.statements.is_empty() {
            problems.push("a rebuild needs at least one statement".to_string());
        }
        if self.batch == 0 {
            problems.push("batch size must be at least 1".to_string());
        }
        if self.keys_per_transaction == 0 {
            problems.push("keys per transaction must be at least 1".to_string());
        }
        if !problems.is_empty() {
            return Err(PgError::config(&problems));
        }
        let arrays = self.arrays || self.batch > 1;
        let c = client(&self.pool).await?;
        let mut param_types = Vec::with_capacity(self.statements.len());
        for (i, sql) in self.statements.iter().enumerate() {
            let stmt = c.prepare(sql).await.map_err(|e| {
                PgError::sql(format!("rebuild statement {} does not prepare", i + 1), e)
            })?;
            param_types.push(stmt.params().to_vec());
            for (j, ty) in stmt.params().iter().enumerate() {
                let array = element(ty).is_some();
                if arrays && !array {
                    problems.push(format!(
                        "statement {}: ${} is {}, but in batch mode every parameter is an array of one key part (write = ANY(${}))",
                        i + 1, j + 1, ty.name(), j + 1
                    ));
                }
                if !arrays && array && *ty != Type::TEXT_ARRAY {
                    problems.push(format!(
                        "statement {}: ${} is an array ({}); array parameters are for batch mode (SqlRebuildBuilder::batch)",
                        i + 1, j + 1, ty.name()
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(PgError::config(&problems));
        }
        Ok(SqlRebuild {
            pool: self.pool,
            statements: self.statements.into(),
            param_types: param_types.into(),
            batch: self.batch,
            bulk: self.bulk.max(self.batch),
            arrays,
            keys_per_transaction: self.keys_per_transaction,
            visibility: self.visibility,
            visibility_wait: self.visibility_wait,
            set: None,
            name: "rebuild",
        })
    }
}

impl SqlRebuild {
    /// A builder over a connection pool.
    pub fn builder(pool: Pool) -> SqlRebuildBuilder {
        SqlRebuildBuilder {
            pool,
            statements: Vec::new(),
            batch: 1,
            bulk: DEFAULT_BULK_BATCH,
            arrays: false,
            keys_per_transaction: 16,
            visibility: Visibility::InSnapshot,
            visibility_wait: Duration::from_secs(2),
            set: Vec::new(),
        }
    }

    /// Rebuilds `due` (as [`Rebuild::rebuild`] does), with the typed error.
    pub async fn run(&self, due: &[Due]) -> Result<(), PgError> {
        // A set call (past a batch) runs the set statements, when there are any.
        let this = match &self.set {
            Some(set) if due.len() > self.max_batch() => &**set,
            _ => self,
        };
        let mut attempts = 0;
        loop {
            match this.attempt(due).await {
                // A serialization failure or deadlock between concurrent rebuilds: the
                // transaction did nothing, run it again at once (a few times).
                Err(e) if matches!(e.sqlstate(), Some("40001" | "40P01")) && attempts < 3 => {
                    attempts += 1;
                }
                other => return other,
            }
        }
    }

    /// What one transaction executes: for each statement execution, its statement's
    /// index, its parameters and what to say if it fails.
    fn plan(&self, due: &[Due]) -> Result<Vec<(usize, Vec<TextParam>, String)>, PgError> {
        let mut out = Vec::new();
        if self.arrays {
            let keys: Vec<Vec<Option<&str>>> =
                due.iter().map(|d| d.key.parts().collect()).collect();
            for (i, types) in self.param_types.iter().enumerate() {
                let mut params = Vec::with_capacity(types.len());
                for (j, ty) in types.iter().enumerate() {
                    let elem = element(ty).unwrap_or(ty);
                    let mut column = Vec::with_capacity(keys.len());
                    for parts in &keys {
                        let part = bound_part(parts, i, j)?;
                        if let Some(text) = part {
                            check_part(elem, text, i, j)?;
                        }
                        column.push(part);
                    }
                    params.push(TextParam(Some(array_literal(column))));
                }
                let what = format!(
                    "{} statement {} failed for a batch of {} keys",
                    self.name,
                    i + 1,
                    due.len()
                );
                out.push((i, params, what));
            }
        } else {
            for d in due {
                let parts: Vec<Option<&str>> = d.key.parts().collect();
                for (i, types) in self.param_types.iter().enumerate() {
                    let mut params = Vec::with_capacity(types.len());
                    for (j, ty) in types.iter().enumerate() {
                        let part = bound_part(&parts, i, j)?;
                        if let Some(text) = part {
                            check_part(ty, text, i, j)?;
                        }
                        params.push(TextParam(part.map(str::to_owned)));
                    }
                    // The key itself is the refresher's to report (shown as `[[redact]]`
                    // says): never its value here.
                    let what = if due.len() == 1 {
                        format!("{} statement {} failed", self.name, i + 1)
                    } else {
                        format!(
                            "{} statement {} failed for one of {} keys",
                            self.name,
                            i + 1,
                            due.len()
                        )
                    };
                    out.push((i, params, what));
                }
            }
        }
        Ok(out)
    }

    fn txids(due: &[Due]) -> Vec<String> {
        txids(due)
    }

    async fn visible_on_source(&self, source: &Pool, txids: &[String]) -> Result<(), PgError> {
        visible_on_source(source, txids, self.visibility_wait).await
    }

    async fn attempt(&self, due: &[Due]) -> Result<(), PgError> {
        let plan = self.plan(due)?;
        let mut txids: Vec<String> = Vec::new();
        match &self.visibility {
            Visibility::InSnapshot => txids = Self::txids(due),
            Visibility::OnSource(source) => {
                let ids = Self::txids(due);
                if !ids.is_empty() {
                    self.visible_on_source(source, &ids).await?;
                }
            }
            Visibility::Off => {}
        }
        let mut guard = CancelOnDrop::new(client(&self.pool).await?);
        let outcome = self.transaction(guard.client(), &plan, &txids).await;
        guard.disarm();
        outcome
    }

    /// Runs the planned statements in one REPEATABLE READ transaction whose snapshot
    /// sees `txids`.
    async fn transaction(
        &self,
        c: &mut deadpool_postgres::Object,
        plan: &[(usize, Vec<TextParam>, String)],
        txids: &[String],
    ) -> Result<(), PgError> {
        let mut statements = Vec::with_capacity(self.statements.len());
        for (i, sql) in self.statements.iter().enumerate() {
            statements.push(c.prepare_cached(sql).await.map_err(|e| {
                PgError::sql(
                    format!("{} statement {} does not prepare", self.name, i + 1),
                    e,
                )
            })?);
        }
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
                .start()
                .await
                .map_err(|e| PgError::sql("cannot begin the rebuild transaction", e))?;
            // The check and every statement go out pipelined, in this order: one round
            // trip for all of them. REPEATABLE READ gives them all the snapshot the check
            // examines; if it misses a dirtying transaction the work is rolled back.
            let tx_ref = &tx;
            let unseen = async {
                if txids.is_empty() {
                    Ok(Vec::new())
                } else {
                    tx_ref.query(&check, &[&txids]).await
                }
            };
            let runs = plan.iter().map(|(i, params, what)| {
                let stmt = &statements[*i];
                async move {
                    let refs: Vec<&(dyn ToSql + Sync)> =
                        params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
                    tx_ref
                        .execute(stmt, &refs)
                        .await
                        .map_err(|e| PgError::sql(what.clone(), e))
                }
            });
            let (unseen, done) = futures_util::future::join(unseen, try_join_all(runs)).await;
            let unseen = unseen.map_err(|e| PgError::sql("visibility check failed", e))?;
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
            done?;
            return tx
                .commit()
                .await
                .map_err(|e| PgError::sql("cannot commit the rebuild", e));
        }
    }
}

/// The distinct transaction ids behind `due`, as text for `$1::text[]`.
pub(crate) fn txids(due: &[Due]) -> Vec<String> {
    let mut ids: Vec<u64> = due.iter().flat_map(|d| d.txids.iter().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.iter().map(u64::to_string).collect()
}

/// Waits until a new snapshot on the source sees every transaction in `txids`.
pub(crate) async fn visible_on_source(
    source: &Pool,
    txids: &[String],
    wait: Duration,
) -> Result<(), PgError> {
    let c = client(source).await?;
    let check = c
        .prepare_cached(NOT_VISIBLE)
        .await
        .map_err(|e| PgError::sql("the visibility check does not prepare", e))?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        let unseen = c
            .query(&check, &[&txids])
            .await
            .map_err(|e| PgError::sql("visibility check on the source failed", e))?;
        if unseen.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let ids: Vec<String> = unseen.iter().map(|r| r.get(0)).collect();
            return Err(not_visible(&ids, wait));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

pub(crate) fn not_visible(ids: &[String], waited: Duration) -> PgError {
    PgError::new(
        ErrorKind::NotVisible,
        format!(
            "transaction(s) {} committed in the WAL but are still not visible to new \
             snapshots after {waited:?} (a synchronous standby or a stalled backend?); the \
             rebuild will be retried",
            ids.join(", "),
        ),
    )
}

/// A pooled connection that, dropped while armed (the refresher gave up on the rebuild
/// mid-flight), cancels what it runs on the server and leaves the pool: a cancel that
/// arrived after the connection went back to the pool could hit another rebuild.
pub(crate) struct CancelOnDrop {
    client: Option<deadpool_postgres::Object>,
    armed: bool,
}

impl CancelOnDrop {
    pub(crate) fn new(client: deadpool_postgres::Object) -> CancelOnDrop {
        CancelOnDrop {
            client: Some(client),
            armed: true,
        }
    }

    pub(crate) fn client(&mut self) -> &mut deadpool_postgres::Object {
        self.client.as_mut().expect("held until dropped")
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if !self.armed {
            return;
        }
        let token: CancelToken = client.cancel_token();
        drop(deadpool_postgres::Object::take(client));
        // A cancel request is answered by the server before authentication and TLS, so
        // a plain connection reaches any server the rebuild reached.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            CANCELS_PENDING.fetch_add(1, Ordering::SeqCst);
            rt.spawn(async move {
                let _ = token.cancel_query(NoTls).await;
                CANCELS_PENDING.fetch_sub(1, Ordering::SeqCst);
                CANCELS_SENT.notify_waiters();
            });
        }
    }
}

/// Cancel requests spawned by dropped rebuilds and not yet answered.
static CANCELS_PENDING: AtomicUsize = AtomicUsize::new(0);
static CANCELS_SENT: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Waits (at most `within`) until every cancel request of an abandoned rebuild has been
/// delivered. A process that exits right after a shutdown calls this last: its
/// runtime would otherwise drop the requests unsent and leave the statements running
/// on the server.
pub async fn cancels_settled(within: std::time::Duration) {
    let settled = async {
        loop {
            let sent = CANCELS_SENT.notified();
            if CANCELS_PENDING.load(Ordering::SeqCst) == 0 {
                return;
            }
            sent.await;
        }
    };
    let _ = tokio::time::timeout(within, settled).await;
}

/// Part `j` of a key's `parts`, for `$j+1` of statement `i`.
fn bound_part<'k>(
    parts: &[Option<&'k str>],
    i: usize,
    j: usize,
) -> Result<Option<&'k str>, PgError> {
    parts.get(j).copied().ok_or_else(|| {
        PgError::new(
            ErrorKind::Config,
            format!(
                "statement {} uses ${} but a key has {} part(s)",
                i + 1,
                j + 1,
                parts.len()
            ),
        )
    })
}

/// A clear error for a key part that cannot be the parameter's type.
fn check_part(ty: &Type, text: &str, i: usize, j: usize) -> Result<(), PgError> {
    check_scalar(ty, text).map_err(|why| {
        PgError::new(
            ErrorKind::Config,
            format!(
                "a key's part {} for ${} of statement {}: {why}",
                j + 1,
                j + 1,
                i + 1
            ),
        )
    })
}

/// `try_join_all` over the pipelined executions: the first error wins (the rest of an
/// aborted transaction fails after it anyway).
async fn try_join_all<F, T>(futures: impl Iterator<Item = F>) -> Result<Vec<T>, PgError>
where
    F: std::future::Future<Output = Result<T, PgError>>,
{
    futures_util::future::try_join_all(futures).await
}

impl Rebuild for SqlRebuild {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let result = self.run(due).await;
            // `RUST_LOG=freshen_postgres=debug` follows every call. Never a key: it is
            // a value of the source's rows, perhaps one `[[redact]]` hides.
            match &result {
                Ok(()) => tracing::debug!(
                    keys = due.len(),
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "rebuilt"
                ),
                Err(e) => tracing::debug!(keys = due.len(), "rebuild failed: {e}"),
            }
            result.map_err(Into::into)
        })
    }

    fn classify(&self, error: &BoxError) -> Retry {
        error
            .downcast_ref::<PgError>()
            .map_or(Retry::Key, PgError::retry)
    }

    fn max_batch(&self) -> usize {
        if self.arrays {
            self.batch
        } else {
            self.keys_per_transaction
        }
    }

    /// Batch mode grows to `bulk` keys a call under a backlog: its statements are
    /// written over arrays, so one statement serves any number of keys; so does per-key
    /// mode with set statements. Per-key mode alone runs the statements once per key and
    /// gains nothing from growing.
    fn bulk_batch(&self) -> usize {
        if self.arrays || self.set.is_some() {
            self.bulk
        } else {
            self.keys_per_transaction
        }
    }
}
