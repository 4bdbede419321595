//! Where rebuild and reconcile SQL runs: a PostgreSQL or a MySQL/MariaDB database,
//! told apart by the URL's scheme. The statements are written the same way for both
//! (`$1`, `$2`, … for the key's parts).

use anyhow::Context;
use freshen::plug::Finding;
use freshen::{Enumerate, Expand, Rebuild};
use freshen_postgres::{
    DEFAULT_QUERY_BATCH, PgAdmin, QueryRebuild, SqlEnumerate, SqlFanOut, SqlRebuild, TableName,
    Visibility,
};

use crate::config::{Config, View};

/// The database family a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` (MySQL and MariaDB).
    MySql,
}

impl Flavor {
    /// The family of `url`, from its scheme; `None` for anything else.
    pub fn of(url: &str) -> Option<Flavor> {
        let scheme = url.split_once("://")?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Some(Flavor::Postgres),
            "mysql" | "mariadb" => Some(Flavor::MySql),
            _ => None,
        }
    }
}

/// A target: where to connect, and how rebuilds there prove they see their changes.
/// Each view gets a pool of its own ([`Target::view`]).
#[derive(Clone)]
pub enum Target {
    /// A PostgreSQL database; and the source database when it is another PostgreSQL
    /// database (query-mode views read it and write here).
    Postgres(
        freshen_postgres::ConnectionConfig,
        Visibility,
        Option<Box<freshen_postgres::ConnectionConfig>>,
    ),
    /// A MySQL/MariaDB database (its URL), and whether it is the source server (so
    /// rebuilds can wait for the dirtying transactions to be visible).
    #[cfg(feature = "mysql")]
    MySql(String, bool),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Postgres(..) => "Target::Postgres",
            #[cfg(feature = "mysql")]
            Target::MySql(..) => "Target::MySql",
        })
    }
}

/// One view's connections to the target.
#[derive(Clone)]
pub enum ViewPool {
    /// To PostgreSQL; with a pool to the source database for a query-mode view whose
    /// source is another PostgreSQL database.
    Postgres(
        freshen_postgres::Pool,
        Visibility,
        Option<freshen_postgres::Pool>,
    ),
    /// To MySQL/MariaDB.
    #[cfg(feature = "mysql")]
    MySql(mysql_async::Pool, bool),
}

impl std::fmt::Debug for ViewPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ViewPool")
    }
}

/// How many connections `view` opens: one per worker and one for its sweep, so its
/// rebuilds never wait for a connection another view holds.
fn pool_size(view: &View, cap: Option<usize>) -> usize {
    let want = view.timing.workers + usize::from(view.reconcile.is_some());
    cap.map_or(want, |c| want.min(c)).max(1)
}

impl Target {
    /// Resolves `cfg`'s target and decides how rebuilds prove visibility.
    pub async fn connect(cfg: &Config) -> anyhow::Result<Target> {
        let url = cfg.target.url.expose();
        let source_url = cfg.source.database_url();
        match Flavor::of(url) {
            Some(Flavor::Postgres) => {
                let conn = freshen_postgres::ConnectionConfig::from_url(url)
                    .context("the target URL is not usable")?;
                let probe = freshen_postgres::connect_pool(&conn, 1)
                    .context("cannot set up the target connection pool")?;
                let visibility = postgres_visibility(source_url, url, &probe).await?;
                let source = match source_url
                    .filter(|s| *s != url && Flavor::of(s) == Some(Flavor::Postgres))
                {
                    Some(s) => Some(Box::new(
                        freshen_postgres::ConnectionConfig::from_url(s)
                            .context("the source URL is not usable")?,
                    )),
                    None => None,
                };
                Ok(Target::Postgres(conn, visibility, source))
            }
            #[cfg(feature = "mysql")]
            Some(Flavor::MySql) => {
                // Positions are the source server's: only there can a rebuild wait for
                // them.
                let same = source_url == Some(url);
                Ok(Target::MySql(url.to_owned(), same))
            }
            #[cfg(not(feature = "mysql"))]
            Some(Flavor::MySql) => {
                anyhow::bail!(
                    "a MySQL target is not built into this freshen: build it with `--features mysql`"
                )
            }
            None => anyhow::bail!("the target URL must be postgres:// or mysql://"),
        }
    }

