//! The reference held to the parser: the same keys, and every stated default and range
//! is what the parser applies (probed through `config::parse`, the whole file).

use std::collections::BTreeSet;

use freshen_testenv::reference::same_keys;

use super::*;
use crate::config;

// ---------------------------------------------------------------- the keys

#[test]
fn every_key_the_parser_accepts_is_documented_and_no_other() {
    same_keys(&freshen::TOP, config::TOP.iter().copied());
    same_keys(&freshen::SOURCE, config::SOURCE_SHARED.iter().copied());
    same_keys(&freshen::TARGET, config::TARGET.iter().copied());
    same_keys(&freshen::HTTP, config::HTTP.iter().copied());
    same_keys(&freshen::LOG, config::LOG.iter().copied());
    same_keys(&freshen::DEFAULTS, config::TIMING.iter().copied());
    same_keys(&freshen::BACKOFF, config::BACKOFF.iter().copied());
    same_keys(&freshen::VIEWS, config::VIEW.iter().copied());
    same_keys(&freshen::WATCH, config::WATCH.iter().copied());
    same_keys(&freshen::RECONCILE, config::RECONCILE.iter().copied());
    same_keys(&freshen::REDACT, config::redact::KEYS.iter().copied());
    same_keys(
        &freshen::SINKS,
        std::iter::once("kind").chain(config::sink_snapshot::KEYS.iter().copied()),
    );
    // A kind's tables are held to its settings types in its crate
    // (`freshen_testenv::reference`); the changefeed's too.
}

/// The `kind` keys list every kind the registries know (built in or left out), and
/// every kind this build has documents its table under its name.
#[test]
fn every_source_and_sink_kind_is_documented() {
    let shown = |header: &str| -> &'static Table {
        tables()
            .into_iter()
            .find(|t| t.header == header)
            .map(|s| s.table)
            .unwrap_or_else(|| panic!("no table `{header}`"))
    };
    let kinds = |t: &Table| -> BTreeSet<&'static str> {
        match t.keys.iter().find(|k| k.name == "kind").map(|k| k.range) {
            Some(Range::OneOf(names)) => names.iter().copied().collect(),
            _ => panic!("`{}` lists its kinds", t.header),
        }
    };
    let registered = crate::kinds::builtin();
    let sources: BTreeSet<&str> = registered.sources.names().into_iter().collect();
    assert_eq!(kinds(shown("[source]")), sources);
    let sinks: BTreeSet<&str> = registered.sinks.names().into_iter().collect();
    assert_eq!(kinds(shown("[[sinks]]")), sinks);
    for name in registered.sources.built() {
        shown(&format!("[source] kind = \"{name}\""));
    }
    for name in registered.sinks.built() {
        shown(&format!("[[sinks]] kind = \"{name}\""));
    }
    // The features named: where the registration lines say.
    let about = shown("[source]").keys[0].about;
    assert_eq!(
        about,
        "The source kind; `mysql` and `mysql-incremental` need the cargo feature `mysql`, `kafka` the feature `kafka`, `pulsar` the feature `pulsar`."
    );
}

// ---------------------------------------------------------------- the values

