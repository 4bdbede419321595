//! Debezium JSON decoding never panics; whatever decodes also re-encodes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Split the input into a key and a value at the first NUL (if any).
    let (key, value) = match data.iter().position(|b| *b == 0) {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (None, data),
    };
    let mut decoder = freshen_codec::DebeziumJson::new();
    if let Ok(decoded) = decoder.decode_with_key(key, Some(value)) {
        let encoder = freshen_codec::DebeziumEncoder::new("fuzz");
        for e in decoded.events() {
            let _ = encoder.encode_value(e, 0);
            let _ = encoder.encode_key(e);
        }
    }
});
