//! canal-json decoding against captured TiCDC messages and Canal-shaped fixtures.

use crate::support;

use std::time::{Duration, UNIX_EPOCH};

use freshen::{Key, Op, Value};
use freshen_codec::{CanalJson, Control, DecodeError, Decoded};
use support::fixture;

fn decode(path: &str) -> Result<Decoded, DecodeError> {
    CanalJson::new().decode(&fixture(path))
}

fn events(path: &str) -> Vec<freshen::RowEvent> {
    match decode(path) {
        Ok(Decoded::Rows(rows)) => rows,
        other => panic!("{path}: expected rows, got {other:?}"),
    }
}

#[test]
fn ticdc_insert() {
    let e = events("canal-json/ticdc_insert.json");
    assert_eq!(e.len(), 1);
    let e = &e[0];
    assert_eq!(
        (&*e.schema, &*e.table, e.op),
        ("demo", "readings", Op::Insert)
    );
    assert_eq!(e.pk_names.iter().map(|c| &**c).collect::<Vec<_>>(), ["id"]);
    assert_eq!(
        e.commit_ts,
        Some(UNIX_EPOCH + Duration::from_millis(1786358942713))
    );
    assert!(e.old.is_none());
    assert!(e.tx.is_none());
    let new = e.new.as_ref().unwrap();
    let cols: Vec<_> = new.iter().map(|(c, _)| c).collect();
    assert_eq!(cols, ["id", "device", "value"], "table order, not sorted");
    assert_eq!(new.get("id"), Some(&Value::Int(1)));
    assert_eq!(new.get("device"), Some(&Value::text("dev-a")));
    assert_eq!(new.get("value"), Some(&Value::Int(10)));
}

#[test]
fn ticdc_update_has_whole_old_image() {
    let e = &events("canal-json/ticdc_update.json")[0];
    assert_eq!(e.op, Op::Update);
    assert_eq!(e.new.as_ref().unwrap().get("value"), Some(&Value::Int(11)));
    let old = e.old.as_ref().unwrap();
    assert_eq!(old.get("value"), Some(&Value::Int(10)));
    assert_eq!(old.get("device"), Some(&Value::text("dev-a")));
    assert_eq!(old.len(), 3);
}

#[test]
fn ticdc_delete_carries_its_row_in_data() {
    let e = &events("canal-json/ticdc_delete.json")[0];
    assert_eq!(e.op, Op::Delete);
    assert!(e.new.is_none());
    let old = e.old.as_ref().unwrap();
    assert_eq!(old.get("id"), Some(&Value::Int(1)));
    assert_eq!(
        e.scope_keys(&["device"]).collect::<Vec<_>>(),
        [Key::from("dev-a")]
    );
}

#[test]
fn canal_delete_carrying_its_row_in_old() {
    let e = &events("canal-json/canal_delete_in_old.json")[0];
    assert_eq!(e.op, Op::Delete);
    assert_eq!(
        e.old.as_ref().unwrap().get("device"),
        Some(&Value::text("dev-d"))
    );
    assert!(e.new.is_none());
}

#[test]
fn canal_partial_old_is_merged_over_data() {
    let rows = events("canal-json/canal_update_partial_old.json");
    assert_eq!(rows.len(), 2);
    let first = rows[0].old.as_ref().unwrap();
    assert_eq!(
        first.get("id"),
        Some(&Value::Int(1)),
        "unchanged column from data"
    );
    assert_eq!(
        first.get("device"),
        Some(&Value::text("dev-a")),
        "changed column from old"
    );
    assert_eq!(first.get("value"), Some(&Value::Int(10)));
    assert_eq!(first.get("note"), Some(&Value::Null));
    // The row moved from dev-a to dev-b: both scopes are dirty.
    let keys: Vec<_> = rows[0].scope_keys(&["device"]).collect();
    assert_eq!(keys, [Key::from("dev-b"), Key::from("dev-a")]);
    let second = rows[1].old.as_ref().unwrap();
    assert_eq!(second.get("device"), Some(&Value::text("dev-c")));
    assert_eq!(second.get("value"), Some(&Value::Int(6)));
    assert_eq!(second.get("note"), Some(&Value::text("x")));
    assert_eq!(
        rows[1].scope_keys(&["device"]).count(),
        1,
        "same scope: one key"
    );
}

