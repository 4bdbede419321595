//! `QueryRebuild`: rebuild keys from a declared query instead of hand-written
//! statements. The query returns the rows the target table should hold for a batch of
//! keys; freshen writes them with one set-based statement per batch (see
//! [`merge`](crate::target::merge)) that changes only the rows that differ.
//!
//! It runs as a [`SqlRebuild`] in batch mode, so the visibility guard, the transaction,
//! cancellation and the failure classification are exactly those of hand-written
//! rebuilds.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use freshen::{BoxError, BoxFuture, Due, Rebuild, Retry, Whole};
use tokio_postgres::Client;
use tokio_postgres::types::Kind;

use crate::error::ErrorKind;
use crate::error::db_message;
use crate::pool::client;
use crate::quote::quote_ident;
use crate::target::across::Across;
use crate::target::merge::{Merge, column_problems};
use crate::target::whole::{PgWhole, Statements};
use crate::{PgError, SqlRebuild, TableName, Visibility};

/// The defaults the configuration applies, kept in the core beside [`freshen::plug::ViewSpec`].
pub use freshen::plug::{DEFAULT_QUERY_BATCH, DEFAULT_WHOLE_TIMEOUT};

/// A [`freshen::Rebuild`] that writes what a query returns into a table: for the
/// batch's keys it inserts the rows the table lacks, updates the rows whose values
/// differ (`IS DISTINCT FROM`: an unchanged row is not rewritten) and deletes the rows
/// of keys the query no longer returns — one statement per batch, in one REPEATABLE
/// READ transaction that sees every change that dirtied the keys.
///
/// The query selects the batch with `$1..$n`, one array per key part
/// (`WHERE device = ANY($1)`), and returns the key columns (named as the target's) and
/// any other columns of the target. The target needs a primary key or unique index on
/// the key columns: a key has one row.
#[derive(Clone, Debug)]
pub struct QueryRebuild {
    inner: Inner,
    statement: String,
    /// For a plain query in the target database: the whole table at once.
    whole: Option<Arc<PgWhole>>,
}

/// Where the query runs.
#[derive(Clone, Debug)]
enum Inner {
    /// In the target database: one statement reads and writes.
    Same(SqlRebuild),
    /// On the source, its rows written into another database.
    Across(Across),
}

/// Configures a [`QueryRebuild`]; from [`QueryRebuild::builder`].
#[derive(Debug)]
pub struct QueryRebuildBuilder {
    pool: Pool,
    into: TableName,
    key: Vec<String>,
    query: String,
    batch: usize,
    visibility: Visibility,
    visibility_wait: Duration,
    source: Option<Pool>,
    whole_timeout: Option<Duration>,
    lock_timeout: Option<Duration>,
}

impl QueryRebuildBuilder {
    /// The statement timeout of a whole-table run (default one hour; `None`: none),
    /// and how long it waits for a lock (`lock`: the view's statement timeout, so that a
    /// locked table fails the run quickly rather than holding the view).
    pub fn whole_timeouts(mut self, run: Option<Duration>, lock: Option<Duration>) -> Self {
        self.whole_timeout = run;
        self.lock_timeout = lock;
        self
    }

    /// Runs the query on `source` (the database the view reads) and writes its rows into
    /// the builder's pool, another database (see the `across` module). The visibility
    /// guard then runs in the query's own snapshot on the source, unless
    /// [`Visibility::Off`].
    pub fn read_from(mut self, source: Pool) -> Self {
        self.source = Some(source);
        self
    }

    /// Keys per statement (default [`DEFAULT_QUERY_BATCH`]).
    pub fn batch(mut self, max_keys: usize) -> Self {
        self.batch = max_keys;
        self
    }

    /// Where visibility is proved (default [`Visibility::InSnapshot`]).
    pub fn visibility(mut self, v: Visibility) -> Self {
        self.visibility = v;
        self
    }

    /// How long to retry a snapshot that does not yet see the dirtying transactions
    /// (default 2 s).
    pub fn visibility_wait(mut self, d: Duration) -> Self {
        self.visibility_wait = d;
        self
    }