    /// A pool for `view` alone (connections open lazily), its statements cancelled by
    /// the server past the view's `statement_timeout`.
    pub fn view(&self, view: &View, cap: Option<usize>) -> anyhow::Result<ViewPool> {
        let size = pool_size(view, cap);
        Ok(match self {
            Target::Postgres(conn, visibility, source) => {
                let pool_for = |c: &freshen_postgres::ConnectionConfig, what: &str| {
                    let mut c = c.clone();
                    c.statement_timeout = view.timing.statement_timeout;
                    c.application_name = format!("freshen {}", view.name);
                    freshen_postgres::connect_pool(&c, size)
                        .with_context(|| format!("cannot set up the {what} connection pool"))
                };
                let pool = pool_for(conn, "target")?;
                // Query mode reads where the view's tables are.
                let source = match source.as_ref().filter(|_| view.query.is_some()) {
                    Some(s) => Some(pool_for(s, "source")?),
                    None => None,
                };
                ViewPool::Postgres(pool, visibility.clone(), source)
            }
            #[cfg(feature = "mysql")]
            Target::MySql(url, same) => ViewPool::MySql(
                freshen_mysql::connect_pool_limited(url, size, view.timing.statement_timeout)
                    .context("cannot set up the target connection pool")?,
                *same,
            ),
        })
    }
}

impl ViewPool {
    /// The view's rebuild, its statements prepared.
    pub async fn rebuild(&self, view: &View) -> anyhow::Result<Box<dyn Rebuild>> {
        let what = || format!("view {}: the rebuild statements are not usable", view.name);
        Ok(match self {
            ViewPool::Postgres(pool, visibility, source) if view.query.is_some() => {
                let (into, key, query) = query_parts(view);
                let mut b = QueryRebuild::builder(pool.clone(), into, key, query)
                    .batch(view.rebuild_batch.unwrap_or(DEFAULT_QUERY_BATCH))
                    .visibility(visibility.clone());
                if let Some(source) = source {
                    b = b.read_from(source.clone());
                }
                let rebuild = b
                    .build()
                    .await
                    .with_context(|| format!("view {}: the query cannot rebuild it", view.name))?;
                tracing::debug!(view = %view.name, statement = rebuild.statement(), "query mode");
                Box::new(rebuild)
            }
            ViewPool::Postgres(pool, visibility, _) => {
                let mut b = SqlRebuild::builder(pool.clone())
                    .statements(view.rebuild.iter().cloned())
                    .visibility(visibility.clone())
                    .keys_per_transaction(view.keys_per_transaction);
                if let Some(n) = view.rebuild_batch {
                    b = b.batch(n);
                }
                Box::new(b.build().await.with_context(what)?)
            }
            #[cfg(feature = "mysql")]
            ViewPool::MySql(pool, same) => {
                if view.query.is_some() {
                    anyhow::bail!(
                        "view {}: `query` writes with PostgreSQL statements; on MySQL/MariaDB use `rebuild` statements",
                        view.name
                    );
                }
                if view.rebuild_batch.is_some() {
                    anyhow::bail!(
                        "view {}: rebuild_batch (keys as arrays) is PostgreSQL's; on MySQL use keys_per_transaction",
                        view.name
                    );
                }
                let w = view.direct().next().context("a view watches a table")?;
                let types = freshen_mysql::key_types_of(pool, &w.schema, &w.table, &w.key)
                    .await
                    .with_context(what)?;
                let b = freshen_mysql::MySqlRebuild::builder(pool.clone())
                    .statements(view.rebuild.iter().cloned())
                    .key_types(types)
                    .keys_per_transaction(view.keys_per_transaction)
                    .check_visibility(*same);
                Box::new(b.build().await.with_context(what)?)
            }
        })
    }

