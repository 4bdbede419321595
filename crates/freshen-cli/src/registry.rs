//! One registry for every kind of part the configuration picks by name — sources by
//! `[source] kind`, sinks by `[[sinks]] kind`, targets by their URL's scheme — and the
//! three of them together ([`Kinds`]), which the configuration reader is handed.
//!
//! A registry knows names, not kinds: each entry is the names a kind answers to and
//! either how it is made or the cargo feature that would build it in, so a file naming
//! a kind this build left out is told which feature adds it. What each part is made
//! from is the registry's type parameter. The registration lines themselves are
//! [`crate::kinds`].

use std::sync::Arc;

use freshen::plug::{SinkPlug, SourcePlug, TargetPlug};
use freshen::reference::{Documented, Table};
use serde::de::DeserializeOwned;
use toml_edit::de::{Error as DeError, ValueDeserializer};

/// A kind of part: the names it answers to (the first is the one messages use), the
/// cargo feature of `freshen-cli` that builds it in (if any), and how it is made when
/// this build has it.
#[derive(Clone)]
pub struct Kind<M> {
    names: &'static [&'static str],
    feature: Option<&'static str>,
    made: Option<M>,
}

impl<M> Kind<M> {
    /// A kind built into every build of this binary.
    pub const fn built(names: &'static [&'static str], make: M) -> Kind<M> {
        Kind {
            names,
            feature: None,
            made: Some(make),
        }
    }

    /// A kind behind cargo `feature`, which this build has.
    pub const fn featured(
        names: &'static [&'static str],
        feature: &'static str,
        make: M,
    ) -> Kind<M> {
        Kind {
            names,
            feature: Some(feature),
            made: Some(make),
        }
    }

    /// A kind this build left out, and the cargo feature that adds it.
    pub const fn left_out(names: &'static [&'static str], feature: &'static str) -> Kind<M> {
        Kind {
            names,
            feature: Some(feature),
            made: None,
        }
    }

    /// The names it answers to.
    pub fn names(&self) -> &'static [&'static str] {
        self.names
    }

    /// Its first name, the one messages use.
    pub fn name(&self) -> &'static str {
        self.names.first().copied().unwrap_or("?")
    }

    /// How it is made, when built in.
    pub fn made(&self) -> Option<&M> {
        self.made.as_ref()
    }

    /// The cargo feature that builds it in, if it needs one (built in or not).
    pub fn feature(&self) -> Option<&'static str> {
        self.feature
    }
}

impl<M> std::fmt::Debug for Kind<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.feature, self.made.is_some()) {
            (Some(feature), false) => write!(f, "{} (feature {feature}, left out)", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// What a registry found under a name.
#[derive(Debug)]
pub enum Found<'a, M> {
    /// A kind built in, and how it is made.
    Built(&'static str, &'a M),
    /// A kind this build left out: its first name and the feature that adds it.
    LeftOut(&'static str, &'static str),
    /// No kind answers to it.
    Unknown,
}

/// The kinds of one part, in the order messages list them.
#[derive(Debug, Clone)]
pub struct Registry<M> {
    kinds: Vec<Kind<M>>,
}

impl<M> Registry<M> {
    /// A registry of `kinds`.
    pub fn new(kinds: Vec<Kind<M>>) -> Registry<M> {
        Registry { kinds }
    }

    /// Every kind, built in or left out.
    pub fn kinds(&self) -> &[Kind<M>] {
        &self.kinds
    }

    /// The kind that answers to `name` (names are compared as written).
    pub fn find(&self, name: &str) -> Found<'_, M> {
        match self.kinds.iter().find(|k| k.names.contains(&name)) {
            Some(k) => match (&k.made, k.feature) {
                (Some(m), _) => Found::Built(k.name(), m),
                (None, Some(f)) => Found::LeftOut(k.name(), f),
                (None, None) => Found::Unknown,
            },
            None => Found::Unknown,
        }
    }

    /// The first names of the kinds built in.
    pub fn built(&self) -> Vec<&'static str> {
        self.kinds
            .iter()
            .filter(|k| k.made.is_some())
            .map(Kind::name)
            .collect()
    }

    /// The first names of every kind: built in, then left out.
    pub fn names(&self) -> Vec<&'static str> {
        let left_out = self.kinds.iter().filter(|k| k.made.is_none());
        self.built()
            .into_iter()
            .chain(left_out.map(Kind::name))
            .collect()
    }
}

