//! The configuration file: parse, validate everything (every problem at once, with its
//! line), then resolve into the settings the program runs with.

// The docs' examples name every kind, so they are read by a binary that has them all
// (the suite's `--all-features` run).
#[cfg(all(test, feature = "kafka", feature = "pulsar", feature = "mysql"))]
mod examples;
mod key_stream;
mod problems;
pub(crate) mod read;
pub(crate) mod redact;
pub(crate) mod sink_snapshot;

use std::net::SocketAddr;
use std::time::Duration;

use freshen::AckPolicy;
use toml_edit::{Document, Item};

pub use key_stream::KeyStream;
pub use problems::ConfigError;
use problems::Problem;
use read::{Reader, Tbl};

use crate::registry::{Found, Kinds, Registry, SinkKind, SourceKind};
pub use sink_snapshot::SinkSnapshot;

/// A connection URL that may hold a password: never printed, never logged.
pub use freshen::SecretUrl as Secret;

/// The one redaction routine of every adapter (see [`freshen::redact_url`]).
pub use freshen::redact_url;

/// Where changes come from: a registered kind's configuration (see `kinds.rs`).
pub type Source = std::sync::Arc<dyn freshen::plug::SourcePlug>;

/// Where captured changes are published besides the views: a registered kind's
/// configuration (see `kinds.rs`), and whether it publishes the rows that already
/// exist.
#[derive(Debug, Clone)]
pub struct Sink {
    /// The kind's own settings.
    pub plug: std::sync::Arc<dyn freshen::plug::SinkPlug>,
    /// Its snapshots (read events of the rows that already exist).
    pub snapshot: SinkSnapshot,
}

/// Timing and failure options; `[defaults]` and every view may set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Quiet period before a key fires.
    pub coalesce: Duration,
    /// Longest a dirty key waits.
    pub max_wait: Duration,
    /// Rebuilds at once.
    pub workers: usize,
    /// Failures in a row before a key is quarantined.
    pub poison_after: u32,
    /// First retry delay.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// How long a stopping view waits for running rebuilds before cancelling them.
    pub shutdown_grace: Duration,
    /// Without a reconcile sweep, how long a quarantined key may hold its transactions
    /// unconfirmed before they are released unrebuilt (default: until it rebuilds).
    pub release_quarantined_after: Option<Duration>,
    /// The target cancels a rebuild statement running longer than this (a failure of
    /// the path: retried with backoff, never a quarantine); `None` when `"0s"`.
    pub statement_timeout: Option<Duration>,
    /// A change waiting longer than this for its rebuild makes `/healthz` unhealthy
    /// naming the view; `None` when `"0s"`.
    pub stale_after: Option<Duration>,
    /// Which ways keys are rebuilt: per key, as sets, the whole table (`"auto"`).
    pub rebuild_by: freshen::RebuildBy,
    /// The statement timeout of a whole-table run (a first build, a large backlog);
    /// `None` when `"0s"`.
    pub whole_timeout: Option<Duration>,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            coalesce: Duration::from_millis(100),
            max_wait: Duration::from_secs(5),
            workers: 4,
            poison_after: 5,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            release_quarantined_after: None,
            statement_timeout: Some(Duration::from_secs(30)),
            stale_after: Some(Duration::from_secs(600)),
            rebuild_by: freshen::RebuildBy::Auto,
            whole_timeout: Some(freshen::plug::DEFAULT_WHOLE_TIMEOUT),
        }
    }
}

/// A watched table and the columns that form a view's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    /// Schema (default `public`).
    pub schema: String,
    /// Table.
    pub table: String,
    /// Key columns, in `$1..$n` order: the view's key, or with `keys` the parent key.
    pub key: Vec<String>,
    /// A key fan-out: SQL mapping the changed row's `key` columns (`$1..$n`) to the
    /// view's keys (`SELECT account_id FROM subscriptions WHERE plan_id = $1`).
    pub keys: Option<String>,
    /// Declared (`fixed_key = true`): no UPDATE changes the key columns and rows are
    /// not deleted, so the view needs no old key (`check`'s replica identity advice).
    pub fixed_key: bool,
    /// Line in the file.
    pub line: Option<usize>,
}

impl Watch {
    /// This entry as the plug-ins take it, for the view called `view`.
    pub fn watched(&self, view: &str) -> freshen::plug::Watched {
        freshen::plug::Watched {
            view: view.to_owned(),
            schema: self.schema.clone(),
            table: self.table.clone(),
            key: self.key.clone(),
            keys: self.keys.clone(),
            fixed_key: self.fixed_key,
        }
    }

    /// `schema.table`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

/// A view's reconcile sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    /// Interval between sweeps.
    pub every: Duration,
    /// Query listing the live keys (one column per key part); `None` for a view given
    /// as a plain query, whose sweep is one whole-table diff ([`View::reconcile_keys`]
    /// lists its keys where a sweep must list them).
    pub keys: Option<String>,
    /// Line in the file.
    pub line: Option<usize>,
}

/// A view rebuilt by query: the rows `query` returns for a batch of keys are written
/// into `into` (inserted, updated where they differ, deleted where gone). A plain query
/// (no parameters) gets its batch filter from freshen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryMode {
    /// The target table: `(schema, table)`.
    pub into: (String, String),
    /// The query: plain, or selecting its batch with `$1..$n` (one array per key part).
    pub query: String,
    /// Line of `query` in the file.
    pub line: Option<usize>,
}

/// One derived table kept fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Unique name (metrics label, logs).
    pub name: String,
    /// Watched tables.
    pub watch: Vec<Watch>,
    /// Statements run in one transaction per key (or per batch of keys); empty in query
    /// mode.
    pub rebuild: Vec<String>,
    /// Rebuild by query instead of statements (`into` + `query`).
    pub query: Option<QueryMode>,
    /// Keys per rebuild round trip (statements written over arrays); `None` = one key.
    /// Query mode always batches ([`freshen::plug::DEFAULT_QUERY_BATCH`] unless set).
    pub rebuild_batch: Option<usize>,
    /// Without `rebuild_batch`: keys rebuilt in one transaction, each with its own
    /// parameters, pipelined (default 16).
    pub keys_per_transaction: usize,
    /// `rebuild_set`: statements over arrays of keys for a call larger than a batch (a
    /// backlog); empty: `rebuild` serves every call.
    pub rebuild_set: Vec<String>,
    /// Optional reconcile sweep.
    pub reconcile: Option<Reconcile>,
    /// Timing for this view.
    pub timing: Timing,
    /// Line of the view in the file.
    pub line: Option<usize>,
    /// Line of the `rebuild` list.
    pub rebuild_line: Option<usize>,
    /// Tables the view reads but does not watch, on purpose (`static = [...]`): they
    /// never change, or their changes are deliberately ignored. `schema.table`.
    pub static_tables: Vec<(String, String)>,
    /// The view's key as the target names it: the file's `key`, or where the watch
    /// entries were inferred (`infer.rs`) the inferred key (a plain query's: the
    /// target's primary key); empty otherwise (the first watch entry that carries the
    /// key names it).
    pub key_names: Vec<String>,
}

