//! What a refresher tells a person ([`Report`]) and why it stops ([`RunError`],
//! [`BuildError`]).

use std::fmt;
use std::time::Duration;

use crate::{BoxError, Gap, Key, Retry, SchemaChange, SourceError, WholeDone, WholeWay};

/// Something a refresher wants a person to know; passed to
/// [`Builder::on_error`](crate::Builder::on_error). The run goes on after every report.
#[derive(Debug)]
#[non_exhaustive]
pub enum Report<'a> {
    /// A rebuild failed; the key is retried after `retry_in`.
    RebuildFailed {
        /// The key.
        key: &'a Key,
        /// Consecutive failures so far, of any kind.
        failures: u32,
        /// Delay before the retry.
        retry_in: Duration,
        /// Whose fault it was: only [`Retry::Key`] counts toward quarantine.
        retry: Retry,
        /// What went wrong.
        error: &'a BoxError,
    },
    /// Rebuilds started failing for a reason that is not the key's (an outage, a
    /// timeout, missing privileges): the view probes with one rebuild at a time and
    /// quarantines nothing until a rebuild succeeds again. Reported once per stall.
    Stalled {
        /// [`Retry::Path`] (it may heal by itself) or [`Retry::Fix`] (a person must act).
        retry: Retry,
        /// What went wrong.
        error: &'a BoxError,
    },
    /// A rebuild succeeded after a stall.
    Recovered {
        /// How long rebuilds failed.
        stalled_for: Duration,
    },
    /// A key failed `poison_after` times in a row by its own fault and is quarantined
    /// until a new change to it or a reconcile sweep. Reported once per quarantine.
    Poisoned {
        /// The key.
        key: &'a Key,
        /// Consecutive failures.
        failures: u32,
        /// Whether the transactions that dirtied the key stay unacknowledged (a view
        /// without a reconcile sweep: nothing else would heal it) or were released.
        holding: bool,
        /// The last error.
        error: &'a BoxError,
    },
    /// A quarantined key was rebuilt (a change to it gave it a fresh attempt).
    Revived {
        /// The key.
        key: &'a Key,
    },
    /// A quarantined key held acknowledgements longer than
    /// [`Builder::release_quarantined_after`](crate::Builder::release_quarantined_after):
    /// its transactions are released unrebuilt, and the derived rows of the key may be
    /// stale until a later change rebuilds it.
    QuarantineReleased {
        /// The key.
        key: &'a Key,
        /// How long it held them.
        after: Duration,
    },
    /// The source lost its way to the data ([`Retry::Path`]: an outage) and goes on
    /// retrying by itself; the refresher reads on, and nothing it holds is dropped.
    SourceFailed {
        /// What went wrong.
        error: &'a SourceError,
    },
    /// The source could not decode a message; it was skipped.
    Skipped {
        /// Why.
        error: &'a BoxError,
    },
    /// A reconcile sweep could not list keys; it is retried after `retry_in`.
    ReconcileFailed {
        /// What went wrong.
        error: &'a BoxError,
        /// Delay before the retry.
        retry_in: Duration,
    },
    /// A table was truncated but no reconcile sweep is configured, so the scopes it
    /// emptied cannot be found and rebuilt.
    TruncateIgnored {
        /// Schema of the table.
        schema: &'a str,
        /// The table.
        table: &'a str,
    },
    /// Rows of a table the view watches changed in a way the stream does not carry (a
    /// key-only message, a statement, a partition truncated): a sweep was asked for, or,
    /// without a reconcile sweep, nothing can find the keys it dirtied. Reported once
    /// per table until the next sweep ends.
    Gap {
        /// The table and what the stream left out.
        gap: &'a Gap,
        /// Whether a sweep will heal it (false: no reconcile sweep is configured).
        swept: bool,
    },
    /// A schema change broke the key of this view (a key column dropped or retyped, the
    /// table renamed or dropped): no rebuild runs until a later change undoes it or the
    /// process restarts with a fixed configuration. Changes keep their keys dirty and,
    /// after rebuild acknowledgement, their transactions unconfirmed: nothing is lost.
    /// (A source that ends meanwhile leaves [`Refresher::run`](crate::Refresher::run)
    /// waiting for its shutdown signal: the keys it holds cannot be rebuilt.)
    Paused {
        /// The change.
        change: &'a SchemaChange,
        /// The differences that break this view.
        breaking: &'a [String],
    },
    /// A change undid what paused the view on a table; rebuilds go on (and a sweep, when
    /// configured, finds the keys of changes that arrived without their key columns).
    Resumed {
        /// The change that undid it.
        change: &'a SchemaChange,
        /// Whether the view is still paused by another table.
        still_paused: bool,
    },
    /// A watched table's shape changed in a way that does not break this view (a column
    /// added, a column it does not key on dropped). Not a problem: a line for the operator.
    SchemaChanged {
        /// The change.
        change: &'a SchemaChange,
    },
    /// A recompute of the whole derived table started: its first build (the table was
    /// empty at start), or a backlog or fan-out past the share of the table above which
    /// the whole table is cheaper than its keys. A lifecycle line.
    WholeStarted {
        /// Why: `build`, `backlog` or `fan-out`.
        reason: &'static str,
        /// How it writes the table.
        way: WholeWay,
        /// Waiting keys it covers.
        keys: usize,
    },
    /// A whole-table run committed. A lifecycle line.
    WholeDone {
        /// Why it ran.
        reason: &'static str,
        /// How it wrote the table.
        way: WholeWay,
        /// What it did.
        done: WholeDone,
        /// How long it took.
        took: Duration,
    },
    /// A whole-table run failed: by the path it is tried again after a backoff; by a
    /// key's data its keys are retried in halves (the failing key is found and
    /// quarantined), and a failed first build leaves the table to the keys that change.
    WholeFailed {
        /// Why it ran.
        reason: &'static str,
        /// Whose fault it was.
        retry: Retry,
        /// What went wrong.
        error: &'a BoxError,
    },
    /// A reconcile sweep started listing keys (at start, on its interval, after a
    /// TRUNCATE, or on request). A lifecycle line.
    SweepStarted,
    /// A long sweep's progress: keys listed so far (reported every
    /// [`SWEEP_PROGRESS_EVERY`](crate::SWEEP_PROGRESS_EVERY) keys).
    SweepProgress {
        /// Keys listed so far.
        keys: u64,
        /// Since the sweep started.
        took: Duration,
    },
    /// A reconcile sweep listed every key (each joins the normal pipeline: its rebuilds
    /// follow). Not a problem: a lifecycle line for the operator.
    Swept {
        /// Keys listed.
        keys: u64,
        /// How long listing took.
        took: Duration,
    },
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::RebuildFailed {
                key,
                failures,
                retry_in,
                retry,
                error,
            } => {
                let whose = match retry {
                    Retry::Key => "",
                    Retry::Path => " (not the key's fault: never quarantined)",
                    Retry::Fix => " (needs a fix: never quarantined)",
                };
                write!(
                    f,
                    "rebuild of key {} failed ({failures} in a row){whose}, retrying in {retry_in:?}: {error}",
                    key.quoted()
                )
            }
            Report::Stalled { retry, error } => {
                let what = match retry {
                    Retry::Fix => "rebuilds fail until something is fixed",
                    _ => "rebuilds cannot reach the database",
                };
                write!(
                    f,
                    "{what}; retrying one at a time, no key is quarantined meanwhile: {error}"
                )
            }
            Report::Recovered { stalled_for } => {
                write!(f, "rebuilds work again after {stalled_for:?}")
            }
            Report::Poisoned {
                key,
                failures,
                holding,
                error,
            } => {
                let then = if *holding {
                    "its transactions stay unconfirmed until it rebuilds (no reconcile sweep would heal it); the next change to it is retried"
                } else {
                    "a reconcile sweep or the next change to it re-admits it"
                };
                write!(
                    f,
                    "key {} quarantined after {failures} failed rebuilds; {then}: {error}",
                    key.quoted()
                )
            }
            Report::Revived { key } => {
                write!(f, "quarantined key {} rebuilt again", key.quoted())
            }
            Report::QuarantineReleased { key, after } => write!(
                f,
                "quarantined key {} held its transactions for {after:?}: released unrebuilt, its derived rows may be stale until it changes again",
                key.quoted()
            ),
            Report::SourceFailed { error } => write!(
                f,
                "the source cannot reach its data and keeps retrying; rebuilds go on: {error}"
            ),
            Report::Skipped { error } => write!(f, "skipped an undecodable message: {error}"),
            Report::WholeStarted { reason, way, keys } => match (*reason, way) {
                ("build", _) => write!(
                    f,
                    "first build: the derived table was empty, it is built from its query in one statement"
                ),
                _ => write!(
                    f,
                    "recomputing the whole derived table ({}, for a {reason} covering {keys} waiting keys): cheaper than the keys one set at a time",
                    way.name()
                ),
            },
            Report::WholeDone {
                reason,
                way,
                done,
                took,
            } => {
                if *reason == "build" && !done.built {
                    write!(
                        f,
                        "first build not needed: the derived table already holds about {} rows",
                        done.rows
                    )
                } else if *reason == "build" {
                    write!(f, "first build done in {took:?}: {} rows", done.rows)
                } else {
                    write!(
                        f,
                        "whole derived table recomputed ({reason}, {}) in {took:?}: {} rows, {} written",
                        way.name(),
                        done.rows,
                        done.written
                    )
                }
            }
            Report::WholeFailed {
                reason,
                retry,
                error,
            } => {
                let then = match (*reason, retry) {
                    (_, Retry::Path | Retry::Fix) => "tried again after a backoff",
                    ("build", Retry::Key) => {
                        "the table holds only the keys rebuilt since; fix the data and restart to build it"
                    }
                    (_, Retry::Key) => {
                        "its keys are rebuilt in halves instead, so that only the failing key is quarantined"
                    }
                };
                write!(f, "whole-table run ({reason}) failed, {then}: {error}")
            }
            Report::ReconcileFailed { error, retry_in } => {
                write!(
                    f,
                    "reconcile sweep failed, retrying in {retry_in:?}: {error}"
                )
            }
            Report::SweepStarted => f.write_str("reconcile sweep started"),
            Report::SweepProgress { keys, took } => write!(
                f,
                "reconcile sweep listed {keys} key(s) so far, in {:.1}s",
                took.as_secs_f64()
            ),
            Report::Swept { keys, took } => write!(
                f,
                "reconcile sweep listed {keys} key(s) in {:.1}s",
                took.as_secs_f64()
            ),
            Report::Gap { gap, swept } => {
                let table = if gap.table.is_empty() {
                    "an unknown table".to_string()
                } else {
                    format!("{}.{}", gap.schema, gap.table)
                };
                let then = if *swept {
                    "a reconcile sweep finds its keys"
                } else {
                    "no reconcile sweep is configured, so its derived rows may be stale"
                };
                write!(
                    f,
                    "rows of {table} changed that the stream did not carry ({}); {then}",
                    gap.reason
                )
            }
            Report::Paused { change, breaking } => write!(
                f,
                "paused: {}.{}: {} breaks the view's key; no rebuild runs until it is undone (or a restart with a fixed configuration), changes stay dirty and unconfirmed",
                change.schema,
                change.table,
                breaking.join(", ")
            ),
            Report::Resumed {
                change,
                still_paused,
            } => {
                let then = if *still_paused {
                    "still paused by another table"
                } else {
                    "rebuilds go on"
                };
                write!(f, "resumed: {change}; {then}")
            }
            Report::SchemaChanged { change } => {
                write!(f, "schema change (the view's key is intact): {change}")
            }
            Report::TruncateIgnored { schema, table } => write!(
                f,
                "{schema}.{table} was truncated but no reconcile sweep is configured: its derived rows may be stale"
            ),
        }
    }
}

/// Why [`Refresher::run`](crate::Refresher::run) stopped with an error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunError {
    /// The source failed for good.
    Source(SourceError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Source(_) => f.write_str("the source failed"),
        }
    }
}

impl std::error::Error for RunError {
    /// The source's own error (downcast it to the adapter's error type).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Source(e) => Some(e.inner()),
        }
    }
}

/// Every problem [`Builder::build`](crate::Builder::build) found, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    pub(crate) problems: Vec<String>,
}

impl BuildError {
    /// Each problem, one sentence apiece.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid refresher configuration:")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BuildError {}
