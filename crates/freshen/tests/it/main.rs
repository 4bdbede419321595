//! freshen's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod deps;
mod dirty_model;
mod refresher_acks;
mod refresher_fanout;
mod refresher_run;
mod refresher_schema;
mod refresher_whole;
