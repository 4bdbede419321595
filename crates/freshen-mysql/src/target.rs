//! MySQL/MariaDB as a target ([`freshen::plug::TargetPlug`]): where hand-written
//! rebuild, fan-out and reconcile statements run. Positions are the source server's, so
//! only there can a rebuild wait for the transactions that dirtied its key.

use freshen::plug::{Finding, Target, TargetError, TargetPlug, ViewSpec, ViewTarget};
use freshen::{BoxError, BoxFuture, Enumerate, Expand, Rebuild, SecretUrl};

use crate::{
    MySqlEnumerate, MySqlFanOut, MySqlRebuild, Pool, check_statements, connect_pool_limited,
    key_types_of, url_problems,
};

/// A MySQL/MariaDB target, parsed from its URL.
#[derive(Debug, Clone)]
pub struct MySqlTarget {
    url: SecretUrl,
}

impl TargetPlug for MySqlTarget {
    fn open(url: &str) -> Result<Self, Vec<String>> {
        let problems = url_problems(url);
        if problems.is_empty() {
            Ok(MySqlTarget {
                url: SecretUrl::new(url),
            })
        } else {
            Err(problems)
        }
    }

    fn naming(&self) -> freshen::plug::Naming {
        crate::incremental::url_naming(self.url.expose())
    }

    fn name(&self) -> &'static str {
        "MySQL/MariaDB"
    }

    fn view_problems(&self, view: &ViewSpec, _source_url: Option<&str>) -> Vec<String> {
        if view.query.is_some() {
            // Without `watch` the file relied on inference, which reads PostgreSQL's plans.
            let watch = if view.watch.is_empty() {
                " with their `watch` entries (freshen infers what a view watches only on PostgreSQL)"
            } else {
                ""
            };
            return vec![format!(
                "view `{}`: `query` writes with PostgreSQL statements; on a MySQL/MariaDB target write hand-written `rebuild` statements{watch}",
                view.name
            )];
        }
        Vec::new()
    }

    fn connect<'a>(
        &'a self,
        source_url: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Box<dyn Target>, BoxError>> {
        let same = source_url == Some(self.url.expose());
        Box::pin(async move {
            Ok(Box::new(MySqlConnected {
                url: self.url.clone(),
                same,
            }) as Box<dyn Target>)
        })
    }
}

/// A MySQL/MariaDB target, and whether it is the source server.
struct MySqlConnected {
    url: SecretUrl,
    same: bool,
}

impl Target for MySqlConnected {
    fn gap_ledger(&self) -> Option<std::sync::Arc<dyn freshen::plug::GapLedger>> {
        // Its own connection: a gap is recorded while the views' pools are busy.
        let pool = crate::connect_pool(self.url.expose(), 1).ok()?;
        Some(std::sync::Arc::new(crate::MySqlGapLedger::new(pool)))
    }

    fn view(&self, view: &ViewSpec) -> Result<Box<dyn ViewTarget>, BoxError> {
        let pool =
            connect_pool_limited(self.url.expose(), view.connections, view.statement_timeout)
                .map_err(|e| TargetError::new("cannot set up the target connection pool", e))?;
        Ok(Box::new(MySqlView {
            view: view.clone(),
            pool,
            same: self.same,
        }))
    }
}

/// One view's pool.
struct MySqlView {
    view: ViewSpec,
    pool: Pool,
    same: bool,
}

impl ViewTarget for MySqlView {
    fn rebuild(&self) -> BoxFuture<'_, Result<Box<dyn Rebuild>, BoxError>> {
        Box::pin(async move {
            let view = &self.view;
            if view.query.is_some() {
                return Err(format!(
                    "view {}: `query` writes with PostgreSQL statements; on MySQL/MariaDB use `rebuild` statements",
                    view.name
                )
                .into());
            }
            if view.rebuild_batch.is_some() {
                return Err(format!(
                    "view {}: rebuild_batch (keys as arrays) is PostgreSQL's; on MySQL use keys_per_transaction",
                    view.name
                )
                .into());
            }
            let what = || format!("view {}: the rebuild statements are not usable", view.name);
            let w = view
                .direct()
                .next()
                .ok_or_else(|| format!("view {}: a view watches a table", view.name))?;
            let types = key_types_of(&self.pool, &w.schema, &w.table, &w.key)
                .await
                .map_err(|e| TargetError::new(what(), e))?;
            let rebuild = MySqlRebuild::builder(self.pool.clone())
                .statements(view.rebuild.iter().cloned())
                .key_types(types)
                .keys_per_transaction(view.keys_per_transaction)
                .set_statements(view.rebuild_set.iter().cloned())
                .check_visibility(self.same)
                .build()
                .await
                .map_err(|e| TargetError::new(what(), e))?;
            Ok(Box::new(rebuild) as Box<dyn Rebuild>)
        })
    }

    fn fanouts(&self) -> BoxFuture<'_, Result<Vec<Box<dyn Expand>>, BoxError>> {
        Box::pin(async move {
            let view = &self.view;
            let mut out: Vec<Box<dyn Expand>> = Vec::new();
            for w in view.fanouts() {
                let what = || {
                    format!(
                        "view {}: the `keys` statement of {}.{} is not usable",
                        view.name, w.schema, w.table
                    )
                };
                let sql = w.keys.clone().unwrap_or_default();
                let types = key_types_of(&self.pool, &w.schema, &w.table, &w.key)
                    .await
                    .map_err(|e| TargetError::new(what(), e))?;
                let fanout =
                    MySqlFanOut::new(self.pool.clone(), &sql, types, view.arity(), self.same)
                        .await
                        .map_err(|e| TargetError::new(what(), e))?;
                out.push(Box::new(fanout));
            }
            Ok(out)
        })
    }

    fn enumerate(&self, sql: &str) -> Box<dyn Enumerate> {
        Box::new(MySqlEnumerate::new(self.pool.clone(), sql))
    }

    fn check(&self) -> BoxFuture<'_, Vec<Finding>> {
        Box::pin(async move {
            let view = &self.view;
            let mut all = view.rebuild.clone();
            all.extend(view.rebuild_set.iter().cloned());
            all.extend(view.reconcile.clone());
            all.extend(view.fanouts().filter_map(|w| w.keys.clone()));
            let subject = format!("view {}", view.name);
            let mut found = check_statements(&self.pool, &subject, &all).await;
            if found.is_empty() {
                found.push(Finding::ok(
                    "statement",
                    subject,
                    format!("{} statement(s) prepare", all.len()),
                ));
            }
            found
        })
    }
}
