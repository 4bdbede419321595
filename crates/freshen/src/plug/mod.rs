//! How a source kind, a target kind and a sink kind plug into a program that picks them
//! from configuration (the `freshen` binary): a trait each, implemented in the kind's
//! crate, so that adding one touches its crate and one registration line. Targets: see
//! [`TargetPlug`]; sinks: [`SinkPlug`].
//!
//! ```text
//!   [source] kind = "…"  ──deserialize──►  XSourceConfig: SourcePlug
//!                                              │ problems()   offline validation
//!                                              │ check(plan)  what `freshen check` finds
//!                                              └ start(plan)  Started { source, probe }
//! ```
//!
//! The [`Plan`] is what the rest of the configuration asks of the source — which tables
//! each view watches and by which key columns — so that a source can prepare for it
//! (a publication, replica identity advice) without knowing how views are configured.

mod chunks;
mod naming;
mod sink;
mod snapshot;
mod target;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use chunks::{
    Chunk, ChunkAnswer, ChunkEvent, ChunkHolder, ChunkReader, ChunkView, ReadError,
    WATERMARK_PREFIX, resolve_tables,
};
pub use naming::Naming;
pub use sink::{Redact, RunSink, SinkPlug, SinkProbe, SinkReport, Splice};
pub use snapshot::{SinkSnapshotSpec, SinkSnapshots, SnapshotState, TableSnapshot};
pub use target::{
    DEFAULT_QUERY_BATCH, DEFAULT_WHOLE_TIMEOUT, GapLedger, Imported, Inferred, QuerySpec,
    SourceFix, Starter, Target, TargetError, TargetPlug, ViewSpec, ViewTarget, is_plain_query,
    missing_params,
};

use crate::source::{BeforeImage, BoxError, BoxFuture, Capabilities, Source, SourceProbe};

/// One table a view watches, and the columns its scope key is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The view's name.
    pub view: String,
    /// Schema (PostgreSQL) or database (MySQL) of the table.
    pub schema: String,
    /// The table.
    pub table: String,
    /// The changed row's columns that make the view's key; with `keys`, the columns
    /// that statement takes (`$1..$n`).
    pub key: Vec<String>,
    /// A fan-out: SQL mapping the changed row's `key` columns to the view's keys, for a
    /// table that does not carry the view's key itself.
    pub keys: Option<String>,
    /// Declared by the user: no UPDATE changes the key columns and rows are not deleted,
    /// so the view needs no old key from this table.
    pub fixed_key: bool,
}

/// What a configuration asks of its source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every (view, table) pair, in configuration order.
    pub watched: Vec<Watched>,
    /// Every table whose changes must be captured, deduplicated: the views' tables and
    /// those named for the changefeed and sinks.
    pub tables: Vec<(String, String)>,
    /// Whether a changefeed publishes whole rows (so partial row images matter).
    pub changefeed: bool,
}

/// A started source and its uniform health handle.
pub struct Started {
    /// The stream of batches.
    pub source: Box<dyn Source>,
    /// Health, lag and setup problems, sampled off the receive path.
    pub probe: Arc<dyn SourceProbe>,
}

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field("kind", &self.probe.kind())
            .finish_non_exhaustive()
    }
}

/// How serious a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Checked and fine.
    Ok,
    /// Works, with a weaker guarantee or a risk; the message says how to fix it.
    Warning,
    /// Will not work (or cannot keep its promises) until fixed.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Error => "error",
        })
    }
}

/// One thing `freshen check` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Severity.
    pub level: Level,
    /// Which check (`wal_level`, `slot`, `replica_identity`, `statement`, …).
    pub check: &'static str,
    /// What it is about (a server with its password redacted, a table, a view).
    pub subject: String,
    /// What was found and, unless it is fine, what to do.
    pub message: String,
}

impl Finding {
    /// A finding of any level.
    pub fn new(
        level: Level,
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            level,
            check,
            subject: subject.into(),
            message: message.into(),
        }
    }

    /// Checked and fine.
    pub fn ok(check: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Finding::new(Level::Ok, check, subject, message)
    }

    /// A risk, with its fix.
    pub fn warning(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Finding::new(Level::Warning, check, subject, message)
    }

    /// A problem, with its fix.
    pub fn error(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Finding::new(Level::Error, check, subject, message)
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}: {}",
            self.level, self.check, self.subject, self.message
        )
    }
}