/// Where a table's keys go in a file that parses, and what they need beside them.
struct Context {
    /// Tables before the probed one (each a block of lines).
    before: String,
    /// The probed table's opening: a header, or `name = {` for an inline table.
    open: String,
    /// Keys the probed table needs, written unless probed (the probe replaces them).
    needs: Vec<(&'static str, String)>,
    /// Closes an inline table.
    close: &'static str,
}

const PG_SOURCE: &str = "[source]\nkind = \"postgres\"\nurl = \"postgres://app@db/app\"\n";
const VIEW: &str = "[[views]]\nname = \"v\"\nwatch = [{ table = \"app.t\", key = [\"id\"] }]\nrebuild = \"SELECT 1 WHERE $1::text IS NOT NULL\"\n";

/// The required keys of `t`, with their examples.
fn required(t: &Table) -> Vec<(&'static str, String)> {
    t.keys
        .iter()
        .filter_map(|k| match k.default {
            Omitted::Required(ex) => Some((k.name, ex.to_owned())),
            _ => None,
        })
        .collect()
}

fn block(open: &str, needs: Vec<(&'static str, String)>) -> Context {
    Context {
        before: String::new(),
        open: open.to_owned(),
        needs,
        close: "",
    }
}

/// The file around table `t`; `None` for a table probed only for its keys (the top
/// level: each of its keys is a table probed on its own).
fn context(t: &Table) -> Option<Context> {
    let source_of = |kind: &str| -> Option<&'static Table> {
        let header = format!("[source] kind = \"{kind}\"");
        tables()
            .into_iter()
            .find(|t| t.header == header)
            .map(|s| s.table)
    };
    let source_block = |kind: &str| -> String {
        let mut s = format!("[source]\nkind = \"{kind}\"\n");
        for (k, v) in required(source_of(kind).expect("a documented kind")) {
            s.push_str(&format!("{k} = {v}\n"));
        }
        s
    };
    let after_pg = |open: &str, needs| Context {
        before: format!("{PG_SOURCE}{VIEW}"),
        ..block(open, needs)
    };
    let c = match t.header {
        "top level" => return None,
        "[source]" => Context {
            before: VIEW.to_owned(),
            ..block(
            "[source]",
            vec![
                ("kind", "\"postgres\"".into()),
                ("url", "\"postgres://app@db/app\"".into()),
            ],
        )
        },
        h if h.starts_with("[source] kind = ") => {
            let kind = h.trim_start_matches("[source] kind = ").trim_matches('"');
            let database = match crate::kinds::builtin().sources.find(kind) {
                crate::registry::Found::Built(_, k) => k.database,
                _ => false,
            };
            let target = if database {
                ""
            } else {
                "[target]\nurl = \"postgres://app@db/app\"\n"
            };
            Context {
                before: format!("{target}{VIEW}"),
                ..block(
                    &format!("[source]\nkind = \"{kind}\""),
                    required(t),
                )
            }
        }
        h if h.starts_with("[source.tables.") => {
            let kind = if h.contains("mysql") {
                "mysql-incremental"
            } else {
                "postgres-incremental"
            };
            Context {
                before: format!("{VIEW}{}", source_block(kind)),
                ..block("[source.tables.\"app.t\"]", Vec::new())
            }
        }
        "[target]" => after_pg("[target]", vec![("url", "\"postgres://app@db/app\"".into())]),
        "[http]" | "[log]" | "[defaults]" | "[key_stream]" => after_pg(t.header, required(t)),
        "backoff = { base, max }" => Context {
            before: format!("{PG_SOURCE}{VIEW}[defaults]\n"),
            open: "backoff = {".into(),
            needs: Vec::new(),
            close: "}",
        },
        "[[views]]" => Context {
            before: PG_SOURCE.to_owned(),
            ..block(
                "[[views]]",
                vec![
                    ("name", "\"v\"".into()),
                    ("watch", "[{ table = \"app.t\", key = [\"id\"] }]".into()),
                    ("rebuild", "\"SELECT 1 WHERE $1::text IS NOT NULL\"".into()),
                ],
            )
        },
        "[[views.watch]]" => Context {
            before: PG_SOURCE.to_owned(),
            open: "[[views]]\nname = \"v\"\nrebuild = \"SELECT 1 WHERE $1::text IS NOT NULL\"\nwatch = [{ table = \"app.t\", key = [\"id\"] }, {".into(),
            needs: vec![("table", "\"app.u\"".into()), ("key", "[\"id\"]".into())],
            close: "}]",
        },
        "reconcile = { every, keys }" => Context {
            before: format!("{PG_SOURCE}{VIEW}"),
            open: "reconcile = {".into(),
            // The probe's view is rebuilt by statements: its sweep lists keys.
            needs: {
                let mut n = required(t);
                n.push(("keys", "\"SELECT 1\"".into()));
                n
            },
            close: "}",
        },
        "[[sinks]]" | "[[sinks]] kind = \"kafka\"" => after_pg(
            "[[sinks]]",
            vec![
                ("kind", "\"kafka\"".into()),
                ("brokers", "\"k:9092\"".into()),
                ("topic", "\"app\"".into()),
            ],
        ),
        "[[sinks]] kind = \"kafka-outbox\"" => after_pg(
            "[[sinks]]",
            vec![
                ("kind", "\"kafka-outbox\"".into()),
                ("brokers", "\"k:9092\"".into()),
                ("table", "\"app.outbox\"".into()),
                ("dead_letter_topic", "\"outbox.dead-letter\"".into()),
            ],
        ),
        "[changefeed]" => after_pg("[changefeed]", required(t)),
        "[[redact]]" => after_pg("[[redact]]", required(t)),
        h if h.starts_with("[changefeed.") || h.starts_with("[[changefeed.") => {
            let needs = if h.contains("tokens") {
                vec![
                    ("scope", "\"read\"".into()),
                    ("token", "\"0123456789abcdef\"".into()),
                ]
            } else {
                Vec::new()
            };
            Context {
                before: format!(
                    "{PG_SOURCE}{VIEW}[changefeed]\npath = \"/nonexistent/freshen/feed.db\"\n"
                ),
                ..block(h, needs)
            }
        }
        other => panic!("no context for `{other}`: add one"),
    };
    Some(c)
}

/// Keys that replace others, or come with others.
fn companions(
    key: &str,
    value: &str,
) -> (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
) {
    match (key, value) {
        // A view's `key` is for a query's target.
        ("key", "[\"region\", \"day\"]") => (
            &["rebuild"],
            &[
                ("into", "\"app.totals\""),
                ("query", "\"SELECT region, day FROM app.t\""),
            ],
        ),
        // `[[redact]]`: each action's parameters (the probe file's action is `mask`).
        ("action", "\"truncate\"") => (&[], &[("length", "4")]),
        ("action", "\"hash\"") => (&[], &[("key_env", "\"FRESHEN_REDACT_KEY\"")]),
        ("key_env", _) => (&["action"], &[("action", "\"hash\"")]),
        _ => companions_of(key),
    }
}

/// Keys that replace others, or come with others, whatever the probed value.
fn companions_of(
    key: &str,
) -> (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
) {
    match key {
        "into" => (
            &["rebuild"],
            &[("query", "\"SELECT id FROM app.t WHERE id = ANY($1)\"")],
        ),
        "query" => (&["rebuild"], &[("into", "\"app.totals\"")]),
        // A view's `key` (a watch entry's `key` is probed as `["id"]`).
        "token_env" => (&["token"], &[]),
        _ => (&[], &[]),
    }
}

/// The file with `key = value` in table `t` (or without it).
fn file(t: &Table, probe: Option<(&str, &str)>) -> String {
    let mut c = context(t).expect("a probed table");
    let (drop, with) = probe.map_or((&[][..], &[][..]), |(k, v)| companions(k, v));
    c.needs
        .retain(|(k, _)| probe.is_none_or(|(p, _)| p != *k) && !drop.contains(k));
    c.needs
        .extend(with.iter().map(|(k, v)| (*k, (*v).to_owned())));
    // Last, so that no line of the rest of the file moves (views keep their lines).
    if let Some((k, v)) = probe {
        let k = t.keys.iter().find(|d| d.name == k).map_or("?", |d| d.name);
        c.needs.push((k, v.to_owned()));
    }
    file_from(c)
}

/// The probes' environment: only the `[[redact]]` hash key is set.
fn env(name: &str) -> Option<String> {
    (name == "FRESHEN_REDACT_KEY").then(|| "0123456789abcdef0123456789abcdef".to_owned())
}

/// The configuration a file gives, as comparable text (its digests, which hash the
/// text as written, left out); or its problems.
fn parsed(src: &str) -> Result<String, String> {
    config::parse(src, "f.toml", &env, crate::kinds::builtin())
        .map(|mut c| {
            c.source_digest = 0;
            c.outputs_digest = 0;
            format!("{c:?}")
        })
        .map_err(|e| e.to_string())
}

/// What the probes found wrong, all of it (one run names every wrong entry).
#[derive(Default)]
struct Wrong(Vec<String>);

impl Wrong {
    fn accepted(&mut self, t: &Table, key: &str, value: &str) -> Option<String> {
        let src = file(t, Some((key, value)));
        parsed(&src)
            .map_err(|e| {
                self.0.push(format!(
                    "`{}` `{key} = {value}` is documented as accepted, but the parser says: {}",
                    t.header,
                    e.trim_end()
                ));
            })
            .ok()
    }

