//! Debezium JSON decoding (both converter shapes) and encoding round trips.

use crate::support;

use std::time::{Duration, UNIX_EPOCH};

use freshen::{Key, Op, Row, RowEvent, Tx, Value};
use freshen_codec::{
    Control, DebeziumEncoder, DebeziumJson, DecodeError, Decoded, NEW_KEY_HEADER, OLD_KEY_HEADER,
    UNAVAILABLE_VALUE,
};
use support::fixture;

fn one(key: Option<&[u8]>, value: &[u8]) -> RowEvent {
    match DebeziumJson::new().decode_with_key(key, Some(value)) {
        Ok(Decoded::Rows(mut rows)) if rows.len() == 1 => rows.remove(0),
        other => panic!("expected one row, got {other:?}"),
    }
}

#[test]
fn postgres_update_without_wrapper() {
    let e = one(
        Some(&fixture("debezium/pg_key.json")),
        &fixture("debezium/pg_update.json"),
    );
    assert_eq!(
        (&*e.schema, &*e.table, e.op),
        ("public", "readings", Op::Update)
    );
    assert_eq!(e.pk_names.iter().map(|c| &**c).collect::<Vec<_>>(), ["id"]);
    assert_eq!(
        e.commit_ts,
        Some(UNIX_EPOCH + Duration::from_millis(1700000000123))
    );
    assert_eq!(
        e.tx,
        Some(Tx {
            id: 771,
            commit: 24023184,
            index: 2
        })
    );
    let new = e.new.as_ref().unwrap();
    assert_eq!(
        new.iter().map(|(c, _)| c).collect::<Vec<_>>(),
        ["id", "device", "value", "payload"]
    );
    assert_eq!(new.get("device"), Some(&Value::text("dev-b")));
    assert_eq!(new.get("value"), Some(&Value::Int(11)));
    assert_eq!(
        new.get("payload"),
        Some(&Value::Unchanged),
        "the placeholder is not text"
    );
    let keys: Vec<_> = e.scope_keys(&["device"]).collect();
    assert_eq!(keys, [Key::from("dev-b"), Key::from("dev-a")]);
}

#[test]
fn mysql_insert_with_schema_types_strings() {
    let e = one(
        Some(&fixture("debezium/mysql_key_schema.json")),
        &fixture("debezium/mysql_insert_schema.json"),
    );
    assert_eq!(
        (&*e.schema, &*e.table, e.op),
        ("inventory", "orders", Op::Insert)
    );
    assert_eq!(e.pk_names.iter().map(|c| &**c).collect::<Vec<_>>(), ["id"]);
    assert!(e.tx.is_none(), "MySQL has no txId");
    let new = e.new.as_ref().unwrap();
    assert_eq!(new.get("id"), Some(&Value::Int(1001)));
    assert_eq!(
        new.get("raw"),
        Some(&Value::Bytes(vec![0, 0xff, 0x41].into()))
    );
    assert_eq!(new.get("price"), Some(&Value::text("12.34")));
    assert_eq!(new.get("doc"), Some(&Value::Json("{\"a\":1}".into())));
    assert_eq!(new.get("flag"), Some(&Value::Bool(true)));
    assert!(e.old.is_none());
}

#[test]
fn delete_snapshot_read_and_truncate() {
    let d = one(None, &fixture("debezium/pg_delete.json"));
    assert_eq!(d.op, Op::Delete);
    assert!(d.new.is_none());
    assert_eq!(d.old.as_ref().unwrap().get("value"), Some(&Value::Null));
    let r = one(None, &fixture("debezium/pg_snapshot_read.json"));
    assert_eq!(r.op, Op::Insert, "a snapshot read acts like an insert");
    let t = one(None, &fixture("debezium/pg_truncate.json"));
    assert_eq!((t.op, &*t.table), (Op::Truncate, "readings"));
}

#[test]
fn tombstones_are_quiet() {
    let mut d = DebeziumJson::new();
    for value in [
        None,
        Some(&b""[..]),
        Some(&b"null"[..]),
        Some(&fixture("debezium/tombstone_schema.json")[..]),
    ] {
        assert_eq!(
            d.decode(value).unwrap(),
            Decoded::Control(Control::Tombstone),
            "{value:?}"
        );
    }
}

