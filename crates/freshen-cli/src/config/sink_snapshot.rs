//! A sink's snapshot settings (`[[sinks]] snapshot`, `snapshot_chunk_rows`,
//! `snapshot_pause_ms`): spelled and defaulted as the changefeed's, read beside the
//! sink's own keys (which its crate reads).

use std::time::Duration;

use freshen_changefeed::SnapshotMode;

use super::Source;
use super::read::{Reader, Tbl};

/// The keys read here, left out of the sink crate's own table.
pub(crate) const KEYS: &[&str] = &["snapshot", "snapshot_chunk_rows", "snapshot_pause_ms"];

/// Whether and how a sink publishes the rows that already exist (DBLog snapshots,
/// the source's `freshen::plug::SinkSnapshots`).
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
            // Watermarks and chunk SELECTs need a source that can snapshot (PostgreSQL's
            // replication stream).
            if let Some(src) = source.filter(|src| !src.capabilities().snapshot) {
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

// A sink kind to read them beside: Kafka's.
#[cfg(all(test, feature = "kafka"))]
mod tests {
    use super::super::{Sink, parse};
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "DATABASE_URL").then(|| "postgres://app@db/app".to_owned())
    }

    fn config(source: &str, sink: &str) -> String {
        format!(
            r#"[source]
{source}

[[sinks]]
kind = "kafka"
brokers = "127.0.0.1:9092"
topic = "pg"
{sink}
"#
        )
    }

    const POSTGRES: &str = "kind = \"postgres\"\nurl = \"${DATABASE_URL}\"";

    #[test]
    fn a_sinks_snapshot_settings_are_read_beside_its_own() {
        let src = config(
            POSTGRES,
            "snapshot = \"initial\"\nsnapshot_chunk_rows = 500\nsnapshot_pause_ms = 20",
        );
        let c = parse(&src, "f.toml", &env, crate::kinds::builtin()).unwrap();
        let Sink { plug, snapshot: s } = &c.sinks[0];
        assert_eq!(plug.identity(), "kafka:pg");
        assert_eq!(
            *s,
            SinkSnapshot {
                mode: SnapshotMode::Initial,
                chunk_rows: 500,
                pause: Duration::from_millis(20),
            }
        );
        // As for the changefeed: no snapshot unless asked.
        let c = parse(
            &config(POSTGRES, ""),
            "f.toml",
            &env,
            crate::kinds::builtin(),
        )
        .unwrap();
        let s = &c.sinks[0].snapshot;
        assert_eq!(*s, SinkSnapshot::default());
        assert_eq!(s.mode, SnapshotMode::Never);
    }

    #[test]
    fn bad_snapshot_settings_are_all_reported_with_their_lines() {
        let src = config(
            POSTGRES,
            "snapshot = \"always\"\nsnapshot_chunk_rows = 0\nsnapshot_pause_ms = -1",
        );
        let p = parse(&src, "f.toml", &env, crate::kinds::builtin())
            .unwrap_err()
            .lines();
        for w in [
            "f.toml:9: `sinks[0].snapshot` must be one of `initial`, `never`, not `always`",
            "f.toml:10: `sinks[0].snapshot_chunk_rows` must be between 1 and 1000000, not 0",
            "f.toml:11: `sinks[0].snapshot_pause_ms` must be between 0 and 3600000, not -1",
        ] {
            assert!(
                p.iter().any(|l| l.starts_with(w)),
                "missing {w:?} in\n{}",
                p.join("\n")
            );
        }
    }

    #[test]
    fn an_initial_snapshot_needs_the_postgres_replication_source() {
        let src = config(
            "kind = \"postgres-incremental\"\nurl = \"${DATABASE_URL}\"\ncursor = \"updated_at\"",
            "snapshot = \"initial\"",
        );
        let p = parse(&src, "f.toml", &env, crate::kinds::builtin())
            .unwrap_err()
            .lines();
        assert!(
            p.iter().any(|l| l.starts_with("f.toml:10: `sinks[0].snapshot` \"initial\" reads from a PostgreSQL replication source, not a postgres-incremental source")),
            "{}",
            p.join("\n")
        );
    }
}
