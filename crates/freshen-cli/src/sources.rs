//! The source kinds this binary knows: one registration line each.
//!
//! Everything else about a source — its `[source]` keys and defaults, validation,
//! `check`, start-up, `drop` — lives in its crate, behind
//! [`freshen::plug::SourcePlug`] on its configuration type. To add a source: implement
//! that trait in its crate and add a line to [`KINDS`].

use std::sync::Arc;

use freshen::plug::{Plan, SourcePlug};
use serde::de::DeserializeOwned;
use toml_edit::Item;

use crate::config::{Config, read::Reader};

/// Reads a kind's `[source]` table (everything but `kind` and `ack`, which are
/// freshen's), reporting its problems with their lines.
type ReadFn = fn(&mut Reader<'_, '_>, &Item, Option<usize>) -> Option<Arc<dyn SourcePlug>>;

/// A registered source kind.
#[derive(Clone, Copy)]
pub struct Kind {
    /// As `[source] kind` names it.
    pub name: &'static str,
    /// Whether the source reads a database, which is then the default `[target]`.
    pub database: bool,
    read: ReadFn,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

const fn kind<T: DeserializeOwned + SourcePlug>(name: &'static str, database: bool) -> Kind {
    Kind {
        name,
        database,
        read: read::<T>,
    }
}

/// Every source kind, in the order error messages list them.
pub const KINDS: &[Kind] = &[
    kind::<freshen_postgres::PgSourceSettings>("postgres", true),
    kind::<freshen_postgres::PgIncrementalSettings>("postgres-incremental", true),
    #[cfg(feature = "mysql")]
    kind::<freshen_mysql::MySqlSourceConfig>("mysql", true),
    #[cfg(feature = "mysql")]
    kind::<freshen_mysql::MySqlIncrementalSettings>("mysql-incremental", true),
    #[cfg(feature = "kafka")]
    kind::<freshen_kafka::KafkaSourceConfig>("kafka", false),
    #[cfg(feature = "pulsar")]
    kind::<freshen_pulsar::PulsarSourceConfig>("pulsar", false),
];

/// Kinds left out of this build, and the cargo feature of `freshen-cli` that adds each.
const LEFT_OUT: &[(&str, &str)] = &[
    #[cfg(not(feature = "mysql"))]
    ("mysql", "mysql"),
    #[cfg(not(feature = "mysql"))]
    ("mysql-incremental", "mysql"),
    #[cfg(not(feature = "kafka"))]
    ("kafka", "kafka"),
    #[cfg(not(feature = "pulsar"))]
    ("pulsar", "pulsar"),
];

/// Every kind's name, those this build left out included.
pub fn all_names() -> Vec<&'static str> {
    KINDS
        .iter()
        .map(|k| k.name)
        .chain(LEFT_OUT.iter().map(|(k, _)| *k))
        .collect()
}

/// `Some((kind, feature))` when `name` is a kind this build left out.
pub fn left_out(name: &str) -> Option<(&'static str, &'static str)> {
    LEFT_OUT.iter().copied().find(|(k, _)| *k == name)
}

/// The registered kind called `name`.
pub fn find(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

impl Kind {
    /// Reads this kind's `[source]` table.
    pub(crate) fn read(
        &self,
        r: &mut Reader<'_, '_>,
        item: &Item,
        line: Option<usize>,
    ) -> Option<Arc<dyn SourcePlug>> {
        (self.read)(r, item, line)
    }
}

fn read<T: DeserializeOwned + SourcePlug>(
    r: &mut Reader<'_, '_>,
    item: &Item,
    line: Option<usize>,
) -> Option<Arc<dyn SourcePlug>> {
    let mark = r.mark();
    let config: T = r.serde_table(item, "source", crate::config::SOURCE_SHARED)?;
    // Offline with an unset variable: kept as written, judged by `run`.
    if !r.judged_since(mark) {
        return Some(Arc::new(config));
    }
    let problems = config.problems();
    for p in &problems {
        r.problem_in(item, "source", p, line);
    }
    problems
        .is_empty()
        .then(|| Arc::new(config) as Arc<dyn SourcePlug>)
}

/// What `cfg` asks of its source.
pub fn plan(cfg: &Config) -> Plan {
    Plan {
        watched: cfg
            .views
            .iter()
            .flat_map(|v| v.watch.iter().map(|w| w.watched(&v.name)))
            .collect(),
        tables: cfg.watched_tables(),
        changefeed: cfg.changefeed.is_some(),
    }
}
