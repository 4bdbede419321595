//! `[key_stream]`: rebuild work spread over many instances (see docs/scaling.md). One
//! file serves both roles: the capture instance reads `[source]` and
//! publishes the views' keys; workers read the key stream and rebuild.

use toml_edit::Item;

use super::View;
use super::read::{Reader, Tbl};

pub use crate::key_stream::KeyStream;

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
    crate::key_stream::read(r, item, line)
}
