//! `[key_stream]`: rebuild work spread over many instances (see docs/scaling.md). One
//! file serves both roles: the capture instance reads `[source]` and
//! publishes the views' keys; workers read the key stream and rebuild.

use toml_edit::Item;

use super::View;
use super::read::{Reader, Tbl};

pub use kind::KeyStream;
use kind::read as read_kind;

/// Reads `[key_stream]`, and what a configuration that has one cannot hold.
pub(super) fn read(r: &mut Reader<'_, '_>, root: Tbl<'_>, views: &[View]) -> Option<KeyStream> {
    let item: &Item = root.t.get("key_stream")?;
    let line = r.line(item.span());
    for v in views {
        for w in v.fanouts() {
            r.p.at_line(
                w.line.or(v.line),
                format!(
                    "view {}: a `keys` fan-out cannot run with [key_stream] yet (its query would run on the capture instance); rebuild {} from a table carrying the view's key, or run without [key_stream]",
                    v.name,
                    w.qualified()
                ),
            );
        }
    }
    if views.is_empty() {
        r.p.at_line(
            line,
            "[key_stream] spreads the views' rebuilds: it needs at least one [[views]] entry"
                .to_string(),
        );
    }
    read_kind(r, item, line)
}

/// Kafka's key stream.
#[cfg(feature = "kafka")]
mod kind {
    use toml_edit::Item;

    use crate::config::read::Reader;

    /// The key stream's settings.
    pub type KeyStream = freshen_kafka::KeyStreamConfig;

    /// Reads the `[key_stream]` table `item`, every problem with its line.
    pub(crate) fn read(
        r: &mut Reader<'_, '_>,
        item: &Item,
        line: Option<usize>,
    ) -> Option<KeyStream> {
        let mark = r.mark();
        let ks: KeyStream = r.serde_table(item, "key_stream", &[])?;
        let problems = if r.judged_since(mark) {
            ks.problems()
        } else {
            Vec::new()
        };
        for p in &problems {
            r.problem_in(item, "key_stream", p, line);
        }
        problems.is_empty().then_some(ks)
    }
}

/// Without Kafka built in: configuration refuses `[key_stream]`, so no settings exist.
#[cfg(not(feature = "kafka"))]
mod kind {
    use toml_edit::Item;

    use crate::config::read::Reader;

    /// The key stream's settings (not built into this freshen: build it with
    /// `--features kafka`).
    #[derive(Debug, Clone)]
    pub enum KeyStream {}

    /// Refuses the `[key_stream]` table.
    pub(crate) fn read(
        r: &mut Reader<'_, '_>,
        _item: &Item,
        line: Option<usize>,
    ) -> Option<KeyStream> {
        r.p.at_line(
            line,
            "[key_stream] is not built into this freshen: build it with `--features kafka`",
        );
        None
    }
}
