//! `freshen config reference`: every key of every table of the configuration file, with
//! its type, default, allowed range and the source kinds it belongs to.
//!
//! The description of each table is kept beside the type that reads it: a kind's in its
//! crate ([`::freshen::reference::Documented`], collected here through the registration
//! lines of `kinds.rs`), the tables `config/` reads itself in `freshen.rs`. It cannot
//! drift from the parser: the tests (`tests.rs`) take every key the parser accepts — the serde types'
//! field lists, `config/`'s lists of known keys — and fail on one the reference lacks
//! or one it has that the parser refuses; every stated default is written into a file
//! and must parse to the same configuration as leaving it out; every stated range is
//! probed at both ends and just beyond them. `docs/configuration.md` is this output, and
//! a test fails when it differs.
//!
//! Kinds behind a cargo feature say which. A build without some of them names them but
//! cannot list their keys (their crates are not in it): `docs/configuration.md` is the
//! output of a build with every kind (`--features full`), and `freshen --version` says
//! what a build reads.

mod freshen;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::sync::OnceLock;

use ::freshen::reference::{Key, Omitted, Range, Table, key};

use crate::registry::Registry;

/// A table as the reference shows it: the table, and the cargo feature of
/// `freshen-cli` that builds its kind in, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown {
    /// The table.
    pub table: &'static Table,
    /// The cargo feature its kind needs.
    pub feature: Option<&'static str>,
}

impl std::ops::Deref for Shown {
    type Target = Table;

    fn deref(&self) -> &Table {
        self.table
    }
}

/// Every table, in the order of the reference: freshen's own, and each registered
/// kind's (its settings type's [`::freshen::reference::Documented`]) after the table
/// whose `kind` picks it.
pub(crate) fn tables() -> Vec<&'static Shown> {
    static TABLES: OnceLock<Vec<Shown>> = OnceLock::new();
    TABLES.get_or_init(collect).iter().collect()
}

fn collect() -> Vec<Shown> {
    let kinds = crate::kinds::builtin();
    let own = |table: &'static Table| Shown {
        table,
        feature: None,
    };
    let mut out = vec![
        own(&freshen::TOP),
        own(with_kinds(&freshen::SOURCE, "source", &kinds.sources)),
    ];
    for k in kinds.sources.kinds() {
        if let Some(made) = k.made() {
            out.extend(made.reference.iter().map(|table| Shown {
                table,
                feature: k.feature(),
            }));
        }
    }
    out.extend(
        [
            &freshen::TARGET,
            &freshen::HTTP,
            &freshen::LOG,
            &freshen::DEFAULTS,
            &freshen::BACKOFF,
            &freshen::VIEWS,
            &freshen::WATCH,
            &freshen::RECONCILE,
        ]
        .map(own),
    );
    out.push(own(with_kinds(&freshen::SINKS, "sink", &kinds.sinks)));
    for k in kinds.sinks.kinds() {
        if let Some(made) = k.made() {
            out.extend(made.reference.iter().map(|table| Shown {
                table,
                feature: k.feature(),
            }));
        }
    }
    // `[key_stream]` is read by the configuration itself, over Kafka.
    #[cfg(feature = "kafka")]
    out.extend(
        <freshen_kafka::KeyStreamConfig as ::freshen::reference::Documented>::REFERENCE
            .iter()
            .map(|table| Shown {
                table,
                feature: Some("kafka"),
            }),
    );
    out.push(own(&freshen::REDACT));
    out.extend(
        <freshen_changefeed::ChangefeedConfig as ::freshen::reference::Documented>::REFERENCE
            .iter()
            .map(own),
    );
    out
}

/// `table` with its `kind` key listing every kind of `kinds` (built in or left out)
/// and the cargo features they need: the registration lines are the one list.
fn with_kinds<M>(table: &'static Table, part: &str, kinds: &Registry<M>) -> &'static Table {
    let names: &'static [&'static str] = kinds.names().leak();
    let mut groups: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for k in kinds.kinds() {
        let Some(f) = k.feature() else { continue };
        match groups.iter_mut().find(|(g, _)| *g == f) {
            Some((_, names)) => names.push(k.name()),
            None => groups.push((f, vec![k.name()])),
        }
    }
    let mut about = format!("The {part} kind");
    for (i, (feature, names)) in groups.iter().enumerate() {
        let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        let listed = match quoted.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => continue,
        };
        let _ = match (i, names.len()) {
            (0, 1) => write!(about, "; {listed} needs the cargo feature `{feature}`"),
            (0, _) => write!(about, "; {listed} need the cargo feature `{feature}`"),
            _ => write!(about, ", {listed} the feature `{feature}`"),
        };
    }
    about.push('.');
    let about: &'static str = about.leak();
    let keys: Vec<Key> = table
        .keys
        .iter()
        .map(|k| match k.name {
            "kind" => Key {
                range: Range::OneOf(names),
                about,
                ..*k
            },
            _ => *k,
        })
        .collect();
    Box::leak(Box::new(Table {
        keys: keys.leak(),
        ..*table
    }))
}

