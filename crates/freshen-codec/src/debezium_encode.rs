//! Debezium JSON encoding: freshen's captured changes in Debezium's envelope, so that
//! existing Debezium consumers read them unchanged.

use std::time::{SystemTime, UNIX_EPOCH};

use freshen::{Op, Row, RowEvent, Value};
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::base64;
use crate::debezium::UNAVAILABLE_VALUE;
use crate::key_change::{KeyChange, split_key_change};

/// Kafka header on the DELETE of a primary-key change: the new key (Debezium's name).
pub const NEW_KEY_HEADER: &str = "__debezium.newkey";
/// Kafka header on the CREATE of a primary-key change: the old key (Debezium's name).
pub const OLD_KEY_HEADER: &str = "__debezium.oldkey";

/// One Kafka record of a change: key, value (`None`: a tombstone) and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DebeziumRecord {
    /// The primary key as a JSON object; `None` for events without one.
    pub key: Option<Vec<u8>>,
    /// The envelope; `None` for a tombstone (a null value, which Kafka's log compaction
    /// reads as "forget this key").
    pub value: Option<Vec<u8>>,
    /// Headers: [`NEW_KEY_HEADER`] or [`OLD_KEY_HEADER`] on the halves of a key change.
    pub headers: Vec<(&'static str, Vec<u8>)>,
}

/// Encodes row events as Debezium change events (the JSON converter with
/// `schemas.enable=false`: the bare envelope, no Connect schema) and their keys.
///
/// Value: `{"before", "after", "source", "op", "ts_ms"}` with `op` `c`, `u`, `d` or `t`;
/// `before` is the old image exactly as the source gave it (whole, key columns only, or
/// null), `after` the new image. `source` is `{"version", "connector": "freshen",
/// "name", "ts_ms", "snapshot": "false", "db", "schema", "table"}` plus `"txId"` and
/// `"lsn"` (the transaction id and commit position) when the event has a
/// [`Tx`](freshen::Tx); `ts_ms` inside `source` is the commit time (0 when unknown).
///
/// Key: the primary-key columns as a JSON object, `{"id": 7}`, taken from the new image
/// (the old one for deletes) — what a Debezium key holds, so that one key's changes
/// share a partition.
///
/// A primary-key change (an UPDATE that moves the row to another key) is, as Debezium
/// publishes it, three records ([`records`](Self::records)): a DELETE (`op` `d`) keyed
/// by the old key with header [`NEW_KEY_HEADER`], a tombstone for the old key, and a
/// CREATE (`op` `c`) keyed by the new key with header [`OLD_KEY_HEADER`].
///
/// Values: NULL → `null`; booleans and integers → JSON booleans and numbers; finite
/// floats → numbers, NaN and infinities → the strings `"NaN"`, `"Infinity"`,
/// `"-Infinity"` (JSON has no such numbers); text → string; JSON → its text as a string
/// (as Debezium's `io.debezium.data.Json`); bytes → base64 (Debezium's default
/// `binary.handling.mode`); [`Value::Unchanged`] → [`UNAVAILABLE_VALUE`], which
/// [`DebeziumJson`](crate::DebeziumJson) decodes back to `Unchanged` — never null, which
/// would claim the column was cleared.
///
/// ```
/// use freshen::{Op, Row, RowEvent, Value};
/// use freshen_codec::DebeziumEncoder;
/// let enc = DebeziumEncoder::new("shop");
/// let e = RowEvent::new("public", "orders", Op::Insert)
///     .with_pk(["id"])
///     .with_new(Row::from_pairs([("id", Value::Int(7)), ("total", Value::text("9.50"))]));
/// let value = String::from_utf8(enc.encode_value(&e, 1_700_000_000_000)).unwrap();
/// assert!(value.starts_with(r#"{"before":null,"after":{"id":7,"total":"9.50"},"source":{"#));
/// assert_eq!(enc.encode_key(&e).unwrap(), br#"{"id":7}"#);
/// ```
#[derive(Debug, Clone)]
pub struct DebeziumEncoder {
    name: String,
    database: String,
}

impl DebeziumEncoder {
    /// An encoder whose events name `name` as their logical server (Debezium's
    /// `topic.prefix`), in `source.name`.
    pub fn new(name: impl Into<String>) -> DebeziumEncoder {
        DebeziumEncoder {
            name: name.into(),
            database: String::new(),
        }
    }

    /// Sets the database name written in `source.db` (default empty: a row event
    /// knows its schema, not its database).
    pub fn database(mut self, database: impl Into<String>) -> DebeziumEncoder {
        self.database = database.into();
        self
    }

    /// The event's value; `ts_ms` is when it was processed (ms since the Unix epoch).
    pub fn encode_value(&self, event: &RowEvent, ts_ms: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.encode_value_into(event, ts_ms, &mut out);
        out
    }

    /// Appends the event's value to `out` (reusing a buffer).
    pub fn encode_value_into(&self, event: &RowEvent, ts_ms: u64, out: &mut Vec<u8>) {
        let envelope = Envelope {
            enc: self,
            event,
            ts_ms,
            read: false,
        };
        // Writing to a Vec cannot fail, and every map key here is a string.
        serde_json::to_writer(out, &envelope).expect("serializing to memory cannot fail");
    }