impl View {
    /// The statement listing the view's live keys for its reconcile sweep: the file's
    /// `keys`, or for a plain query (whose sweeps are whole-table diffs, listing nothing
    /// while they can) its key columns from the query and from the target, in case a
    /// sweep must list them (after a whole run failed). `None` without a reconcile.
    pub fn reconcile_keys(&self) -> Option<String> {
        let rec = self.reconcile.as_ref()?;
        if let Some(keys) = &rec.keys {
            return Some(keys.clone());
        }
        let q = self.query.as_ref()?;
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let key = self
            .key_names
            .iter()
            .map(|k| quote(k))
            .collect::<Vec<_>>()
            .join(", ");
        let body = q.query.trim_end().trim_end_matches(';').trim_end();
        Some(format!(
            "SELECT {key} FROM (\n{body}\n) AS freshen_q UNION SELECT {key} FROM {}.{}",
            quote(&q.into.0),
            quote(&q.into.1)
        ))
    }

    /// The view as a target builds it; `cap`: the most connections it may open.
    pub fn spec(&self, cap: Option<usize>) -> freshen::plug::ViewSpec {
        freshen::plug::ViewSpec {
            name: self.name.clone(),
            watch: self.watch.iter().map(|w| w.watched(&self.name)).collect(),
            rebuild: self.rebuild.clone(),
            query: self.query.as_ref().map(|q| freshen::plug::QuerySpec {
                into: q.into.clone(),
                query: q.query.clone(),
            }),
            rebuild_batch: self.rebuild_batch,
            keys_per_transaction: self.keys_per_transaction,
            rebuild_set: self.rebuild_set.clone(),
            reconcile: self.reconcile_keys(),
            static_tables: self.static_tables.clone(),
            connections: self.connections(cap),
            statement_timeout: self.timing.statement_timeout,
            whole_timeout: self.timing.whole_timeout,
            key_names: self.key_names.clone(),
        }
    }

    /// How many connections the view opens: one per worker and one for its sweep, so
    /// its rebuilds never wait for a connection another view holds.
    fn connections(&self, cap: Option<usize>) -> usize {
        let want = self.timing.workers + usize::from(self.reconcile.is_some());
        cap.map_or(want, |c| want.min(c)).max(1)
    }

    /// Number of key parts (`$1..$n`): the key of the watched tables that carry it
    /// (fan-out entries carry a parent key instead).
    pub fn arity(&self) -> usize {
        self.direct().next().map_or(0, |w| w.key.len())
    }

    /// Watched tables that carry the view's key.
    pub fn direct(&self) -> impl Iterator<Item = &Watch> {
        self.watch.iter().filter(|w| w.keys.is_none())
    }

    /// Watched tables mapped to the view's keys by a `keys` statement.
    pub fn fanouts(&self) -> impl Iterator<Item = &Watch> {
        self.watch.iter().filter(|w| w.keys.is_some())
    }
}

/// Where rebuild and reconcile SQL runs.
#[derive(Debug, Clone)]
pub struct Target {
    /// Connection URL.
    pub url: Secret,
    /// The most connections one view opens (`None`: its workers, plus one for its
    /// reconcile sweep). Each view has its own pool, so a slow or locked view never
    /// takes another's connections.
    pub pool_size: Option<usize>,
    /// Its kind, opened from the URL by the registry the reader was handed; or why
    /// it could not be (an unusable URL, reported with its line unless offline).
    kind: Result<std::sync::Arc<dyn freshen::plug::TargetPlug>, Vec<String>>,
}

/// Two targets are the same when configured alike: the kind follows from the URL.
impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        self.url == other.url && self.pool_size == other.pool_size
    }
}

impl Target {
    /// Its kind, or why its URL is not usable.
    pub fn kind(&self) -> anyhow::Result<&dyn freshen::plug::TargetPlug> {
        self.kind
            .as_deref()
            .map_err(|p| anyhow::anyhow!("the target URL is not usable: {}", p.join("; ")))
    }