/// A source kind's configuration, as a program that reads configuration files uses it.
///
/// Implemented by each source crate's configuration type (which also derives serde's
/// `Deserialize` and rejects unknown fields), so everything a source knows about
/// itself — its defaults, validation, checks, start-up — lives in its crate.
pub trait SourcePlug: fmt::Debug + Send + Sync + 'static {
    /// The kind, as `[source] kind` names it.
    fn kind(&self) -> &'static str;

    /// What is wrong with the values themselves (ranges, names, URLs), each problem a
    /// sentence starting with the field's name; checked without any I/O.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }

    /// Tables this configuration names itself (captured besides the views' tables).
    fn tables(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The `[source] tables` entries that select tables by pattern (`"all"`,
    /// `"schema.*"`, `"schema.prefix_*"`), which the source follows as tables appear, and
    /// how often others (the changefeed's snapshots) should look for new ones. `None`:
    /// the source captures named tables only.
    fn discovery(&self) -> Option<Discovery> {
        None
    }

    /// The database the events come from, when the source reads one directly: rebuilds
    /// that run there (the default target) can prove they see the changes that dirtied
    /// their keys. `None` for brokers.
    fn database_url(&self) -> Option<&str> {
        None
    }

    /// How this source's tables are spelled in the file (a view's `watch` and `static`
    /// entries): the upstream database's quoting, case and default schema, so a name
    /// written as that database would take it matches the events' tables.
    fn naming(&self) -> Naming;

    /// What this source guarantees, as configured (static per kind; e.g. a temporary
    /// slot is not recoverable). [`gaps`] turns it into what `check` reports per view.
    fn capabilities(&self) -> Capabilities;

    /// What `freshen check` reports about the source: reachable, set up for capture,
    /// privileges, and what the plan relies on that the source cannot give.
    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>>;

    /// Connects and starts capturing what the plan needs (creating what the
    /// configuration allows: a slot, a publication, a position table).
    fn start<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>>;

    /// Tries once to become the one active process for this configuration, so that a
    /// second process on the same configuration waits as a standby instead of
    /// rebuilding beside the first (see [`Lease`]). The default, for sources whose
    /// upstream arbitrates by itself or needs no arbiter: [`Lease::Unneeded`].
    fn lead(&self) -> BoxFuture<'_, Result<Lease, BoxError>> {
        Box::pin(async { Ok(Lease::Unneeded) })
    }

    /// Removes what the source keeps upstream for this configuration (`freshen drop`:
    /// a slot, a publication freshen created), one line per thing and what became of
    /// it. The default: nothing to remove.
    fn drop_upstream(&self) -> BoxFuture<'_, Result<Vec<String>, BoxError>> {
        let kind = self.kind();
        Box::pin(async move {
            Err(format!("a {kind} source keeps nothing upstream that `drop` could remove").into())
        })
    }

    /// The snapshots of a sink fed by this source (the rows that already exist,
    /// published among its changes), as `spec` says; `None`: this source cannot take
    /// them (the default). Nothing is read until [`SinkSnapshots::run`].
    fn sink_snapshots(
        &self,
        spec: SinkSnapshotSpec,
    ) -> Result<Option<std::sync::Arc<dyn SinkSnapshots>>, BoxError> {
        let _ = spec;
        Ok(None)
    }

    /// A reader of this source's existing rows in chunks interleaved with its stream
    /// (the changefeed's snapshots); `None`: this source cannot take snapshots (the
    /// default). Nothing is read until [`ChunkReader::read_table`].
    fn chunk_reader(&self) -> Result<Option<Arc<dyn ChunkReader>>, BoxError> {
        Ok(None)
    }

    /// The columns of `tables` as the upstream catalog has them (an empty list: no
    /// such table), for `check` to hold `[[redact]]` rules to; `None`: this source
    /// cannot tell (the default), or could not be asked.
    fn columns<'a>(
        &'a self,
        tables: &'a [(String, String)],
    ) -> BoxFuture<'a, Option<Vec<TableColumns>>> {
        let _ = tables;
        Box::pin(async { None })
    }
}

/// A table (`(schema, table)`) and its columns' names, as [`SourcePlug::columns`]
/// answers them.
pub type TableColumns = ((String, String), Vec<String>);

/// What [`SourcePlug::discovery`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The pattern entries, as written.
    pub patterns: Vec<String>,
    /// How often to read the catalog for tables they select.
    pub every: Duration,
}

