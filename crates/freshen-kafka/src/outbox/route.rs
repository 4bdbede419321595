//! What one captured change of the outbox table becomes: a record for its aggregate's
//! topic, a dead letter with its reason, or nothing. Pure: no I/O.

use freshen::{Op, Row, RowEvent, Value};

use super::config::{KafkaOutboxConfig, PayloadEncoding, ROUTED_BY};
use crate::config::valid_topic_char;

/// The routing rules of one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct Router {
    schema: String,
    table: String,
    topic: String,
    id: String,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    encoding: PayloadEncoding,
}

/// One record to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) topic: String,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(&'static str, Vec<u8>)>,
}

/// Why rows become dead letters, as the metrics label them: a fixed set, never the
/// error's text (which names values and would make a label per row).
pub(crate) const REASONS: &[&str] = &[
    MISSING_ID,
    MISSING_AGGREGATE_TYPE,
    MISSING_AGGREGATE_ID,
    MISSING_PAYLOAD,
    INVALID_PAYLOAD,
];
const MISSING_ID: &str = "missing_id";
const MISSING_AGGREGATE_TYPE: &str = "missing_aggregate_type";
const MISSING_AGGREGATE_ID: &str = "missing_aggregate_id";
/// The payload column is absent, or the source did not send it (unchanged TOAST).
const MISSING_PAYLOAD: &str = "missing_payload";
/// The payload does not fit the encoding (not UTF-8, not JSON).
const INVALID_PAYLOAD: &str = "invalid_payload";

/// What a change becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Routed {
    /// An outbox event for its aggregate's topic.
    Event(Record),
    /// A malformed outbox row, for the dead-letter topic (header `freshen.error`), and
    /// its reason as one of [`REASONS`] (the metrics' label).
    Dead(Record, &'static str),
    /// Not an outbox event: another table, or an update, delete or truncate (the
    /// router relays inserts only, as Debezium's does; an application that deletes its
    /// rows right after inserting them is the usual pattern).
    Ignored,
}

impl Router {
    /// The rules `config` describes (its `problems` already checked).
    pub(crate) fn new(config: &KafkaOutboxConfig) -> Router {
        let (schema, table) = config.table_parts().unwrap_or(("", ""));
        Router {
            schema: schema.to_owned(),
            table: table.to_owned(),
            topic: config.topic.clone(),
            id: config.id_column.clone(),
            aggregate_type: config.aggregate_type_column.clone(),
            aggregate_id: config.aggregate_id_column.clone(),
            event_type: config.type_column.clone(),
            payload: config.payload_column.clone(),
            encoding: config.payload_encoding,
        }
    }

    /// What `event` becomes; `dead_letter` is the topic of malformed rows. A snapshot's
    /// row (`read`) is routed as an insert.
    pub(crate) fn route(&self, event: &RowEvent, read: bool, dead_letter: &str) -> Routed {
        if *event.schema != *self.schema || *event.table != *self.table {
            return Routed::Ignored;
        }
        let row = match (&event.new, event.op) {
            (Some(row), Op::Insert) => row,
            (Some(row), _) if read => row,
            _ => return Routed::Ignored,
        };
        let text = |column: &str| row.get(column).and_then(Value::to_text);
        let id = text(&self.id);
        let aggregate_type = text(&self.aggregate_type);
        let aggregate_id = text(&self.aggregate_id);
        let event_type = text(&self.event_type);
        let mut headers = Vec::with_capacity(2);
        if let Some(id) = &id {
            headers.push(("id", id.as_bytes().to_vec()));
        }
        if let Some(t) = &event_type {
            headers.push(("type", t.as_bytes().to_vec()));
        }
        let key = aggregate_id.as_ref().map(|k| k.as_bytes().to_vec());
        let payload = self.payload(row);
        let problem = if id.is_none() {
            Some((MISSING_ID, format!("{} is missing or NULL", self.id)))
        } else if aggregate_type.as_deref().is_none_or(str::is_empty) {
            Some((
                MISSING_AGGREGATE_TYPE,
                format!("{} is missing, NULL or empty", self.aggregate_type),
            ))
        } else if aggregate_id.is_none() {
            Some((
                MISSING_AGGREGATE_ID,
                format!("{} is missing or NULL", self.aggregate_id),
            ))
        } else {
            payload.as_ref().err().cloned()
        };
        if let Some((why, reason)) = problem {
            headers.push(("freshen.error", reason.into_bytes()));
            headers.push((
                "freshen.table",
                format!("{}.{}", self.schema, self.table).into_bytes(),
            ));
            return Routed::Dead(
                Record {
                    topic: dead_letter.to_owned(),
                    key,
                    // The column as it is, so the row can be inspected and replayed.
                    value: row
                        .get(&self.payload)
                        .and_then(raw)
                        .or_else(|| payload.ok().flatten()),
                    headers,
                },
                why,
            );
        }
        let routed_by = aggregate_type.unwrap_or_default();
        let topic = self.topic.replace(
            ROUTED_BY,
            &routed_by
                .chars()
                .map(|c| if valid_topic_char(c) { c } else { '_' })
                .collect::<String>(),
        );
        Routed::Event(Record {
            topic,
            key,
            value: payload.ok().flatten(),
            headers,
        })
    }

