//! The stored form of one changefeed event, and its ThemisDB-compatible JSON.
//!
//! A record is a small binary header (what filters and retention read) followed by the
//! event's JSON text without its `sequence`. The sequence is the record's key in the
//! store; serving an event is `{"sequence":N,` + body — no JSON is parsed or re-encoded
//! on the read path, however many clients read it.
//!
//! Header, little-endian: `version: u8` (2), `op: u8`, `appended_ms: u64`,
//! `key_len: u32`, `key`, `schema_len: u16`, `schema`, `table_len: u16`, `table`,
//! `flags: u8`. Version 1 (written before the latest-per-key index) has no `flags`; it
//! is still read.
//!
//! The only flag, [`FLAG_KEYED`], says the record belongs to one row (its table has a
//! primary key and the operation is not a TRUNCATE): the latest-per-key index and
//! compaction apply to it.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use freshen::{Op, Row, RowEvent, Value, clip};
use serde_json::value::RawValue;

const VERSION: u8 = 2;
const FIXED_V1: usize = 1 + 1 + 8 + 4;
const FIXED: usize = FIXED_V1 + 1;

/// The record belongs to one row: see the module docs.
const FLAG_KEYED: u8 = 1;

/// Column values of a row's last known image, as JSON text, by column name: what
/// fills the values a source left out as unchanged.
pub(crate) type Fill = HashMap<String, Box<RawValue>>;

/// What an event's JSON says beyond the event itself.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Extra<'a> {
    /// The DELETE half of a primary-key change: the key the row moved to.
    pub(crate) new_key: Option<&'a str>,
    /// The PUT half of a primary-key change: the key the row moved from.
    pub(crate) old_key: Option<&'a str>,
    /// The row's last image, for values the source left out as unchanged.
    pub(crate) fill: Option<&'a Fill>,
    /// A row read by a snapshot: `op` is `read` (Debezium's `r`), `type` stays `PUT`.
    pub(crate) read: bool,
}

/// The source position a stored record carries (its `lsn` and `xid`), when it has one:
/// a snapshot's `read` events and sources without transactions have none.
///
/// Found by searching the body for the top-level fields: inside the JSON string values
/// every quote is escaped, so `,"lsn":"` cannot occur there.
pub(crate) fn position_of(r: &RecordRef<'_>) -> Option<(u64, u64)> {
    let body = std::str::from_utf8(r.body).ok()?;
    let at = body.rfind(",\"lsn\":\"")?;
    let rest = &body[at + 8..];
    let (lsn, rest) = rest.split_once('"')?;
    let (hi, lo) = lsn.split_once('/')?;
    let lsn = (u64::from(u32::from_str_radix(hi, 16).ok()?) << 32)
        | u64::from(u32::from_str_radix(lo, 16).ok()?);
    let rest = rest.strip_prefix(",\"xid\":")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    Some((lsn, rest[..end].parse().ok()?))
}

/// The latest-per-key index's key for a row: `schema \0 table \0 pk`. PostgreSQL and
/// MySQL names cannot hold NUL, so one table's keys form one contiguous range.
pub(crate) fn index_key(schema: &str, table: &str, pk: &str) -> String {
    let mut k = String::with_capacity(schema.len() + table.len() + pk.len() + 2);
    k.push_str(schema);
    k.push('\0');
    k.push_str(table);
    k.push('\0');
    k.push_str(pk);
    k
}

/// The range of index keys of one table: `[start, end)`.
pub(crate) fn table_range(schema: &str, table: &str) -> (String, String) {
    let start = index_key(schema, table, "");
    let mut end = start.clone();
    end.pop();
    end.push('\u{1}');
    (start, end)
}

