//! Zero-copy JSON building blocks shared by the decoders: borrowed strings, scalars, and
//! objects read as ordered `(name, value)` pairs.
//!
//! serde_json's own map sorts keys (its `preserve_order` feature would pull in another
//! crate), but a row image must keep table order, so objects are read pair by pair.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A string, borrowed from the input when it holds no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl Str<'_> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// Any JSON value, with nested objects and arrays kept as their JSON text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar<'a> {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(Cow<'a, str>),
    /// An object or array, re-serialized as compact JSON text.
    Nested(String),
}

impl Scalar<'_> {
    /// A non-negative integer, from a number or a string of digits.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Scalar::U64(u) => Some(*u),
            Scalar::I64(i) => u64::try_from(*i).ok(),
            Scalar::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::I64(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar<'a>, E> {
                Ok(match i64::try_from(v) {
                    Ok(i) => Scalar::I64(i),
                    Err(_) => Scalar::U64(v),
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::F64(v))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar<'a>, A::Error> {
                let v = serde_json::Value::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(Scalar::Nested(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar<'a>, A::Error> {
                let v = serde_json::Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Scalar::Nested(v.to_string()))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A JSON object as its `(name, value)` pairs, in document order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pairs<'a, T>(pub(crate) Vec<(Str<'a>, T)>);

impl<'a, T> Pairs<'a, T> {
    /// The value of `name`: first looked up at `hint` (producers usually write a
    /// message's maps in one column order), then by a scan.
    pub(crate) fn get_at(&self, hint: usize, name: &str) -> Option<&T> {
        if let Some((k, v)) = self.0.get(hint)
            && k.as_str() == name
        {
            return Some(v);
        }
        self.0
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v)
    }
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Pairs<'a, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a, T>(PhantomData<(&'a (), T)>);
        impl<'de: 'a, 'a, T: Deserialize<'de>> Visitor<'de> for V<'a, T> {
            type Value = Pairs<'a, T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs<'a, T>, A::Error> {
                // Cap the preallocation: a size hint is the input's claim, not a fact.
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
                while let Some((k, v)) = map.next_entry::<Str<'a>, T>()? {
                    out.push((k, v));
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A field that may be absent, present as `null`, or present with a value — three
/// different things for a Debezium `payload` (absent: no wrapper; null: a tombstone).
#[derive(Debug, Default)]
pub(crate) enum Field<T> {
    #[default]
    Absent,
    Null,
    Value(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(d)? {
            None => Field::Null,
            Some(v) => Field::Value(v),
        })
    }
}
