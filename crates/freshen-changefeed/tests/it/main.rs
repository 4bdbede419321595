//! freshen-changefeed's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod browser;
mod http_api;
mod http_compress;
mod http_groups;
mod http_guard;
mod http_poll;
mod http_sse;
mod http_tx;
mod http_ws;
mod log_append;
mod log_crash;
mod log_semantics;
mod postgres_cursors;
mod postgres_redact;
mod postgres_replay;
mod postgres_snapshot;
mod postgres_tx;
mod postgres_ws;
