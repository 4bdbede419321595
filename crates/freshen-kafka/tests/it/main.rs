//! freshen-kafka's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod key_stream;
mod postgres_sink;
mod postgres_sink_redact;
mod postgres_sink_snapshot;
mod sink;
mod source_canal;
mod source_group;
mod source_restart;
