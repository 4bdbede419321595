//! What the user said on the command line (resolved into settings elsewhere).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args as ClapArgs, CommandFactory, Parser, Subcommand};

/// Keep derived tables fresh from change-data-capture.
#[derive(Debug, Parser)]
#[command(
    name = "freshen",
    version = version(),
    about,
    propagate_version = true,
    // Our own `help`, which takes `--help` itself and suggests a subcommand for a typo.
    disable_help_subcommand = true
)]
pub(crate) struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The configuration file of a subcommand that reads one.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct ConfigFile {
    /// The configuration file.
    #[arg(short, long, value_name = "FILE", default_value = crate::config::DEFAULT_FILE)]
    pub config: PathBuf,
}

/// Which running instance `status` and `health` ask.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct Instance {
    /// The instance's HTTP address: `host:port` or `http://host:port`. Without it, the
    /// `[http] listen` of `-c FILE` (or of `freshen.toml` in the working directory), else
    /// 127.0.0.1:9187.
    #[arg(value_name = "ADDRESS")]
    pub address: Option<String>,
    /// The same as ADDRESS (kept for scripts written against earlier versions).
    #[arg(long, hide = true, conflicts_with = "address")]
    pub url: Option<String>,
    /// Read the address from this configuration file's `[http] listen`.
    #[arg(short, long, value_name = "FILE", conflicts_with_all = ["address", "url"])]
    pub config: Option<PathBuf>,
}

impl Instance {
    /// The base URL (`http://host:port`) to ask.
    pub(crate) fn base_url(&self) -> anyhow::Result<String> {
        if let Some(a) = self.address.as_deref().or(self.url.as_deref()) {
            return base_url(a);
        }
        let default = Path::new(crate::config::DEFAULT_FILE);
        let file = match &self.config {
            Some(f) => f.as_path(),
            None if default.is_file() => default,
            None => return Ok(format!("http://{DEFAULT_ADDRESS}")),
        };
        let Some(listen) = crate::config::http_listen(file)? else {
            anyhow::bail!(
                "{}: `[http] listen = \"off\"`, so the instance serves no status",
                file.display()
            );
        };
        Ok(crate::status::local_url(listen))
    }
}

/// Where `freshen run` serves `/status` unless configured otherwise.
pub(crate) const DEFAULT_ADDRESS: &str = "127.0.0.1:9187";