    /// The view's fan-outs, one per watch entry with `keys`, their statements prepared.
    pub async fn fanouts(&self, view: &View) -> anyhow::Result<Vec<Box<dyn Expand>>> {
        let mut out: Vec<Box<dyn Expand>> = Vec::new();
        for w in view.fanouts() {
            let what = || {
                format!(
                    "view {}: the `keys` statement of {} is not usable",
                    view.name,
                    w.qualified()
                )
            };
            match self {
                ViewPool::Postgres(pool, visibility, _) => {
                    let sql = w.keys.clone().unwrap_or_default();
                    let fanout = SqlFanOut::builder(pool.clone(), sql)
                        .arity(view.arity())
                        .parent_arity(w.key.len())
                        .visibility(visibility.clone())
                        .build()
                        .await
                        .with_context(what)?;
                    out.push(Box::new(fanout));
                }
                #[cfg(feature = "mysql")]
                ViewPool::MySql(pool, same) => {
                    let sql = w.keys.clone().unwrap_or_default();
                    let types = freshen_mysql::key_types_of(pool, &w.schema, &w.table, &w.key)
                        .await
                        .with_context(what)?;
                    let fanout = freshen_mysql::MySqlFanOut::new(
                        pool.clone(),
                        &sql,
                        types,
                        view.arity(),
                        *same,
                    )
                    .await
                    .with_context(what)?;
                    out.push(Box::new(fanout));
                }
            }
        }
        Ok(out)
    }

    /// The view's reconcile listing.
    pub fn enumerate(&self, sql: &str) -> Box<dyn Enumerate> {
        match self {
            ViewPool::Postgres(pool, _, _) => Box::new(SqlEnumerate::new(pool.clone(), sql)),
            #[cfg(feature = "mysql")]
            ViewPool::MySql(pool, _) => {
                Box::new(freshen_mysql::MySqlEnumerate::new(pool.clone(), sql))
            }
        }
    }

    /// What `check` finds about the view's statements.
    pub async fn check(&self, view: &View) -> Vec<Finding> {
        match self {
            ViewPool::Postgres(pool, _, source) => {
                let key: Vec<String> = view
                    .direct()
                    .next()
                    .map(|w| w.key.clone())
                    .unwrap_or_default();
                let statements = match &view.query {
                    Some(q) => vec![q.query.clone()],
                    None => view.rebuild.clone(),
                };
                let shape = freshen_postgres::check::StatementShape {
                    view: &view.name,
                    arity: view.arity(),
                    key_columns: &key,
                    batch: view.rebuild_batch.is_some(),
                };
                let reconcile = view.reconcile.as_ref().map(|r| r.keys.as_str());
                // A query with a separate source reads there; the sweep lists the target.
                let reads = source.as_ref().unwrap_or(pool);
                let mut found = if source.is_some() {
                    let mut f =
                        freshen_postgres::check::statements(reads, shape, &statements, None).await;
                    f.extend(
                        freshen_postgres::check::statements(pool, shape, &[], reconcile).await,
                    );
                    f
                } else {
                    freshen_postgres::check::statements(pool, shape, &statements, reconcile).await
                };
                match pool.get().await {
                    Ok(client) => match source {
                        None => {
                            found.extend(
                                freshen_postgres::check::check_view(&client, &view_spec(view))
                                    .await,
                            );
                            if view.query.is_some() {
                                found.extend(
                                    freshen_postgres::check::query_view(&client, &query_spec(view))
                                        .await,
                                );
                            }
                        }
                        Some(source) => match source.get().await {
                            Ok(read) => {
                                found.extend(
                                    freshen_postgres::check::check_view(&read, &view_spec(view))
                                        .await,
                                );
                                found.extend(
                                    freshen_postgres::check::query_view_across(
                                        &read,
                                        &client,
                                        &query_spec(view),
                                    )
                                    .await,
                                );
                            }
                            Err(e) => found.push(Finding::error(
                                "source",
                                view.name.clone(),
                                format!("cannot connect: {e}"),
                            )),
                        },
                    },
                    Err(e) => found.push(Finding::error(
                        "target",
                        view.name.clone(),
                        format!("cannot connect: {e}"),
                    )),
                }
                found
            }
            #[cfg(feature = "mysql")]
            ViewPool::MySql(pool, _) => {
                let mut all = view.rebuild.clone();
                if let Some(r) = &view.reconcile {
                    all.push(r.keys.clone());
                }
                all.extend(view.fanouts().filter_map(|w| w.keys.clone()));
                let subject = format!("view {}", view.name);
                let mut found = freshen_mysql::check_statements(pool, &subject, &all).await;
                if found.is_empty() {
                    found.push(Finding::ok(
                        "statement",
                        subject,
                        format!("{} statement(s) prepare", all.len()),
                    ));
                }
                found
            }
        }
    }
}

