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

#[cfg(all(test, feature = "kafka"))]
mod tests {
    use super::super::parse;

    const BASE: &str = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"

[[views]]
name = "device_totals"
watch = [{ table = "readings", key = ["device"] }]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]
"#;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_key_stream_is_read_with_its_defaults() {
        let src = format!(
            "{BASE}\n[key_stream]\nbrokers = [\"k1:9092\", \"k2:9092\"]\ntopic = \"keys\"\ngroup = \"workers\"\n"
        );
        let c = parse(&src, "f.toml", &no_env).unwrap();
        let ks = c.key_stream.expect("read");
        assert_eq!(ks.brokers, "k1:9092,k2:9092");
        assert_eq!(ks.revoke_timeout_ms, 30_000);
    }

    #[test]
    fn every_key_stream_problem_is_listed_with_its_line() {
        let src = format!(
            r#"{BASE}
[[views]]
name = "plan_totals"
watch = [
  {{ table = "accounts", key = ["id"] }},
  {{ table = "plans", key = ["id"], keys = "SELECT id FROM accounts WHERE plan_id = $1" }},
]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]

[key_stream]
brokers = "k:9092"
topic = "bad topic"
group = ""
max_batch = 0
propertys = {{}}
"#
        );
        let err = parse(&src, "f.toml", &no_env).unwrap_err();
        let text = err.to_string();
        let lines = err.lines();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("plan_totals") && l.contains("fan-out")),
            "{text}"
        );
        assert!(lines.iter().any(|l| l.contains("propertys")), "{text}");
        // Unknown keys are reported first (serde stops there); fixed, the values are
        // judged: every one of them at once, each on its line.
        let src = src.replace("propertys = {}\n", "");
        let err = parse(&src, "f.toml", &no_env).unwrap_err();
        let text = err.to_string();
        for (what, line) in [("topic", 21), ("group", 22), ("max_batch", 23)] {
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.line == Some(line) && p.message.contains(what)),
                "{what} on line {line}: {text}"
            );
        }
    }
}