/// The outcome of [`SourcePlug::lead`].
pub enum Lease {
    /// This source needs no arbiter: every process may run.
    Unneeded,
    /// This process is the active one until the future resolves (the lease is lost —
    /// e.g. the session holding it ended — with why); keep the future alive to keep
    /// the lease.
    Granted(BoxFuture<'static, BoxError>),
    /// Another process is active: who, as far as the upstream can tell.
    Held(String),
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lease::Unneeded => f.write_str("Unneeded"),
            Lease::Granted(_) => f.write_str("Granted"),
            Lease::Held(who) => f.debug_tuple("Held").field(who).finish(),
        }
    }
}

/// What a view relies on from its source beyond the rows themselves, for [`gaps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reliance<'a> {
    /// The view's name.
    pub view: &'a str,
    /// How often its reconcile sweep runs, if it has one: the sweep covers every gap in
    /// the source's guarantees, once per period.
    pub sweep: Option<Duration>,
}

/// What `check` says about one view and its source: each guarantee the view relies on
/// that the source (`kind`, `caps`) cannot give, and what covers the gap — a warning when
/// the reconcile sweep covers it (the view is then stale for up to a sweep period), an
/// error when nothing does and the view can keep wrong rows for ever. One `ok` finding
/// when nothing is missing.
///
/// ```
/// use std::time::Duration;
/// use freshen::Capabilities;
/// use freshen::plug::{Level, Reliance, gaps};
///
/// let found = gaps("kafka", &Capabilities::NONE, &Reliance { view: "totals", sweep: None });
/// assert!(found.iter().any(|f| f.level == Level::Error && f.message.contains("deletes")));
/// let swept = Reliance { view: "totals", sweep: Some(Duration::from_secs(600)) };
/// assert!(gaps("kafka", &Capabilities::NONE, &swept).iter().all(|f| f.level != Level::Error));
/// ```
pub fn gaps(kind: &str, caps: &Capabilities, view: &Reliance<'_>) -> Vec<Finding> {
    let subject = format!("view {}", view.view);
    let mut out = Vec::new();
    let mut gap = |missing: bool, what: &str, harm: &str| {
        if !missing {
            return;
        }
        out.push(match view.sweep {
            Some(every) => Finding::warning(
                "contract",
                &subject,
                format!(
                    "{what} not given by a {kind} source: the reconcile sweep (every {}) heals it, so {harm} for up to that long",
                    span(every)
                ),
            ),
            None => Finding::error(
                "contract",
                &subject,
                format!(
                    "{what} not given by a {kind} source and the view has no reconcile sweep: {harm} until the key changes again; add `reconcile = {{ every = \"10m\", keys = \"…\" }}`"
                ),
            ),
        });
    };
    gap(!caps.deletes, "deletes are", "a deleted row stays counted");
    gap(
        !caps.recoverable,
        "a replay after a restart is",
        "changes in flight at a crash are lost",
    );
    gap(
        !caps.truncates,
        "TRUNCATE is",
        "a truncated table's rows stay in the view",
    );
    // A gap asks for a sweep at once, as a TRUNCATE does: with a sweep nothing is
    // missing; without one it is the same hole as an unhealed TRUNCATE (a warning).
    if caps.row_gaps && view.sweep.is_none() {
        out.push(Finding::warning(
            "contract",
            &subject,
            format!(
                "some changes reach a {kind} source without their rows (large messages sent key-only, statements instead of rows, dropped partitions) and the view has no reconcile sweep: their scopes stay stale until the keys change again; add `reconcile = {{ every = \"10m\", keys = \"…\" }}` (each such change then sweeps at once)"
            ),
        ));
    }
    // Late commits past the lookback are a loss no log records: only a sweep heals it.
    if caps.lookback_only {
        out.push(Finding::warning(
            "contract",
            &subject,
            match view.sweep {
                Some(every) => format!(
                    "late commits: a {kind} source finds a row committed late with an earlier cursor value only within `lookback` of the poll that read past that value (the server reports no transaction horizon); a longer transaction's row waits for the reconcile sweep (every {}) or its next change; set lookback above your longest write transaction",
                    span(every)
                ),
                None => format!(
                    "late commits: a {kind} source finds a row committed late with an earlier cursor value only within `lookback` of the poll that read past that value (the server reports no transaction horizon); a longer transaction's row is missed until it changes again (nothing sweeps this view); set lookback above your longest write transaction and add a reconcile sweep"
                ),
            },
        ));
    }
    // A row that moves to another key dirties the key it left only with its former
    // row; without one the old key keeps the row. Per-table images are the source's own
    // check (it names the tables).
    let moves = caps.before_image == BeforeImage::None;
    if moves {
        out.push(match view.sweep {
            Some(every) => Finding::warning(
                "contract",
                &subject,
                format!(
                    "the former row of an update is not given by a {kind} source: a row whose key columns change leaves its old key stale until the reconcile sweep (every {})",
                    span(every)
                ),
            ),
            None => Finding::warning(
                "contract",
                &subject,
                format!(
                    "the former row of an update is not given by a {kind} source: if the key columns ever change, the old key keeps the row (nothing sweeps this view); add a reconcile sweep unless they never change"
                ),
            ),
        });
    }
    if out.is_empty() {
        let mut given = vec!["deletes", "truncates", "replay after a restart"];
        if caps.before_image != BeforeImage::None {
            given.push("former rows");
        }
        out.push(Finding::ok(
            "contract",
            subject,
            format!("{kind} gives what the view relies on: {}", given.join(", ")),
        ));
    }
    out
}