    /// Checks the query against the target table (every mismatch at once), writes the
    /// statement and prepares it.
    pub async fn build(mut self) -> Result<QueryRebuild, PgError> {
        let plain = freshen::plug::is_plain_query(&self.query).then(|| self.query.clone());
        self.query = crate::target::keyed::batch_query(&self.query, &self.key);
        if self.batch == 0 {
            return Err(problems(
                &self.into,
                &["batch size must be at least 1".into()],
            ));
        }
        if let Some(source) = self.source.clone() {
            return self.build_across(source).await;
        }
        let c = client(&self.pool).await?;
        let statement = match plan(&c, &self.into, &self.key, &self.query).await? {
            Ok(statement) => statement,
            Err(found) => return Err(problems(&self.into, &found)),
        };
        let whole = match &plain {
            Some(q) => Some(Arc::new(self.whole(&c, q).await?)),
            None => None,
        };
        drop(c);
        let inner = SqlRebuild::builder(self.pool)
            .statement(statement.clone())
            .batch(self.batch)
            .arrays()
            .visibility(self.visibility)
            .visibility_wait(self.visibility_wait)
            .build()
            .await?;
        Ok(QueryRebuild {
            inner: Inner::Same(inner),
            statement,
            whole,
        })
    }

    /// The whole-table way of a plain query (`query`), its statements checked.
    async fn whole(&self, c: &Client, query: &str) -> Result<PgWhole, PgError> {
        let stmt = c
            .prepare(crate::target::keyed::trim(query))
            .await
            .map_err(|e| PgError::sql("the query does not prepare", e))?;
        let values: Vec<String> = stmt
            .columns()
            .iter()
            .map(|c| c.name().to_owned())
            .filter(|c| !self.key.contains(c))
            .collect();
        // TRUNCATE where the role may and nothing references the table (a foreign
        // key would refuse it); otherwise the rows are deleted.
        let truncate: bool = c
            .query_one(
                "SELECT has_table_privilege($1::text::regclass, 'TRUNCATE') \
                    AND NOT EXISTS (SELECT FROM pg_constraint \
                                     WHERE confrelid = $1::text::regclass AND contype = 'f')",
                &[&self.into.quoted()],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read the privileges on {}", self.into), e))?
            .get(0);
        let statements = Statements::new(&self.into, &self.key, &values, query, truncate);
        for (what, sql) in [
            ("the first build", &statements.fill),
            ("the whole-table diff", &statements.diff),
        ] {
            c.prepare(sql).await.map_err(|e| {
                PgError::sql(format!("{what} written from the query does not prepare"), e)
            })?;
        }
        Ok(PgWhole {
            pool: self.pool.clone(),
            statements,
            visibility: self.visibility.clone(),
            visibility_wait: self.visibility_wait,
            timeout: self.whole_timeout,
            lock_timeout: self.lock_timeout,
        })
    }

    async fn build_across(self, source: Pool) -> Result<QueryRebuild, PgError> {
        let s = client(&source).await?;
        let t = client(&self.pool).await?;
        let planned = match plan_across(&s, &t, &self.into, &self.key, &self.query).await? {
            Ok(p) => p,
            Err(found) => return Err(problems(&self.into, &found)),
        };
        drop((s, t));
        let statement = planned.write.clone();
        Ok(QueryRebuild {
            inner: Inner::Across(Across {
                source,
                target: self.pool,
                fetch: planned.fetch,
                write: planned.write,
                key_types: planned.key_types,
                check: !matches!(self.visibility, Visibility::Off),
                visibility_wait: self.visibility_wait,
                batch: self.batch,
            }),
            statement,
            whole: None,
        })
    }
}

fn problems(into: &TableName, found: &[String]) -> PgError {
    let mut message = format!("the query cannot rebuild {into}:");
    for p in found {
        message.push_str("\n  - ");
        message.push_str(p);
    }
    PgError::new(ErrorKind::Config, message)
}

impl QueryRebuild {
    /// A builder: `query`'s rows for a batch of keys go into `into`, whose `key` columns
    /// are the view's key (`$1..$n` in this order).
    pub fn builder(
        pool: Pool,
        into: TableName,
        key: Vec<String>,
        query: impl Into<String>,
    ) -> QueryRebuildBuilder {
        QueryRebuildBuilder {
            pool,
            into,
            key,
            query: query.into(),
            batch: DEFAULT_QUERY_BATCH,
            visibility: Visibility::InSnapshot,
            visibility_wait: Duration::from_secs(2),
            source: None,
            whole_timeout: Some(DEFAULT_WHOLE_TIMEOUT),
            lock_timeout: None,
        }
    }

