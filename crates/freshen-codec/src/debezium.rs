//! Debezium JSON decoding: the change-event envelope, with or without Kafka Connect's
//! `schema`/`payload` wrapper.

use freshen::{Op, Row, RowEvent, Tx, Value};
use serde::Deserialize;

use crate::canal::commit_ts;
use crate::columns::{TableCache, TableRef};
use crate::json::{Field, Pairs, Scalar, Str};
use crate::{Control, DecodeError, Decoded, base64};

/// Debezium's stand-in for a value it did not capture (PostgreSQL's unchanged TOAST
/// columns): `unavailable.value.placeholder`'s default. Decoded to
/// [`Value::Unchanged`](freshen::Value::Unchanged) and written for it.
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";
const JSON: &str = "io.debezium.data.Json";

type Image<'a> = Pairs<'a, Scalar<'a>>;

/// The top level: either the wrapper (`schema`, `payload`) or the bare payload, whose
/// fields are repeated here (serde's `flatten` would buffer every field first).
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(default, borrow)]
    schema: Option<Schema<'a>>,
    #[serde(default, borrow)]
    payload: Field<Payload<'a>>,
    #[serde(default, borrow)]
    before: Option<Image<'a>>,
    #[serde(default, borrow)]
    after: Option<Image<'a>>,
    #[serde(default, borrow)]
    source: Option<Source<'a>>,
    #[serde(default, borrow)]
    op: Option<Str<'a>>,
    #[serde(default, borrow)]
    transaction: Option<Transaction<'a>>,
    #[serde(default, borrow)]
    ddl: Option<Str<'a>>,
    #[serde(default, borrow, rename = "databaseName")]
    database_name: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(default, borrow)]
    before: Option<Image<'a>>,
    #[serde(default, borrow)]
    after: Option<Image<'a>>,
    #[serde(default, borrow)]
    source: Option<Source<'a>>,
    #[serde(default, borrow)]
    op: Option<Str<'a>>,
    #[serde(default, borrow)]
    transaction: Option<Transaction<'a>>,
    /// Present on Debezium's schema-change topic instead of `op`.
    #[serde(default, borrow)]
    ddl: Option<Str<'a>>,
    #[serde(default, borrow, rename = "databaseName")]
    database_name: Option<Str<'a>>,
}

#[derive(Deserialize, Default)]
struct Source<'a> {
    #[serde(default, borrow)]
    db: Option<Str<'a>>,
    #[serde(default, borrow)]
    schema: Option<Str<'a>>,
    #[serde(default, borrow)]
    table: Option<Str<'a>>,
    #[serde(default, borrow, rename = "txId")]
    tx_id: Option<Scalar<'a>>,
    #[serde(default, borrow)]
    lsn: Option<Scalar<'a>>,
    #[serde(default, borrow)]
    ts_ms: Option<Scalar<'a>>,
}

#[derive(Deserialize)]
struct Transaction<'a> {
    #[serde(default, borrow)]
    total_order: Option<Scalar<'a>>,
}

/// A Kafka Connect schema node (only what typing string values needs).
#[derive(Deserialize)]
struct Schema<'a> {
    #[serde(default, borrow)]
    field: Option<Str<'a>>,
    #[serde(default, borrow, rename = "type")]
    kind: Option<Str<'a>>,
    #[serde(default, borrow)]
    name: Option<Str<'a>>,
    #[serde(default, borrow)]
    fields: Option<Vec<Schema<'a>>>,
    #[serde(default, borrow)]
    parameters: Option<Pairs<'a, Scalar<'a>>>,
}

impl<'a> Schema<'a> {
    fn child(&self, name: &str) -> Option<&Schema<'a>> {
        self.fields
            .as_ref()?
            .iter()
            .find(|f| f.field.as_ref().is_some_and(|n| n.as_str() == name))
    }
}

/// How a JSON string of a column is read, from the column's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrType {
    Text,
    Bytes,
    Json,
    Decimal(u32),
}