/// How a source kind is made: its `[source]` table deserialized.
#[derive(Clone, Copy)]
pub struct SourceKind {
    /// Whether the source reads a database, which is then the default `[target]`.
    pub database: bool,
    /// The tables of the configuration reference its settings type documents.
    pub reference: &'static [Table],
    read: fn(ValueDeserializer) -> Result<Arc<dyn SourcePlug>, DeError>,
}

impl SourceKind {
    /// Reads the kind's `[source]` table (everything but the keys every kind shares).
    pub fn read(&self, table: ValueDeserializer) -> Result<Arc<dyn SourcePlug>, DeError> {
        (self.read)(table)
    }
}

/// A source kind whose `[source]` table deserializes into `T`.
pub fn source<T: DeserializeOwned + SourcePlug + Documented>(database: bool) -> SourceKind {
    SourceKind {
        database,
        reference: T::REFERENCE,
        read: |d| T::deserialize(d).map(|t| Arc::new(t) as Arc<dyn SourcePlug>),
    }
}

/// How a sink kind is made: its `[[sinks]]` table deserialized.
#[derive(Clone, Copy)]
pub struct SinkKind {
    /// The tables of the configuration reference its settings type documents.
    pub reference: &'static [Table],
    read: fn(ValueDeserializer) -> Result<Arc<dyn SinkPlug>, DeError>,
}

impl SinkKind {
    /// Reads the kind's `[[sinks]]` table (everything but the keys every sink shares).
    pub fn read(&self, table: ValueDeserializer) -> Result<Arc<dyn SinkPlug>, DeError> {
        (self.read)(table)
    }
}

/// A sink kind whose `[[sinks]]` table deserializes into `T`.
pub fn sink<T: DeserializeOwned + SinkPlug + Documented>() -> SinkKind {
    SinkKind {
        reference: T::REFERENCE,
        read: |d| T::deserialize(d).map(|t| Arc::new(t) as Arc<dyn SinkPlug>),
    }
}

/// Opens a target from its URL, or lists every problem with it.
type OpenTarget = fn(&str) -> Result<Arc<dyn TargetPlug>, Vec<String>>;

/// How a target kind is made: parsed from its URL.
#[derive(Clone, Copy)]
pub struct TargetKind {
    open: OpenTarget,
}

/// A target kind parsed from its URL as `T`.
pub fn target<T: TargetPlug>() -> TargetKind {
    TargetKind {
        open: |url| T::open(url).map(|t| Arc::new(t) as Arc<dyn TargetPlug>),
    }
}

/// The kinds a configuration may name: sources, targets (by URL scheme) and sinks.
#[derive(Debug, Clone)]
pub struct Kinds {
    /// By `[source] kind`.
    pub sources: Registry<SourceKind>,
    /// By the scheme of `[target] url`.
    pub targets: Registry<TargetKind>,
    /// By `[[sinks]] kind`.
    pub sinks: Registry<SinkKind>,
}

impl Kinds {
    /// The target `url` names, or every problem with it (never quoting its password).
    pub fn open_target(&self, url: &str) -> Result<Arc<dyn TargetPlug>, Vec<String>> {
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default();
        match self.targets.find(&scheme) {
            Found::Built(_, k) => (k.open)(url),
            Found::LeftOut(scheme, feature) => Err(vec![format!(
                "a {scheme}:// target is not built into this freshen: build it with `--features {feature}`"
            )]),
            Found::Unknown => {
                let names: Vec<String> = self
                    .targets
                    .kinds()
                    .iter()
                    .filter(|k| k.made().is_some())
                    .map(|k| match k.names() {
                        [one] => format!("{one}://"),
                        [first, rest @ ..] => {
                            format!("{first}:// (or {})", rest.join("://, ") + "://")
                        }
                        [] => String::new(),
                    })
                    .collect();
                Err(vec![format!(
                    "must be a {} URL, not {}",
                    names.join(" or "),
                    freshen::redact_url(url)
                )])
            }
        }
    }
}

impl std::fmt::Debug for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceKind")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SinkKind")
    }
}

impl std::fmt::Debug for TargetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TargetKind")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_finds_its_kind_or_the_feature_that_adds_it() {
        let r: Registry<u8> = Registry::new(vec![
            Kind::built(&["a", "alpha"], 1),
            Kind::left_out(&["b"], "bee"),
            Kind::built(&["c"], 3),
        ]);
        assert!(matches!(r.find("alpha"), Found::Built("a", 1)));
        assert!(matches!(r.find("b"), Found::LeftOut("b", "bee")));
        assert!(matches!(r.find("z"), Found::Unknown));
        assert_eq!(r.built(), ["a", "c"]);
        assert_eq!(r.names(), ["a", "c", "b"]);
    }
}
