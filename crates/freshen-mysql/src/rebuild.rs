//! `MySqlRebuild`: rebuild keys by running your statements in one transaction.
//!
//! Visibility. A MariaDB transaction is in the binlog — and so in this source's stream —
//! before InnoDB makes it visible to new snapshots: group commit writes (and syncs) the
//! binlog, wakes the binlog dump threads, and only then runs the engines' ordered
//! commit. The gap is microseconds on an idle server, and the whole acknowledgement wait
//! with semi-synchronous replication at `rpl_semi_sync_master_wait_point = AFTER_SYNC`
//! (measured: a row event and its XID arrive while `SELECT count(*)` still misses the
//! row). A rebuild in that gap recomputes the scope without the change that dirtied it,
//! and nothing would dirty it again. So on MariaDB a rebuild first opens a read-only
//! `START TRANSACTION WITH CONSISTENT SNAPSHOT` and reads `Binlog_snapshot_file` /
//! `Binlog_snapshot_position`: the binlog position up to which every transaction is
//! visible to that snapshot (MariaDB computes it under the commit-ordering lock, and
//! commits in binlog order). If a dirtying transaction ([`Due::txids`](freshen::Due):
//! the position where it starts in the binlog) is not below it, it tries again shortly;
//! past `visibility_wait` it fails as a path failure and the refresher's backoff takes
//! over. The rebuild's own transaction starts after the check, so every snapshot it
//! takes is at least as new.
//!
//! MySQL 8 commits the same way (flush and sync the binlog, then the engines' commit
//! stage; `AFTER_SYNC` semi-sync waits in between), so the hazard is the same, but MySQL
//! has no snapshot binlog position. Its guard would wait for the transaction's GTID in
//! `@@gtid_executed` (updated after the engine commit) — which needs GTIDs carried to
//! the rebuild; on MySQL the check is skipped and [`MySqlRebuild::guards_visibility`]
//! says so.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use freshen::{BoxError, BoxFuture, Due, Rebuild, Retry};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Statement};

use crate::error::ErrorKind;
use crate::params::{self, KeyType, Rewritten};
use crate::{FilePos, MySqlError};

/// One statement execution of a call: the statement's index, its parameters and the key
/// it runs for (a set call's: its first).
type Run<'d> = (usize, Vec<mysql_async::Value>, &'d Due);

/// Keys one set call takes at most (see [`MySqlRebuildBuilder::set_statements`]): as
/// PostgreSQL's bulk batch; a JSON array of 10 000 keys is a few hundred kilobytes,
/// well within `max_allowed_packet`.
pub const SET_BATCH: usize = 10_000;

/// Rebuilds keys with SQL: the statements run in order in one READ COMMITTED
/// transaction per call, `$1`, `$2`, … bound to the key's parts (see
/// [`KeyType`] for how). One call takes up to
/// [`keys_per_transaction`](MySqlRebuildBuilder::keys_per_transaction) keys and runs
/// every statement for each of them.
#[derive(Clone)]
pub struct MySqlRebuild {
    pool: Pool,
    statements: Arc<[Rewritten]>,
    /// Run instead of `statements` for a call larger than `keys_per_transaction` (a
    /// backlog's set call); empty: none.
    set: Arc<[Rewritten]>,
    key_types: Arc<[KeyType]>,
    keys_per_transaction: usize,
    check_visibility: bool,
    visibility_wait: Duration,
}

impl fmt::Debug for MySqlRebuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlRebuild")
            .field("statements", &self.statements)
            .field("set", &self.set)
            .field("key_types", &self.key_types)
            .field("keys_per_transaction", &self.keys_per_transaction)
            .field("check_visibility", &self.check_visibility)
            .field("visibility_wait", &self.visibility_wait)
            .finish_non_exhaustive()
    }
}

/// Configures a [`MySqlRebuild`]; from [`MySqlRebuild::builder`].
#[derive(Debug)]
pub struct MySqlRebuildBuilder {
    pool: Pool,
    statements: Vec<String>,
    set: Vec<String>,
    key_types: Vec<KeyType>,
    keys_per_transaction: usize,
    check_visibility: bool,
    visibility_wait: Duration,
}

impl MySqlRebuildBuilder {
    /// Adds a statement (run in the order added), with `$n` for key part n.
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

