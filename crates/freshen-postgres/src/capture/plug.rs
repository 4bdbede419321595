//! [`PgSourceSettings`] plugged into the `freshen` binary through
//! [`freshen::plug::SourcePlug`]: its problems, tables, capabilities, `check`,
//! leadership and start.

use std::sync::Arc;
use std::time::Duration;

use freshen::plug::{Finding, Lease, Plan, SourcePlug, Started};
use freshen::{BoxError, BoxFuture};

use crate::TableName;
use crate::capture::settings::{MAX_STREAM_MEMORY_MB, PgSourceSettings, valid_identifier};
use crate::config::{MAX_READ_GAP, MAX_STATUS_INTERVAL};
use crate::{PgAdmin, PgSource, PublicationDrop, TablePattern, check, url_problems};

impl SourcePlug for PgSourceSettings {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        // A URL holding an unexpanded `${VAR}` is reported by the reader as the
        // variable's problem; here it is judged as written.
        for problem in url_problems(self.url.expose()) {
            p.push(format!("url: {problem}"));
        }
        if let Some(primary) = &self.primary_url {
            for problem in url_problems(primary.expose()) {
                p.push(format!("primary_url: {problem}"));
            }
        }
        for (what, name) in [("slot", &self.slot), ("publication", &self.publication)] {
            if !valid_identifier(name) {
                p.push(format!(
                    "{what}: must be a lower-case identifier (letters, digits, _), not `{name}`"
                ));
            }
        }
        if self.status_interval.is_zero() || self.status_interval > MAX_STATUS_INTERVAL {
            p.push("status_interval: must be between 1ms and 1h".into());
        }
        if self.read_gap > MAX_READ_GAP {
            p.push("read_gap: must be at most 10ms".into());
        }
        if self.stream_memory_mb > MAX_STREAM_MEMORY_MB {
            p.push("stream_memory_mb: must be at most 65536 (64 GiB)".into());
        }
        if self.stall_after > Duration::from_secs(3600) {
            p.push("stall_after: must be at most 1h (0s turns the watch off)".into());
        }
        if self.discover_every < Duration::from_millis(10)
            || self.discover_every > Duration::from_secs(86_400)
        {
            p.push("discover_every: must be between 10ms and 24h".into());
        }
        for t in &self.tables {
            let problem = match TablePattern::parse(t) {
                Some(pattern) => pattern.err(),
                None => t.parse::<TableName>().err().map(|e| e.to_string()),
            };
            if let Some(e) = problem {
                p.push(format!(
                    "tables: {e} (\"schema.table\", \"table\", \"schema.*\", \"schema.prefix_*\" or \"all\")"
                ));
            }
        }
        p
    }

    fn tables(&self) -> Vec<(String, String)> {
        self.table_names()
            .into_iter()
            .map(|t| (t.schema, t.name))
            .collect()
    }

    fn database_url(&self) -> Option<&str> {
        Some(self.url.expose())
    }

    fn discovery(&self) -> Option<freshen::plug::Discovery> {
        let patterns: Vec<String> = self
            .tables
            .iter()
            .filter(|t| TablePattern::parse(t).is_some())
            .cloned()
            .collect();
        (!patterns.is_empty()).then_some(freshen::plug::Discovery {
            patterns,
            every: self.discover_every,
        })
    }

    fn naming(&self) -> freshen::plug::Naming {
        crate::naming()
    }

    fn capabilities(&self) -> freshen::Capabilities {
        crate::capture::source::capabilities(self.slot_mode.into())
    }

    fn drop_upstream(&self) -> BoxFuture<'_, Result<Vec<String>, BoxError>> {
        Box::pin(async move {
            let admin = PgAdmin::connect(&self.connection()?).await?;
            let slot = admin.drop_slot(&self.slot).await?;
            let publication = admin.drop_publication(&self.publication).await?;
            Ok(vec![
                format!(
                    "slot {}: {}",
                    self.slot,
                    if slot { "dropped" } else { "did not exist" }
                ),
                format!(
                    "publication {}: {}",
                    self.publication,
                    match publication {
                        PublicationDrop::Dropped => "dropped",
                        PublicationDrop::Kept => "kept (not created by freshen)",
                        PublicationDrop::Missing => "did not exist",
                    }
                ),
            ])
        })
    }

    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(check::source(self, plan))
    }

    /// An advisory lock keyed by the slot's name on the source database
    /// ([`Leadership`](crate::Leadership)).
    fn lead(&self) -> BoxFuture<'_, Result<Lease, BoxError>> {
        Box::pin(async move {
            let connection = self.connection()?;
            Ok(
                match crate::Leadership::try_acquire(&connection, &self.slot).await? {
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

    fn sink_snapshots(
        &self,
        spec: freshen::plug::SinkSnapshotSpec,
    ) -> Result<Option<Arc<dyn freshen::plug::SinkSnapshots>>, BoxError> {
        crate::snapshot::sink::plugged(self.url.expose(), spec).map(Some)
    }

    fn chunk_reader(&self) -> Result<Option<Arc<dyn freshen::plug::ChunkReader>>, BoxError> {
        let pool = crate::connect_pool(&self.connection()?, 1)
            .map_err(|e| format!("cannot set up the snapshot connection: {e}"))?;
        Ok(Some(Arc::new(crate::PgChunkReader::new(pool))))
    }

    fn columns<'a>(
        &'a self,
        tables: &'a [(String, String)],
    ) -> BoxFuture<'a, Option<Vec<freshen::plug::TableColumns>>> {
        Box::pin(async move {
            crate::catalog::column_names(self.url.expose(), tables)
                .await
                .ok()
        })
    }

    fn start<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>> {
        Box::pin(async move {
            let connection = self.connection()?;
            let admin = PgAdmin::connect(&connection).await?;
            // A weak replica identity works, with a weaker promise: said once, in the
            // words `check` and `init` use.
            for advice in
                crate::check::identity::advise_watched(&admin, &plan.watched, plan.changefeed).await
            {
                match advice {
                    Ok(a) if a.loses_changes() => {
                        tracing::warn!(table = %a.finding.subject, "{}", a.finding.message);
                    }
                    Ok(_) => {}
                    Err(f) => return Err(format!("{}: {}", f.subject, f.message).into()),
                }
            }
            let mut builder = PgSource::builder()
                .connection(connection)
                .slot(self.slot.clone(), self.slot_mode.into())
                .publication(self.publication.clone(), self.publication_mode.into())
                .status_interval(self.status_interval)
                .read_gap(self.read_gap)
                .stall_after(self.stall_after)
                .stream_in_progress(self.stream_in_progress)
                .stream_memory((self.stream_memory_mb as usize).saturating_mul(1024 * 1024));
            for (schema, table) in &plan.tables {
                builder = builder.table_name(TableName::new(schema, table));
            }
            for pattern in self.patterns() {
                builder = builder.pattern(pattern);
            }
            if let Some(primary) = self.primary()? {
                builder = builder.primary(primary);
            }
            if let Some(on) = self.failover {
                builder = builder.failover(on);
            }
            let source = builder.start().await?;
            let probe = Arc::new(source.handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}
