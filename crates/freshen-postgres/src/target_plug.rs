//! PostgreSQL as a target ([`freshen::plug::TargetPlug`]): where rebuild, fan-out and
//! reconcile SQL runs, and how rebuilds there prove they see the changes that dirtied
//! their keys.
//!
//! It sits beside `target/`, `check/` and `infer/` rather than in one of them: it
//! assembles a view's rebuild (`target/`), its checks (`check/`) and its inferred watch
//! entries (`infer/`), while `check/` and `infer/` use `target/`'s query planning, so
//! no folder imports back into another.

use freshen::plug::{Finding, Target, TargetError, TargetPlug, ViewSpec, ViewTarget};
use freshen::{BoxError, BoxFuture, Enumerate, Expand, Rebuild};

use crate::{
    ConnectionConfig, DEFAULT_QUERY_BATCH, PgAdmin, Pool, QueryRebuild, SqlEnumerate, SqlFanOut,
    SqlRebuild, TableName, Visibility, connect_pool, url_problems,
};

/// Whether `url` names a PostgreSQL server (`postgres://`, `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
    })
}

/// A PostgreSQL target, parsed from its URL.
#[derive(Clone)]
pub struct PgTarget {
    /// As written: the source is this very database when its URL is the same.
    url: String,
    conn: ConnectionConfig,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: the parsed form redacts it.
        f.debug_struct("PgTarget")
            .field("conn", &self.conn)
            .finish()
    }
}

impl TargetPlug for PgTarget {
    fn open(url: &str) -> Result<Self, Vec<String>> {
        let problems = url_problems(url);
        if !problems.is_empty() {
            return Err(problems);
        }
        ConnectionConfig::from_url(url)
            .map(|conn| PgTarget {
                url: url.to_owned(),
                conn,
            })
            .map_err(|e| vec![e.to_string()])
    }

    fn naming(&self) -> freshen::plug::Naming {
        crate::naming()
    }

    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn view_problems(&self, view: &ViewSpec, source_url: Option<&str>) -> Vec<String> {
        // A query reads the source where it is another PostgreSQL database
        // (QueryRebuildBuilder::read_from); any other source it cannot read.
        if view.query.is_some() && source_url.is_some_and(|s| !is_postgres_url(s)) {
            return vec![format!(
                "view `{}`: `query` reads a PostgreSQL source; with this source it would run in the [target] database instead: use hand-written `rebuild` statements",
                view.name
            )];
        }
        Vec::new()
    }

    fn settled(&self, within: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(crate::cancels_settled(within))
    }

    fn connect<'a>(
        &'a self,
        source_url: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Box<dyn Target>, BoxError>> {
        Box::pin(async move {
            let probe = connect_pool(&self.conn, 1)
                .map_err(|e| TargetError::new("cannot set up the target connection pool", e))?;
            // Rebuilds write here: a standby (decoding on a standby with no [target], or
            // [target] on a standby) is refused now, not retried for ever. Unreachable:
            // judged when rebuilds connect.
            if let Ok(Some(why)) = PgAdmin::from_pool(probe.clone()).read_only().await {
                let hint = if source_url == Some(self.url.as_str()) {
                    "the source is a standby, and rebuilds write to the source's database when [target] is not set: set [target] url to the primary"
                } else {
                    "point [target] url at the primary"
                };
                return Err(TargetError::new(
                    format!("the target {} {why}", freshen::redact_url(&self.url)),
                    format!("rebuilds write there; {hint}"),
                )
                .into());
            }
            let visibility = visibility(source_url, &self.url, &probe).await?;
            let source = match source_url.filter(|s| *s != self.url && is_postgres_url(s)) {
                Some(s) => Some(
                    ConnectionConfig::from_url(s)
                        .map_err(|e| TargetError::new("the source URL is not usable", e))?,
                ),
                None => None,
            };
            Ok(Box::new(PgConnected {
                conn: self.conn.clone(),
                visibility,
                source,
            }) as Box<dyn Target>)
        })
    }
}