    /// The payload as the record's value (`None`: NULL, a tombstone), or why the
    /// encoding refuses it (its reason and sentence).
    fn payload(&self, row: &Row) -> Result<Option<Vec<u8>>, (&'static str, String)> {
        let name = &self.payload;
        let value = match row.get(name) {
            None => return Err((MISSING_PAYLOAD, format!("{name} is missing"))),
            Some(Value::Null) => return Ok(None),
            Some(Value::Unchanged) => {
                return Err((
                    MISSING_PAYLOAD,
                    format!("{name} was not sent by the source (unchanged)"),
                ));
            }
            Some(v) => v,
        };
        match (self.encoding, value) {
            (PayloadEncoding::Bytes, Value::Bytes(b)) => Ok(Some(b.to_vec())),
            (_, Value::Bytes(b)) => match std::str::from_utf8(b) {
                Ok(s) => self.text(name, s),
                Err(_) => Err((INVALID_PAYLOAD, format!("{name} is not valid UTF-8"))),
            },
            (_, v) => {
                let s = v.to_text().unwrap_or_default();
                self.text(name, &s)
            }
        }
    }

    /// Text checked against the encoding.
    fn text(&self, name: &str, s: &str) -> Result<Option<Vec<u8>>, (&'static str, String)> {
        if self.encoding == PayloadEncoding::Json
            && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(s)
        {
            return Err((INVALID_PAYLOAD, format!("{name} is not valid JSON: {e}")));
        }
        Ok(Some(s.as_bytes().to_vec()))
    }
}

