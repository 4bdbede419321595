//! The `freshen` binary's code: configuration, commands, HTTP endpoints.
//!
//! `main.rs` only parses arguments and maps outcomes to exit codes; everything else is
//! here so that tests can drive it in-process.

pub mod admin;
pub mod args;
pub mod check;
pub mod config;
pub mod demo;
pub mod drop;
pub mod gap_keeping;
pub mod http;
pub mod infer;
pub mod init;
pub mod key_stream;
pub mod logging;
pub mod metrics;
pub mod pipeline;
pub mod redact_coverage;
pub mod reference;
pub mod reload;
pub mod role;
pub mod run;
pub mod scope;
pub mod shown_key;
pub mod sink_snapshot;
pub mod sinks;
pub mod snapshot;
pub mod sources;
pub mod standby;
pub mod status;
pub mod supervisor;
pub mod targets;