/// A connected PostgreSQL target; and the source database when it is another
/// PostgreSQL database (views rebuilt by `query` read it and write here).
struct PgConnected {
    conn: ConnectionConfig,
    visibility: Visibility,
    source: Option<ConnectionConfig>,
}

impl Target for PgConnected {
    fn gap_ledger(&self) -> Option<std::sync::Arc<dyn freshen::plug::GapLedger>> {
        // Its own connection: a gap is recorded while the views' pools are busy.
        let pool = connect_pool(&self.conn, 1).ok()?;
        Some(std::sync::Arc::new(crate::PgGapLedger::new(pool)))
    }

    fn view(&self, view: &ViewSpec) -> Result<Box<dyn ViewTarget>, BoxError> {
        let pool_for = |c: &ConnectionConfig, what: &str| {
            let mut c = c.clone();
            c.statement_timeout = view.statement_timeout;
            c.application_name = format!("freshen {}", view.name);
            connect_pool(&c, view.connections).map_err(|e| {
                TargetError::new(format!("cannot set up the {what} connection pool"), e)
            })
        };
        let pool = pool_for(&self.conn, "target")?;
        // A query reads where the view's tables are.
        let source = match self.source.as_ref().filter(|_| view.query.is_some()) {
            Some(s) => Some(pool_for(s, "source")?),
            None => None,
        };
        Ok(Box::new(PgView {
            view: view.clone(),
            pool,
            visibility: self.visibility.clone(),
            source,
        }))
    }

    fn infer<'a>(
        &'a self,
        view: &'a ViewSpec,
    ) -> BoxFuture<'a, Result<freshen::plug::Inferred, Vec<String>>> {
        Box::pin(async move {
            // The query reads the source where it is another PostgreSQL database.
            let conn = self.source.as_ref().unwrap_or(&self.conn);
            let cannot = |e: &dyn std::fmt::Display| {
                vec![format!(
                    "view `{}`: cannot connect to infer what it watches: {e}",
                    view.name
                )]
            };
            let pool = connect_pool(conn, 1).map_err(|e| cannot(&e))?;
            let client = pool.get().await.map_err(|e| cannot(&e))?;
            crate::infer::infer(&client, view).await
        })
    }

    fn starter<'a>(
        &'a self,
        view: &'a ViewSpec,
        inferred: &'a freshen::plug::Inferred,
        url_var: &'a str,
    ) -> BoxFuture<'a, Result<freshen::plug::Starter, Vec<String>>> {
        Box::pin(async move {
            let conn = self.source.as_ref().unwrap_or(&self.conn);
            let cannot = |e: &dyn std::fmt::Display| {
                vec![format!("view `{}`: cannot connect: {e}", view.name)]
            };
            let pool = connect_pool(conn, 1).map_err(|e| cannot(&e))?;
            // Read before the client is taken: the pool has one connection.
            let fixes = source_fixes(&PgAdmin::from_pool(pool.clone()), &inferred.watch).await?;
            let client = pool.get().await.map_err(|e| cannot(&e))?;
            crate::infer::starter(&client, view, inferred, url_var, fixes).await
        })
    }

    fn fix_source<'a>(
        &'a self,
        statements: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<String>, Vec<String>>> {
        Box::pin(async move {
            // The replica identity is the source's tables'.
            let conn = self.source.as_ref().unwrap_or(&self.conn);
            let cannot = |e: &dyn std::fmt::Display| vec![format!("cannot connect: {e}")];
            let pool = connect_pool(conn, 1).map_err(|e| cannot(&e))?;
            let client = pool.get().await.map_err(|e| cannot(&e))?;
            crate::infer::run_each(&client, statements).await
        })
    }

    fn import_matview<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<freshen::plug::Imported, Vec<String>>> {
        Box::pin(async move {
            // The materialized view is where the view's tables are.
            let conn = self.source.as_ref().unwrap_or(&self.conn);
            let cannot = |e: &dyn std::fmt::Display| vec![format!("{name}: cannot connect: {e}")];
            let pool = connect_pool(conn, 1).map_err(|e| cannot(&e))?;
            let client = pool.get().await.map_err(|e| cannot(&e))?;
            crate::infer::matview(&client, name).await
        })
    }

    fn create<'a>(
        &'a self,
        statements: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<String>, Vec<String>>> {
        Box::pin(async move {
            let cannot = |e: &dyn std::fmt::Display| vec![format!("cannot connect: {e}")];
            // The table goes into the target, the publication into the source.
            let (publication, table): (Vec<String>, Vec<String>) = statements
                .iter()
                .cloned()
                .partition(|s| s.starts_with("CREATE PUBLICATION"));
            let mut done = Vec::new();
            for (conn, statements) in [
                (&self.conn, table),
                (self.source.as_ref().unwrap_or(&self.conn), publication),
            ] {
                if statements.is_empty() {
                    continue;
                }
                let pool = connect_pool(conn, 1).map_err(|e| cannot(&e))?;
                let mut client = pool.get().await.map_err(|e| cannot(&e))?;
                done.extend(crate::infer::create(&mut client, &statements).await?);
            }
            Ok(done)
        })
    }
}