/// A period as a configuration writes it: `10m`, `1h30m`, `500ms`.
fn span(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels(caps: &Capabilities, sweep: Option<Duration>) -> Vec<Level> {
        gaps("x", caps, &Reliance { view: "v", sweep })
            .iter()
            .map(|f| f.level)
            .collect()
    }

    #[test]
    fn periods_read_as_written() {
        assert_eq!(span(Duration::from_secs(600)), "10m");
        assert_eq!(span(Duration::from_secs(5400)), "1h30m");
        assert_eq!(span(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn a_sweep_turns_every_gap_into_a_warning() {
        let none = Capabilities::NONE;
        assert_eq!(
            levels(&none, None),
            [Level::Error, Level::Error, Level::Error, Level::Warning]
        );
        assert_eq!(
            levels(&none, Some(Duration::from_secs(60))),
            [Level::Warning; 4]
        );
    }

    #[test]
    fn a_cursor_without_a_horizon_says_what_lookback_covers() {
        let polled = Capabilities {
            recoverable: true,
            cursor: true,
            lookback_only: true,
            ..Capabilities::NONE
        };
        let found = gaps(
            "mysql-incremental",
            &polled,
            &Reliance {
                view: "v",
                sweep: Some(Duration::from_secs(600)),
            },
        );
        let late: Vec<&Finding> = found
            .iter()
            .filter(|f| f.message.starts_with("late commits"))
            .collect();
        assert_eq!(late.len(), 1, "{found:?}");
        assert_eq!(late[0].level, Level::Warning);
        assert!(
            late[0].message.contains("within `lookback`") && late[0].message.contains("every 10m")
        );
        let horizon = Capabilities {
            lookback_only: false,
            ..polled
        };
        let found = gaps(
            "postgres-incremental",
            &horizon,
            &Reliance {
                view: "v",
                sweep: None,
            },
        );
        assert!(
            !found.iter().any(|f| f.message.starts_with("late commits")),
            "{found:?}"
        );
    }

    #[test]
    fn a_source_that_can_lose_rows_needs_a_sweep() {
        let lossy = Capabilities {
            before_image: BeforeImage::Full,
            deletes: true,
            truncates: true,
            recoverable: true,
            row_gaps: true,
            ..Capabilities::NONE
        };
        assert_eq!(levels(&lossy, None), [Level::Warning]);
        assert_eq!(
            levels(&lossy, Some(Duration::from_secs(60))),
            [Level::Ok],
            "each gap sweeps at once"
        );
        let f = gaps(
            "kafka",
            &lossy,
            &Reliance {
                view: "v",
                sweep: None,
            },
        );
        assert!(
            f[0].message.contains("without their rows"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn a_complete_source_is_one_ok() {
        let all = Capabilities {
            before_image: BeforeImage::KeyOnly,
            deletes: true,
            truncates: true,
            recoverable: true,
            ..Capabilities::NONE
        };
        let found = gaps(
            "postgres",
            &all,
            &Reliance {
                view: "v",
                sweep: None,
            },
        );
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].level, Level::Ok);
        assert!(found[0].message.contains("former rows"));
        let temporary = Capabilities {
            recoverable: false,
            ..all
        };
        let found = gaps(
            "postgres",
            &temporary,
            &Reliance {
                view: "v",
                sweep: None,
            },
        );
        assert_eq!(found.len(), 1);
        assert!(found[0].message.contains("restart"), "{found:?}");
    }
}
