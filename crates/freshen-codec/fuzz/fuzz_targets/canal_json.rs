//! canal-json decoding never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut decoder = freshen_codec::CanalJson::new();
    if let Ok(decoded) = decoder.decode(data) {
        // Touch what a source would: every image's keys.
        for e in decoded.events() {
            let _ = e.scope_keys(&["id"]).count();
        }
    }
});
