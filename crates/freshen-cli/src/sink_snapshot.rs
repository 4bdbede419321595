//! Sinks' snapshots in a pipeline: each sink on a PostgreSQL source gets a
//! `freshen_postgres::SinkSnapshots` (under the sink's identity, e.g. `kafka:<topic>`,
//! so a sink new to a deployment, or pointed at a new topic, starts afresh), spliced into
//! its stream, driven on its own task, shown in `/status` and started on demand
//! (`POST /admin/sinks/{n}/snapshot`, `freshen snapshot --sink N`).

use freshen_postgres::{Pool, SinkSnapshots, SnapshotProgress, TableName};
use serde::{Deserialize, Serialize};

/// One sink's snapshot driver: what it reads from.
#[derive(Debug)]
pub struct Driver {
    /// The sink's snapshots (shared with its splice and the observer).
    pub snapshots: SinkSnapshots,
    pool: Pool,
    tables: Vec<TableName>,
}

impl Driver {
    /// Runs the sink's snapshots until `stop` completes.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        self.snapshots
            .run(self.pool, self.tables, stop)
            .await
            .map_err(Into::into)
    }
}

/// The snapshots of the sink called `identity` (see
/// [`freshen::plug::SinkPlug::identity`]), when the source can snapshot
/// ([`freshen::Capabilities::snapshot`]: PostgreSQL's replication stream, the one whose
/// WAL carries the watermarks); `None` otherwise (configuration checking rejects
/// `snapshot = "initial"` there).
pub fn driver(
    cfg: &crate::config::Config,
    identity: &str,
    s: &crate::config::SinkSnapshot,
) -> anyhow::Result<Option<Driver>> {
    if !cfg.source.capabilities().snapshot {
        return Ok(None);
    }
    let Some(url) = cfg.source.database_url() else {
        return Ok(None);
    };
    use anyhow::Context;
    let conn = freshen_postgres::ConnectionConfig::from_url(url)
        .context("the source URL is not usable")?;
    let pool = freshen_postgres::connect_pool(&conn, 1)
        .context("cannot set up the sink snapshot connection")?;
    let tables = cfg
        .watched_tables()
        .into_iter()
        .map(|(schema, table)| TableName::new(schema, table))
        .collect();
    let mut settings = freshen_postgres::SinkSnapshotConfig::new(
        identity,
        s.mode == freshen_changefeed::SnapshotMode::Initial,
    )
    .chunk_rows(s.chunk_rows)
    .pause(s.pause);
    if !cfg.redact.is_empty() {
        // The progress it stores holds a hidden key column's position sealed.
        settings = settings.redact(std::sync::Arc::new(cfg.redact.clone()));
    }
    Ok(Some(Driver {
        snapshots: SinkSnapshots::new(settings),
        pool,
        tables,
    }))
}

/// The splice a sink calls on every batch.
pub fn splice(
    s: SinkSnapshots,
) -> impl FnMut(&freshen::Batch) -> Vec<(usize, Vec<freshen::RowEvent>, freshen::Ack)> + Send {
    move |b| {
        s.splice(b)
            .into_iter()
            .map(|x| (x.at, x.rows, x.delivered))
            .collect()
    }
}

/// A sink's snapshot progress, as `/status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SinkSnapshotStatus {
    /// The sink's index in `[[sinks]]`.
    pub sink: usize,
    /// Its identity in the progress table.
    pub id: String,
    /// Each table's progress.
    pub tables: Vec<SnapshotProgress>,
}

/// Every sink's snapshot progress.
pub fn status(sinks: &[(usize, SinkSnapshots)]) -> Vec<SinkSnapshotStatus> {
    sinks
        .iter()
        .map(|(i, s)| SinkSnapshotStatus {
            sink: *i,
            id: s.sink().to_owned(),
            tables: s.status(),
        })
        .collect()
}