/// The last image a stored PUT holds (its `value`), column by column; `None` for a
/// DELETE or a record that does not read.
pub(crate) fn image_of(r: &RecordRef<'_>) -> Option<Fill> {
    if !matches!(r.op, Op::Insert | Op::Update) {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Body {
        value: Option<String>,
    }
    let mut json = Vec::with_capacity(r.body.len() + 1);
    json.push(b'{');
    json.extend_from_slice(r.body);
    let body: Body = serde_json::from_slice(&json).ok()?;
    serde_json::from_str(&body.value?).ok()
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn op_code(op: Op) -> u8 {
    match op {
        Op::Insert => 0,
        Op::Update => 1,
        Op::Delete => 2,
        Op::Truncate => 3,
    }
}

fn op_from_code(code: u8) -> Option<Op> {
    Some(match code {
        0 => Op::Insert,
        1 => Op::Update,
        2 => Op::Delete,
        3 => Op::Truncate,
        _ => return None,
    })
}

/// ThemisDB's event type for an operation: `PUT` for rows that exist afterwards,
/// `DELETE` otherwise (a TRUNCATE deletes every row of its table).
pub(crate) fn themis_type(op: Op) -> &'static str {
    match op {
        Op::Insert | Op::Update => "PUT",
        Op::Delete | Op::Truncate => "DELETE",
    }
}

/// A stored record, borrowed: the header fields and the JSON body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordRef<'a> {
    pub(crate) op: Op,
    pub(crate) appended_ms: u64,
    pub(crate) key: &'a str,
    pub(crate) schema: &'a str,
    pub(crate) table: &'a str,
    /// The record belongs to one row (its table has a key; not a TRUNCATE).
    pub(crate) keyed: bool,
    /// The event JSON after `{"sequence":N,`: starts with `"type"`, ends with `}`.
    pub(crate) body: &'a [u8],
    /// The whole record's length.
    pub(crate) len: usize,
}

impl<'a> RecordRef<'a> {
    /// Reads a record; `None` when the bytes are not one (corruption or a newer version).
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<RecordRef<'a>> {
        let (&version, rest) = bytes.split_first()?;
        let has_flags = match version {
            VERSION if bytes.len() >= FIXED => true,
            1 if bytes.len() >= FIXED_V1 => false,
            _ => return None,
        };
        let (&op, rest) = rest.split_first()?;
        let (ms, rest) = rest.split_at_checked(8)?;
        let (klen, rest) = rest.split_at_checked(4)?;
        let klen = u32::from_le_bytes(klen.try_into().ok()?) as usize;
        let (key, rest) = rest.split_at_checked(klen)?;
        let (slen, rest) = rest.split_at_checked(2)?;
        let (schema, rest) =
            rest.split_at_checked(u16::from_le_bytes(slen.try_into().ok()?) as usize)?;
        let (tlen, rest) = rest.split_at_checked(2)?;
        let (table, rest) =
            rest.split_at_checked(u16::from_le_bytes(tlen.try_into().ok()?) as usize)?;
        let (flags, body) = if has_flags {
            let (&f, body) = rest.split_first()?;
            (Some(f), body)
        } else {
            (None, rest)
        };
        let op = op_from_code(op)?;
        let key = std::str::from_utf8(key).ok()?;
        let table = std::str::from_utf8(table).ok()?;
        let keyed = match flags {
            Some(f) => f & FLAG_KEYED != 0,
            // Version 1: a non-empty pk is the best sign of a keyed table.
            None => op != Op::Truncate && key.len() > table.len() + 1,
        };
        Some(RecordRef {
            op,
            appended_ms: u64::from_le_bytes(ms.try_into().ok()?),
            key,
            schema: std::str::from_utf8(schema).ok()?,
            table,
            keyed,
            body,
            len: bytes.len(),
        })
    }

    /// The primary-key part of the key (after `table:`).
    pub(crate) fn pk(&self) -> &'a str {
        self.key.get(self.table.len() + 1..).unwrap_or("")
    }

    /// The latest-per-key index's key of this record, when it is keyed.
    pub(crate) fn index_key(&self) -> Option<String> {
        self.keyed
            .then(|| index_key(self.schema, self.table, self.pk()))
    }

    /// Writes the event's JSON: `{"sequence":N,` + body.
    pub(crate) fn write_json(&self, sequence: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"sequence\":");
        push_u64(out, sequence);
        out.push(b',');
        out.extend_from_slice(self.body);
    }

    /// Writes the event's JSON with a delivery count (consumer-group receives).
    pub(crate) fn write_json_delivery(&self, sequence: u64, deliveries: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"sequence\":");
        let _ = write!(out, "{sequence},\"deliveries\":{deliveries},");
        out.extend_from_slice(self.body);
    }
}

