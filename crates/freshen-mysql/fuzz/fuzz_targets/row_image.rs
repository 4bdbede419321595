//! The table map and row-image decoders never panic: the input is split into a
//! TABLE_MAP body and a rows event body (the first byte says where), decoded as every
//! rows event kind; whatever decodes is touched as a source would touch it.
#![no_main]

use freshen::{Op, RowEvent};
use freshen_mysql::binlog::{Charsets, RowsKind, TableMap, decode_rows};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = usize::from(split).min(rest.len());
    let (map, rows) = rest.split_at(at);
    let Ok(table) = TableMap::decode(map, &Charsets::builtin()) else {
        return;
    };
    // The rows event names the table map's id, so the decoder reaches the images.
    let mut body = table.table_id.to_le_bytes()[..6].to_vec();
    body.extend_from_slice(rows);
    let template = RowEvent::new("s", "t", Op::Insert);
    for kind in [RowsKind::Write, RowsKind::Update, RowsKind::Delete] {
        for v2 in [false, true] {
            let mut out = Vec::new();
            if decode_rows(kind, v2, &body, &table, &template, &mut out).is_ok() {
                for e in &out {
                    let _ = e.scope_keys(&["@1", "@2"]).count();
                    if let Some(r) = &e.new {
                        for (_, v) in r.iter() {
                            let _ = v.to_text();
                        }
                    }
                }
            }
        }
    }
});
