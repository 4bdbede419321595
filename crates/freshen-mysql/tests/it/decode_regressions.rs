//! Inputs the fuzzers found (`fuzz/regressions/<target>/`), replayed as the fuzz targets
//! do: each must decode or fail cleanly, in bounded time and memory.

use std::path::Path;

use freshen::{Op, RowEvent};
use freshen_mysql::binlog::{
    Charsets, MariaGtid, MySqlGtid, QueryEvent, RowsKind, TableMap, classify, decode_rotate,
    decode_rows,
};

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// The `row_image` fuzz target's body.
fn row_image(data: &[u8]) -> usize {
    let Some((&split, rest)) = data.split_first() else {
        return 0;
    };
    let at = usize::from(split).min(rest.len());
    let (map, rows) = rest.split_at(at);
    let Ok(table) = TableMap::decode(map, &Charsets::builtin()) else {
        return 0;
    };
    let mut body = table.table_id.to_le_bytes()[..6].to_vec();
    body.extend_from_slice(rows);
    let template = RowEvent::new("s", "t", Op::Insert);
    let mut decoded = 0;
    for kind in [RowsKind::Write, RowsKind::Update, RowsKind::Delete] {
        for v2 in [false, true] {
            let mut out = Vec::new();
            if decode_rows(kind, v2, &body, &table, &template, &mut out).is_ok() {
                // A row takes at least one byte: never more rows than bytes.
                assert!(out.len() <= body.len());
                decoded += out.len();
            }
        }
    }
    decoded
}

#[test]
fn row_image_regressions_decode_or_fail_cleanly() {
    let cases = inputs("row_image");
    assert!(!cases.is_empty());
    for (name, data) in cases {
        let n = row_image(&data);
        assert!(
            n <= data.len() * 6,
            "{name}: {n} rows from {} bytes",
            data.len()
        );
    }
}

#[test]
fn event_regressions_decode_or_fail_cleanly() {
    for (_, data) in inputs("events") {
        if let Ok(q) = QueryEvent::decode(&data) {
            let _ = classify(q.statement, q.database);
        }
        let _ = MariaGtid::decode(&data, 1);
        let _ = MySqlGtid::decode(&data);
        let _ = decode_rotate(&data);
    }
}