/// Appends the decimal digits of `n` (the hot path writes two per event: `fmt` costs
/// more than the rest of the event).
pub(crate) fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The event JSON of `sequence` as a `String`.
pub(crate) fn event_json(sequence: u64, record: &RecordRef<'_>) -> String {
    let mut out = Vec::with_capacity(record.body.len() + 24);
    record.write_json(sequence, &mut out);
    // The body was produced by `encode` (valid UTF-8 by construction).
    String::from_utf8(out).unwrap_or_default()
}

/// Encodes row events into records; holds reusable scratch space.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    row: Vec<u8>,
    /// Whether the last event encoded left a value unknown (`"partial":true`).
    pub(crate) partial: bool,
}

impl Encoder {
    /// Encodes `event`, appended at `appended_ms`, as a record.
    #[cfg(test)]
    pub(crate) fn encode(&mut self, event: &RowEvent, appended_ms: u64) -> Vec<u8> {
        self.encode_with(event, appended_ms, Extra::default())
    }

    /// Encodes `event` with what the log adds to it (key-change links, filled values).
    pub(crate) fn encode_with(
        &mut self,
        event: &RowEvent,
        appended_ms: u64,
        extra: Extra<'_>,
    ) -> Vec<u8> {
        let key = key_of(event);
        let keyed = !event.pk_names.is_empty() && event.op != Op::Truncate;
        let schema = clip(&event.schema, u16::MAX as usize);
        let table = clip(&event.table, u16::MAX as usize);
        let mut out = Vec::with_capacity(FIXED + key.len() + schema.len() + table.len() + 512);
        out.push(VERSION);
        out.push(op_code(event.op));
        out.extend_from_slice(&appended_ms.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&(schema.len() as u16).to_le_bytes());
        out.extend_from_slice(schema.as_bytes());
        out.extend_from_slice(&(table.len() as u16).to_le_bytes());
        out.extend_from_slice(table.as_bytes());
        out.push(if keyed { FLAG_KEYED } else { 0 });
        self.body(event, &key, appended_ms, extra, &mut out);
        out
    }

    fn body(
        &mut self,
        e: &RowEvent,
        key: &Key,
        appended_ms: u64,
        extra: Extra<'_>,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(b"\"type\":");
        json_str(themis_type(e.op), out);
        out.extend_from_slice(b",\"key\":");
        json_str(&key.text, out);
        out.extend_from_slice(b",\"value\":");
        let after = match e.op {
            Op::Insert | Op::Update => e.new.as_ref(),
            Op::Delete | Op::Truncate => None,
        };
        let before = match e.op {
            Op::Update | Op::Delete => e.old.as_ref(),
            Op::Insert | Op::Truncate => None,
        };
        // The new row's text is both `value` and `after_snapshot`: escape it once.
        // Unchanged values come from the row's last image in the log (the writer finds
        // it); what remains is unknown. (Sources that have a whole old image fill them
        // from it before the event gets here.)
        let known = |column: &str| -> Option<&RawValue> {
            extra.fill.and_then(|f| f.get(column)).map(|r| &**r)
        };
        let value_at = out.len();
        let mut unknown: Vec<&str> = Vec::new();
        match after {
            Some(row) => self.row_text(row, &known, &mut unknown, out),
            None => out.extend_from_slice(b"null"),
        }
        let value = value_at..out.len();
        out.extend_from_slice(b",\"timestamp_ms\":");
        push_u64(out, e.commit_ts.map_or(appended_ms, unix_ms));
        out.extend_from_slice(b",\"metadata\":{\"table\":");
        json_str(&e.table, out);
        out.extend_from_slice(b",\"pk\":");
        json_str(key.pk(), out);
        out.push(b'}');
        if let Some(row) = before {
            out.extend_from_slice(b",\"before_snapshot\":");
            self.row_text(row, &|_| None, &mut Vec::new(), out);
        }
        if after.is_some() {
            out.extend_from_slice(b",\"after_snapshot\":");
            out.extend_from_within(value);
        }
        out.extend_from_slice(b",\"op\":");
        json_str(if extra.read { "read" } else { e.op.as_str() }, out);
        out.extend_from_slice(b",\"schema\":");
        json_str(&e.schema, out);
        out.extend_from_slice(b",\"table\":");
        json_str(&e.table, out);
        if let Some(tx) = e.tx {
            let _ = write!(
                out,
                ",\"lsn\":\"{:X}/{:X}\",\"xid\":{}",
                tx.commit >> 32,
                tx.commit & 0xFFFF_FFFF,
                tx.id
            );
        }
        if let Some(k) = extra.new_key {
            out.extend_from_slice(b",\"new_key\":");
            json_str(k, out);
        }
        if let Some(k) = extra.old_key {
            out.extend_from_slice(b",\"old_key\":");
            json_str(k, out);
        }
        self.partial = !unknown.is_empty();
        if self.partial {
            out.extend_from_slice(b",\"unchanged_columns\":[");
            for (i, c) in unknown.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_str(c, out);
            }
            // Said outright: `value` is not the whole row.
            out.extend_from_slice(b"],\"partial\":true");
        }
        out.push(b'}');
    }

    /// Writes a row image as a JSON string holding the row's JSON object text; unchanged
    /// values come from `known`, and those it does not know are pushed to `unknown`.
    fn row_text<'r, 'k>(
        &mut self,
        row: &'r Row,
        known: &dyn Fn(&str) -> Option<&'k RawValue>,
        unknown: &mut Vec<&'r str>,
        out: &mut Vec<u8>,
    ) {
        self.row.clear();
        row_object(row, known, unknown, &mut self.row);
        // The object is valid UTF-8: every part is written from `str`s or ASCII.
        json_str(std::str::from_utf8(&self.row).unwrap_or("{}"), out);
    }
}