#[test]
fn multi_row_message_and_value_families() {
    let rows = events("canal-json/canal_insert_multi_row.json");
    assert_eq!(rows.len(), 3);
    assert!(
        std::sync::Arc::ptr_eq(
            rows[0].new.as_ref().unwrap().columns(),
            rows[2].new.as_ref().unwrap().columns()
        ),
        "rows of one table share their column list"
    );
    let a = rows[0].new.as_ref().unwrap();
    assert_eq!(
        a.get("price"),
        Some(&Value::text("10.50")),
        "decimal keeps its digits"
    );
    assert_eq!(a.get("ratio"), Some(&Value::Float(0.25)));
    assert_eq!(
        a.get("flag"),
        Some(&Value::Int(1)),
        "tinyint(1) stays an integer"
    );
    assert_eq!(a.get("big"), Some(&Value::text("18446744073709551615")));
    assert_eq!(a.get("doc"), Some(&Value::Json("{\"k\": [1, 2]}".into())));
    assert_eq!(
        a.get("raw"),
        Some(&Value::Bytes(vec![0, 0xff, 0x41].into()))
    );
    let b = rows[1].new.as_ref().unwrap();
    assert_eq!(b.get("ratio"), Some(&Value::Float(1000.0)));
    assert_eq!(b.get("big"), Some(&Value::Int(5)));
    assert_eq!(b.get("raw"), Some(&Value::Bytes(Vec::new().into())));
    let c = rows[2].new.as_ref().unwrap();
    assert!(c.values().iter().skip(2).all(Value::is_null));
    let keys: Vec<_> = rows
        .iter()
        .flat_map(|e| e.scope_keys(&["device"]))
        .collect();
    assert_eq!(
        keys,
        [Key::from("dev-a"), Key::from("dev-b"), Key::from("dev-a")]
    );
}

