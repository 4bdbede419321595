//! A sink's snapshot settings (`[[sinks]] snapshot`, `snapshot_chunk_rows`,
//! `snapshot_pause_ms`): spelled and defaulted as the changefeed's, read beside the
//! sink's own keys (which its crate reads).

use std::time::Duration;

use freshen_changefeed::SnapshotMode;

use super::Source;
use super::read::{Reader, Tbl};

/// The keys read here, left out of the sink crate's own table.
pub(super) const KEYS: &[&str] = &["snapshot", "snapshot_chunk_rows", "snapshot_pause_ms"];

/// Whether and how a sink publishes the rows that already exist (DBLog snapshots,
/// `freshen_postgres::SinkSnapshots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkSnapshot {
    /// `"initial"`: on first start (and for a sink new to a deployment) every captured
    /// table; `"never"` (default): only tables asked for (`freshen snapshot --sink`).
    pub mode: SnapshotMode,
    /// Rows per chunk SELECT (default 10 000).
    pub chunk_rows: usize,
    /// Pause between chunks (default none).
    pub pause: Duration,
}

impl Default for SinkSnapshot {
    fn default() -> SinkSnapshot {
        SinkSnapshot {
            mode: SnapshotMode::Never,
            chunk_rows: 10_000,
            pause: Duration::ZERO,
        }
    }
}

/// Reads the settings of sink table `t`; every problem is reported with its line.
pub(super) fn read(r: &mut Reader<'_, '_>, t: Tbl<'_>, source: Option<&Source>) -> SinkSnapshot {
    let mut s = SinkSnapshot::default();
    if let Some(m) = r.choice(t, "snapshot", &["initial", "never"])
        && m.value == "initial"
    {
        {
            s.mode = SnapshotMode::Initial;
            // Watermarks and chunk SELECTs need the PostgreSQL replication source.
            if let Some(src) = source.filter(|src| src.kind() != "postgres") {
                r.p.at_line(
                    m.line,
                    format!(
                        "`{}.snapshot` \"initial\" reads from a PostgreSQL replication source, not a {} source (remove `snapshot`)",
                        t.path,
                        src.kind()
                    ),
                );
            }
        }
    }
    if let Some(n) = r.int(t, "snapshot_chunk_rows", 1..=1_000_000) {
        s.chunk_rows = usize::try_from(n.value).unwrap_or(s.chunk_rows);
    }
    if let Some(ms) = r.int(t, "snapshot_pause_ms", 0..=3_600_000) {
        s.pause = Duration::from_millis(u64::try_from(ms.value).unwrap_or(0));
    }
    s
}