    /// Appends the value of a row read by a snapshot to `out`: `op` `r` (Debezium's
    /// READ) and `source.snapshot` `"incremental"`, as Debezium marks the rows of its
    /// incremental (watermark-interleaved, DBLog) snapshots. `event` is the row as an
    /// insert (its `new` image).
    pub fn encode_read_into(&self, event: &RowEvent, ts_ms: u64, out: &mut Vec<u8>) {
        let envelope = Envelope {
            enc: self,
            event,
            ts_ms,
            read: true,
        };
        serde_json::to_writer(out, &envelope).expect("serializing to memory cannot fail");
    }

    /// The Kafka records of `event`: one for most events, three for a primary-key
    /// change (delete, tombstone, create: see the type's docs).
    pub fn records(&self, event: &RowEvent, ts_ms: u64) -> Vec<DebeziumRecord> {
        match split_key_change(event) {
            None => vec![DebeziumRecord {
                key: self.encode_key(event),
                value: Some(self.encode_value(event, ts_ms)),
                headers: Vec::new(),
            }],
            Some(KeyChange { delete, insert }) => {
                let old_key = self.encode_key(&delete);
                let new_key = self.encode_key(&insert);
                vec![
                    DebeziumRecord {
                        key: old_key.clone(),
                        value: Some(self.encode_value(&delete, ts_ms)),
                        headers: new_key
                            .iter()
                            .map(|k| (NEW_KEY_HEADER, k.clone()))
                            .collect(),
                    },
                    DebeziumRecord {
                        key: old_key.clone(),
                        value: None,
                        headers: Vec::new(),
                    },
                    DebeziumRecord {
                        key: new_key,
                        value: Some(self.encode_value(&insert, ts_ms)),
                        headers: old_key.into_iter().map(|k| (OLD_KEY_HEADER, k)).collect(),
                    },
                ]
            }
        }
    }

    /// The event's key, `{"pk": value, …}`; `None` when the event has no primary-key
    /// columns or its images lack them (a truncate, a table without a key).
    pub fn encode_key(&self, event: &RowEvent) -> Option<Vec<u8>> {
        if event.pk_names.is_empty() {
            return None;
        }
        let new = event.new.as_ref();
        let old = event.old.as_ref();
        let mut pairs = Vec::with_capacity(event.pk_names.len());
        for name in event.pk_names.iter() {
            let value = known(new, name).or_else(|| known(old, name))?;
            pairs.push((&**name, value));
        }
        serde_json::to_vec(&KeyJson(&pairs)).ok()
    }
}

/// `column`'s value in `row` when the image has it and it is known.
fn known<'r>(row: Option<&'r Row>, column: &str) -> Option<&'r Value> {
    row?.get(column).filter(|v| !v.is_unchanged())
}

fn op_code(op: Op) -> &'static str {
    match op {
        Op::Insert => "c",
        Op::Update => "u",
        Op::Delete => "d",
        Op::Truncate => "t",
    }
}

fn millis(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Envelope<'a> {
    enc: &'a DebeziumEncoder,
    event: &'a RowEvent,
    ts_ms: u64,
    /// A row read by a snapshot.
    read: bool,
}

impl Serialize for Envelope<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.event;
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("before", &e.old.as_ref().map(RowJson))?;
        m.serialize_entry("after", &e.new.as_ref().map(RowJson))?;
        m.serialize_entry(
            "source",
            &SourceJson {
                enc: self.enc,
                event: e,
                read: self.read,
            },
        )?;
        m.serialize_entry("op", if self.read { "r" } else { op_code(e.op) })?;
        m.serialize_entry("ts_ms", &self.ts_ms)?;
        m.end()
    }
}

struct SourceJson<'a> {
    enc: &'a DebeziumEncoder,
    event: &'a RowEvent,
    read: bool,
}

impl Serialize for SourceJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.event;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("version", env!("CARGO_PKG_VERSION"))?;
        m.serialize_entry("connector", "freshen")?;
        m.serialize_entry("name", &self.enc.name)?;
        m.serialize_entry("ts_ms", &millis(e.commit_ts))?;
        m.serialize_entry("snapshot", if self.read { "incremental" } else { "false" })?;
        m.serialize_entry("db", &self.enc.database)?;
        m.serialize_entry("schema", &*e.schema)?;
        m.serialize_entry("table", &*e.table)?;
        if let Some(tx) = e.tx {
            m.serialize_entry("txId", &tx.id)?;
            m.serialize_entry("lsn", &tx.commit)?;
        }
        m.end()
    }
}

struct RowJson<'a>(&'a Row);

impl Serialize for RowJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0.iter() {
            m.serialize_entry(name, &ValueJson(value))?;
        }
        m.end()
    }
}

struct KeyJson<'a>(&'a [(&'a str, &'a Value)]);

impl Serialize for KeyJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            m.serialize_entry(name, &ValueJson(value))?;
        }
        m.end()
    }
}

struct ValueJson<'a>(&'a Value);

impl Serialize for ValueJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit(),
            Value::Unchanged => s.serialize_str(UNAVAILABLE_VALUE),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(x) if x.is_finite() => s.serialize_f64(*x),
            Value::Float(x) if x.is_nan() => s.serialize_str("NaN"),
            Value::Float(x) if *x > 0.0 => s.serialize_str("Infinity"),
            Value::Float(_) => s.serialize_str("-Infinity"),
            Value::Text(t) | Value::Json(t) => s.serialize_str(t),
            Value::Bytes(b) => s.serialize_str(&base64::encode(b)),
            // A variant added to the core later: its text form, or null.
            other => match other.to_text() {
                Some(t) => s.serialize_str(&t),
                None => s.serialize_unit(),
            },
        }
    }
}