/// Writes a row image as a JSON object. Unchanged values are filled from `known`; the
/// rest are left out (listed in `unchanged_columns` instead: their value is unknown).
fn row_object<'r, 'k>(
    row: &'r Row,
    known: &dyn Fn(&str) -> Option<&'k RawValue>,
    unknown: &mut Vec<&'r str>,
    out: &mut Vec<u8>,
) {
    out.push(b'{');
    let mut first = true;
    for (column, value) in row.iter() {
        let filled = if value.is_unchanged() {
            match known(column) {
                Some(k) => Some(k),
                None => {
                    unknown.push(column);
                    continue;
                }
            }
        } else {
            None
        };
        if !first {
            out.push(b',');
        }
        first = false;
        json_str(column, out);
        out.push(b':');
        match filled {
            Some(r) => out.extend_from_slice(r.get().as_bytes()),
            None => json_value(value, out),
        }
    }
    out.push(b'}');
}

/// `freshen::Value` as JSON: NULL → null, numbers and booleans as themselves, JSON
/// embedded, text as a string, bytes as PostgreSQL's hex text (`"\\x0a0b"`).
fn json_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null | Value::Unchanged => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => {
            if *i < 0 {
                out.push(b'-');
            }
            push_u64(out, i.unsigned_abs());
        }
        Value::Float(x) if x.is_finite() => {
            let _ = write!(out, "{x:?}");
        }
        // JSON has no NaN or infinities: keep them as PostgreSQL spells them.
        Value::Float(x) => json_str(
            if x.is_nan() {
                "NaN"
            } else if *x > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            },
            out,
        ),
        Value::Json(text) => {
            // Embedded as-is when it is JSON; a source that sent something else must not
            // break every client's parser, so it is kept as a string instead.
            if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
                out.extend_from_slice(text.trim().as_bytes());
            } else {
                json_str(text, out);
            }
        }
        Value::Text(s) => json_str(s, out),
        other => match other.to_text() {
            Some(text) => json_str(&text, out),
            None => out.extend_from_slice(b"null"),
        },
    }
}