    fn refused(&mut self, t: &Table, key: &str, value: &str) {
        if parsed(&file(t, Some((key, value)))).is_ok() {
            self.0.push(format!(
                "`{}` `{key} = {value}` is outside the documented range, but the parser takes it",
                t.header
            ));
        }
    }

    #[track_caller]
    fn none(self) {
        assert!(
            self.0.is_empty(),
            "{} wrong:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// Whether this build reads table `t` (the shared `[[sinks]]` keys are probed beside
/// Kafka's sink, the one sink kind).
fn readable(t: &Shown) -> bool {
    t.feature.is_none_or(built_in) && (t.header != "[[sinks]]" || built_in("kafka"))
}

#[test]
fn every_documented_default_is_what_leaving_the_key_out_gives() {
    let mut wrong = Wrong::default();
    for t in tables().into_iter().filter(|t| readable(t)) {
        if context(t).is_none() {
            continue;
        }
        let without = match parsed(&file(t, None)) {
            Ok(c) => c,
            Err(e) => {
                wrong.0.push(format!(
                    "`{}`: the probe file does not parse: {e}",
                    t.header
                ));
                continue;
            }
        };
        for k in t.keys {
            match k.default {
                Omitted::Is(v) => {
                    if wrong.accepted(t, k.name, v).is_some_and(|c| c != without) {
                        wrong.0.push(format!(
                            "`{}` `{} = {v}` is documented as the default, but writing it changes the configuration",
                            t.header, k.name
                        ));
                    }
                }
                Omitted::Required(ex) | Omitted::Unset(ex) | Omitted::Derived(_, ex) => {
                    wrong.accepted(t, k.name, ex);
                }
            }
            if matches!(k.default, Omitted::Required(_)) {
                let mut c = context(t).unwrap();
                c.needs.retain(|(n, _)| *n != k.name);
                if parsed(&file_from(c)).is_ok() {
                    wrong.0.push(format!(
                        "`{}` `{}` is documented as required, but a file without it parses",
                        t.header, k.name
                    ));
                }
            }
        }
    }
    wrong.none();
}

fn file_from(c: Context) -> String {
    let body: Vec<String> = c.needs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    if c.close.is_empty() {
        format!("{}{}\n{}\n", c.before, c.open, body.join("\n"))
    } else {
        format!("{}{} {} {}\n", c.before, c.open, body.join(", "), c.close)
    }
}

#[test]
fn every_documented_range_is_what_the_parser_accepts() {
    let mut wrong = Wrong::default();
    for t in tables().into_iter().filter(|t| readable(t)) {
        if context(t).is_none() {
            continue;
        }
        for k in t.keys {
            match k.range {
                Range::Any => {}
                Range::Int(lo, hi) => {
                    wrong.accepted(t, k.name, &lo.to_string());
                    wrong.accepted(t, k.name, &hi.to_string());
                    if let Some(below) = lo.checked_sub(1) {
                        wrong.refused(t, k.name, &below.to_string());
                    }
                    if let Some(above) = hi.checked_add(1) {
                        wrong.refused(t, k.name, &above.to_string());
                    }
                }
                Range::Millis(lo, hi) => {
                    wrong.accepted(t, k.name, &format!("\"{lo}ms\""));
                    wrong.accepted(t, k.name, &format!("\"{hi}ms\""));
                    if lo > 0 {
                        wrong.refused(t, k.name, &format!("\"{}ms\"", lo - 1));
                    }
                    wrong.refused(t, k.name, &format!("\"{}ms\"", hi + 1));
                }
                // `kind` chooses the table itself: its values are the kinds' tables.
                Range::OneOf(_) if k.name == "kind" => {}
                Range::OneOf(choices) => {
                    for c in choices {
                        wrong.accepted(t, k.name, &format!("\"{c}\""));
                    }
                    wrong.refused(t, k.name, "\"no-such-choice\"");
                }
            }
        }
    }
    wrong.none();
}

// ---------------------------------------------------------------- the file

// The file is the output of a build with every kind: a build without one cannot list
// its keys.
#[cfg(all(feature = "mysql", feature = "kafka", feature = "pulsar"))]
#[test]
fn docs_configuration_md_is_the_commands_output() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == render(),
        "docs/configuration.md differs from `freshen config reference`: regenerate it with `{REGENERATE}`"
    );
}
