//! freshen-mysql's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod check;
mod decode_regressions;
mod gap_ledger;
mod incremental;
mod rebuild_visibility;
mod refresher_end_to_end;
mod set_statements;
mod source_decoding;
mod source_positions;
mod source_reconnect;
mod source_setup;
mod standby_lock;