/// The command that writes `docs/configuration.md`.
pub(crate) const REGENERATE: &str =
    "cargo run -p freshen-cli --features full -- config reference > docs/configuration.md";

/// The reference, as Markdown.
pub(crate) fn render() -> String {
    let mut s = String::new();
    s.push_str("# Configuration reference\n\n");
    let _ = writeln!(
        s,
        "Every key of every table of freshen's TOML file. Generated by `freshen config reference` \
         from the descriptions kept beside the types that read the file \
         (each kind's in its crate, the rest in `crates/freshen-cli/src/reference/`), which tests hold to the parser: every key it \
         accepts is here, every default and range here is what it applies. Do not edit; \
         regenerate with `{REGENERATE}`.\n"
    );
    s.push_str(
        "Durations are strings: `\"250us\"`, `\"500ms\"`, `\"10s\"`, `\"5m\"`, `\"1h\"`. \
         Any string value may use `${VAR}`, replaced by the environment variable (keep \
         passwords and tokens there). Unknown keys are errors, reported with their lines \
         together with every other problem of the file. A kind marked with a cargo feature \
         is read only by a binary built with it (`freshen --version` lists what a binary \
         reads). Where a bound depends on another key (`coalesce` at most `max_wait`), \
         the range shown is the one the other key's default gives.\n\n",
    );
    s.push_str("## Tables\n\n");
    for t in tables() {
        let _ = writeln!(s, "- [`{}`](#{})", t.header, anchor(t.header));
    }
    s.push('\n');
    for t in tables() {
        let _ = writeln!(s, "## `{}`\n", t.header);
        let feature = t
            .feature
            .map(|f| format!(" Needs the cargo feature `{f}`."))
            .unwrap_or_default();
        let _ = writeln!(s, "{}{feature}\n", t.about);
        s.push_str("| key | type | default | accepted | what it does |\n");
        s.push_str("|---|---|---|---|---|\n");
        for k in t.keys {
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} | {} |",
                k.name,
                k.ty,
                default_cell(k.default),
                range_cell(k.range),
                k.about.replace('|', "\\|")
            );
        }
        s.push('\n');
    }
    s
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes.
fn anchor(header: &str) -> String {
    header
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn default_cell(d: Omitted) -> String {
    match d {
        Omitted::Required(_) => "required".to_owned(),
        Omitted::Unset(_) => "unset".to_owned(),
        Omitted::Is(v) => format!("`{}`", v.replace('|', "\\|")),
        Omitted::Derived(words, _) => words.to_owned(),
    }
}

fn range_cell(r: Range) -> String {
    match r {
        Range::Any => String::new(),
        Range::Int(lo, hi) => format!("{lo} to {hi}"),
        Range::Millis(lo, hi) => format!("{} to {}", millis(lo), millis(hi)),
        Range::OneOf(choices) => choices
            .iter()
            .map(|c| format!("`\"{c}\"`"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A bound in the unit a reader would write it in.
fn millis(ms: u64) -> String {
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// Prints the reference; a build without some kinds says so on stderr (their names are
/// in the reference, their keys are not).
pub(crate) fn print() {
    print!("{}", render());
    let kinds = crate::kinds::builtin();
    let mut features: Vec<&str> = (kinds.sources.kinds().iter().filter_map(|k| k.feature()))
        .chain(kinds.sinks.kinds().iter().filter_map(|k| k.feature()))
        .filter(|f| !built_in(f))
        .collect();
    if !features.is_empty() {
        features.sort_unstable();
        features.dedup();
        eprintln!(
            "note: this binary is built without the cargo features {}: their kinds are named but their keys are not listed (`--features full` lists them all, as docs/configuration.md does)",
            features.join(", ")
        );
    }
}

/// Whether this binary is built with cargo feature `f`.
fn built_in(f: &str) -> bool {
    const BUILT: &[(&str, bool)] = &[
        ("mysql", cfg!(feature = "mysql")),
        ("kafka", cfg!(feature = "kafka")),
        ("pulsar", cfg!(feature = "pulsar")),
    ];
    BUILT
        .iter()
        .find(|(name, _)| *name == f)
        .is_none_or(|(_, built)| *built)
}
