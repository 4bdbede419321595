//! What the user said on the command line (resolved into settings elsewhere).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Keep derived tables fresh from change-data-capture.
#[derive(Debug, Parser)]
#[command(name = "freshen", version = version(), about, propagate_version = true)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Keep every view of a configuration fresh until SIGINT/SIGTERM.
    Run {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Validate a configuration file and the database it points at.
    Check {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
        /// Only validate the file; do not connect to the database.
        #[arg(long)]
        offline: bool,
        /// Fail on warnings too (for CI).
        #[arg(long)]
        deny_warnings: bool,
    },
    /// See freshen work: a throwaway PostgreSQL, a live workload, two derived tables kept
    /// fresh and verified against truth at the end.
    Demo {
        /// How long the workload runs.
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Concurrent writers.
        #[arg(long, default_value_t = 4)]
        writers: usize,
        /// Leave the database running at the end and print how to connect.
        #[arg(long)]
        keep: bool,
    },
    /// Print a running instance's status.
    Status {
        /// The instance's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:9187")]
        url: String,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 while a running instance's /healthz answers 200, else 1 saying why (a
    /// container's health check, with no HTTP client in the image).
    Health {
        /// The instance's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:9187")]
        url: String,
    },
    /// Print the version and what this build can read (as `--version` does).
    Version,
    /// Remove the replication slot (and the publication freshen created) so an abandoned
    /// pipeline never retains WAL.
    Drop {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
}

/// This build's version and what it was built with, e.g. `0.1.0 (sources: postgres,
/// mysql; changefeed)`: which sources a binary reads depends on its cargo features, so a
/// user (or a bug report) can tell from the binary alone.
pub fn version() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        let sources: Vec<&str> = crate::sources::KINDS.iter().map(|k| k.name).collect();
        format!(
            "{} (sources: {}; changefeed)",
            env!("CARGO_PKG_VERSION"),
            sources.join(", ")
        )
    })
}