    /// Statements that rebuild a set of keys at once, run instead of the others for a
    /// call larger than [`keys_per_transaction`](Self::keys_per_transaction) (a
    /// backlog, a large fan-out, a sweep), up to [`SET_BATCH`] keys a call. MySQL has no
    /// array parameters, so each `$n` binds part n of every key as one JSON array, read
    /// with `JSON_TABLE` (MySQL 8, MariaDB 10.6):
    /// `JOIN JSON_TABLE($1, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k ON t.id = k.id`.
    /// Integer parts are JSON numbers, text parts strings, binary parts hex strings
    /// (`UNHEX(k.id)`), a NULL part `null`. A call that fails is split as any other, so
    /// a small one runs the per-key statements.
    pub fn set_statements<I, S>(mut self, sqls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.set.extend(sqls.into_iter().map(Into::into));
        self
    }

    /// How each key part binds (`$1` is the first); parts not listed bind as text.
    pub fn key_types(mut self, types: impl IntoIterator<Item = KeyType>) -> Self {
        self.key_types = types.into_iter().collect();
        self
    }

    /// Rebuild up to `n` keys in one transaction (default 16). A failure fails them all;
    /// the refresher then retries the keys in halves until the failing one is alone.
    pub fn keys_per_transaction(mut self, n: usize) -> Self {
        self.keys_per_transaction = n;
        self
    }

    /// Whether to wait until the snapshot sees the dirtying transactions (default on).
    pub fn check_visibility(mut self, on: bool) -> Self {
        self.check_visibility = on;
        self
    }

    /// How long to wait for a snapshot that sees them (default 2 s).
    pub fn visibility_wait(mut self, d: Duration) -> Self {
        self.visibility_wait = d;
        self
    }