#[test]
fn schema_change_and_heartbeat_are_control() {
    let mut d = DebeziumJson::new();
    match d
        .decode(Some(&fixture("debezium/mysql_schema_change.json")))
        .unwrap()
    {
        Decoded::Control(Control::Ddl { schema, sql, .. }) => {
            assert_eq!(schema, "inventory");
            assert!(sql.starts_with("ALTER TABLE"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        d.decode(Some(br#"{"ts_ms":1700000000000}"#)).unwrap(),
        Decoded::Control(Control::Other { .. })
    ));
}

#[test]
fn unknown_op_and_malformed_are_errors() {
    let mut d = DebeziumJson::new();
    let err = d
        .decode(Some(br#"{"op":"x","after":{"a":1}}"#))
        .unwrap_err();
    assert!(matches!(err, DecodeError::UnknownType(_)), "{err}");
    for bad in [
        &br#"{"op":"c","after":null}"#[..],
        br#"{"op":"u"}"#,
        br#"{"before":{"a":1},"source":{}}"#,
        br#"{"op":"c","after":[1]}"#,
        br#"{"op":"c","after":{"a":1,"a":2}}"#,
        b"{",
        b"12",
    ] {
        assert!(
            d.decode(Some(bad)).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_key_that_is_not_json_is_ignored() {
    let e = one(
        Some(b"plain-text-key"),
        &fixture("debezium/pg_snapshot_read.json"),
    );
    assert!(e.pk_names.is_empty());
    assert_eq!(e.op, Op::Insert);
}

fn sample() -> RowEvent {
    RowEvent::new("public", "orders", Op::Update)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::Int(7)),
            ("note", Value::text("caf\u{e9} \"quoted\"")),
            ("big", Value::Unchanged),
            ("raw", Value::Bytes(vec![1, 2, 255].into())),
            ("doc", Value::Json("{\"a\":[1]}".into())),
            ("ratio", Value::Float(0.5)),
            ("flag", Value::Bool(false)),
            ("gone", Value::Null),
        ]))
        .with_old(Row::from_pairs([("id", Value::Int(7))]))
        .with_commit_ts(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000))
        .with_tx(Tx {
            id: 42,
            commit: 0x1_0000_0010,
            index: 0,
        })
}

#[test]
fn encoded_value_has_the_debezium_envelope() {
    let enc = DebeziumEncoder::new("shop").database("shopdb");
    let bytes = enc.encode_value(&sample(), 1_700_000_000_500);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["op"], "u");
    assert_eq!(v["ts_ms"], 1_700_000_000_500u64);
    assert_eq!(v["before"], serde_json::json!({"id": 7}));
    assert_eq!(v["after"]["big"], UNAVAILABLE_VALUE);
    assert_eq!(v["after"]["raw"], "AQL/");
    assert_eq!(v["after"]["doc"], "{\"a\":[1]}");
    assert_eq!(v["after"]["gone"], serde_json::Value::Null);
    let source = &v["source"];
    assert_eq!(source["connector"], "freshen");
    assert_eq!(source["name"], "shop");
    assert_eq!(source["db"], "shopdb");
    assert_eq!(source["schema"], "public");
    assert_eq!(source["table"], "orders");
    assert_eq!(source["txId"], 42);
    assert_eq!(source["lsn"], 0x1_0000_0010u64);
    assert_eq!(source["ts_ms"], 1_700_000_000_000u64);
    let order: Vec<_> = v["after"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(order.len(), 8);
}

/// A snapshot's row is Debezium's READ: `op` `r`, `source.snapshot` `incremental`
/// (what Debezium's own watermark-interleaved snapshots say), and our decoder — as
/// Debezium consumers do — applies it like an insert.
#[test]
fn a_snapshot_read_is_op_r_and_decodes_as_an_insert() {
    let enc = DebeziumEncoder::new("shop");
    let row = RowEvent::new("public", "orders", Op::Insert)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::Int(7)),
            ("note", Value::text("x")),
        ]));
    let mut out = Vec::new();
    enc.encode_read_into(&row, 5, &mut out);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["op"], "r");
    assert_eq!(v["source"]["snapshot"], "incremental");
    assert_eq!(v["after"], serde_json::json!({"id": 7, "note": "x"}));
    assert_eq!(v["before"], serde_json::Value::Null);
    let live = enc.encode_value(&row, 5);
    let live: serde_json::Value = serde_json::from_slice(&live).unwrap();
    assert_eq!(
        (live["op"].as_str(), live["source"]["snapshot"].as_str()),
        (Some("c"), Some("false"))
    );
    let back = one(enc.encode_key(&row).as_deref(), &out);
    assert_eq!(back.op, Op::Insert);
    assert_eq!(back.new, row.new);
}

