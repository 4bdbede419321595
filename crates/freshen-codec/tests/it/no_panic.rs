//! Decoders never panic: arbitrary bytes, and mutations of real messages, give a value
//! or an error. (The cargo-fuzz targets in `fuzz/` search harder; crashes they find
//! become cases in `regressions`.)

use crate::support;

use freshen_codec::{CanalJson, DebeziumJson, Decoder, Format};
use proptest::prelude::*;

const SEEDS: &[&str] = &[
    "canal-json/ticdc_insert.json",
    "canal-json/ticdc_update.json",
    "canal-json/canal_update_partial_old.json",
    "canal-json/canal_insert_multi_row.json",
    "debezium/pg_update.json",
    "debezium/mysql_insert_schema.json",
];

fn decode_all(bytes: &[u8]) {
    let _ = CanalJson::new().decode(bytes);
    let _ = DebeziumJson::new().decode_with_key(Some(bytes), Some(bytes));
    let _ = Decoder::new(Format::Debezium).decode(None, Some(bytes));
}

proptest! {
    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes);
    }

    #[test]
    fn mutated_real_messages(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut bytes = support::fixture(SEEDS[seed]);
        for (at, byte, kind) in edits {
            let at = at % (bytes.len() + 1);
            match kind {
                0 if at < bytes.len() => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ if at < bytes.len() => { bytes.remove(at); }
                _ => {}
            }
        }
        decode_all(&bytes);
    }

    #[test]
    fn json_shaped_noise(
        kind in prop::sample::select(vec!["INSERT", "UPDATE", "DELETE", "TRUNCATE", "c", "u", "d", "t", "r"]),
        cols in proptest::collection::vec(("[a-c]{1,2}", prop_oneof![
            Just("null".to_string()),
            "-?[0-9]{1,25}".prop_map(|s| s),
            "\"[^\"\\\\]{0,8}\"".prop_map(|s| s),
            Just("\"__debezium_unavailable_value\"".to_string()),
            Just("[1,{\"x\":[]}]".to_string()),
            Just("1e400".to_string()),
        ]), 0..5),
        types in proptest::collection::vec(("[a-c]{1,2}", prop::sample::select(vec!["\"int\"", "\"json\"", "\"blob\"", "\"double\"", "2004", "null", "\"bool\""])), 0..4),
    ) {
        let row = format!("{{{}}}", cols.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(","));
        let types = format!("{{{}}}", types.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(","));
        let canal = format!(r#"{{"database":"d","table":"t","type":"{kind}","mysqlType":{types},"sqlType":{types},"data":[{row}],"old":[{row}]}}"#);
        let dbz = format!(r#"{{"op":"{kind}","before":{row},"after":{row},"source":{{"table":"t","txId":{}}}}}"#, cols.len());
        decode_all(canal.as_bytes());
        decode_all(dbz.as_bytes());
    }
}
