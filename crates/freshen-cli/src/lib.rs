//! The `freshen` binary's code — configuration, commands, HTTP endpoints — and what
//! an embedder or a benchmark needs of it: read a configuration with the kinds it
//! registers ([`config`], [`Kinds`]), start a [`Pipeline`] and read what it shows of
//! itself ([`Readout`], the `/status` document), serve that over HTTP ([`http`]), ask
//! a running instance ([`status()`]), or run the whole `freshen run` ([`run`]).
//!
//! `main.rs` only calls [`main`]; everything else is here so that tests can drive it
//! in-process. The rest of the modules are the binary's own.
//!
//! # Features
//!
//! - `demo` (default): `freshen demo`, which starts a throwaway PostgreSQL (the test
//!   environment's server). Embedders leave it out with `default-features = false`.
//! - `mysql`, `kafka`, `pulsar` (and `full`, all three): those source and sink kinds.

pub mod admin;
mod args;
mod check;
mod commands;
pub mod config;
#[cfg(feature = "demo")]
mod demo;
mod drop;
mod gap_keeping;
pub mod http;
mod infer;
mod init;
mod key_stream;
mod kinds;
mod logging;
mod metrics;
mod parts;
mod pipeline;
mod readout;
mod redact_coverage;
mod reference;
mod registry;
mod reload;
mod role;
mod run;
mod scope;
mod shown_key;
mod sink_snapshot;
mod snapshot;
mod standby;
pub mod status;
mod supervisor;

pub use commands::main;
pub use kinds::builtin as kinds;
pub use metrics::{Redacted, SinkStatus, SourceStatus, ViewStats};
pub use pipeline::{Observer, Pipeline};
pub use readout::{
    Activity, Change, PathStatus, QuarantinedKey, Readout, Refused, SinkSnapshotStatus,
    SinkSnapshots, Status, ViewStatus, WholeRunStatus, problems, status,
};
pub use registry::{
    Found, Kind, Kinds, Registry, SinkKind, SourceKind, TargetKind, sink, source, target,
};
pub use role::Role;
pub use run::run;
