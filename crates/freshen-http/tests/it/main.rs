//! freshen-http's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod serve_flood;
mod serve_guard;
mod serve_limits;