    /// Checks every statement: placeholders, then that it prepares on the server.
    /// Every problem is reported at once.
    pub async fn build(self) -> Result<MySqlRebuild, MySqlError> {
        let mut problems = Vec::new();
        if self.statements.is_empty() {
            problems.push("a rebuild needs at least one statement".to_string());
        }
        if self.keys_per_transaction == 0 {
            problems.push("keys per transaction must be at least 1".to_string());
        }
        let rewrite = |sqls: &[String], what: &str, problems: &mut Vec<String>| {
            let mut out = Vec::new();
            for (i, sql) in sqls.iter().enumerate() {
                match params::rewrite(sql) {
                    Ok(r) => out.push((format!("{what}{}", i + 1), r)),
                    Err(e) => problems.push(format!("{what}{}: {e}", i + 1)),
                }
            }
            out
        };
        let rewritten = rewrite(&self.statements, "statement ", &mut problems);
        let set = rewrite(&self.set, "set statement ", &mut problems);
        if problems.is_empty() {
            let mut c = self
                .pool
                .get_conn()
                .await
                .map_err(|e| MySqlError::driver("cannot connect to check the rebuild", e))?;
            for (what, r) in rewritten.iter().chain(&set) {
                if let Err(e) = c.prep(r.sql.as_str()).await {
                    problems.push(format!(
                        "{what} does not prepare: {}",
                        MySqlError::driver("", e).source_text()
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(MySqlError::config("rebuild", &problems));
        }
        let guard = self.check_visibility && is_mariadb(&self.pool).await?;
        Ok(MySqlRebuild {
            pool: self.pool,
            statements: rewritten.into_iter().map(|(_, r)| r).collect(),
            set: set.into_iter().map(|(_, r)| r).collect(),
            key_types: self.key_types.into(),
            keys_per_transaction: self.keys_per_transaction,
            check_visibility: guard,
            visibility_wait: self.visibility_wait,
        })
    }
}

pub(crate) async fn is_mariadb(pool: &Pool) -> Result<bool, MySqlError> {
    let mut c = pool
        .get_conn()
        .await
        .map_err(|e| MySqlError::driver("cannot connect", e))?;
    let v: Option<String> = c
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| MySqlError::driver("cannot read the server version", e))?;
    Ok(v.unwrap_or_default()
        .to_ascii_lowercase()
        .contains("mariadb"))
}

impl MySqlRebuild {
    /// A builder over a connection pool (see [`connect_pool`](crate::connect_pool)).
    pub fn builder(pool: Pool) -> MySqlRebuildBuilder {
        MySqlRebuildBuilder {
            pool,
            statements: Vec::new(),
            set: Vec::new(),
            key_types: Vec::new(),
            keys_per_transaction: 16,
            check_visibility: true,
            visibility_wait: Duration::from_secs(2),
        }
    }

    /// Whether rebuilds wait until the dirtying transactions are visible (MariaDB with
    /// the check on; see the module docs for MySQL).
    pub fn guards_visibility(&self) -> bool {
        self.check_visibility
    }

    /// Rebuilds `due` (as [`Rebuild::rebuild`] does), with the typed error.
    pub async fn run(&self, due: &[Due]) -> Result<(), MySqlError> {
        let mut attempts = 0;
        loop {
            match self.attempt(due).await {
                // A deadlock between concurrent rebuilds: the transaction was rolled back,
                // run it again at once (a few times).
                Err(e) if e.code() == Some(1213) && attempts < 3 => attempts += 1,
                other => return other,
            }
        }
    }

    fn params(
        &self,
        due: &Due,
        r: &Rewritten,
        i: usize,
    ) -> Result<Vec<mysql_async::Value>, MySqlError> {
        r.parts
            .iter()
            .map(|&p| {
                let ty = self.key_types.get(p).copied().unwrap_or_default();
                params::bind(&due.key, p, ty).map_err(|why| {
                    MySqlError::new(
                        ErrorKind::Key,
                        format!("rebuild statement {}: {why}", i + 1),
                    )
                })
            })
            .collect()
    }

    /// A set call's plan: each set statement once, its `$n` bound to part n of every
    /// key as a JSON array.
    fn set_plan<'d>(&self, due: &'d [Due]) -> Result<Vec<Run<'d>>, MySqlError> {
        let keys: Vec<&freshen::Key> = due.iter().map(|d| &d.key).collect();
        let mut plan = Vec::with_capacity(self.set.len());
        for (i, r) in self.set.iter().enumerate() {
            let params = r
                .parts
                .iter()
                .map(|&p| {
                    let ty = self.key_types.get(p).copied().unwrap_or_default();
                    params::bind_set(&keys, p, ty).map_err(|why| {
                        MySqlError::new(
                            ErrorKind::Key,
                            format!("rebuild_set statement {}: {why}", i + 1),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            plan.push((i, params, &due[0]));
        }
        Ok(plan)
    }

    /// Whether `due` is a set call: larger than a batch, with set statements to run.
    fn is_set(&self, due: &[Due]) -> bool {
        !self.set.is_empty() && due.len() > self.keys_per_transaction
    }

    async fn attempt(&self, due: &[Due]) -> Result<(), MySqlError> {
        // Bind everything first: a key that cannot bind fails before any work.
        let set = self.is_set(due);
        let statements = if set { &self.set } else { &self.statements };
        // The configuration key the statements came from, as errors name them.
        let name = if set { "rebuild_set" } else { "rebuild" };
        let plan = if set {
            self.set_plan(due)?
        } else {
            let mut plan = Vec::with_capacity(due.len() * self.statements.len());
            for d in due {
                for (i, r) in self.statements.iter().enumerate() {
                    plan.push((i, self.params(d, r, i)?, d));
                }
            }
            plan
        };
        let needed = due.iter().flat_map(|d| d.txids.iter().copied()).max();
        let mut c = self
            .pool
            .get_conn()
            .await
            .map_err(|e| MySqlError::driver("cannot connect for the rebuild", e))?;
        let mut stmts: Vec<Statement> = Vec::with_capacity(statements.len());
        for (i, r) in statements.iter().enumerate() {
            stmts.push(c.prep(r.sql.as_str()).await.map_err(|e| {
                MySqlError::driver(format!("{name} statement {} does not prepare", i + 1), e)
            })?);
        }
        if let (true, Some(needed)) = (self.check_visibility, needed) {
            self.wait_visible(&mut c, needed).await?;
        }
        // READ COMMITTED: an INSERT … SELECT then reads the source rows without locking
        // them (REPEATABLE READ takes shared next-key locks on every row it reads: a
        // tax on writers and a source of deadlocks). Every statement's snapshot is
        // newer than the one the visibility check examined, so it sees what that one saw.
        query(
            &mut c,
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "cannot set the isolation level",
        )
        .await?;
        query(
            &mut c,
            "START TRANSACTION",
            "cannot begin the rebuild transaction",
        )
        .await?;
        for (i, params, _) in &plan {
            if let Err(e) = c.exec_drop(&stmts[*i], params.clone()).await {
                let _ = c.query_drop("ROLLBACK").await;
                // The key itself is the refresher's to report (shown as `[[redact]]`
                // says): never its value here.
                let what = match (set, due.len()) {
                    (true, n) => format!("{name} statement {} failed for a set of {n} keys", i + 1),
                    (false, 1) => format!("{name} statement {} failed", i + 1),
                    (false, n) => format!("{name} statement {} failed for one of {n} keys", i + 1),
                };
                return Err(MySqlError::driver(what, e));
            }
        }
        query(&mut c, "COMMIT", "cannot commit the rebuild").await
    }

    async fn wait_visible(&self, c: &mut Conn, needed: u64) -> Result<(), MySqlError> {
        wait_visible(c, needed, self.visibility_wait).await
    }
}

/// Waits until a new snapshot sees every transaction that starts before `needed` in the
/// binlog, or fails with [`ErrorKind::NotVisible`] after `visibility_wait`.
pub(crate) async fn wait_visible(
    c: &mut Conn,
    needed: u64,
    visibility_wait: Duration,
) -> Result<(), MySqlError> {
    {
        let deadline = tokio::time::Instant::now() + visibility_wait;
        let mut pause = Duration::from_millis(2);
        loop {
            query(
                c,
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "cannot set the isolation level",
            )
            .await?;
            query(
                c,
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                "cannot begin the visibility check",
            )
            .await?;
            let seen = snapshot_token(c).await;
            query(c, "COMMIT", "cannot end the visibility check").await?;
            if seen? > needed {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(MySqlError::new(
                    ErrorKind::NotVisible,
                    format!(
                        "a transaction at binlog position {} is in the binlog but still not \
                         visible to new snapshots after {:?} (semi-synchronous replication \
                         waiting for a replica?); the rebuild will be retried",
                        token_text(needed),
                        visibility_wait
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

pub(crate) async fn query(c: &mut Conn, sql: &str, what: &str) -> Result<(), MySqlError> {
    c.query_drop(sql)
        .await
        .map_err(|e| MySqlError::driver(what.to_string(), e))
}

/// The binlog position the current consistent snapshot sees up to, as a token.
async fn snapshot_token(c: &mut Conn) -> Result<u64, MySqlError> {
    let rows: Vec<(String, String)> = c
        .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
        .await
        .map_err(|e| MySqlError::driver("cannot read the snapshot's binlog position", e))?;
    let get = |name: &str| {
        rows.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let file = get("Binlog_snapshot_file").unwrap_or_default();
    let pos: u64 = get("Binlog_snapshot_position")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    FilePos::new(file, pos).token().ok_or_else(|| {
        MySqlError::new(
            ErrorKind::Setup,
            "the server reports no snapshot binlog position (is binary logging on?)",
        )
    })
}

fn token_text(t: u64) -> String {
    format!("{:06}:{}", t >> 32, t & 0xffff_ffff)
}

impl Rebuild for MySqlRebuild {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move { self.run(due).await.map_err(Into::into) })
    }

    fn max_batch(&self) -> usize {
        self.keys_per_transaction
    }

    /// With set statements a backlog's calls grow to [`SET_BATCH`] keys: one statement
    /// serves any number of them.
    fn bulk_batch(&self) -> usize {
        if self.set.is_empty() {
            self.keys_per_transaction
        } else {
            SET_BATCH.max(self.keys_per_transaction)
        }
    }

    fn classify(&self, error: &BoxError) -> Retry {
        match error.downcast_ref::<MySqlError>() {
            Some(e) => e.retry(),
            None => Retry::Key,
        }
    }
}

/// How the key parts read from `columns` of `database.table` bind, from the columns'
/// types: integers as integers (signed or not, so keys above 2^53 compare exactly),
/// binary strings as bytes, everything else as text. For a program that configures
/// rebuilds from the watched table instead of declared types.
pub async fn key_types_of(
    pool: &Pool,
    database: &str,
    table: &str,
    columns: &[String],
) -> Result<Vec<KeyType>, MySqlError> {
    let mut conn = pool
        .get_conn()
        .await
        .map_err(|e| MySqlError::driver("cannot connect for the key types", e))?;
    let rows: Vec<(String, String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (database, table),
        )
        .await
        .map_err(|e| MySqlError::driver("cannot read the key columns' types", e))?;
    if rows.is_empty() {
        // The catalog shows a table only to users who may read it.
        return Err(MySqlError::new(
            ErrorKind::Config,
            format!(
                "table {database}.{table} does not exist (or the user may not see it: GRANT SELECT ON {database}.{table})"
            ),
        ));
    }
    columns
        .iter()
        .map(|c| {
            let (_, data, full) = rows
                .iter()
                .find(|(name, _, _)| name.eq_ignore_ascii_case(c))
                .ok_or_else(|| {
                    MySqlError::new(
                        ErrorKind::Config,
                        format!("{database}.{table} has no column {c:?}"),
                    )
                })?;
            let unsigned = full.to_ascii_lowercase().contains("unsigned");
            Ok(match data.to_ascii_lowercase().as_str() {
                "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" if unsigned => {
                    KeyType::Uint
                }
                "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => KeyType::Int,
                "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                    KeyType::Bytes
                }
                _ => KeyType::Text,
            })
        })
        .collect()
}