    /// The statement each batch runs (with a separate source: the write).
    pub fn statement(&self) -> &str {
        &self.statement
    }

    /// Rebuilds `due` (as [`Rebuild::rebuild`] does), with the typed error.
    pub async fn run(&self, due: &[Due]) -> Result<(), PgError> {
        match &self.inner {
            Inner::Same(r) => r.run(due).await,
            Inner::Across(a) => a.run(due).await,
        }
    }
}

impl Rebuild for QueryRebuild {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        match &self.inner {
            Inner::Same(r) => r.rebuild(due),
            Inner::Across(a) => Box::pin(async move { a.run(due).await.map_err(Into::into) }),
        }
    }

    fn classify(&self, error: &BoxError) -> Retry {
        error
            .downcast_ref::<PgError>()
            .map_or(Retry::Key, PgError::retry)
    }

    fn max_batch(&self) -> usize {
        match &self.inner {
            Inner::Same(r) => r.max_batch(),
            Inner::Across(a) => a.batch,
        }
    }

    /// In the target database the merge grows like any batch-mode rebuild; across
    /// databases the rows travel through freshen, so a call keeps its batch.
    fn bulk_batch(&self) -> usize {
        match &self.inner {
            Inner::Same(r) => r.bulk_batch(),
            Inner::Across(a) => a.batch,
        }
    }

    /// A plain query in the target database recomputes the whole table at once
    /// (`PgWhole`); across databases its rows would travel through freshen, so a
    /// view there stays key by key.
    fn whole(&self) -> Option<Arc<dyn Whole>> {
        self.whole.clone().map(|w| w as Arc<dyn Whole>)
    }
}

/// What [`plan_across`] writes.
pub(crate) struct AcrossPlan {
    pub(crate) fetch: String,
    pub(crate) write: String,
    pub(crate) key_types: Vec<tokio_postgres::types::Type>,
}

/// [`plan`] for a query that runs on `source` and writes into `into` on `target`: the
/// query's output is compared with the target table in the target database (names, key,
/// required columns, unique key, and that each type can be assigned there), and the
/// write is prepared on the target.
pub(crate) async fn plan_across(
    source: &Client,
    target: &Client,
    into: &TableName,
    key: &[String],
    query: &str,
) -> Result<Result<AcrossPlan, Vec<String>>, PgError> {
    let mut found = Vec::new();
    let stmt = match source.prepare(query).await {
        Ok(s) => s,
        Err(e) => {
            found.push(format!(
                "the query does not prepare on the source: {}",
                db_message(&e)
            ));
            return Ok(Err(found));
        }
    };
    let key_types = match crate::target::across::array_elements(stmt.params()) {
        Some(t) if t.len() == key.len() => t,
        _ => {
            found.push(params_problem(key, stmt.params()));
            Vec::new()
        }
    };
    let Some(columns) = target_columns(target, into).await? else {
        found.push(format!(
            "the target table {into} does not exist in the target database"
        ));
        return Ok(Err(found));
    };
    let output: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let names: Vec<String> = columns.iter().map(|t| t.name.clone()).collect();
    found.extend(column_problems(key, &output, &names));
    for t in &columns {
        if t.required && !output.contains(&t.name) {
            found.push(format!(
                "{into}.{} is NOT NULL without a default, and the query does not return it",
                t.name
            ));
        }
    }
    if key.iter().all(|k| names.contains(k)) && !unique_on(target, into, key).await? {
        found.push(format!(
            "{into} has no primary key or unique index on ({}) in the target database: a key must have one row",
            key.join(", ")
        ));
    }
    for c in stmt.columns() {
        let Some(t) = columns.iter().find(|t| t.name == c.name()) else {
            continue;
        };
        if !crate::target::across::fits(target, c.type_(), t.type_oid).await? {
            found.push(format!(
                "column `{}`: the query returns {} on the source, which the target's {into}.{} ({}) does not take",
                c.name(),
                c.type_().name(),
                c.name(),
                t.type_name
            ));
        }
    }
    if !found.is_empty() {
        return Ok(Err(found));
    }
    let shape: Vec<crate::target::across::Column> = columns
        .iter()
        .map(|t| crate::target::across::Column {
            name: t.name.clone(),
            type_name: t.type_name.clone(),
        })
        .collect();
    let (fetch, write) = crate::target::across::statements(into, key, query, &output, &shape);
    if let Err(e) = source.prepare(&fetch).await {
        found.push(format!(
            "the query's rows cannot be read as text: {}",
            db_message(&e)
        ));
    }
    if let Err(e) = target.prepare(&write).await {
        found.push(format!(
            "the statement written into the target does not prepare: {}",
            db_message(&e)
        ));
    }
    if !found.is_empty() {
        return Ok(Err(found));
    }
    Ok(Ok(AcrossPlan {
        fetch,
        write,
        key_types,
    }))
}

