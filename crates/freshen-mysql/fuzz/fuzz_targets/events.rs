//! The other event decoders never panic: QUERY events and statement classification,
//! MariaDB and MySQL GTID events, rotates.
#![no_main]

use freshen_mysql::binlog::{MariaGtid, MySqlGtid, QueryEvent, classify, decode_rotate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(q) = QueryEvent::decode(data) {
        let _ = classify(q.statement, q.database);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = classify(s, "db");
    }
    let _ = MariaGtid::decode(data, 1);
    let _ = MySqlGtid::decode(data);
    let _ = decode_rotate(data);
});
