//! `[key_stream]`: rebuild work spread over many instances (see the README's "Scaling
//! out"). One file serves both roles: the capture instance reads `[source]` and
//! publishes the views' keys; workers read the key stream and rebuild.

use toml_edit::Item;

use super::View;
use super::read::{Reader, Tbl};

/// The key stream's settings.
#[cfg(feature = "kafka")]
pub type KeyStream = freshen_kafka::KeyStreamConfig;

/// The key stream's settings (not built into this freshen: build it with `--features
/// kafka`).
#[cfg(not(feature = "kafka"))]
#[derive(Debug, Clone)]
pub enum KeyStream {}

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
    read_table(r, item, line)
}

#[cfg(feature = "kafka")]
fn read_table(r: &mut Reader<'_, '_>, item: &Item, line: Option<usize>) -> Option<KeyStream> {
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

#[cfg(not(feature = "kafka"))]
fn read_table(r: &mut Reader<'_, '_>, _item: &Item, line: Option<usize>) -> Option<KeyStream> {
    r.p.at_line(
        line,
        "[key_stream] is not built into this freshen: build it with `--features kafka`",
    );
    None
}
