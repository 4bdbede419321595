//! Decoding throughput of the wire formats: freshen-codec against the straightforward
//! decoder — parse into a `serde_json::Value` tree, then walk it into row events.
//!
//! Messages are shaped like the real thing: a TiCDC canal-json single-row INSERT, a
//! Canal 10-row UPDATE with partial `old`, a Debezium PostgreSQL update without the
//! schema wrapper, and a Debezium MySQL insert with it. Every message is decoded into
//! `RowEvent`s by both decoders (same events out, checked once before timing).

use std::hint::black_box;
use std::time::{Duration, Instant};

use freshen::{Op, Row, RowEvent, Value};
use freshen_codec::{CanalJson, DebeziumJson};

use crate::Opts;
use crate::report::{Table, rate, ratio};

fn canal_insert(i: usize) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"INSERT","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4,"note":12}},"mysqlType":{{"id":"int","device":"varchar","value":"int","note":"varchar"}},"old":null,"data":[{{"id":"{i}","device":"dev-{}","value":"{}","note":"reading number {i}"}}]}}"#,
        i % 1000,
        i % 97
    )
    .into_bytes()
}

fn canal_update_10(i: usize) -> Vec<u8> {
    let rows: Vec<String> = (0..10)
        .map(|r| {
            format!(
                r#"{{"id":"{}","device":"dev-{}","value":"{}","price":"{}.50","flag":"1"}}"#,
                i * 10 + r,
                (i + r) % 1000,
                r,
                r * 3
            )
        })
        .collect();
    let old: Vec<String> = (0..10)
        .map(|r| format!(r#"{{"value":"{}"}}"#, r + 1))
        .collect();
    format!(
        r#"{{"data":[{}],"database":"demo","es":1786358950000,"id":12,"isDdl":false,"mysqlType":{{"id":"int(11)","device":"varchar(64)","value":"int(11)","price":"decimal(10,2)","flag":"tinyint(1)"}},"old":[{}],"pkNames":["id"],"sql":"","sqlType":{{"id":4,"device":12,"value":4,"price":3,"flag":-6}},"table":"readings","ts":1786358950123,"type":"UPDATE"}}"#,
        rows.join(","),
        old.join(",")
    )
    .into_bytes()
}

fn debezium_pg(i: usize) -> Vec<u8> {
    format!(
        r#"{{"before":{{"id":{i},"device":"dev-{}","value":10,"note":"__debezium_unavailable_value"}},"after":{{"id":{i},"device":"dev-{}","value":11,"note":"__debezium_unavailable_value"}},"source":{{"version":"2.7.0.Final","connector":"postgresql","name":"shop","ts_ms":1700000000123,"snapshot":"false","db":"shop","sequence":"[\"24023128\",\"24023184\"]","schema":"public","table":"readings","txId":{},"lsn":{},"xmin":null}},"op":"u","ts_ms":1700000000200,"transaction":null}}"#,
        i % 1000,
        (i + 1) % 1000,
        700 + i,
        24_000_000 + i
    )
    .into_bytes()
}

fn debezium_mysql_schema(i: usize) -> Vec<u8> {
    let field = |t: &str, name: &str, extra: &str| {
        format!(r#"{{"type":"{t}","optional":true,"field":"{name}"{extra}}}"#)
    };
    let cols = [
        field("int32", "id", ""),
        field("string", "device", ""),
        field(
            "bytes",
            "price",
            r#","name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}"#,
        ),
        field("string", "doc", r#","name":"io.debezium.data.Json","version":1"#),
    ]
    .join(",");
    format!(
        r#"{{"schema":{{"type":"struct","fields":[{{"type":"struct","fields":[{cols}],"optional":true,"name":"shop.inventory.orders.Value","field":"before"}},{{"type":"struct","fields":[{cols}],"optional":true,"name":"shop.inventory.orders.Value","field":"after"}},{{"type":"struct","fields":[{{"type":"string","optional":false,"field":"db"}},{{"type":"string","optional":true,"field":"table"}}],"optional":false,"name":"io.debezium.connector.mysql.Source","field":"source"}},{{"type":"string","optional":false,"field":"op"}},{{"type":"int64","optional":true,"field":"ts_ms"}}],"optional":false,"name":"shop.inventory.orders.Envelope"}},"payload":{{"before":null,"after":{{"id":{i},"device":"dev-{}","price":"BNI=","doc":"{{\"a\":{i}}}"}},"source":{{"version":"2.7.0.Final","connector":"mysql","name":"shop","ts_ms":1700000001000,"snapshot":"false","db":"inventory","table":"orders","server_id":223344,"gtid":null,"file":"mysql-bin.000003","pos":154,"row":0}},"op":"c","ts_ms":1700000001050}}}}"#,
        i % 1000
    )
    .into_bytes()
}

/// The rival: a `serde_json::Value` tree walked into events. Values become text or
/// numbers by their JSON type; column order is the tree's (sorted), which is all this
/// decoder can offer without an order-preserving map.
fn value_row(v: &serde_json::Value) -> Option<Row> {
    let obj = v.as_object()?;
    Some(Row::from_pairs(obj.iter().map(|(k, v)| {
        let value = match v {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map_or_else(|| Value::Float(n.as_f64().unwrap_or(0.0)), Value::Int),
            serde_json::Value::String(s) => Value::text(s.as_str()),
            other => Value::Json(other.to_string().into()),
        };
        (k.as_str(), value)
    })))
}

fn rival_canal(msg: &[u8]) -> Vec<RowEvent> {
    let v: serde_json::Value = serde_json::from_slice(msg).expect("valid");
    let op = match v["type"].as_str() {
        Some("INSERT") => Op::Insert,
        Some("UPDATE") => Op::Update,
        _ => Op::Delete,
    };
    let schema = v["database"].as_str().unwrap_or("");
    let table = v["table"].as_str().unwrap_or("");
    let pk: Vec<&str> = v["pkNames"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    let empty = Vec::new();
    let old = v["old"].as_array().unwrap_or(&empty);
    v["data"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut e = RowEvent::new(schema, table, op).with_pk(pk.iter().copied());
            e.new = value_row(row);
            if let (Some(mut merged), Some(changed)) =
                (value_row(row), old.get(i).and_then(|o| o.as_object()))
            {
                for (k, val) in changed {
                    merged.set(k, Value::text(val.as_str().unwrap_or("")));
                }
                e.old = Some(merged);
            }
            e
        })
        .collect()
}

fn rival_debezium(msg: &[u8]) -> Vec<RowEvent> {
    let top: serde_json::Value = serde_json::from_slice(msg).expect("valid");
    let p = if top.get("payload").is_some() {
        &top["payload"]
    } else {
        &top
    };
    let op = match p["op"].as_str() {
        Some("c") | Some("r") => Op::Insert,
        Some("u") => Op::Update,
        Some("d") => Op::Delete,
        _ => Op::Truncate,
    };
    let src = &p["source"];
    let schema = src["schema"].as_str().or(src["db"].as_str()).unwrap_or("");
    let mut e = RowEvent::new(schema, src["table"].as_str().unwrap_or(""), op);
    e.new = value_row(&p["after"]);
    e.old = value_row(&p["before"]);
    vec![e]
}

struct Case {
    name: &'static str,
    messages: Vec<Vec<u8>>,
    ours: fn(&mut Decoders, &[u8]) -> usize,
    rival: fn(&[u8]) -> Vec<RowEvent>,
}

#[derive(Default)]
struct Decoders {
    canal: CanalJson,
    dbz: DebeziumJson,
}

fn ours_canal(d: &mut Decoders, m: &[u8]) -> usize {
    d.canal.decode(m).expect("valid").events().len()
}

fn ours_dbz(d: &mut Decoders, m: &[u8]) -> usize {
    d.dbz.decode(Some(m)).expect("valid").events().len()
}

/// Decodes every message `rounds` times; returns the best round's time and the rows.
fn time(
    messages: &[Vec<u8>],
    rounds: usize,
    mut decode: impl FnMut(&[u8]) -> usize,
) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut rows = 0;
    for _ in 0..rounds {
        let t0 = Instant::now();
        rows = 0;
        for m in messages {
            rows += black_box(decode(m));
        }
        best = best.min(t0.elapsed());
    }
    (best, rows)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let n = if opts.quick { 2_000 } else { 100_000 };
    let rounds = if opts.quick { 1 } else { 5 };
    let cases = [
        Case {
            name: "canal-json TiCDC INSERT (1 row)",
            messages: (0..n).map(canal_insert).collect(),
            ours: ours_canal,
            rival: rival_canal,
        },
        Case {
            name: "canal-json Canal UPDATE (10 rows, partial old)",
            messages: (0..n / 10).map(canal_update_10).collect(),
            ours: ours_canal,
            rival: rival_canal,
        },
        Case {
            name: "Debezium PostgreSQL update (no schema)",
            messages: (0..n).map(debezium_pg).collect(),
            ours: ours_dbz,
            rival: rival_debezium,
        },
        Case {
            name: "Debezium MySQL insert (schema wrapper)",
            messages: (0..n / 4).map(debezium_mysql_schema).collect(),
            ours: ours_dbz,
            rival: rival_debezium,
        },
    ];
    let mut table = Table::new(&[
        "message",
        "bytes/msg",
        "freshen msgs/s",
        "freshen rows/s",
        "Value-tree msgs/s",
        "speed-up",
    ]);
    for case in &cases {
        let mut d = Decoders::default();
        // Same number of rows out of both, once, before timing.
        let first = &case.messages[0];
        anyhow::ensure!(
            (case.ours)(&mut d, first) == (case.rival)(first).len(),
            "{}: the decoders disagree",
            case.name
        );
        let bytes = case.messages.iter().map(Vec::len).sum::<usize>() / case.messages.len();
        let (ours, rows) = time(&case.messages, rounds, |m| (case.ours)(&mut d, m));
        let (theirs, _) = time(&case.messages, rounds, |m| (case.rival)(m).len());
        let msgs = case.messages.len() as f64;
        table.row(vec![
            case.name.into(),
            bytes.to_string(),
            rate(msgs, ours),
            rate(rows as f64, ours),
            rate(msgs, theirs),
            ratio(theirs, ours),
        ]);
    }
    table.print();
    println!(
        "\nOne core, best of {rounds} rounds; speed-up = Value-tree time / freshen time. \
         freshen also keeps column order and types values by mysqlType/schema; the \
         Value tree does neither."
    );
    Ok(())
}
