//! freshen-postgres's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod fanout_bulk;
mod fanout_depends;
mod incremental;
mod query_rebuild;
mod refresher_end_to_end;
mod source_decoding;
mod source_discovery;
mod source_failover;
mod source_feedback;
mod source_reading;
mod source_schema;
mod source_setup;
mod source_streaming;
mod sql_helpers;