impl StrType {
    fn of(schema: Option<&Schema<'_>>) -> StrType {
        let Some(s) = schema else {
            return StrType::Text;
        };
        match s.name.as_ref().map(Str::as_str) {
            Some(JSON) => return StrType::Json,
            Some(DECIMAL) => {
                let scale = s
                    .parameters
                    .as_ref()
                    .and_then(|p| p.get_at(0, "scale"))
                    .and_then(Scalar::as_u64)
                    .and_then(|x| u32::try_from(x).ok());
                if let Some(scale) = scale {
                    return StrType::Decimal(scale);
                }
            }
            _ => {}
        }
        match s.kind.as_ref().map(Str::as_str) {
            Some("bytes") => StrType::Bytes,
            _ => StrType::Text,
        }
    }
}

/// Decodes Debezium change events (JSON converter, schemas on or off) into row events.
///
/// - `op`: `c` and `r` (snapshot read) are inserts, `u` updates, `d` deletes, `t`
///   truncates; `m` (a logical-decoding message) is a [`Control::Other`]; anything else
///   is [`DecodeError::UnknownType`].
/// - `before` is the old image, `after` the new one, in the producer's column order.
/// - `source`: `schema` when present (PostgreSQL), else `db` (MySQL), becomes the event's
///   `schema`; `table`; `ts_ms` the commit time; `txId` with `lsn` a [`Tx`] (`id` = txId,
///   `commit` = lsn — Debezium's lsn is the change's own position, which orders like
///   the commit — `index` = `transaction.total_order - 1`, or 0). No txId, no `Tx`.
/// - A null value (a tombstone after a delete, for log compaction), or a wrapper whose
///   payload is null, is [`Control::Tombstone`]; a message of the schema-change topic
///   (`ddl`) is [`Control::Ddl`]; a heartbeat (no `op`, no images) is
///   [`Control::Other`] `heartbeat`.
/// - The primary key's column names are not in the value: pass the message key to
///   [`decode_with_key`](Self::decode_with_key) to fill `pk_names` (a key that is not
///   a JSON object is ignored — the event still flows).
///
/// Values: JSON null, booleans and numbers map to [`Value::Null`], [`Value::Bool`],
/// [`Value::Int`] (or [`Value::Text`] past `i64`) and [`Value::Float`]; objects and
/// arrays to [`Value::Json`]. Strings are [`Value::Text`] unless the wrapper's schema
/// says otherwise: `bytes` columns are base64 → [`Value::Bytes`], `Decimal` columns
/// (base64 two's complement with a scale) → their decimal text, `io.debezium.data.Json`
/// → [`Value::Json`]. [`UNAVAILABLE_VALUE`] (as text, or as base64 bytes) is
/// [`Value::Unchanged`]. Without a schema nothing says a string was bytes, so bytes
/// arrive as their base64 text.
#[derive(Debug, Default)]
pub struct DebeziumJson {
    cache: TableCache,
}

impl DebeziumJson {
    /// A decoder with an empty name cache.
    pub fn new() -> DebeziumJson {
        DebeziumJson::default()
    }

    /// Decodes one message value (`None` or empty: a tombstone). Never panics.
    pub fn decode(&mut self, value: Option<&[u8]>) -> Result<Decoded, DecodeError> {
        self.decode_with_key(None, value)
    }

    /// Decodes one message, taking the primary-key column names from its key.
    pub fn decode_with_key(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<Decoded, DecodeError> {
        let value = value.unwrap_or_default();
        if value.iter().all(u8::is_ascii_whitespace) {
            return Ok(Decoded::Control(Control::Tombstone));
        }
        let Some(top): Option<Top<'_>> = serde_json::from_slice(value)? else {
            return Ok(Decoded::Control(Control::Tombstone));
        };
        let (payload, schema) = match top.payload {
            Field::Null => return Ok(Decoded::Control(Control::Tombstone)),
            Field::Value(p) => (p, top.schema),
            // No wrapper: the top level is the payload.
            Field::Absent => (
                Payload {
                    before: top.before,
                    after: top.after,
                    source: top.source,
                    op: top.op,
                    transaction: top.transaction,
                    ddl: top.ddl,
                    database_name: top.database_name,
                },
                None,
            ),
        };
        self.payload(key, payload, schema.as_ref())
    }