    /// Connects, deciding how rebuilds prove visibility of the changes read from
    /// `source_url` (the source's database, when it reads one).
    pub async fn connect(
        &self,
        source_url: Option<&str>,
    ) -> anyhow::Result<Box<dyn freshen::plug::Target>> {
        self.kind()?
            .connect(source_url)
            .await
            .map_err(anyhow::Error::from_boxed)
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[http]`: the metrics, health and status listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Host and Origin rules, timeouts, the connection limit.
    pub serving: freshen_http::ListenerConfig,
    /// The bearer token the `/admin` endpoints require (`None`: open on loopback, off
    /// beyond it).
    pub admin_token: Option<AdminToken>,
}

/// The `/admin` endpoints' bearer token: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// The shortest token accepted: guessable tokens make the check theatre.
    pub const MIN_LEN: usize = 16;

    /// The token itself, to compare with what a request presents.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The keys of `[target]`.
pub(crate) const TARGET: &[&str] = &["url", "pool_size"];
/// The keys of `[log]`.
pub(crate) const LOG: &[&str] = &["format"];
/// The keys of a `backoff` table.
pub(crate) const BACKOFF: &[&str] = &["base", "max"];
/// The keys of a view's `reconcile` table.
pub(crate) const RECONCILE: &[&str] = &["every", "keys"];
/// The keys of a `[[views.watch]]` entry.
pub(crate) const WATCH: &[&str] = &["table", "key", "keys", "fixed_key"];
/// The keys `[source]` reads for every kind (the kind's crate reads the others).
pub(crate) const SOURCE_SHARED: &[&str] = &["kind", "ack"];

/// The longest duration any setting takes: a year. Every interval freshen runs on is
/// far shorter, and a year keeps `now + interval` far from overflowing a clock, so a
/// typo like "18446744073709551615s" is an error with its line, not a panic later.
pub const MAX_DURATION: Duration = Duration::from_secs(31_557_600); // 365.25 days, "1year"

/// The longest `status_interval`: an hour. PostgreSQL drops a replication connection
/// that sends no feedback for `wal_sender_timeout` (60 s by default) unless asked for a
/// reply; much longer than that only retains WAL.
pub const MAX_STATUS_INTERVAL: Duration = Duration::from_secs(3600);

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where changes come from.
    pub source: Source,
    /// When batches are acknowledged.
    pub ack: AckPolicy,
    /// Where SQL runs (defaults to the source database).
    pub target: Target,
    /// Metrics/health listener; `None` when disabled.
    pub http: Option<Http>,
    /// Log format.
    pub log: LogFormat,
    /// The views.
    pub views: Vec<View>,
    /// Sinks that receive every captured change.
    pub sinks: Vec<Sink>,
    /// The durable changefeed, when configured.
    pub changefeed: Option<freshen_changefeed::ChangefeedConfig>,
    /// A digest of the `[source]` table as read (secrets included;
    /// comments and layout not): a reload refuses a changed source even when only a redacted
    /// value changed.
    pub source_digest: u64,
    /// The same for `[[sinks]]`, `[changefeed]` and `[[redact]]` together.
    pub outputs_digest: u64,
    /// Rebuild work spread over many instances (`[key_stream]`): see
    /// `role.rs`.
    pub key_stream: Option<KeyStream>,
    /// Column redaction applied to every output (`[[redact]]`): the changefeed and
    /// every sink; never rebuilds.
    pub redact: freshen_codec::Redactor,
    /// The line of each `[[redact]]` rule (the order of `redact`'s rules).
    pub redact_lines: Vec<Option<usize>>,
    /// Offline only: variables that are not set here, with their line and where they
    /// are used (their values were not judged).
    pub unset: Vec<(Option<usize>, String, String)>,
}

impl Config {
    /// Every watched table, each once, in first-seen order, then the source's extra
    /// captured tables, then those sinks need (a transactional outbox's).
    pub fn watched_tables(&self) -> Vec<(String, String)> {
        let extra = self.source.tables();
        let sinks = self.sinks.iter().flat_map(|s| s.plug.tables());
        let mut out: Vec<(String, String)> = Vec::new();
        let views = self
            .views
            .iter()
            .flat_map(|v| &v.watch)
            .map(|w| (w.schema.clone(), w.table.clone()));
        for t in views.chain(extra).chain(sinks) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// `[[redact]]` rules whose table nothing here captures (and no `[source] tables`
    /// pattern could select): known without I/O; see `redact_coverage.rs`.
    pub fn unmatched_redactions(&self) -> Vec<crate::redact_coverage::Unmatched> {
        let patterns = self
            .source
            .discovery()
            .map(|d| d.patterns)
            .unwrap_or_default();
        crate::redact_coverage::unmatched_tables(
            self.redact.rules(),
            &self.redact_lines,
            &self.watched_tables(),
            &patterns,
        )
    }

    /// What the configuration asks of its source.
    pub fn plan(&self) -> freshen::plug::Plan {
        freshen::plug::Plan {
            watched: self
                .views
                .iter()
                .flat_map(|v| v.watch.iter().map(|w| w.watched(&v.name)))
                .collect(),
            tables: self.watched_tables(),
            changefeed: self.changefeed.is_some(),
        }
    }

    /// How many consumers the source feeds: views, sinks and the changefeed.
    pub fn consumers(&self) -> usize {
        self.views.len() + self.sinks.len() + usize::from(self.changefeed.is_some())
    }
}

/// The file's top-level keys (`reference/` documents each of these lists).
pub(crate) const TOP: &[&str] = &[
    "source",
    "target",
    "http",
    "log",
    "defaults",
    "views",
    "sinks",
    "changefeed",
    "key_stream",
    "redact",
];
/// The timing keys of `[defaults]` and of each view.
pub(crate) const TIMING: &[&str] = &[
    "coalesce",
    "max_wait",
    "workers",
    "poison_after",
    "backoff",
    "shutdown_grace",
    "release_quarantined_after",
    "statement_timeout",
    "stale_after",
    "rebuild_by",
    "whole_timeout",
];
/// The keys of a `[[views]]` entry.
pub(crate) const VIEW: &[&str] = &[
    "name",
    "watch",
    "rebuild",
    "into",
    "query",
    "key",
    "rebuild_batch",
    "keys_per_transaction",
    "rebuild_set",
    "reconcile",
    "static",
    "coalesce",
    "max_wait",
    "workers",
    "poison_after",
    "backoff",
    "shutdown_grace",
    "release_quarantined_after",
    "statement_timeout",
    "stale_after",
    "rebuild_by",
    "whole_timeout",
];

/// Reads and validates `path`, expanding `${VAR}` from the process environment; the
/// kinds it may name are those of `kinds`.
pub fn load(path: &std::path::Path, kinds: &Kinds) -> Result<Config, ConfigError> {
    let (src, file) = read(path)?;
    parse(&src, &file, &|name| std::env::var(name).ok(), kinds)
}

/// Reads and validates `path` for `check --offline`: an unset `${VAR}` is no problem —
/// the value using it is kept as written and not judged — and is listed in
/// [`Config::unset`].
pub fn load_offline(path: &std::path::Path, kinds: &Kinds) -> Result<Config, ConfigError> {
    let (src, file) = read(path)?;
    parse_with(&src, &file, &|name| std::env::var(name).ok(), kinds, true)
}

/// Only the `[http] listen` address of `path` (`None`: `"off"`), for `status` and
/// `health`: they ask a running instance and need nothing else from its file, so the
/// rest is not judged.
pub fn http_listen(path: &std::path::Path) -> Result<Option<SocketAddr>, ConfigError> {
    let (src, file) = read(path)?;
    let problem = |message: String| ConfigError {
        file: file.clone(),
        problems: vec![Problem {
            line: None,
            message,
        }],
    };
    let doc: toml_edit::DocumentMut = src
        .parse()
        .map_err(|e: toml_edit::TomlError| problem(e.message().to_owned()))?;
    let default = SocketAddr::from(([127, 0, 0, 1], 9187));
    match doc.get("http").and_then(|h| h.get("listen")) {
        None => Ok(Some(default)),
        Some(v) => match v.as_str() {
            Some("off") => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|_| {
                problem(format!(
                    "`http.listen` must be an address like \"127.0.0.1:9187\", not `{s}`"
                ))
            }),
            None => Err(problem("`http.listen` must be a string".into())),
        },
    }
}

/// The default configuration file, looked for in the working directory.
pub const DEFAULT_FILE: &str = "freshen.toml";

/// The file's text and its name for messages.
fn read(path: &std::path::Path) -> Result<(String, String), ConfigError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(src) => Ok((src, file)),
        Err(e) => {
            let message = if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "no such file (freshen reads `{DEFAULT_FILE}` from the working directory \
                     unless `-c FILE` names another; `deploy/freshen.toml` is a starting point)"
                )
            } else {
                format!("cannot read the file: {e}")
            };
            Err(ConfigError {
                file,
                problems: vec![Problem {
                    line: None,
                    message,
                }],
            })
        }
    }
}

/// Parses and validates a configuration; `env` looks up `${VAR}` references, and
/// `kinds` are the sources, targets and sinks it may name.
pub fn parse(
    src: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
    kinds: &Kinds,
) -> Result<Config, ConfigError> {
    parse_with(src, file, env, kinds, false)
}

fn parse_with(
    src: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
    kinds: &Kinds,
    offline: bool,
) -> Result<Config, ConfigError> {
    let doc = match Document::parse(src) {
        Ok(doc) => doc,
        Err(e) => {
            let line = Reader::new(src, env).line(e.span());
            return Err(ConfigError {
                file: file.to_string(),
                problems: vec![Problem {
                    line,
                    message: format!("not valid TOML: {}", e.message()),
                }],
            });
        }
    };
    let mut r = Reader::new(src, env);
    if offline {
        r = r.lenient();
    }
    let root = Tbl {
        t: doc.as_table(),
        path: "",
        span: None,
    };
    r.known_keys(root, TOP);

    let (source, ack) = read_source(&mut r, root, &kinds.sources);
    let target = read_target(&mut r, root, source.as_ref(), kinds);
    let http = read_http(&mut r, root);
    let log = read_log(&mut r, root);
    let defaults = match r.table(root, "defaults", "defaults") {
        Some(t) => {
            r.known_keys(t, TIMING);
            read_timing(&mut r, t, Timing::default())
        }
        None => Timing::default(),
    };
    let sinks = read_sinks(&mut r, root, source.as_ref(), &kinds.sinks);
    let changefeed = root.t.get("changefeed").and_then(|item| {
        let mark = r.mark();
        let cf: freshen_changefeed::ChangefeedConfig = r.serde_table(item, "changefeed", &[])?;
        let problems = if r.judged_since(mark) {
            cf.problems()
        } else {
            Vec::new()
        };
        for p in problems {
            r.problem_in(item, "changefeed", &p, None);
        }
        // Snapshot watermarks travel through replication: a source that cannot
        // snapshot says so here when it polls (it never brings them back, and its
        // first run reads every row anyway); the others are refused at start.
        let polls = source.as_ref().is_some_and(|s| {
            let c = s.capabilities();
            !c.snapshot && c.cursor
        });
        if polls && cf.snapshot != freshen_changefeed::SnapshotMode::Never {
            r.problem_in(
                item,
                "changefeed",
                &format!(
                    "changefeed.snapshot: a {} source reads every existing row on its first run; snapshots need a replication source (remove `snapshot`)",
                    source.as_ref().map_or("polling", |s| s.kind())
                ),
                None,
            );
        }
        Some(cf)
    });
    // The target's kind, opened once from its URL (a URL with problems was reported by
    // check_url): its table-name rules and what it cannot rebuild.
    let target_plug = target.as_ref().and_then(|t| t.kind.as_ref().ok().cloned());
    let names = Names::new(source.as_ref(), target_plug.as_deref());
    let views = read_views(
        &mut r,
        root,
        defaults,
        !sinks.is_empty() || changefeed.is_some(),
        &names,
    );
    check_views_on_target(&mut r, &views, target_plug.as_deref(), source.as_ref());
    let key_stream = key_stream::read(&mut r, root, &views);
    let (redact, redact_lines) = redact::read(&mut r, root, &names.source);

    let database = root
        .t
        .get("source")
        .and_then(|s| s.get("kind"))
        .and_then(|k| k.as_str())
        .and_then(|k| match kinds.sources.find(k) {
            Found::Built(_, kind) => Some(kind.database),
            _ => None,
        });
    if target.is_none() && !views.is_empty() && database == Some(false) {
        r.missing(
            root,
            "target",
            "a [target] url: where rebuild and reconcile SQL runs (only a database source provides a default: its own)",
        );
    }
    match (source, target, r.p.list.is_empty()) {
        (Some(source), target, true) if target.is_some() || views.is_empty() => Ok(Config {
            source,
            source_digest: root.t.get("source").map_or(0, read::digest),
            outputs_digest: ["sinks", "changefeed", "redact"]
                .iter()
                .map(|k| root.t.get(k).map_or(0, read::digest))
                .fold(0, |a, d| a.rotate_left(1) ^ d),
            ack: ack.unwrap_or_default(),
            target: target.unwrap_or(Target {
                url: Secret::new(String::new()),
                pool_size: None,
                kind: Err(vec!["no [target] url".to_owned()]),
            }),
            http,
            log,
            views,
            sinks,
            changefeed,
            key_stream,
            redact,
            redact_lines,
            unset: r
                .unset
                .iter()
                .map(|(line, name, path)| (*line, name.clone(), path.clone()))
                .collect(),
        }),
        _ => {
            let mut problems = r.p.list;
            problems.sort_by_key(|p| p.line.unwrap_or(0));
            Err(ConfigError {
                file: file.to_string(),
                problems,
            })
        }
    }
}

fn read_source(
    r: &mut Reader<'_, '_>,
    root: Tbl<'_>,
    kinds: &Registry<SourceKind>,
) -> (Option<Source>, Option<AckPolicy>) {
    let Some(t) = r.table(root, "source", "source") else {
        if root.t.get("source").is_none() {
            r.missing(root, "source", "a [source] table: where changes come from");
        }
        return (None, None);
    };
    let ack = r
        .choice(t, "ack", &["after-rebuild", "on-enqueue"])
        .map(|s| match s.value.as_str() {
            "on-enqueue" => AckPolicy::OnEnqueue,
            _ => AckPolicy::AfterRebuild,
        });
    if let Some(Found::LeftOut(name, feature)) =
        t.t.get("kind")
            .and_then(|k| k.as_str())
            .map(|k| kinds.find(k))
    {
        let line = r.line(t.t.get("kind").and_then(|i| i.span()));
        r.p.at_line(
            line,
            format!("`source.kind` \"{name}\" is not built into this freshen: build it with `--features {feature}`"),
        );
        return (None, ack);
    }
    let names = kinds.built();
    let kind = r.choice(t, "kind", &names);
    if kind.is_none() && t.t.get("kind").is_none() {
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        r.missing(
            t,
            "kind",
            &format!("the source type: {}", quoted.join(", ")),
        );
    }
    let Some(kind) = kind else {
        return (None, ack);
    };
    let Found::Built(_, registered) = kinds.find(&kind.value) else {
        return (None, ack);
    };
    let item = root.t.get("source").expect("read above");
    let mark = r.mark();
    let Some(config) = r.serde_with(item, "source", SOURCE_SHARED, |d| registered.read(d)) else {
        return (None, ack);
    };
    // Offline with an unset variable: kept as written, judged by `run`.
    if !r.judged_since(mark) {
        return (Some(config), ack);
    }
    let problems = config.problems();
    for p in &problems {
        r.problem_in(item, "source", p, kind.line);
    }
    (problems.is_empty().then_some(config), ack)
}

/// A target URL is parsed and checked here, so that `check --offline` rejects what
/// `run` would. The parsers' messages never quote a value.
fn check_url(r: &mut Reader<'_, '_>, path: &str, url: &read::Spanned<String>, kinds: &Kinds) {
    let problems = match kinds.open_target(&url.value) {
        Ok(_) => Vec::new(),
        Err(problems) => problems,
    };
    for p in problems {
        r.p.at_line(url.line, format!("`{path}`: {p}"));
    }
}

fn read_target(
    r: &mut Reader<'_, '_>,
    root: Tbl<'_>,
    source: Option<&Source>,
    kinds: &Kinds,
) -> Option<Target> {
    let target = |url: Secret, pool_size| Target {
        kind: kinds.open_target(url.expose()),
        url,
        pool_size,
    };
    let default_url = source.and_then(|s| s.database_url()).map(Secret::new);
    let Some(t) = r.table(root, "target", "target") else {
        return default_url.map(|url| target(url, None));
    };
    r.known_keys(t, TARGET);
    let mark = r.mark();
    let url = r.string(t, "url");
    if let Some(u) = url.as_ref().filter(|_| r.judged_since(mark)) {
        check_url(r, "target.url", u, kinds);
    }
    let url = url.map(|s| Secret::new(s.value)).or(default_url);
    let pool_size = r.int(t, "pool_size", 1..=1024).map(|n| n.value as usize);
    url.map(|url| target(url, pool_size))
}

/// The keys of `[http]`.
pub(crate) const HTTP: &[&str] = &[
    "listen",
    "allowed_hosts",
    "header_timeout",
    "request_timeout",
    "max_connections",
    "admin_token",
];

fn read_http(r: &mut Reader<'_, '_>, root: Tbl<'_>) -> Option<Http> {
    let default = SocketAddr::from(([127, 0, 0, 1], 9187));
    let mut serving = freshen_http::ListenerConfig::new("metrics");
    // Prometheus and a few people: a small limit keeps descriptors for the databases.
    serving.max_connections = 64;
    let Some(t) = r.table(root, "http", "http") else {
        return Some(Http {
            listen: default,
            serving,
            admin_token: None,
        });
    };
    r.known_keys(t, HTTP);
    if let Some(hosts) = r.strings(t, "allowed_hosts") {
        for h in &hosts.value {
            if let Some(why) = freshen_http::host_problem(h) {
                r.p.at_line(hosts.line, format!("`http.allowed_hosts`: {why}"));
            }
        }
        serving.allowed_hosts = hosts.value;
    }
    use freshen_http::limits as l;
    if let Some(d) = r.duration_within(
        t,
        "header_timeout",
        l::MIN_HEADER_TIMEOUT..=l::MAX_HEADER_TIMEOUT,
    ) {
        serving.header_timeout = d.value;
    }
    if let Some(d) = r.duration_within(
        t,
        "request_timeout",
        l::MIN_REQUEST_TIMEOUT..=l::MAX_REQUEST_TIMEOUT,
    ) {
        serving.request_timeout = Some(d.value);
    }
    if let Some(n) = r.int(t, "max_connections", 1..=l::MAX_CONNECTIONS as i64) {
        serving.max_connections = n.value as usize;
    }
    let admin_token = r.string(t, "admin_token").and_then(|tok| {
        if tok.value.chars().count() < AdminToken::MIN_LEN {
            r.p.at_line(
                tok.line,
                format!(
                    "`http.admin_token` must be at least {} characters (e.g. `openssl rand -hex 24`, passed as \"${{FRESHEN_ADMIN_TOKEN}}\")",
                    AdminToken::MIN_LEN
                ),
            );
            return None;
        }
        Some(AdminToken(tok.value))
    });
    let Some(listen) = r.string(t, "listen") else {
        return Some(Http {
            listen: default,
            serving,
            admin_token,
        });
    };
    if listen.value == "off" {
        return None;
    }
    match listen.value.parse::<SocketAddr>() {
        Ok(listen) => Some(Http {
            listen,
            serving,
            admin_token,
        }),
        Err(_) => {
            r.p.at_line(
                listen.line,
                format!(
                    "`http.listen` must be an address like \"127.0.0.1:9187\" (or \"off\"), not `{}`",
                    listen.value
                ),
            );
            None
        }
    }
}

fn read_log(r: &mut Reader<'_, '_>, root: Tbl<'_>) -> LogFormat {
    let Some(t) = r.table(root, "log", "log") else {
        return LogFormat::Text;
    };
    r.known_keys(t, LOG);
    match r.choice(t, "format", &["text", "json"]) {
        Some(s) if s.value == "json" => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

fn read_timing(r: &mut Reader<'_, '_>, t: Tbl<'_>, base: Timing) -> Timing {
    let mut out = base;
    if let Some(d) = r.duration(t, "coalesce") {
        out.coalesce = d.value;
    }
    if let Some(d) = r.duration(t, "max_wait") {
        out.max_wait = d.value;
    }
    if let Some(n) = r.int(t, "workers", 1..=1024) {
        out.workers = n.value as usize;
    }
    if let Some(n) = r.int(t, "poison_after", 1..=65_535) {
        out.poison_after = n.value as u32;
    }
    if let Some(d) = r.duration(t, "shutdown_grace") {
        out.shutdown_grace = d.value;
    }
    if let Some(d) = r.duration(t, "release_quarantined_after") {
        out.release_quarantined_after = Some(d.value);
    }
    if let Some(d) = r.duration(t, "statement_timeout") {
        out.statement_timeout = (!d.value.is_zero()).then_some(d.value);
    }
    if let Some(d) = r.duration(t, "stale_after") {
        out.stale_after = (!d.value.is_zero()).then_some(d.value);
    }
    if let Some(c) = r.choice(t, "rebuild_by", &["auto", "per-key", "set"]) {
        out.rebuild_by = match c.value.as_str() {
            "per-key" => freshen::RebuildBy::PerKey,
            "set" => freshen::RebuildBy::Set,
            _ => freshen::RebuildBy::Auto,
        };
    }
    if let Some(d) = r.duration(t, "whole_timeout") {
        out.whole_timeout = (!d.value.is_zero()).then_some(d.value);
    }
    let path = format!(
        "{}{}backoff",
        t.path,
        if t.path.is_empty() { "" } else { "." }
    );
    if let Some(b) = r.table(t, "backoff", &path) {
        r.known_keys(b, BACKOFF);
        if let Some(d) = r.duration(b, "base") {
            out.backoff_base = d.value;
        }
        if let Some(d) = r.duration(b, "max") {
            out.backoff_max = d.value;
        }
    }
    if out.coalesce > out.max_wait {
        let line = r.line(
            t.t.get("coalesce")
                .or(t.t.get("max_wait"))
                .and_then(|i| i.span()),
        );
        r.p.at_line(
            line,
            format!(
                "in `{}`: coalesce ({}) must not exceed max_wait ({})",
                if t.path.is_empty() {
                    "defaults"
                } else {
                    t.path
                },
                humantime::format_duration(out.coalesce),
                humantime::format_duration(out.max_wait)
            ),
        );
    }
    if out.backoff_base.is_zero() || out.backoff_base > out.backoff_max {
        let line = r.line(t.t.get("backoff").and_then(|i| i.span()));
        r.p.at_line(
            line,
            format!(
                "backoff base ({}) must be above zero and at most max ({})",
                humantime::format_duration(out.backoff_base),
                humantime::format_duration(out.backoff_max)
            ),
        );
    }
    out
}

/// How the file's table names are read: a source's tables (`watch`, `static`) by the
/// source's rules, a target's (`into`) by the target's (see [`freshen::plug::Naming`]).
struct Names {
    source: freshen::plug::Naming,
    target: freshen::plug::Naming,
}

impl Names {
    fn new(source: Option<&Source>, target: Option<&dyn freshen::plug::TargetPlug>) -> Names {
        // Without a usable source (already reported) names are only checked for their
        // quotes, under no database's rules.
        let source = source.map_or_else(
            || freshen::plug::Naming {
                quote: '"',
                fold_unquoted: false,
                default_schema: Some(String::new()),
                schema_word: "schema",
            },
            |s| s.naming(),
        );
        let target = target.map_or_else(|| source.clone(), |t| t.naming());
        Names { source, target }
    }
}

fn read_views(
    r: &mut Reader<'_, '_>,
    root: Tbl<'_>,
    defaults: Timing,
    optional: bool,
    names: &Names,
) -> Vec<View> {
    let Some(views) = r.tables(root, "views") else {
        if root.t.get("views").is_none() && !optional {
            r.missing(
                root,
                "views",
                "at least one [[views]] entry (or a [changefeed] or [[sinks]])",
            );
        }
        return Vec::new();
    };
    if views.is_empty() && !optional {
        r.missing(root, "views", "at least one [[views]] entry");
    }
    let mut out: Vec<View> = Vec::new();
    for (t, path) in &views {
        let t = Tbl { path, ..*t };
        r.known_keys(t, VIEW);
        let line = r.line(t.span.map(|s| s..s));
        let name = r.string(t, "name");
        if name.is_none() && t.t.get("name").is_none() {
            r.missing(t, "name", "a unique name for the view");
        }
        if let Some(n) = &name
            && let Some(prev) = out.iter().find(|v| v.name == n.value)
        {
            r.p.at_line(
                n.line,
                format!(
                    "duplicate view name `{}` (first used on line {})",
                    n.value,
                    prev.line.map_or("?".into(), |l| l.to_string())
                ),
            );
        }
        let vname = name
            .as_ref()
            .map_or_else(|| path.clone(), |n| n.value.clone());
        // A view rebuilt by `query` may leave `watch` out: it is inferred (crate::infer).
        let inferred = t.t.get("query").is_some();
        let watch = read_watch(r, t, &vname, &names.source, inferred);
        let rebuild = r.strings(t, "rebuild");
        let query = read_query(r, t, &vname, &watch, &names.target);
        let key_names = r.strings(t, "key").map_or_else(Vec::new, |k| {
            if t.t.get("query").is_none() {
                r.p.at_line(
                    k.line,
                    format!(
                        "view `{vname}`: `key` names the key columns of `into` for a `query`; a view rebuilt by statements takes its key from its watch entries"
                    ),
                );
            } else if k.value.is_empty() || k.value.iter().any(|c| c.trim().is_empty()) {
                r.p.at_line(k.line, format!("view `{vname}`: `key` must name at least one column"));
            }
            k.value
        });
        match &rebuild {
            None if t.t.get("rebuild").is_none() && t.t.get("query").is_none() && t.t.get("into").is_none() => r.missing(
                t,
                "rebuild",
                "how to recompute a key: `into` (the target table) and `query` (its rows for a batch of keys, `WHERE key = ANY($1)`), or `rebuild` statements with the key as $1..$n",
            ),
            Some(s) if s.value.is_empty() || s.value.iter().any(|q| q.trim().is_empty()) => {
                r.p.at_line(
                    s.line,
                    format!("view `{vname}`: `rebuild` statements must not be empty"),
                )
            }
            _ => {}
        }
        if let Some(s) = &rebuild
            && (t.t.get("query").is_some() || t.t.get("into").is_some())
        {
            r.p.at_line(
                s.line,
                format!(
                    "view `{vname}`: has both `rebuild` statements and `into`/`query`: keep one (a query, which freshen writes set-based, or hand-written statements)"
                ),
            );
        }
        let rebuild_batch = r
            .int(t, "rebuild_batch", 1..=100_000)
            .map(|n| n.value as usize);
        let keys_per_transaction = r.int(t, "keys_per_transaction", 1..=10_000);
        if let (Some(_), Some(k)) = (rebuild_batch, &keys_per_transaction) {
            r.p.at_line(
                k.line,
                format!(
                    "view `{vname}`: `keys_per_transaction` is for per-key statements; with `rebuild_batch` the batch size is the number of keys"
                ),
            );
        } else if let Some(k) = keys_per_transaction
            .as_ref()
            .filter(|_| t.t.get("query").is_some())
        {
            r.p.at_line(
                k.line,
                format!(
                    "view `{vname}`: `keys_per_transaction` is for per-key statements; a query rebuilds batches of keys (set their size with `rebuild_batch`)"
                ),
            );
        }
        let rebuild_batch = match &query {
            Some(_) => Some(rebuild_batch.unwrap_or(freshen::plug::DEFAULT_QUERY_BATCH)),
            None => rebuild_batch,
        };
        let keys_per_transaction = keys_per_transaction.map_or(16, |k| k.value as usize);
        let rebuild_set = r.strings(t, "rebuild_set").map_or_else(Vec::new, |s| {
            if t.t.get("query").is_some() || t.t.get("into").is_some() {
                r.p.at_line(
                    s.line,
                    format!(
                        "view `{vname}`: `rebuild_set` is for hand-written `rebuild` statements; a `query`'s set statement is written by freshen"
                    ),
                );
            } else if s.value.is_empty() || s.value.iter().any(|q| q.trim().is_empty()) {
                r.p.at_line(
                    s.line,
                    format!("view `{vname}`: `rebuild_set` statements must not be empty"),
                );
            }
            s.value
        });
        let reconcile = r.table(t, "reconcile", "reconcile").and_then(|rt| {
            r.known_keys(rt, RECONCILE);
            let every = r.duration(rt, "every");
            let keys = r.string(rt, "keys");
            if every.is_none() && rt.t.get("every").is_none() {
                r.missing(rt, "every", "the sweep interval, e.g. \"1h\"");
            }
            let plain = t
                .t
                .get("query")
                .and_then(|q| q.as_str())
                .is_some_and(freshen::plug::is_plain_query);
            if keys.is_none() && rt.t.get("keys").is_none() && !plain {
                r.missing(
                    rt,
                    "keys",
                    "a query listing every live key (a view given as a plain query needs none: its sweep is one whole-table diff)",
                );
            }
            if let Some(e) = &every
                && e.value.is_zero()
            {
                r.p.at_line(e.line, "`reconcile.every` must be greater than zero");
            }
            if keys.is_none() && !plain {
                return None;
            }
            Some(Reconcile {
                every: every?.value,
                line: keys
                    .as_ref()
                    .and_then(|k| k.line)
                    .or_else(|| r.line(rt.span.map(|s| s..s))),
                keys: keys.map(|k| k.value),
            })
        });
        let mut static_tables = Vec::new();
        if let Some(list) = r.strings(t, "static") {
            for name in &list.value {
                match names.source.parse(name) {
                    Ok(st) => static_tables.push(st),
                    Err(_) => r.p.at_line(
                        list.line,
                        format!(
                            "view `{vname}`: `static` entry `{name}` is not a table name ({})",
                            names.source.shapes()
                        ),
                    ),
                }
            }
        }
        if !watch.is_empty() && watch.iter().all(|w| w.keys.is_some()) {
            r.p.at_line(
                line,
                format!(
                    "view `{vname}`: at least one watched table must carry the view's key (an entry without `keys`)"
                ),
            );
        }
        let timing = read_timing(r, t, defaults);
        let (rebuild, rebuild_line) = match (rebuild, &query) {
            (Some(s), None) => (Some(s.value), s.line),
            (None, Some(q)) => (Some(Vec::new()), q.line),
            _ => (None, None),
        };
        if let (Some(name), Some(rebuild)) = (name, rebuild) {
            out.push(View {
                name: name.value,
                watch,
                rebuild,
                query,
                rebuild_batch,
                keys_per_transaction,
                rebuild_set,
                reconcile,
                timing,
                line,
                rebuild_line,
                static_tables,
                key_names,
            });
        }
    }
    out
}

/// `into` and `query`, which come together; what can be known of them without a
/// database (a table name, a query using each key part's parameter).
fn read_query(
    r: &mut Reader<'_, '_>,
    t: Tbl<'_>,
    vname: &str,
    watch: &[Watch],
    naming: &freshen::plug::Naming,
) -> Option<QueryMode> {
    let into = r.string(t, "into");
    let query = r.string(t, "query");
    match (&into, &query) {
        (None, Some(_)) if t.t.get("into").is_none() => r.missing(
            t,
            "into",
            "the table the query's rows are written into; its key columns are the view's key",
        ),
        (Some(_), None) if t.t.get("query").is_none() => r.missing(
            t,
            "query",
            "the rows of `into` for a batch of keys, e.g. \"SELECT device, sum(value) AS total FROM readings WHERE device = ANY($1) GROUP BY device\"",
        ),
        _ => {}
    }
    let (into, query) = (into?, query?);
    let table = naming.parse(&into.value).ok();
    if table.is_none() {
        r.p.at_line(
            into.line,
            format!(
                "view `{vname}`: `into` `{}` is not a table name ({})",
                into.value,
                naming.shapes()
            ),
        );
    }
    if query.value.trim().is_empty() {
        r.p.at_line(
            query.line,
            format!("view `{vname}`: `query` must not be empty"),
        );
        return None;
    }
    let key: Vec<&str> = watch
        .iter()
        .find(|w| w.keys.is_none())
        .map(|w| w.key.iter().map(String::as_str).collect())
        .unwrap_or_default();
    // A plain query (the SELECT of a materialized view) takes no parameter: freshen
    // writes its batch filter. Otherwise it selects its batch itself: without a watch
    // entry that carries the key, it takes at least $1.
    let plain = freshen::plug::is_plain_query(&query.value);
    let missing = freshen::plug::missing_params(&query.value, key.len().max(1));
    if !plain && !missing.is_empty() {
        let example: Vec<String> = if key.is_empty() {
            vec!["key = ANY($1)".to_string()]
        } else {
            key.iter()
                .enumerate()
                .map(|(i, k)| format!("{k} = ANY(${})", i + 1))
                .collect()
        };
        let missing: Vec<String> = missing.iter().map(|i| format!("${i}")).collect();
        r.p.at_line(
            query.line,
            format!(
                "view `{vname}`: the query must select its batch of keys with one array per key part ({}), but never uses {}",
                example.join(" AND "),
                missing.join(", ")
            ),
        );
    }
    Some(QueryMode {
        into: table?,
        query: query.value,
        line: query.line,
    })
}

/// What the target cannot do for a view, known offline (e.g. a `query` writes with
/// PostgreSQL statements): the target's kind says.
fn check_views_on_target(
    r: &mut Reader<'_, '_>,
    views: &[View],
    plug: Option<&dyn freshen::plug::TargetPlug>,
    source: Option<&Source>,
) {
    let Some(plug) = plug else { return };
    let source_url = source.and_then(|s| s.database_url());
    for v in views {
        // A problem is most often with the query: its line, else the view's.
        let line = v.query.as_ref().and_then(|q| q.line).or(v.line);
        for p in plug.view_problems(&v.spec(None), source_url) {
            r.p.at_line(line, p);
        }
    }
}

fn read_sinks(
    r: &mut Reader<'_, '_>,
    root: Tbl<'_>,
    source: Option<&Source>,
    kinds: &Registry<SinkKind>,
) -> Vec<Sink> {
    let Some(item) = root.t.get("sinks") else {
        return Vec::new();
    };
    let entries: Vec<Item> = match item {
        Item::ArrayOfTables(a) => a.iter().map(|t| Item::Table(t.clone())).collect(),
        Item::Value(toml_edit::Value::Array(a)) => {
            a.iter().map(|v| Item::Value(v.clone())).collect()
        }
        other => {
            r.p.at(other.span(), "`sinks` must be a list of tables ([[sinks]])");
            return Vec::new();
        }
    };
    let names = kinds.names();
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let path = format!("sinks[{i}]");
        let Some(t) = r.as_table(entry, &path) else {
            continue;
        };
        let kind = r.choice(t, "kind", &names);
        if kind.is_none() && t.t.get("kind").is_none() {
            let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
            r.missing(t, "kind", &format!("the sink type: {}", quoted.join(", ")));
        }
        let Some(kind) = kind else { continue };
        let registered = match kinds.find(&kind.value) {
            Found::Built(_, registered) => registered,
            Found::LeftOut(name, feature) => {
                r.p.at_line(
                    kind.line,
                    format!("`{path}.kind` \"{name}\" is not built into this freshen: build it with `--features {feature}`"),
                );
                continue;
            }
            Found::Unknown => continue,
        };
        let mark = r.mark();
        let snapshot = sink_snapshot::read(r, t, source);
        let skip: Vec<&str> = ["kind"]
            .iter()
            .chain(sink_snapshot::KEYS)
            .copied()
            .collect();
        let Some(plug) = r.serde_with(entry, &path, &skip, |d| registered.read(d)) else {
            continue;
        };
        let problems = if r.judged_since(mark) {
            plug.problems()
        } else {
            Vec::new()
        };
        for p in &problems {
            r.problem_in(entry, &path, p, kind.line);
        }
        if problems.is_empty() {
            out.push(Sink { plug, snapshot });
        }
    }
    out
}

fn read_watch(
    r: &mut Reader<'_, '_>,
    t: Tbl<'_>,
    view: &str,
    naming: &freshen::plug::Naming,
    optional: bool,
) -> Vec<Watch> {
    let Some(entries) = r.tables(t, "watch") else {
        if t.t.get("watch").is_none() && !optional {
            r.missing(
                t,
                "watch",
                "the tables whose changes dirty this view, with their key columns (only a view rebuilt by `query` on PostgreSQL may leave it out: freshen infers it there)",
            );
        }
        return Vec::new();
    };
    if entries.is_empty() {
        r.missing(t, "watch", "at least one watched table");
    }
    let mut out: Vec<Watch> = Vec::new();
    for (w, path) in &entries {
        let w = Tbl { path, ..*w };
        r.known_keys(w, WATCH);
        let fixed_key = r.flag(w, "fixed_key").unwrap_or(false);
        let line = r.line(w.span.map(|s| s..s));
        let table = r.string(w, "table");
        if table.is_none() && w.t.get("table").is_none() {
            r.missing(w, "table", "a table name, \"schema.table\" or \"table\"");
        }
        let key = r.strings(w, "key");
        if key.is_none() && w.t.get("key").is_none() {
            r.missing(w, "key", "the columns whose values form the view's key");
        }
        let keys = r.string(w, "keys");
        if let Some(k) = &keys
            && k.value.trim().is_empty()
        {
            r.p.at_line(
                k.line,
                format!("view `{view}`: `keys` must be a query returning the view's key"),
            );
        }
        let (Some(table), Some(key)) = (table, key) else {
            continue;
        };
        if key.value.is_empty() {
            r.p.at_line(
                key.line,
                format!("view `{view}`: `key` needs at least one column"),
            );
            continue;
        }
        let Ok((schema, table_name)) = naming.parse(&table.value) else {
            r.p.at_line(
                table.line,
                format!(
                    "view `{view}`: `{}` is not a table name ({})",
                    table.value,
                    naming.shapes()
                ),
            );
            continue;
        };
        if let Some(first) = out.iter().find(|o| o.keys.is_none())
            && keys.is_none()
            && first.key.len() != key.value.len()
        {
            r.p.at_line(
                key.line,
                format!(
                    "view `{view}`: every watched table must give a key of the same arity: {} has {} column(s) ({}), {} has {} ({})",
                    first.qualified(),
                    first.key.len(),
                    first.key.join(", "),
                    format_args!("{schema}.{table_name}"),
                    key.value.len(),
                    key.value.join(", ")
                ),
            );
        }
        if out
            .iter()
            .any(|o| o.schema == schema && o.table == table_name)
        {
            r.p.at_line(
                table.line,
                format!("view `{view}` watches {schema}.{table_name} twice"),
            );
        }
        out.push(Watch {
            schema,
            table: table_name,
            key: key.value,
            keys: keys.map(|k| k.value),
            fixed_key,
            line,
        });
    }
    out
}

#[cfg(test)]
mod tests;