#[test]
fn ddl_messages_carry_no_rows() {
    for path in [
        "canal-json/ticdc_ddl_create.json",
        "canal-json/ticdc_ddl_query.json",
    ] {
        match decode(path).unwrap() {
            Decoded::Control(Control::Ddl { schema, sql, .. }) => {
                assert_eq!(schema, "demo");
                assert!(sql.starts_with("CREATE"), "{sql}");
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    let create = decode("canal-json/ticdc_ddl_create.json").unwrap();
    assert!(create.events().is_empty());
}

#[test]
fn watermark_is_a_control_message() {
    assert_eq!(
        decode("canal-json/docs_ticdc_watermark.json").unwrap(),
        Decoded::Control(Control::Watermark {
            ts: 434919270523076621
        })
    );
}

#[test]
fn truncate_becomes_a_truncate_event() {
    let e = events("canal-json/hand_ticdc_truncate.json");
    assert_eq!(e.len(), 1);
    assert_eq!((&*e[0].table, e[0].op), ("readings", Op::Truncate));
    assert!(e[0].new.is_none() && e[0].old.is_none());
}

#[test]
fn unknown_type_is_an_error() {
    let err = CanalJson::new()
        .decode(br#"{"database":"d","table":"t","type":"UPSERT","data":[{"id":"1"}]}"#)
        .unwrap_err();
    assert!(
        matches!(&err, DecodeError::UnknownType(t) if t == "UPSERT"),
        "{err}"
    );
}

#[test]
fn malformed_messages_are_errors() {
    let mut d = CanalJson::new();
    let cases: &[&[u8]] = &[
        b"",
        b"not json",
        b"[]",
        br#"{"database":"d"}"#,
        br#"{"type":"INSERT","data":null}"#,
        br#"{"type":"INSERT","data":[]}"#,
        br#"{"type":"DELETE","data":null,"old":null}"#,
        br#"{"type":"UPDATE","data":[{"a":"1"},{"a":"2"}],"old":[{"a":"0"}]}"#,
        br#"{"type":"INSERT","data":[{"a":"1","a":"2"}]}"#,
        br#"{"type":"INSERT","data":{"a":"1"}}"#,
        br#"{"type":7,"data":[{"a":"1"}]}"#,
    ];
    for case in cases {
        assert!(d.decode(case).is_err(), "{}", String::from_utf8_lossy(case));
    }
    // The decoder goes on after errors.
    assert_eq!(
        d.decode(&fixture("canal-json/ticdc_insert.json"))
            .unwrap()
            .events()
            .len(),
        1
    );
}

#[test]
fn error_text_does_not_echo_a_long_type() {
    let long = "X".repeat(10_000);
    let msg = format!(r#"{{"type":"{long}"}}"#);
    let err = CanalJson::new()
        .decode(msg.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(err.len() < 200, "{}", err.len());
}

#[test]
fn extreme_times_do_not_panic() {
    let msg = br#"{"database":"d","table":"t","type":"INSERT","es":18446744073709551615,"data":[{"a":"1"}]}"#;
    let e = CanalJson::new().decode(msg).unwrap().into_events();
    assert_eq!(
        e[0].commit_ts,
        UNIX_EPOCH.checked_add(Duration::from_millis(u64::MAX))
    );
    let negative = br#"{"database":"d","table":"t","type":"INSERT","es":-5,"data":[{"a":"1"}]}"#;
    let e = CanalJson::new().decode(negative).unwrap().into_events();
    assert_eq!(e[0].commit_ts, None);
}

#[test]
fn an_old_column_missing_from_data_is_kept_in_the_old_image() {
    let msg = br#"{"database":"d","table":"t","type":"UPDATE","mysqlType":{"id":"int"},
        "data":[{"id":"1"}],"old":[{"gone":"7"}]}"#;
    let e = CanalJson::new().decode(msg).unwrap().into_events();
    let old = e[0].old.as_ref().unwrap();
    assert_eq!(
        old.iter().map(|(c, _)| c).collect::<Vec<_>>(),
        ["id", "gone"]
    );
    assert_eq!(old.get("gone"), Some(&Value::text("7")), "no type declared");
    assert_eq!(e[0].new.as_ref().unwrap().len(), 1);
}

/// A captured TiCDC message, edited: `edit` changes its JSON before it is decoded.
fn ticdc(path: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Result<Decoded, DecodeError> {
    let mut msg: serde_json::Value = serde_json::from_slice(&fixture(path)).unwrap();
    edit(&mut msg);
    CanalJson::new().decode(msg.to_string().as_bytes())
}

fn gap_of(decoded: Result<Decoded, DecodeError>) -> freshen::Gap {
    match decoded {
        Ok(Decoded::Gap(g)) => g,
        other => panic!("expected a gap, got {other:?}"),
    }
}

#[test]
fn ticdc_key_only_messages_are_gaps_naming_the_setting() {
    // TiCDC's large-message-handle-option=handle-key-only: the handle key, no row.
    let g = gap_of(ticdc("canal-json/ticdc_update.json", |m| {
        m["data"] = serde_json::json!([{"id": "1"}]);
        m["old"] = serde_json::json!([{"id": "1"}]);
        m["_tidb"] = serde_json::json!({"commitTs": 1, "onlyHandleKey": true});
    }));
    assert_eq!((&*g.schema, &*g.table), ("demo", "readings"));
    assert!(g.reason.contains("handle-key-only"), "{}", g.reason);
    assert!(g.reason.contains("max-message-bytes"), "{}", g.reason);
    // claim-check: the row is elsewhere, freshen does not fetch it.
    let g = gap_of(ticdc("canal-json/ticdc_insert.json", |m| {
        m["data"] = serde_json::json!([{"id": "1"}]);
        m["_tidb"] = serde_json::json!({"claimCheckLocation": "s3://bucket/msg-1"});
    }));
    assert!(g.reason.contains("claim-check"), "{}", g.reason);
    // onlyHandleKey false is an ordinary message.
    let rows = ticdc("canal-json/ticdc_insert.json", |m| {
        m["_tidb"] = serde_json::json!({"commitTs": 1, "onlyHandleKey": false});
    })
    .unwrap();
    assert_eq!(rows.events().len(), 1);
}

#[test]
fn canal_minimal_row_images_are_gaps_naming_the_setting() {
    // binlog_row_image=MINIMAL: an UPDATE carries only the changed column, not the key.
    let update = br#"{"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,
        "type":"UPDATE","mysqlType":{"value":"int(11)"},"sqlType":{"value":4},
        "data":[{"value":"11"}],"old":[{"value":"10"}]}"#;
    let g = gap_of(CanalJson::new().decode(update));
    assert_eq!(&*g.table, "readings");
    assert!(g.reason.contains("binlog_row_image=FULL"), "{}", g.reason);
    // A DELETE with the key only, while the message declares more columns.
    let delete = br#"{"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,
        "type":"DELETE","mysqlType":{"id":"int(11)","device":"varchar(64)"},
        "data":[{"id":"3"}]}"#;
    gap_of(CanalJson::new().decode(delete));
}

#[test]
fn statement_form_dml_is_a_gap_naming_the_setting() {
    let msg = br#"{"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,
        "type":"UPDATE","sql":"UPDATE readings SET value = value + 1 WHERE device = 'dev-a'",
        "data":null,"old":null}"#;
    let g = gap_of(CanalJson::new().decode(msg));
    assert_eq!((&*g.schema, &*g.table), ("demo", "readings"));
    assert!(g.reason.contains("binlog_format=ROW"), "{}", g.reason);
    // Without rows and without SQL it is still malformed.
    assert!(
        CanalJson::new()
            .decode(br#"{"type":"UPDATE","data":null,"sql":""}"#)
            .is_err()
    );
}

#[test]
fn partition_and_table_drops_sweep_like_truncate() {
    for sql in [
        "ALTER TABLE `demo`.`readings` TRUNCATE PARTITION `p0`",
        "alter table readings drop\n partition p1, p2",
        "ALTER TABLE readings EXCHANGE PARTITION p0 WITH TABLE archive",
    ] {
        let g = gap_of(ticdc("canal-json/ticdc_ddl_create.json", |m| {
            m["type"] = "ALTER".into();
            m["sql"] = sql.into();
        }));
        assert_eq!(&*g.table, "readings", "{sql}");
        assert!(g.reason.contains("partition"), "{}", g.reason);
    }
    // Other ALTERs are schema changes, not gaps.
    let add = ticdc("canal-json/ticdc_ddl_create.json", |m| {
        m["type"] = "ALTER".into();
        m["sql"] = "ALTER TABLE readings ADD COLUMN unit VARCHAR(8)".into();
    });
    assert!(
        matches!(add, Ok(Decoded::Control(Control::Ddl { .. }))),
        "{add:?}"
    );
    // DROP TABLE (ERASE): every row is gone, as after a TRUNCATE.
    let erase = ticdc("canal-json/ticdc_ddl_create.json", |m| {
        m["type"] = "ERASE".into();
        m["sql"] = "DROP TABLE `demo`.`readings`".into();
    })
    .unwrap();
    let e = erase.events();
    assert_eq!(e.len(), 1);
    assert_eq!((&*e[0].table, e[0].op), ("readings", Op::Truncate));
}

#[test]
fn a_rows_query_message_is_not_a_schema_change() {
    let rows_query = ticdc("canal-json/ticdc_ddl_query.json", |m| {
        m["isDdl"] = false.into();
        m["sql"] = "INSERT INTO readings VALUES (1, 'dev-a', 10)".into();
    })
    .unwrap();
    assert_eq!(
        rows_query,
        Decoded::Control(Control::Other {
            kind: "QUERY".into()
        })
    );
    assert!(matches!(
        decode("canal-json/ticdc_ddl_query.json").unwrap(),
        Decoded::Control(Control::Ddl { .. })
    ));
}

#[test]
fn a_column_named_twice_in_old_is_rejected_like_in_data() {
    let msg = br#"{"database":"d","table":"t","type":"UPDATE","pkNames":["id"],
        "data":[{"id":"1","v":"2"}],"old":[{"v":"0","v":"1"}]}"#;
    let err = CanalJson::new().decode(msg).unwrap_err();
    assert!(matches!(err, DecodeError::Malformed(_)), "{err}");
    assert!(err.to_string().contains("twice"), "{err}");
}

#[test]
fn an_empty_mysql_type_defers_to_the_sql_type() {
    // Canal on MySQL 8 without table metadata writes empty mysqlType entries.
    let msg = br#"{"database":"d","table":"t","type":"INSERT","pkNames":["id"],
        "mysqlType":{"id":"","ratio":""},"sqlType":{"id":4,"ratio":8},
        "data":[{"id":"5","ratio":"0.5"}]}"#;
    let e = CanalJson::new().decode(msg).unwrap().into_events();
    let new = e[0].new.as_ref().unwrap();
    assert_eq!(new.get("id"), Some(&Value::Int(5)));
    assert_eq!(new.get("ratio"), Some(&Value::Float(0.5)));
}
