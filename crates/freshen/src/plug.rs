//! How a source kind plugs into a program that picks its source from configuration
//! (the `freshen` binary): one trait, implemented by each source crate's configuration
//! type, so that adding a source touches its crate and one registration line.
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

use std::fmt;
use std::sync::Arc;

use crate::source::{BoxError, BoxFuture, Source, SourceProbe};

/// One table a view watches, and the columns its scope key is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The view's name.
    pub view: String,
    /// Schema (PostgreSQL) or database (MySQL) of the table.
    pub schema: String,
    /// The table.
    pub table: String,
    /// The changed row's columns that make the view's key.
    pub key: Vec<String>,
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

    /// The database the events come from, when the source reads one directly: rebuilds
    /// that run there (the default target) can prove they see the changes that dirtied
    /// their keys. `None` for brokers.
    fn database_url(&self) -> Option<&str> {
        None
    }

    /// What `freshen check` reports about the source: reachable, set up for capture,
    /// privileges, and what the plan relies on that the source cannot give.
    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>>;

    /// Connects and starts capturing what the plan needs (creating what the
    /// configuration allows: a slot, a publication, a position table).
    fn start<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>>;

    /// Removes what the source keeps upstream for this configuration (`freshen drop`:
    /// a slot, a publication freshen created), one line per thing and what became of
    /// it. The default: nothing to remove.
    fn drop_upstream(&self) -> BoxFuture<'_, Result<Vec<String>, BoxError>> {
        let kind = self.kind();
        Box::pin(async move {
            Err(format!("a {kind} source keeps nothing upstream that `drop` could remove").into())
        })
    }
}
