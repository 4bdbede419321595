//! The sink kinds this binary knows: one registration line each.
//!
//! Everything else about a sink — its `[[sinks]]` keys and defaults, validation, how it
//! publishes its branch of the source (with a snapshot's rows spliced in) — lives in its
//! crate, behind [`freshen::plug::SinkPlug`] on its configuration type. The snapshot
//! settings every sink shares are freshen's (`config/sink_snapshot.rs`). To add a sink:
//! implement that trait in its crate and add a line to [`KINDS`].

use std::sync::Arc;

use freshen::plug::SinkPlug;
use serde::de::DeserializeOwned;
use toml_edit::Item;

use crate::config::read::Reader;

/// Reads a kind's `[[sinks]]` table (its path, and the keys that are freshen's),
/// reporting what does not deserialize with its line; values are judged by the caller.
type ReadFn = fn(&mut Reader<'_, '_>, &Item, &str, &[&str]) -> Option<Arc<dyn SinkPlug>>;

/// A registered sink kind.
#[derive(Clone, Copy)]
pub struct Kind {
    /// As `[[sinks]] kind` names it.
    pub name: &'static str,
    read: ReadFn,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The registration of sink kind `T`, read from `[[sinks]]` tables whose `kind` is
/// `name`.
pub const fn kind<T: DeserializeOwned + SinkPlug>(name: &'static str) -> Kind {
    Kind {
        name,
        read: read::<T>,
    }
}

/// Every sink kind, in the order error messages list them.
pub const KINDS: &[Kind] = &[
    #[cfg(feature = "kafka")]
    kind::<freshen_kafka::KafkaSinkConfig>("kafka"),
    #[cfg(feature = "kafka")]
    kind::<freshen_kafka::KafkaOutboxConfig>("kafka-outbox"),
];

/// Kinds left out of this build, and the cargo feature of `freshen-cli` that adds each.
const LEFT_OUT: &[(&str, &str)] = &[
    #[cfg(not(feature = "kafka"))]
    ("kafka", "kafka"),
    #[cfg(not(feature = "kafka"))]
    ("kafka-outbox", "kafka"),
];

/// Every kind `[[sinks]] kind` may name: those built in, then those left out.
pub fn names() -> Vec<&'static str> {
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
    /// Reads this kind's table `item` at `path`, leaving out the keys in `skip`.
    pub(crate) fn read(
        &self,
        r: &mut Reader<'_, '_>,
        item: &Item,
        path: &str,
        skip: &[&str],
    ) -> Option<Arc<dyn SinkPlug>> {
        (self.read)(r, item, path, skip)
    }
}

fn read<T: DeserializeOwned + SinkPlug>(
    r: &mut Reader<'_, '_>,
    item: &Item,
    path: &str,
    skip: &[&str],
) -> Option<Arc<dyn SinkPlug>> {
    let sink: T = r.serde_table(item, path, skip)?;
    Some(Arc::new(sink))
}