    fn payload(
        &mut self,
        key: Option<&[u8]>,
        p: Payload<'_>,
        schema: Option<&Schema<'_>>,
    ) -> Result<Decoded, DecodeError> {
        let Some(op) = p.op.as_ref().map(Str::as_str) else {
            if let Some(ddl) = &p.ddl {
                return Ok(Decoded::Control(Control::Ddl {
                    schema: p.database_name.as_ref().map_or("", Str::as_str).to_owned(),
                    table: String::new(),
                    kind: "DDL".to_owned(),
                    sql: ddl.as_str().to_owned(),
                }));
            }
            if p.before.is_none() && p.after.is_none() && p.source.is_none() {
                return Ok(Decoded::Control(Control::Other {
                    kind: "heartbeat".to_owned(),
                }));
            }
            return Err(DecodeError::malformed("a change event without op"));
        };
        let op = match op {
            "c" | "r" => Op::Insert,
            "u" => Op::Update,
            "d" => Op::Delete,
            "t" => Op::Truncate,
            "m" => {
                return Ok(Decoded::Control(Control::Other {
                    kind: "m".to_owned(),
                }));
            }
            other => return Err(DecodeError::unknown_type(other)),
        };
        if matches!(op, Op::Insert | Op::Update) && p.after.is_none() {
            return Err(DecodeError::malformed(format!(
                "{} without after",
                op.as_str()
            )));
        }
        let source = p.source.unwrap_or_default();
        let schema_name = source
            .schema
            .as_ref()
            .or(source.db.as_ref())
            .map_or("", Str::as_str);
        let table = source.table.as_ref().map_or("", Str::as_str);
        let mut t = self.cache.table(schema_name, table);
        let mut event = RowEvent::new(t.schema(), t.name(), op);
        event.commit_ts = commit_ts(source.ts_ms.as_ref());
        if let Some(id) = source.tx_id.as_ref().and_then(Scalar::as_u64) {
            let index = p
                .transaction
                .as_ref()
                .and_then(|tx| tx.total_order.as_ref())
                .and_then(Scalar::as_u64)
                .map_or(0, |n| {
                    u32::try_from(n.saturating_sub(1)).unwrap_or(u32::MAX)
                });
            event.tx = Some(Tx {
                id,
                commit: source.lsn.as_ref().and_then(Scalar::as_u64).unwrap_or(0),
                index,
            });
        }
        if let Some(names) = key.and_then(key_names) {
            event.pk_names = t.pk(names.iter().map(Str::as_str));
        }
        if op != Op::Truncate {
            let types = |side: &str| schema.and_then(|s| s.child(side));
            if let Some(after) = &p.after {
                event.new = Some(row(&mut t, after, types("after"))?);
            }
            if let Some(before) = &p.before {
                event.old = Some(row(&mut t, before, types("before"))?);
            }
        }
        Ok(Decoded::Rows(vec![event]))
    }
}

fn row(
    t: &mut TableRef<'_>,
    image: &Image<'_>,
    schema: Option<&Schema<'_>>,
) -> Result<Row, DecodeError> {
    let columns = t.columns(image.0.iter().map(|(k, _)| k.as_str()))?;
    let values = image
        .0
        .iter()
        .map(|(k, v)| value(v, schema.and_then(|s| s.child(k.as_str()))))
        .collect();
    Ok(Row::new(columns, values))
}

