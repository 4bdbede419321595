//! The configuration reference held to the parser's keys: a kind's crate tests that
//! its [`Documented`](freshen::reference::Documented) tables list exactly the fields its
//! settings types accept.

use std::collections::BTreeSet;

use freshen::reference::Table;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The field names a serde struct accepts, as its derive hands them to the deserializer.
pub fn fields<'de, T: Deserialize<'de>>() -> BTreeSet<&'static str> {
    struct Fields(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Stop {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            enum identifier ignored_any
        }
    }
    let mut d = Fields(None);
    let _ = T::deserialize(&mut d);
    d.0.expect("a struct with named fields")
        .iter()
        .copied()
        .collect()
}

fn documented(t: &Table) -> BTreeSet<&'static str> {
    t.keys.iter().map(|k| k.name).collect()
}

/// Fails unless table `t` documents exactly the keys `parser` accepts, naming those
/// it lacks and those it has beyond them.
#[track_caller]
pub fn same_keys(t: &Table, parser: impl IntoIterator<Item = &'static str>) {
    let parser: BTreeSet<&str> = parser.into_iter().collect();
    let doc = documented(t);
    let missing: Vec<_> = parser.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&parser).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "`{}`: keys the parser accepts but the reference lacks: {missing:?}; keys the reference has but the parser refuses: {extra:?}",
        t.header
    );
}