/// A value's bytes as they are, for a dead letter.
fn raw(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Bytes(b) => Some(b.to_vec()),
        v => v.to_text().map(|s| s.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(encoding: PayloadEncoding) -> Router {
        let mut c = KafkaOutboxConfig::new("b:9092", "public.outbox", "dlq");
        c.payload_encoding = encoding;
        Router::new(&c)
    }

    fn insert(pairs: Vec<(&str, Value)>) -> RowEvent {
        RowEvent::new("public", "outbox", Op::Insert).with_new(Row::from_pairs(pairs))
    }

    fn good(payload: Value) -> RowEvent {
        insert(vec![
            ("id", Value::text("e-1")),
            ("aggregatetype", Value::text("Customer Order")),
            ("aggregateid", Value::Int(42)),
            ("type", Value::text("OrderCreated")),
            ("payload", payload),
        ])
    }

    fn header<'a>(r: &'a Record, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
    }

    #[test]
    fn an_insert_is_routed_by_aggregate_type_and_keyed_by_aggregate_id() {
        let r = router(PayloadEncoding::Json);
        let Routed::Event(rec) = r.route(&good(Value::Json(r#"{"seq":1}"#.into())), false, "dlq")
        else {
            panic!("an event")
        };
        assert_eq!(rec.topic, "outbox.event.Customer_Order");
        assert_eq!(rec.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(rec.value.as_deref(), Some(&br#"{"seq":1}"#[..]));
        assert_eq!(header(&rec, "id"), Some("e-1"));
        assert_eq!(header(&rec, "type"), Some("OrderCreated"));
        assert_eq!(header(&rec, "freshen.error"), None);
    }

    #[test]
    fn other_tables_and_other_operations_are_ignored_but_snapshot_reads_are_not() {
        let r = router(PayloadEncoding::Json);
        let mut other = good(Value::Json("{}".into()));
        other.table = "orders".into();
        assert_eq!(r.route(&other, false, "dlq"), Routed::Ignored);
        let mut update = good(Value::Json("{}".into()));
        update.op = Op::Update;
        assert_eq!(r.route(&update, false, "dlq"), Routed::Ignored);
        assert!(matches!(r.route(&update, true, "dlq"), Routed::Event(_)));
        let delete = RowEvent::new("public", "outbox", Op::Delete);
        assert_eq!(r.route(&delete, false, "dlq"), Routed::Ignored);
    }

    #[test]
    fn malformed_rows_are_dead_letters_with_a_reason() {
        let r = router(PayloadEncoding::Json);
        let no_key = insert(vec![
            ("id", Value::text("e-2")),
            ("aggregatetype", Value::text("order")),
            ("aggregateid", Value::Null),
            ("type", Value::text("t")),
            ("payload", Value::text("{}")),
        ]);
        let Routed::Dead(d, why) = r.route(&no_key, false, "dlq") else {
            panic!("a dead letter")
        };
        assert_eq!(why, "missing_aggregate_id");
        assert_eq!(d.topic, "dlq");
        assert_eq!(
            header(&d, "freshen.error"),
            Some("aggregateid is missing or NULL")
        );
        assert_eq!(header(&d, "id"), Some("e-2"));
        assert_eq!(header(&d, "freshen.table"), Some("public.outbox"));
        let Routed::Dead(d, why) = r.route(&good(Value::text("{not json")), false, "dlq") else {
            panic!("a dead letter")
        };
        assert_eq!(why, "invalid_payload");
        assert!(
            header(&d, "freshen.error")
                .unwrap()
                .starts_with("payload is not valid JSON"),
            "{d:?}"
        );
        assert_eq!(
            d.value.as_deref(),
            Some(&b"{not json"[..]),
            "kept as it was"
        );
        let empty_type = insert(vec![
            ("id", Value::text("e-3")),
            ("aggregatetype", Value::text("")),
            ("aggregateid", Value::Int(1)),
            ("payload", Value::Null),
        ]);
        assert!(matches!(
            r.route(&empty_type, false, "dlq"),
            Routed::Dead(_, "missing_aggregate_type")
        ));
        let Routed::Dead(d, why) = router(PayloadEncoding::Text).route(
            &good(Value::Bytes(vec![0xff, 0xfe].into())),
            false,
            "dlq",
        ) else {
            panic!("a dead letter")
        };
        assert_eq!(
            header(&d, "freshen.error"),
            Some("payload is not valid UTF-8")
        );
        assert_eq!(why, "invalid_payload");
        let no_id = insert(vec![("aggregatetype", Value::text("order"))]);
        let no_payload = insert(vec![
            ("id", Value::text("e-4")),
            ("aggregatetype", Value::text("order")),
            ("aggregateid", Value::Int(1)),
        ]);
        for (event, want) in [(no_id, "missing_id"), (no_payload, "missing_payload")] {
            let Routed::Dead(_, why) = r.route(&event, false, "dlq") else {
                panic!("a dead letter: {event:?}")
            };
            assert_eq!(why, want);
            assert!(REASONS.contains(&why), "one of the fixed set");
        }
    }

    #[test]
    fn encodings_and_null_payloads() {
        let bytes = router(PayloadEncoding::Bytes);
        let Routed::Event(rec) = bytes.route(&good(Value::Bytes(vec![0, 0xff].into())), false, "d")
        else {
            panic!("an event")
        };
        assert_eq!(rec.value.as_deref(), Some(&[0u8, 0xff][..]));
        let text = router(PayloadEncoding::Text);
        let Routed::Event(rec) = text.route(&good(Value::text("plain")), false, "d") else {
            panic!("an event")
        };
        assert_eq!(rec.value.as_deref(), Some(&b"plain"[..]));
        let Routed::Event(rec) = text.route(&good(Value::Null), false, "d") else {
            panic!("an event")
        };
        assert_eq!(rec.value, None, "NULL: a tombstone");
        let json = router(PayloadEncoding::Json);
        assert!(matches!(
            json.route(&good(Value::text("plain")), false, "d"),
            Routed::Dead(_, "invalid_payload")
        ));
    }
}