/// `host:port` or `http://host:port[/]` as a base URL.
fn base_url(address: &str) -> anyhow::Result<String> {
    let address = address.trim_end_matches('/');
    if address.starts_with("http://") {
        return Ok(address.to_owned());
    }
    if let Some((scheme, _)) = address.split_once("://") {
        anyhow::bail!("{address}: only http:// is supported (not {scheme}://)");
    }
    Ok(format!("http://{address}"))
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Keep every view of a configuration fresh until SIGINT/SIGTERM.
    Run {
        /// The configuration file.
        #[command(flatten)]
        file: ConfigFile,
        /// With a `[key_stream]`: this instance's part — `capture` (reads the source,
        /// publishes the views' keys; one instance) or `worker` (rebuilds; any number).
        #[arg(long, value_enum)]
        role: Option<crate::role::Role>,
    },
    /// Validate a configuration file and the database it points at.
    Check {
        /// The configuration file.
        #[command(flatten)]
        file: ConfigFile,
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
    /// Write a starting file for one query — the SELECT you would write for `CREATE
    /// MATERIALIZED VIEW`, or an existing materialized view imported — the view with what
    /// it watches inferred from the database, and the target table's CREATE TABLE and the
    /// publication to run first (PostgreSQL; the URL is read from an environment
    /// variable, never written). The first `run` builds the table whole.
    Init {
        /// The view's name (default: the materialized view's, or the target table's).
        #[arg(long)]
        name: Option<String>,
        /// The target table the query's rows go into (`schema.table` or `table`;
        /// default with --from-matview: `<name>_fresh` beside it).
        #[arg(long)]
        into: Option<String>,
        /// The query: a plain SELECT (`SELECT region, count(*) AS n FROM orders GROUP BY
        /// region`).
        #[arg(long, conflicts_with = "from_matview")]
        query: Option<String>,
        /// A materialized view to import (`schema.name`): its definition, keyed on its
        /// unique index.
        #[arg(long, value_name = "SCHEMA.NAME")]
        from_matview: Option<String>,
        /// The key columns, comma-separated (default: the target's primary key, the
        /// materialized view's unique index, or the query's GROUP BY).
        #[arg(long, value_delimiter = ',')]
        key: Vec<String>,
        /// Run the statements first — the target table, the publication — each only if
        /// missing (printed as they run).
        #[arg(long)]
        create: bool,
        /// Where a watched table's replica identity loses changes the view needs (a
        /// DELETE, or an UPDATE that moves a row to another key, without the old key),
        /// set the cheapest one that carries them — a unique index over the key and the
        /// primary key, made the identity — printing each statement as it runs. It
        /// changes your table and what its writes log: without the flag, `init` prints
        /// the statements and writes them into the file instead.
        #[arg(long)]
        fix_identity: bool,
        /// The environment variable holding the database URL (the file refers to it).
        #[arg(long, value_name = "VAR", default_value = "DATABASE_URL")]
        url_env: String,
        /// Where to write the file (never over an existing one); default: print it.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
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
        /// Keep running at the end — the tables kept fresh, the status page served —
        /// until Ctrl-C, and leave the database running (it prints how to connect).
        #[arg(long)]
        keep: bool,
        /// Where the status page listens (loopback; the default port taken, any free one).
        #[arg(long, default_value = "127.0.0.1:9187")]
        listen: std::net::SocketAddr,
    },
    /// Print a running instance's status.
    Status {
        /// Which instance.
        #[command(flatten)]
        instance: Instance,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 while a running instance's /healthz answers 200, else 1 saying why (a
    /// container's health check, with no HTTP client in the image).
    Health {
        /// Which instance.
        #[command(flatten)]
        instance: Instance,
    },
    /// Print the version and what this build can read (as `--version` does).
    Version,
    /// About the configuration file.
    Config {
        /// What to print.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Remove the replication slot (and the publication freshen created) so an abandoned
    /// pipeline never retains WAL.
    Drop {
        /// The configuration file.
        #[command(flatten)]
        file: ConfigFile,
    },
    /// Snapshot tables into a running instance's changefeed (existing rows as `read`
    /// events), or with `--sink N` into its N-th sink (READ events, `op` `r`); with no
    /// table show each table's snapshot progress.
    Snapshot {
        /// The configuration file (its `[changefeed]`, or with `--sink` its `[http]`).
        #[command(flatten)]
        file: ConfigFile,
        /// The sink to snapshot into, by its place in `[[sinks]]` (from 0) instead of
        /// the changefeed.
        #[arg(long, value_name = "N")]
        sink: Option<usize>,
        /// Tables to snapshot, `schema.table`.
        tables: Vec<String>,
    },
    /// Print a shell completion script, e.g. `freshen completions bash >
    /// /etc/bash_completion.d/freshen`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the help of freshen or of one of its subcommands.
    Help {
        /// The subcommand.
        command: Option<String>,
    },
}

/// The subcommands of `freshen config`.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print every key of every table of the configuration file — type, default,
    /// accepted values, what it does — as Markdown (`docs/configuration.md`).
    Reference,
}

/// Prints the help `freshen help [COMMAND]` asks for; an unknown subcommand is an error
/// that suggests the closest one.
pub(crate) fn help(command: Option<&str>) -> std::process::ExitCode {
    let mut args = vec!["freshen".to_owned()];
    args.extend(command.map(str::to_owned));
    args.push("--help".to_owned());
    match Args::command().try_get_matches_from(args) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        // `--help` "fails" by printing the help; a typo fails by naming the closest.
        Err(e) => {
            let _ = e.print();
            std::process::ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Writes the completion script for `shell` to stdout.
pub(crate) fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(
        shell,
        &mut Args::command(),
        "freshen",
        &mut std::io::stdout(),
    );
}

/// This build's version and what it was built with, e.g. `0.1.0 (sources: postgres,
/// mysql; changefeed)`: which sources a binary reads depends on its cargo features, so a
/// user (or a bug report) can tell from the binary alone.
pub(crate) fn version() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        let sources = crate::kinds::builtin().sources.built();
        format!(
            "{} (sources: {}; changefeed)",
            env!("CARGO_PKG_VERSION"),
            sources.join(", ")
        )
    })
}
