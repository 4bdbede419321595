//! Sinks' snapshots in a pipeline: each sink whose source can take them gets its
//! snapshots from the source's plug ([`freshen::plug::SourcePlug::sink_snapshots`]),
//! under the sink's identity (e.g. `kafka:<topic>`, so a sink new to a deployment, or
//! pointed at a new topic, starts afresh), spliced into its stream, driven on its own
//! task, shown in `/status` and started on demand (`POST /admin/sinks/{n}/snapshot`,
//! `freshen snapshot --sink N`).

use crate::readout::{SinkSnapshotStatus, SinkSnapshots};

/// The snapshots of the sink called `identity` (see
/// [`freshen::plug::SinkPlug::identity`]), when the source can take them; `None`
/// otherwise (configuration checking rejects `snapshot = "initial"` there).
pub(crate) fn open(
    cfg: &crate::config::Config,
    identity: &str,
    s: &crate::config::SinkSnapshot,
) -> anyhow::Result<Option<SinkSnapshots>> {
    let spec = freshen::plug::SinkSnapshotSpec {
        identity: identity.to_owned(),
        initial: s.mode == freshen_changefeed::SnapshotMode::Initial,
        chunk_rows: s.chunk_rows,
        pause: s.pause,
        tables: cfg.watched_tables(),
        redact: (!cfg.redact.is_empty()).then(|| {
            std::sync::Arc::new(cfg.redact.clone()) as std::sync::Arc<dyn freshen::plug::Redact>
        }),
    };
    cfg.source
        .sink_snapshots(spec)
        .map_err(anyhow::Error::from_boxed)
}

/// Every sink's snapshot progress.
pub(crate) fn status(sinks: &[(usize, SinkSnapshots)]) -> Vec<SinkSnapshotStatus> {
    sinks
        .iter()
        .map(|(i, s)| SinkSnapshotStatus {
            sink: *i,
            id: s.identity().to_owned(),
            tables: s.status().into_iter().map(Into::into).collect(),
        })
        .collect()
}
