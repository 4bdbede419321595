//! Wire formats for freshen: change events from brokers decoded into
//! [`freshen::RowEvent`]s, and freshen's own captured changes encoded for them.
//!
//! Pure: no I/O, no async; serde and serde_json, hmac/sha2 for redaction, and ring's
//! AEAD for positions that hold redacted values (sealed, see [`Redactor::seal_position`]).
//!
//! - [`CanalJson`] decodes canal-json, what TiCDC (`protocol=canal-json`) and Alibaba
//!   Canal write to Kafka and Pulsar.
//! - [`DebeziumJson`] decodes Debezium's JSON change events; [`DebeziumEncoder`] writes
//!   them, for the Kafka sink.
//! - [`Decoder`] picks one by [`Format`] at run time.
//! - [`split_key_change`] turns a primary-key UPDATE into a DELETE of the old key and
//!   an INSERT of the new one, as every keyed output publishes it.
//! - [`Redactor`] rewrites row images before they leave freshen (`[[redact]]`: drop,
//!   mask, keyed hash, truncate), for the changefeed and the sinks alike.
//! - [`SnapshotProgress`]: a table's snapshot progress as the changefeed and the sinks
//!   store it and show it (JSON), its position sealed where a rule hides a key column.
//!
//! A decoder never panics, whatever the bytes: a message it cannot read is a
//! [`DecodeError`] (the source skips and counts it), and a message that carries no rows
//! (DDL, watermarks, tombstones, heartbeats) is a [`Decoded::Control`], no error. A
//! message that changed rows without carrying them whole (a TiCDC key-only message, a
//! Canal partial image or statement, a dropped partition) is a [`Decoded::Gap`]: the
//! source hands it on and the views over the table sweep; [`Format::capabilities`] says
//! which formats can lose rows that way.
//!
//! ```
//! use freshen::{Op, Value};
//! use freshen_codec::{Decoded, Decoder, Format};
//!
//! let mut decoder = Decoder::new(Format::CanalJson);
//! let msg = br#"{"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,
//!   "type":"INSERT","es":1786358942713,"sqlType":{"id":4,"device":12},
//!   "mysqlType":{"id":"int","device":"varchar"},"old":null,
//!   "data":[{"id":"1","device":"dev-a"},{"id":"2","device":"dev-b"}]}"#;
//! let events = decoder.decode(None, Some(msg)).unwrap().into_events();
//! assert_eq!(events.len(), 2);
//! assert_eq!(events[1].op, Op::Insert);
//! assert_eq!(events[1].new.as_ref().unwrap().get("id"), Some(&Value::Int(2)));
//!
//! let watermark = br#"{"type":"TIDB_WATERMARK","_tidb":{"watermarkTs":434919270523076621}}"#;
//! assert!(matches!(decoder.decode(None, Some(watermark)), Ok(Decoded::Control(_))));
//! assert!(decoder.decode(None, Some(br#"{"type":"SURPRISE"}"#)).is_err());
//! ```
//!
//! # Value mapping
//!
//! canal-json (every value a string, typed by `mysqlType`/`sqlType`):
//!
//! | column type | value |
//! |---|---|
//! | `tinyint` … `bigint`, `year`, `bit` | `Value::Int`; digits past `i64` (a large `bigint unsigned`) stay `Value::Text` |
//! | `float`, `double`, `real` | `Value::Float` |
//! | `bool`, `boolean` | `Value::Bool`; MySQL's BOOLEAN is `tinyint(1)` and stays `Value::Int` 0/1, which is what a rebuild must bind |
//! | `json` | `Value::Json` |
//! | `binary`, `varbinary`, `*blob` | `Value::Bytes` (canal writes bytes as ISO-8859-1 text); text that cannot be ISO-8859-1 stays `Value::Text` |
//! | anything else (`decimal`, `varchar`, dates, `enum`, …) | `Value::Text` as sent (decimals keep their digits) |
//!
//! A value that does not parse as its type stays `Value::Text`: the event is a doorbell,
//! and dropping it would be worse than a key in text form.
//!
//! Debezium: see [`DebeziumJson`] (decoding) and [`DebeziumEncoder`] (encoding).
//! [`Value::Unchanged`](freshen::Value::Unchanged) travels as [`UNAVAILABLE_VALUE`]
//! both ways.

mod base64;
mod canal;
mod canal_types;
mod columns;
mod debezium;
mod debezium_encode;
mod decoded;
mod error;
mod format;
mod hex;
mod json;
mod key_change;
mod progress;
mod redact;
mod seal;

pub use canal::CanalJson;
pub use debezium::{DebeziumJson, UNAVAILABLE_VALUE};
pub use debezium_encode::{DebeziumEncoder, DebeziumRecord, NEW_KEY_HEADER, OLD_KEY_HEADER};
pub use decoded::{Control, Decoded};
pub use error::DecodeError;
pub use format::{Decoder, Format};
pub use key_change::{KeyChange, changes_key, split_key_change};
pub use progress::{SnapshotProgress, SnapshotState};
pub use redact::{
    Action as RedactAction, DEFAULT_MASK_LENGTH, HashKey, MASK_CHAR, Mask, RedactRule, Redactor,
    hmac_hex, redact_value,
};
pub use seal::SEALED_PREFIX;