/// A view as freshen-postgres' checks take it.
fn view_spec(view: &View) -> freshen_postgres::check::ViewSpec<'_> {
    freshen_postgres::check::ViewSpec {
        name: &view.name,
        watch: view
            .watch
            .iter()
            .map(|w| freshen_postgres::check::WatchSpec {
                table: TableName::new(&w.schema, &w.table),
                key: &w.key,
                keys: w.keys.as_deref(),
            })
            .collect(),
        rebuild: match &view.query {
            Some(q) => vec![q.query.as_str()],
            None => view.rebuild.iter().map(String::as_str).collect(),
        },
        batch: view.rebuild_batch.is_some(),
        static_tables: view
            .static_tables
            .iter()
            .map(|(s, t)| TableName::new(s, t))
            .collect(),
        reconcile: view.reconcile.is_some(),
    }
}

/// A query-mode view's target table, key columns (the view's key as its first watch
/// carrying it names them) and query.
fn query_parts(view: &View) -> (TableName, Vec<String>, String) {
    let q = view.query.as_ref().expect("a query-mode view");
    let key = view
        .direct()
        .next()
        .map(|w| w.key.clone())
        .unwrap_or_default();
    (TableName::new(&q.into.0, &q.into.1), key, q.query.clone())
}

/// A query-mode view as freshen-postgres' check takes it.
fn query_spec(view: &View) -> freshen_postgres::check::QuerySpec<'_> {
    let q = view.query.as_ref().expect("a query-mode view");
    freshen_postgres::check::QuerySpec {
        view: &view.name,
        into: TableName::new(&q.into.0, &q.into.1),
        key: view.direct().next().map_or(&[], |w| w.key.as_slice()),
        query: &q.query,
        batch: view.rebuild_batch.unwrap_or(DEFAULT_QUERY_BATCH),
        sources: view
            .direct()
            .map(|w| (TableName::new(&w.schema, &w.table), w.key.as_slice()))
            .collect(),
    }
}

/// How PostgreSQL rebuilds prove they see the changes that dirtied their keys:
/// transaction ids are the source cluster's, so they are checked in the rebuild's
/// snapshot only where the target is that cluster (or a physical standby of it: same
/// system identifier), and on the source otherwise. Broker sources and MySQL carry no
/// ids of the target's.
async fn postgres_visibility(
    source: Option<&str>,
    target: &str,
    pool: &freshen_postgres::Pool,
) -> anyhow::Result<Visibility> {
    let Some(source) = source.filter(|s| Flavor::of(s) == Some(Flavor::Postgres)) else {
        return Ok(Visibility::Off);
    };
    if source == target {
        return Ok(Visibility::InSnapshot);
    }
    let conn = freshen_postgres::ConnectionConfig::from_url(source)
        .context("the source URL is not usable")?;
    let source_pool = freshen_postgres::connect_pool(&conn, 2)
        .context("cannot set up the source connection pool")?;
    let (a, b) = (
        PgAdmin::from_pool(source_pool.clone())
            .system_identifier()
            .await,
        PgAdmin::from_pool(pool.clone()).system_identifier().await,
    );
    Ok(match (a, b) {
        (Ok(a), Ok(b)) if a == b => Visibility::InSnapshot,
        (a, b) => {
            tracing::info!(
                same_cluster = false,
                source = ?a.ok(),
                target = ?b.ok(),
                "the target is another cluster: rebuilds check on the source that the changes are visible before they run"
            );
            Visibility::OnSource(source_pool)
        }
    })
}