/// The query does not take its batch as one array per key part.
fn params_problem(key: &[String], params: &[tokio_postgres::types::Type]) -> String {
    let example: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ANY(${})", quote_ident(k), i + 1))
        .collect();
    let got: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${} is {}", i + 1, t.name()))
        .collect();
    format!(
        "the query must select its batch of keys with one array per key part ({}): {}",
        example.join(" AND "),
        if got.is_empty() {
            "it takes no parameters".to_string()
        } else {
            got.join(", ")
        }
    )
}

/// A column of the target table as the merge needs it.
struct TargetColumn {
    name: String,
    type_name: String,
    /// NOT NULL without a default: an insert must give it.
    required: bool,
    /// The column's type.
    type_oid: u32,
}

/// Checks `query` against `into` and writes the merge statement: `Ok(Ok(sql))`, or
/// `Ok(Err(problems))` listing every mismatch; `Err` when the database could not be
/// asked.
pub(crate) async fn plan(
    c: &Client,
    into: &TableName,
    key: &[String],
    query: &str,
) -> Result<Result<String, Vec<String>>, PgError> {
    let mut found = Vec::new();
    let stmt = match c.prepare(query).await {
        Ok(s) => s,
        Err(e) => {
            found.push(format!("the query does not prepare: {}", db_message(&e)));
            return Ok(Err(found));
        }
    };
    let params = stmt.params();
    if params.len() != key.len() || params.iter().any(|t| !matches!(t.kind(), Kind::Array(_))) {
        found.push(params_problem(key, params));
    }
    let target = match target_columns(c, into).await? {
        Some(t) => t,
        None => {
            found.push(format!("the target table {into} does not exist"));
            return Ok(Err(found));
        }
    };
    let output: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let names: Vec<String> = target.iter().map(|t| t.name.clone()).collect();
    found.extend(column_problems(key, &output, &names));
    for t in &target {
        if t.required && !output.contains(&t.name) {
            found.push(format!(
                "{into}.{} is NOT NULL without a default, and the query does not return it",
                t.name
            ));
        }
    }
    if key.iter().all(|k| names.contains(k)) && !unique_on(c, into, key).await? {
        found.push(format!(
            "{into} has no primary key or unique index on ({}): a key must have one row (and the index is how each batch finds its rows)",
            key.join(", ")
        ));
    }
    // Each shared column, written and compared the way the statement will, so that
    // every type mismatch is reported (a whole statement stops at its first).
    for (col, ty) in stmt.columns().iter().map(|c| (c.name(), c.type_())) {
        let Some(t) = target.iter().find(|t| t.name == col) else {
            continue;
        };
        let c_ = quote_ident(col);
        let compare = if key.iter().any(|k| k == col) {
            format!("t.{c_} = q.{c_}")
        } else {
            format!("ROW(t.{c_}) IS DISTINCT FROM ROW(q.{c_})")
        };
        let probe = format!(
            "WITH q AS ({query}\n) UPDATE {} AS t SET {c_} = q.{c_} FROM q WHERE {compare}",
            into.quoted()
        );
        if let Err(e) = c.prepare(&probe).await {
            found.push(format!(
                "column `{col}`: the query returns {}, which does not fit {into}.{col} ({}): {}",
                ty.name(),
                t.type_name,
                db_message(&e)
            ));
        }
    }
    if !found.is_empty() {
        return Ok(Err(found));
    }
    let values: Vec<String> = output.into_iter().filter(|c| !key.contains(c)).collect();
    let sql = Merge {
        into,
        key,
        values: &values,
        key_types: None,
    }
    .statement(query);
    if let Err(e) = c.prepare(&sql).await {
        found.push(format!(
            "the statement written from the query does not prepare: {}",
            db_message(&e)
        ));
        return Ok(Err(found));
    }
    Ok(Ok(sql))
}