/// Writes `s` as a JSON string literal.
pub(crate) fn json_str(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping: fast and correct (control characters, quotes, \u2028
    // pass through as allowed by JSON).
    let _ = serde_json::to_writer(&mut *out, s);
}

/// An event's key, `table:pk`, with the pk parts joined by `:` as ThemisDB joins the
/// parts of its keys.
struct Key {
    text: String,
    pk_start: usize,
}

impl Key {
    fn pk(&self) -> &str {
        &self.text[self.pk_start..]
    }
}

impl std::ops::Deref for Key {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

/// `table:pk`: the primary-key values of the new image (the old one for a DELETE, or
/// where the new one left a key column unchanged). A NULL or unknown part is empty; a
/// table without a declared key (or a TRUNCATE) has an empty pk.
fn key_of(e: &RowEvent) -> Key {
    let mut text = String::with_capacity(e.table.len() + 16);
    text.push_str(&e.table);
    text.push(':');
    let pk_start = text.len();
    if e.op != Op::Truncate {
        let primary = match e.op {
            Op::Delete => e.old.as_ref().or(e.new.as_ref()),
            _ => e.new.as_ref().or(e.old.as_ref()),
        };
        for (i, column) in e.pk_names.iter().enumerate() {
            if i > 0 {
                text.push(':');
            }
            let value = primary
                .and_then(|r| r.get(column))
                .filter(|v| !v.is_unchanged())
                .or_else(|| e.old.as_ref().and_then(|r| r.get(column)));
            if let Some(t) = value.and_then(Value::to_text) {
                text.push_str(&t);
            }
        }
    }
    let max = u32::MAX as usize;
    if text.len() > max {
        text = clip(&text, max).to_owned();
    }
    Key { text, pk_start }
}

/// Whether `event`'s new image has values the source left out as unchanged.
pub(crate) fn has_unchanged(event: &RowEvent) -> bool {
    matches!(event.op, Op::Insert | Op::Update)
        && event
            .new
            .as_ref()
            .is_some_and(|r| r.values().iter().any(Value::is_unchanged))
}

/// The event's key, `table:pk`, as its JSON says it.
pub(crate) fn key_text(event: &RowEvent) -> String {
    key_of(event).text
}

/// The event's latest-per-key index key.
pub(crate) fn index_key_of(event: &RowEvent) -> String {
    let key = key_of(event);
    index_key(&event.schema, &event.table, key.pk())
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen::Tx;
    use std::time::Duration;

    fn parse(record: &[u8], seq: u64) -> serde_json::Value {
        let r = RecordRef::parse(record).expect("a record");
        serde_json::from_str(&event_json(seq, &r)).expect("valid JSON")
    }

    fn row(pairs: &[(&str, Value)]) -> Row {
        Row::from_pairs(pairs.iter().cloned())
    }

    #[test]
    fn reads_are_puts_and_positions_are_found_in_the_body() {
        let mut enc = Encoder::default();
        let tricky = r#"x,"lsn":"0/1","xid":5"#;
        let e = RowEvent::new("public", "orders", Op::Insert)
            .with_pk(["id"])
            .with_new(row(&[("id", Value::Int(1)), ("note", Value::text(tricky))]));
        let read = enc.encode_with(
            &e,
            7,
            Extra {
                read: true,
                ..Extra::default()
            },
        );
        let j = parse(&read, 1);
        assert_eq!(
            (j["type"].as_str(), j["op"].as_str()),
            (Some("PUT"), Some("read"))
        );
        // A value that looks like a position is not one: only escaped quotes inside.
        assert_eq!(position_of(&RecordRef::parse(&read).unwrap()), None);
        let live = enc.encode(
            &e.clone().with_tx(Tx {
                id: 4_294_967_300,
                commit: 0x1_6B37_4D48,
                index: 0,
            }),
            7,
        );
        assert_eq!(
            position_of(&RecordRef::parse(&live).unwrap()),
            Some((0x1_6B37_4D48, 4_294_967_300))
        );
    }

    #[test]
    fn insert_is_a_themis_put() {
        let e = RowEvent::new("public", "orders", Op::Insert)
            .with_pk(["id"])
            .with_new(row(&[
                ("id", Value::Int(42)),
                ("note", Value::text("a \"quoted\"\nline")),
                ("paid", Value::Bool(true)),
                ("total", Value::Float(12.5)),
                ("gone", Value::Null),
                ("doc", Value::Json(r#"{"a":[1,2]}"#.into())),
                ("raw", Value::Bytes(vec![0, 0xab].into())),
            ]))
            .with_commit_ts(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123))
            .with_tx(Tx {
                id: 771,
                commit: 0x1_6B37_4D48,
                index: 0,
            });
        let rec = Encoder::default().encode(&e, 5);
        let j = parse(&rec, 9);
        assert_eq!(j["sequence"], 9);
        assert_eq!(j["type"], "PUT");
        assert_eq!(j["key"], "orders:42");
        assert_eq!(j["timestamp_ms"], 1_700_000_000_123u64);
        assert_eq!(j["metadata"]["table"], "orders");
        assert_eq!(j["metadata"]["pk"], "42");
        assert_eq!(j["op"], "insert");
        assert_eq!(j["schema"], "public");
        assert_eq!(j["table"], "orders");
        assert_eq!(j["lsn"], "1/6B374D48");
        assert_eq!(j["xid"], 771);
        assert!(j.get("before_snapshot").is_none());
        let value: serde_json::Value =
            serde_json::from_str(j["value"].as_str().expect("value is JSON text")).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"id": 42, "note": "a \"quoted\"\nline", "paid": true,
                "total": 12.5, "gone": null, "doc": {"a": [1, 2]}, "raw": "\\x00ab"})
        );
        assert_eq!(j["after_snapshot"], j["value"]);
        let r = RecordRef::parse(&rec).unwrap();
        assert_eq!(
            (r.op, r.appended_ms, r.key, r.table, r.schema),
            (Op::Insert, 5, "orders:42", "orders", "public")
        );
    }

    #[test]
    fn delete_update_truncate() {
        let d = RowEvent::new("s", "t", Op::Delete)
            .with_pk(["a", "b"])
            .with_old(row(&[("a", Value::Int(1)), ("b", Value::text("x"))]));
        let j = parse(&Encoder::default().encode(&d, 77), 1);
        assert_eq!(j["type"], "DELETE");
        assert_eq!(j["key"], "t:1:x");
        assert_eq!(j["metadata"]["pk"], "1:x");
        assert!(j["value"].is_null());
        assert_eq!(j["timestamp_ms"], 77);
        assert!(j["before_snapshot"].is_string());
        assert!(j.get("after_snapshot").is_none());
        assert!(j.get("lsn").is_none() && j.get("xid").is_none());

        // An unchanged key column is taken from the old image; unchanged values are
        // listed, not shown as null.
        let u = RowEvent::new("s", "t", Op::Update)
            .with_pk(["id"])
            .with_new(row(&[
                ("id", Value::Unchanged),
                ("big", Value::Unchanged),
                ("v", Value::Int(2)),
            ]))
            .with_old(row(&[("id", Value::Int(7))]));
        let j = parse(&Encoder::default().encode(&u, 1), 2);
        assert_eq!(j["key"], "t:7");
        assert_eq!(j["value"], r#"{"v":2}"#);
        assert_eq!(j["unchanged_columns"], serde_json::json!(["id", "big"]));

        let t = RowEvent::new("s", "t", Op::Truncate);
        let j = parse(&Encoder::default().encode(&t, 1), 3);
        assert_eq!(
            (j["type"].as_str(), j["key"].as_str(), j["op"].as_str()),
            (Some("DELETE"), Some("t:"), Some("truncate"))
        );
    }

    #[test]
    fn odd_values_stay_valid_json() {
        let e = RowEvent::new("s", "t", Op::Insert).with_new(row(&[
            ("nan", Value::Float(f64::NAN)),
            ("inf", Value::Float(f64::NEG_INFINITY)),
            ("bad", Value::Json("{not json".into())),
            ("ctl", Value::text("\u{0}\u{1f}\u{2028}")),
            ("min", Value::Int(i64::MIN)),
            ("neg", Value::Int(-7)),
        ]));
        let j = parse(&Encoder::default().encode(&e, 1), 1);
        let v: serde_json::Value = serde_json::from_str(j["value"].as_str().unwrap()).unwrap();
        assert_eq!(v["nan"], "NaN");
        assert_eq!(v["inf"], "-Infinity");
        assert_eq!(v["bad"], "{not json");
        assert_eq!(v["ctl"], "\u{0}\u{1f}\u{2028}");
        assert_eq!(
            (v["min"].as_i64(), v["neg"].as_i64()),
            (Some(i64::MIN), Some(-7))
        );
        assert_eq!(j["key"], "t:");
    }

    #[test]
    fn digits() {
        for n in [0, 7, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    #[test]
    fn garbage_is_not_a_record() {
        assert!(RecordRef::parse(&[]).is_none());
        assert!(RecordRef::parse(&[1, 0, 0]).is_none());
        assert!(RecordRef::parse(&[9; 40]).is_none());
        let mut r = Encoder::default().encode(&RowEvent::new("s", "t", Op::Insert), 1);
        r[10] = 0xff; // key length far beyond the record
        assert!(RecordRef::parse(&r).is_none());
    }
}
