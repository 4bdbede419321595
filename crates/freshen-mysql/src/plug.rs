//! The MySQL/MariaDB binlog source as the `freshen` binary plugs it in.

use std::sync::Arc;

use freshen::plug::{Finding, Lease, Plan, SourcePlug, Started};
use freshen::{BoxError, BoxFuture};

use crate::config::TablePattern;
use crate::{MySqlSource, MySqlSourceConfig, check_source};

impl MySqlSourceConfig {
    /// This configuration with the plan's tables added to an explicit table list (an
    /// empty list already means every table).
    fn for_plan(&self, plan: &Plan) -> MySqlSourceConfig {
        let mut config = self.clone();
        if !config.tables.is_empty() {
            for (database, table) in &plan.tables {
                let covered = config
                    .tables
                    .iter()
                    .filter_map(|t| TablePattern::parse(t).ok())
                    .any(|p| p.matches(database, table));
                if !covered {
                    config.tables.push(format!("{database}.{table}"));
                }
            }
        }
        config
    }
}

impl SourcePlug for MySqlSourceConfig {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    fn problems(&self) -> Vec<String> {
        MySqlSourceConfig::problems(self)
    }

    fn tables(&self) -> Vec<(String, String)> {
        self.tables
            .iter()
            .filter_map(|t| TablePattern::parse(t).ok())
            .filter_map(|p| Some((p.database, p.table?)))
            .collect()
    }

    fn database_url(&self) -> Option<&str> {
        Some(self.url.expose())
    }

    fn naming(&self) -> freshen::plug::Naming {
        crate::incremental::url_naming(self.url.expose())
    }

    fn capabilities(&self) -> freshen::Capabilities {
        crate::source::capabilities()
    }

    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(async move {
            let mut found = check_source(&self.for_plan(plan)).await;
            if !found.iter().any(|f| f.level == freshen::plug::Level::Error) {
                found.push(Finding::ok(
                    "source",
                    self.url.redacted(),
                    "binlog settings, grants and the stored position are usable",
                ));
            }
            found
        })
    }

    /// A named server lock (`GET_LOCK`) keyed by the source's name
    /// ([`Leadership`](crate::Leadership)).
    fn lead(&self) -> BoxFuture<'_, Result<Lease, BoxError>> {
        Box::pin(async move {
            Ok(
                match crate::Leadership::try_acquire(self.url.expose(), &self.name).await? {
                    crate::Attempt::Leader(mut l) => {
                        Lease::Granted(Box::pin(async move { BoxError::from(l.lost().await) }))
                    }
                    crate::Attempt::Held(holder) => Lease::Held(match holder {
                        Some(h) => h.to_string(),
                        None => "another process".to_owned(),
                    }),
                },
            )
        })
    }

    fn start<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>> {
        Box::pin(async move {
            let source = MySqlSource::start(self.for_plan(plan)).await?;
            let probe = Arc::new(source.handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}