#[test]
fn encode_then_decode_round_trips() {
    let event = sample();
    let enc = DebeziumEncoder::new("shop");
    let key = enc.encode_key(&event).unwrap();
    assert_eq!(key, br#"{"id":7}"#);
    let back = one(Some(&key), &enc.encode_value(&event, 1));
    assert_eq!(back.op, Op::Update);
    assert_eq!(back.schema, event.schema);
    assert_eq!(back.pk_names, event.pk_names);
    assert_eq!(back.commit_ts, event.commit_ts);
    assert_eq!(back.tx, event.tx);
    assert_eq!(back.old, event.old);
    let new = back.new.unwrap();
    let want = event.new.unwrap();
    assert_eq!(new.columns(), want.columns(), "column order survives");
    for (col, value) in want.iter() {
        let got = new.get(col).unwrap();
        match (col, value) {
            // Schemaless JSON carries no types: bytes and JSON come back as their text.
            ("raw", _) => assert_eq!(got, &Value::text("AQL/")),
            ("doc", Value::Json(j)) => assert_eq!(got, &Value::Text(j.clone())),
            _ => assert_eq!(got, value, "{col}"),
        }
    }
}

#[test]
fn special_floats_and_keys() {
    let enc = DebeziumEncoder::new("s");
    let e = RowEvent::new("s", "t", Op::Delete)
        .with_pk(["a", "b"])
        .with_old(Row::from_pairs([
            ("b", Value::Float(f64::NAN)),
            ("a", Value::Float(f64::NEG_INFINITY)),
        ]));
    let v: serde_json::Value = serde_json::from_slice(&enc.encode_value(&e, 0)).unwrap();
    assert_eq!(v["before"]["b"], "NaN");
    assert_eq!(v["after"], serde_json::Value::Null);
    assert_eq!(v["op"], "d");
    assert_eq!(
        enc.encode_key(&e).unwrap(),
        br#"{"a":"-Infinity","b":"NaN"}"#
    );
    let truncate = RowEvent::new("s", "t", Op::Truncate);
    assert_eq!(enc.encode_key(&truncate), None);
    let v: serde_json::Value = serde_json::from_slice(&enc.encode_value(&truncate, 0)).unwrap();
    assert_eq!(v["op"], "t");
    // A key column only the old image knows (an unchanged value in the new one).
    let moved = RowEvent::new("s", "t", Op::Update)
        .with_pk(["id"])
        .with_new(Row::from_pairs([("id", Value::Unchanged)]))
        .with_old(Row::from_pairs([("id", Value::Int(3))]));
    assert_eq!(enc.encode_key(&moved).unwrap(), br#"{"id":3}"#);
}

#[test]
fn a_primary_key_change_is_delete_tombstone_create() {
    let enc = DebeziumEncoder::new("shop");
    let renamed = RowEvent::new("public", "users", Op::Update)
        .with_pk(["id"])
        .with_old(Row::from_pairs([("id", Value::text("alice"))]))
        .with_new(Row::from_pairs([
            ("id", Value::text("alice-renamed")),
            ("name", Value::text("Alice")),
        ]))
        .with_tx(Tx {
            id: 5,
            commit: 77,
            index: 0,
        });
    let records = enc.records(&renamed, 1);
    assert_eq!(records.len(), 3, "{records:?}");
    let (old_key, new_key) = (
        br#"{"id":"alice"}"#.to_vec(),
        br#"{"id":"alice-renamed"}"#.to_vec(),
    );

    assert_eq!(records[0].key.as_ref(), Some(&old_key));
    assert_eq!(records[0].headers, vec![(NEW_KEY_HEADER, new_key.clone())]);
    let delete = one(Some(&old_key), records[0].value.as_ref().unwrap());
    assert_eq!(delete.op, Op::Delete);
    assert_eq!(delete.old.unwrap().get("id"), Some(&Value::text("alice")));
    assert_eq!(delete.tx, renamed.tx);

    assert_eq!(records[1].key.as_ref(), Some(&old_key));
    assert_eq!(records[1].value, None, "a tombstone for the old key");
    assert!(matches!(
        DebeziumJson::new().decode_with_key(Some(&old_key), None),
        Ok(Decoded::Control(Control::Tombstone))
    ));

    assert_eq!(records[2].key.as_ref(), Some(&new_key));
    assert_eq!(records[2].headers, vec![(OLD_KEY_HEADER, old_key)]);
    let create = one(Some(&new_key), records[2].value.as_ref().unwrap());
    assert_eq!(create.op, Op::Insert);
    assert!(create.old.is_none());
    assert_eq!(create.new.unwrap().get("name"), Some(&Value::text("Alice")));

    // Any other change is one record, as before.
    let records = enc.records(&sample(), 1);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key.as_deref(), Some(&br#"{"id":7}"#[..]));
    assert!(records[0].headers.is_empty());
}