fn value(raw: &Scalar<'_>, schema: Option<&Schema<'_>>) -> Value {
    match raw {
        Scalar::Null => Value::Null,
        Scalar::Bool(b) => Value::Bool(*b),
        Scalar::I64(i) => Value::Int(*i),
        Scalar::U64(u) => Value::Text(u.to_string().into()),
        Scalar::F64(x) => Value::Float(*x),
        Scalar::Nested(json) => Value::Json(json.as_str().into()),
        Scalar::Str(s) if s == UNAVAILABLE_VALUE => Value::Unchanged,
        Scalar::Str(s) => {
            let text = || Value::Text(Box::from(&**s));
            match StrType::of(schema) {
                StrType::Text => text(),
                StrType::Json => Value::Json(Box::from(&**s)),
                StrType::Bytes => match base64::decode(s) {
                    Some(b) if b == UNAVAILABLE_VALUE.as_bytes() => Value::Unchanged,
                    Some(b) => Value::Bytes(b.into()),
                    None => text(),
                },
                StrType::Decimal(scale) => match base64::decode(s) {
                    Some(b) if b == UNAVAILABLE_VALUE.as_bytes() => Value::Unchanged,
                    Some(b) => decimal(&b, scale).map_or_else(text, |d| Value::Text(d.into())),
                    None => text(),
                },
            }
        }
    }
}

/// Kafka Connect's `Decimal`: a big-endian two's-complement unscaled integer and a scale.
/// `None` past 128 bits (kept as its base64 text by the caller).
fn decimal(bytes: &[u8], scale: u32) -> Option<String> {
    if bytes.is_empty() || bytes.len() > 16 {
        return None;
    }
    let negative = bytes[0] & 0x80 != 0;
    let mut n: i128 = if negative { -1 } else { 0 };
    for b in bytes {
        n = (n << 8) | i128::from(*b);
    }
    let digits = n.unsigned_abs().to_string();
    let scale = usize::try_from(scale).ok()?;
    if scale > 64 {
        return None;
    }
    let mut out = String::with_capacity(digits.len() + scale + 3);
    if negative {
        out.push('-');
    }
    if scale == 0 {
        out.push_str(&digits);
    } else if digits.len() > scale {
        let (int, frac) = digits.split_at(digits.len() - scale);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', scale - digits.len()));
        out.push_str(&digits);
    }
    Some(out)
}

/// The column names of a message key: a JSON object, wrapped or not.
fn key_names(key: &[u8]) -> Option<Vec<Str<'_>>> {
    let pairs: Pairs<'_, Scalar<'_>> = serde_json::from_slice(key).ok()?;
    let is_wrapper = pairs.0.len() == 2
        && pairs.get_at(0, "schema").is_some()
        && pairs.get_at(1, "payload").is_some();
    if is_wrapper {
        let Some(Scalar::Nested(inner)) = pairs.get_at(1, "payload") else {
            return None;
        };
        let inner: Pairs<'_, Scalar<'_>> = serde_json::from_str(inner).ok()?;
        return Some(
            inner
                .0
                .into_iter()
                .map(|(k, _)| Str(std::borrow::Cow::Owned(k.0.into_owned())))
                .collect(),
        );
    }
    Some(pairs.0.into_iter().map(|(k, _)| k).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        assert_eq!(decimal(&[0x04, 0xd2], 2).as_deref(), Some("12.34"));
        assert_eq!(decimal(&[0xfb, 0x2e], 2).as_deref(), Some("-12.34"));
        assert_eq!(decimal(&[0x05], 3).as_deref(), Some("0.005"));
        assert_eq!(decimal(&[0x05], 0).as_deref(), Some("5"));
        assert_eq!(
            decimal(&[0x80; 16], 0).map(|s| s.starts_with('-')),
            Some(true)
        );
        assert_eq!(decimal(&[1; 17], 0), None);
        assert_eq!(decimal(&[], 0), None);
    }

    #[test]
    fn key_names_with_and_without_wrapper() {
        let names = |k: &[u8]| {
            key_names(k).map(|v| v.into_iter().map(|s| s.0.into_owned()).collect::<Vec<_>>())
        };
        assert_eq!(
            names(br#"{"b":1,"a":2}"#),
            Some(vec!["b".into(), "a".into()])
        );
        assert_eq!(
            names(br#"{"schema":{"type":"struct"},"payload":{"id":7}}"#),
            Some(vec!["id".into()])
        );
        assert_eq!(names(b"\"plain\""), None);
    }
}
