//! Shared test helpers: fixture loading.

use std::path::PathBuf;

/// The bytes of `tests/fixtures/<path>`.
pub(crate) fn fixture(path: &str) -> Vec<u8> {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("reading {}: {e}", full.display()))
}