/// The replica identities `watched` needs that the tables lack, each as a fix in the
/// words `check` uses; a table whose catalog cannot be read is a problem.
async fn source_fixes(
    admin: &PgAdmin,
    watched: &[freshen::plug::Watched],
) -> Result<Vec<freshen::plug::SourceFix>, Vec<String>> {
    let mut fixes = Vec::new();
    let mut problems = Vec::new();
    for advice in crate::check::identity::advise_watched(admin, watched, false).await {
        match advice {
            Ok(a) if a.loses_changes() => fixes.push(freshen::plug::SourceFix {
                table: a.finding.subject,
                advice: a.finding.message,
                statements: a.recommendation.statements,
            }),
            Ok(_) => {}
            Err(f) => problems.push(format!("{}: {}", f.subject, f.message)),
        }
    }
    if problems.is_empty() {
        Ok(fixes)
    } else {
        Err(problems)
    }
}

/// One view's pools.
struct PgView {
    view: ViewSpec,
    pool: Pool,
    visibility: Visibility,
    source: Option<Pool>,
}

impl ViewTarget for PgView {
    fn rebuild(&self) -> BoxFuture<'_, Result<Box<dyn Rebuild>, BoxError>> {
        Box::pin(async move {
            let view = &self.view;
            if let Some(q) = &view.query {
                let into = TableName::new(&q.into.0, &q.into.1);
                let mut b = QueryRebuild::builder(
                    self.pool.clone(),
                    into,
                    view.key().to_vec(),
                    q.query.clone(),
                )
                .batch(view.rebuild_batch.unwrap_or(DEFAULT_QUERY_BATCH))
                .visibility(self.visibility.clone())
                .whole_timeouts(view.whole_timeout, view.statement_timeout);
                if let Some(source) = &self.source {
                    b = b.read_from(source.clone());
                }
                let rebuild = b.build().await.map_err(|e| {
                    TargetError::new(
                        format!("view {}: the query cannot rebuild it", view.name),
                        e,
                    )
                })?;
                tracing::debug!(view = %view.name, statement = rebuild.statement(), "query mode");
                return Ok(Box::new(rebuild) as Box<dyn Rebuild>);
            }
            let mut b = SqlRebuild::builder(self.pool.clone())
                .statements(view.rebuild.iter().cloned())
                .visibility(self.visibility.clone())
                .keys_per_transaction(view.keys_per_transaction)
                .set_statements(view.rebuild_set.iter().cloned());
            if let Some(n) = view.rebuild_batch {
                b = b.batch(n);
            }
            let rebuild = b.build().await.map_err(|e| {
                TargetError::new(
                    format!("view {}: the rebuild statements are not usable", view.name),
                    e,
                )
            })?;
            Ok(Box::new(rebuild) as Box<dyn Rebuild>)
        })
    }

    fn fanouts(&self) -> BoxFuture<'_, Result<Vec<Box<dyn Expand>>, BoxError>> {
        Box::pin(async move {
            let view = &self.view;
            let mut out: Vec<Box<dyn Expand>> = Vec::new();
            for w in view.fanouts() {
                let sql = w.keys.clone().unwrap_or_default();
                let fanout = SqlFanOut::builder(self.pool.clone(), sql)
                    .arity(view.arity())
                    .parent_arity(w.key.len())
                    .visibility(self.visibility.clone())
                    .build()
                    .await
                    .map_err(|e| {
                        TargetError::new(
                            format!(
                                "view {}: the `keys` statement of {}.{} is not usable",
                                view.name, w.schema, w.table
                            ),
                            e,
                        )
                    })?;
                out.push(Box::new(fanout));
            }
            Ok(out)
        })
    }

    fn enumerate(&self, sql: &str) -> Box<dyn Enumerate> {
        Box::new(SqlEnumerate::new(self.pool.clone(), sql))
    }

    fn check(&self) -> BoxFuture<'_, Vec<Finding>> {
        Box::pin(self.findings())
    }
}