/// `into`'s columns; `None` when it does not exist.
async fn target_columns(
    c: &Client,
    into: &TableName,
) -> Result<Option<Vec<TargetColumn>>, PgError> {
    let rows = c
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    a.attnotnull AND NOT a.atthasdef AND a.attidentity = '', a.atttypid \
             FROM pg_attribute a JOIN pg_class r ON r.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE n.nspname = $1 AND r.relname = $2 AND r.relkind IN ('r', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&into.schema, &into.name],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot read the columns of {into}"), e))?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .map(|r| TargetColumn {
                name: r.get(0),
                type_name: r.get(1),
                required: r.get(2),
                type_oid: r.get(3),
            })
            .collect(),
    ))
}

/// An index as the rebuild advice reads it.
#[derive(Debug, Clone)]
pub(crate) struct IndexInfo {
    /// Its name.
    pub(crate) name: String,
    /// Unique, not partial, no expressions.
    pub(crate) plain_unique: bool,
    /// Its key columns in order (expressions left out).
    pub(crate) key: Vec<String>,
    /// How many key columns it has (expressions included).
    pub(crate) key_count: usize,
    /// Whether the table was last CLUSTERed on it.
    pub(crate) clustered: bool,
    /// Its INCLUDE columns.
    pub(crate) include: Vec<String>,
    /// Whether it is the table's primary key.
    pub(crate) primary: bool,
}

impl IndexInfo {
    /// Whether its leading key columns are `key`, in any order.
    pub(crate) fn leads_with(&self, key: &[String]) -> bool {
        self.key.len() >= key.len()
            && self.key_count >= key.len()
            && key.iter().all(|k| self.key[..key.len()].contains(k))
    }
}

/// The indexes of `table` (none when it does not exist).
pub(crate) async fn indexes(c: &Client, table: &TableName) -> Result<Vec<IndexInfo>, PgError> {
    let rows = c
        .query(
            "SELECT i.indexrelid::regclass::text, \
                    i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL, \
                    ARRAY(SELECT a.attname::text FROM generate_series(0, i.indnkeyatts - 1) s \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[s] ORDER BY s), \
                    i.indnkeyatts::int4, i.indisclustered, \
                    ARRAY(SELECT a.attname::text FROM generate_series(i.indnkeyatts, i.indnatts - 1) s \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[s] ORDER BY s), \
                    i.indisprimary \
             FROM pg_index i JOIN pg_class r ON r.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE n.nspname = $1 AND r.relname = $2 AND i.indisvalid",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot read the indexes of {table}"), e))?;
    Ok(rows
        .iter()
        .map(|r| IndexInfo {
            name: r.get(0),
            plain_unique: r.get(1),
            key: r.get(2),
            key_count: usize::try_from(r.get::<_, i32>(3)).unwrap_or(0),
            clustered: r.get(4),
            include: r.get(5),
            primary: r.get(6),
        })
        .collect())
}

/// Whether `into` has a primary key or a unique index (not partial, no expressions)
/// whose columns are exactly `key`.
async fn unique_on(c: &Client, into: &TableName, key: &[String]) -> Result<bool, PgError> {
    Ok(indexes(c, into)
        .await?
        .iter()
        .any(|i| i.plain_unique && i.key_count == key.len() && i.leads_with(key)))
}