impl PgView {
    async fn findings(&self) -> Vec<Finding> {
        let view = &self.view;
        let pool = &self.pool;
        let statements = match &view.query {
            Some(q) => vec![crate::target::keyed::batch_query(&q.query, view.key())],
            None => view.rebuild.clone(),
        };
        let shape = crate::check::StatementShape {
            view: &view.name,
            arity: view.arity(),
            key_columns: view.key(),
            batch: view.rebuild_batch.is_some(),
            list: "rebuild",
        };
        let set = crate::check::StatementShape {
            batch: true,
            list: "rebuild_set",
            ..shape
        };
        let reconcile = view.reconcile.as_deref();
        // A query with a separate source reads there; the sweep lists the target.
        let mut found = match &self.source {
            Some(source) => {
                let mut f = crate::check::statements(source, shape, &statements, None).await;
                f.extend(crate::check::statements(pool, shape, &[], reconcile).await);
                f
            }
            None => crate::check::statements(pool, shape, &statements, reconcile).await,
        };
        if !view.rebuild_set.is_empty() {
            found.extend(crate::check::statements(pool, set, &view.rebuild_set, None).await);
        }
        let client = match pool.get().await {
            Ok(c) => c,
            Err(e) => {
                found.push(Finding::error(
                    "target",
                    view.name.clone(),
                    format!("cannot connect: {e}"),
                ));
                return found;
            }
        };
        match &self.source {
            None => {
                found.extend(crate::check::check_view(&client, view).await);
                found.extend(crate::check::query_view(&client, view).await);
            }
            Some(source) => match source.get().await {
                Ok(read) => {
                    found.extend(crate::check::check_view(&read, view).await);
                    found.extend(crate::check::query_view_across(&read, &client, view).await);
                }
                Err(e) => found.push(Finding::error(
                    "source",
                    view.name.clone(),
                    format!("cannot connect: {e}"),
                )),
            },
        }
        found
    }
}

/// How rebuilds prove they see the changes that dirtied their keys: transaction ids
/// are the source cluster's, so they are checked in the rebuild's snapshot only where
/// the target is that cluster (or a physical standby of it: same system identifier),
/// and on the source otherwise. Broker sources and other databases carry no ids of the
/// target's.
async fn visibility(
    source: Option<&str>,
    target: &str,
    pool: &Pool,
) -> Result<Visibility, BoxError> {
    let Some(source) = source.filter(|s| is_postgres_url(s)) else {
        return Ok(Visibility::Off);
    };
    if source == target {
        return Ok(Visibility::InSnapshot);
    }
    let conn = ConnectionConfig::from_url(source)
        .map_err(|e| TargetError::new("the source URL is not usable", e))?;
    let source_pool = connect_pool(&conn, 2)
        .map_err(|e| TargetError::new("cannot set up the source connection pool", e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_by_scheme_alone() {
        assert!(is_postgres_url("postgres://u@h/db"));
        assert!(is_postgres_url("PostgreSQL://h/db"));
        assert!(!is_postgres_url("mysql://h/db"));
        assert!(!is_postgres_url("host=h dbname=db"));
    }
}
