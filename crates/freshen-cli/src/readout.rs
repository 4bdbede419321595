//! What a running pipeline shows of itself, in one place: the [`Readout`] every
//! reader of it uses (the HTTP endpoints, `/admin`, the demo, the benchmarks), what a
//! process is now ([`Activity`]), what a reload did ([`Change`], [`Refused`]), and the
//! `/status` document ([`Status`]) with its health verdict ([`problems`]). The pipeline,
//! the standby process and the HTTP endpoints all use it; it uses none of them.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::metrics::{Redacted, SinkStatus, SourceStatus, ViewStats};

/// What this process is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// Connecting, not yet known.
    Starting,
    /// Waiting for the active process (named) to go away.
    Standby(String),
    /// Running the pipeline.
    Active,
}

impl Activity {
    /// `starting`, `standby` or `active`.
    pub fn name(&self) -> &'static str {
        match self {
            Activity::Starting => "starting",
            Activity::Standby(_) => "standby",
            Activity::Active => "active",
        }
    }
}

/// What a reload changes, by view name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Views only in the new file.
    pub added: Vec<String>,
    /// Views only in the old file.
    pub removed: Vec<String>,
    /// Views in both, configured differently (or under a different `[target]`).
    pub changed: Vec<String>,
    /// Views in both, the same.
    pub unchanged: Vec<String>,
}

impl Change {
    /// Whether the pipeline needs restarting at all.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        write!(
            f,
            "added: {}; removed: {}; changed: {}; unchanged: {}",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            list(&self.unchanged)
        )
    }
}

/// Why a reload was refused; the running configuration goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A sink's snapshot progress, as `/status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SinkSnapshotStatus {
    /// The sink's index in `[[sinks]]`.
    pub sink: usize,
    /// Its identity in the progress table.
    pub id: String,
    /// Each table's progress.
    pub tables: Vec<freshen_codec::SnapshotProgress>,
}

/// The snapshots of one sink, for `/admin` to ask for tables.
pub type SinkSnapshots = Arc<dyn freshen::plug::SinkSnapshots>;

/// What the endpoints read: the views' stats and the source's health.
pub trait Readout: Send + Sync + 'static {
    /// Every view's stats, in configuration order.
    fn views(&self) -> Vec<ViewStats>;
    /// The source's health.
    fn source(&self) -> SourceStatus;
    /// The changefeed's snapshot progress, table by table (none without a changefeed).
    fn snapshots(&self) -> Vec<freshen_changefeed::SnapshotProgress> {
        Vec::new()
    }
    /// Each sink's snapshot progress (none without sink snapshots).
    fn sink_snapshots(&self) -> Vec<SinkSnapshotStatus> {
        Vec::new()
    }
    /// Each sink's deliveries (none without sinks that report them). No default: a
    /// wrapper that forgot to forward it would hide every sink from `/metrics`.
    fn sinks(&self) -> Vec<SinkStatus>;
    /// What each `[[redact]]` rule redacted so far (none without rules). No default,
    /// for the same reason.
    fn redactions(&self) -> Vec<Redacted>;
    /// The snapshots of sink `index` (`[[sinks]]` order), for `/admin`.
    fn sink(&self, index: usize) -> Option<SinkSnapshots> {
        let _ = index;
        None
    }
    /// The view named `view`, for `/admin` (none: no such view).
    fn view(&self, view: &str) -> Option<AdminView> {
        let _ = view;
        None
    }
    /// The handle of the view named `view`, for `/admin` (none: no such view).
    fn handle(&self, view: &str) -> Option<freshen::Handle> {
        self.view(view).map(|v| v.handle)
    }
    /// Re-reads the configuration file (`POST /admin/reload`); `None`: not supported.
    fn reload(&self) -> Option<Result<Change, Refused>> {
        None
    }
    /// Whether this process is the active one (see `standby.rs`).
    fn activity(&self) -> Activity {
        Activity::Active
    }
}

/// A running view as `/admin` acts on it.
#[derive(Debug, Clone)]
pub struct AdminView {
    /// Its refresher's handle.
    pub handle: freshen::Handle,
    /// Its scope: how its keys are shown.
    pub scope: Arc<crate::scope::ViewScope>,
    /// Where its unhealed gaps are kept (a view without a reconcile sweep).
    pub gaps: Option<Arc<crate::gap_keeping::GapKeeper>>,
}

/// The `/status` document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// freshen's version.
    pub version: String,
    /// `active`, `standby` (another process on this configuration is active) or
    /// `starting`.
    #[serde(default = "active")]
    pub role: String,
    /// The active process a standby waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_for: Option<String>,
    /// The source.
    pub source: SourceStatus,
    /// Each view.
    pub views: Vec<ViewStatus>,
    /// The changefeed's snapshots, table by table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<freshen_changefeed::SnapshotProgress>,
    /// Each sink's snapshots, table by table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sink_snapshots: Vec<SinkSnapshotStatus>,
}

fn active() -> String {
    "active".into()
}

/// One view in `/status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ViewStatus {
    /// View name.
    pub name: String,
    /// Row events of the tables this view watches.
    pub events: u64,
    /// Messages skipped.
    pub skipped: u64,
    /// Keys marked.
    pub keys_marked: u64,
    /// Changes that carried no value for the key columns (see docs/views.md on replica identity).
    pub unscoped: u64,
    /// Successful key rebuilds.
    pub rebuilds_ok: u64,
    /// Of those, keys no change made due (listed by a sweep, or asked for): not in the
    /// freshness figures; rebuilds per change is `(rebuilds_ok - sweep_rebuilds) / events`.
    #[serde(default)]
    pub sweep_rebuilds: u64,
    /// Failed key rebuilds.
    pub rebuilds_failed: u64,
    /// Reconcile sweeps completed.
    pub reconciles: u64,
    /// Dirty keys now.
    pub dirty: u64,
    /// Quarantined keys now.
    pub poisoned: u64,
    /// Rebuilds running now.
    pub in_flight: u64,
    /// Seconds the longest-running rebuild call has run (`None`: none runs).
    #[serde(default)]
    pub oldest_in_flight_s: Option<f64>,
    /// Seconds the reconcile sweep now listing keys has run (`None`: none is).
    #[serde(default)]
    pub sweep_for_s: Option<f64>,
    /// Keys that sweep has listed so far.
    #[serde(default)]
    pub sweep_listed: u64,
    /// Unacknowledged batches.
    pub unacked_batches: u64,
    /// Freshness-lag median, milliseconds.
    pub freshness_p50_ms: Option<f64>,
    /// Freshness-lag 99th percentile, milliseconds.
    pub freshness_p99_ms: Option<f64>,
    /// Freshness-lag median over the last minute, milliseconds (`None`: nothing rebuilt
    /// in it). Lifetime figures are dominated by the start-up sweep; these move with
    /// live changes.
    #[serde(default)]
    pub recent_p50_ms: Option<f64>,
    /// Freshness-lag 99th percentile over the last minute, milliseconds.
    #[serde(default)]
    pub recent_p99_ms: Option<f64>,
    /// Seconds since the last rebuild.
    pub last_rebuild_age_s: Option<f64>,
    /// Seconds the longest-waiting change has waited for its rebuild (`None`: nothing
    /// waits).
    #[serde(default)]
    pub oldest_waiting_s: Option<f64>,
    /// Failed rebuilds that were not the key's fault (outages, timeouts).
    #[serde(default)]
    pub path_failures: u64,
    /// Seconds since rebuilds started failing for a reason that is not the key's.
    #[serde(default)]
    pub stalled_for_s: Option<f64>,
    /// The stall's last error.
    #[serde(default)]
    pub stall_error: Option<String>,
    /// The last rebuild failure of any kind.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Quarantined keys holding their transactions unconfirmed.
    #[serde(default)]
    pub poisoned_holding: u64,
    /// Quarantined keys whose transactions were confirmed without a rebuild.
    #[serde(default)]
    pub quarantine_releases: u64,
    /// The quarantined keys (the first few).
    #[serde(default)]
    pub quarantined: Vec<QuarantinedKey>,
    /// Why the view is paused: one line per table whose schema change broke its key
    /// (`public.readings: column device dropped`); empty while it runs.
    #[serde(default)]
    pub paused: Vec<String>,
    /// Gaps no sweep heals (the view has no reconcile): one line per table, until a
    /// person acknowledges them (`POST /admin/views/{view}/gaps/acknowledge`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealed_gaps: Vec<String>,
    /// Schema changes of the tables the view watches.
    #[serde(default)]
    pub schema_changes: u64,
    /// Changes that arrived without their rows (each answered by a sweep).
    #[serde(default)]
    pub gaps: u64,
    /// Which ways keys were rebuilt: per-key batches, set calls, whole-table runs; and
    /// the threshold between sets and the whole table.
    #[serde(default)]
    pub paths: PathStatus,
}

/// How a view's keys were rebuilt, in `/status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PathStatus {
    /// Calls of the rebuild's batch (a trickle).
    pub per_key_calls: u64,
    /// Calls grown to work through a backlog as sets.
    pub set_calls: u64,
    /// Keys rebuilt by set calls.
    pub set_keys: u64,
    /// Whole-table runs that finished (first builds included).
    pub whole_runs: u64,
    /// Whole-table runs that failed.
    pub whole_failures: u64,
    /// Keys whole-table runs covered.
    pub whole_keys: u64,
    /// Rows whole-table runs inserted, updated or deleted.
    pub whole_written: u64,
    /// Waiting keys at or above which the backlog goes to the whole table (`None`:
    /// never — a query with `$1`, a hand-written rebuild, `rebuild_by = "per-key"` — or
    /// not known yet).
    pub whole_threshold: Option<u64>,
    /// Rows the derived table holds, last known.
    pub table_rows: Option<u64>,
    /// Keys per second of set work, and rows per second of whole-table runs, as the
    /// choice now assumes (measured, or the priors until measured).
    pub rates: (f64, f64),
    /// The whole-table run running now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<WholeRunStatus>,
    /// Why the first build of the (empty) table failed: it holds only the keys rebuilt
    /// since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_failed: Option<String>,
}

/// A whole-table run in progress, in `/status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WholeRunStatus {
    /// Why: `build`, `backlog`, `fan-out`.
    pub reason: String,
    /// How: `build`, `replace`, `diff`.
    pub way: String,
    /// Seconds it has run.
    pub for_s: f64,
    /// Keys it covers.
    pub keys: u64,
}

impl From<&freshen::Stats> for PathStatus {
    fn from(s: &freshen::Stats) -> PathStatus {
        PathStatus {
            per_key_calls: s.rebuild_calls.saturating_sub(s.set_calls),
            set_calls: s.set_calls,
            set_keys: s.set_keys,
            whole_runs: s.whole_runs,
            whole_failures: s.whole_failures,
            whole_keys: s.whole_keys,
            whole_written: s.whole_written,
            whole_threshold: s.whole_threshold,
            table_rows: s.table_rows,
            rates: s.rates,
            running: s.whole_running.as_ref().map(|r| WholeRunStatus {
                reason: r.reason.to_owned(),
                way: r.way.to_owned(),
                for_s: age(Some(r.since)).unwrap_or(0.0),
                keys: r.keys,
            }),
            build_failed: s.build_failed.as_deref().map(freshen::redact_text),
        }
    }
}

/// A quarantined key in `/status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuarantinedKey {
    /// The key as text (composite keys as `(a, b)`).
    pub key: String,
    /// Seconds since it was quarantined.
    pub since_s: f64,
    /// The last error.
    pub error: String,
    /// Whether it holds its transactions unconfirmed.
    pub holding: bool,
}

/// Seconds since `t`.
fn age(t: Option<SystemTime>) -> Option<f64> {
    t.and_then(|t| SystemTime::now().duration_since(t).ok())
        .map(|d| d.as_secs_f64())
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1000.0)
}

impl From<&ViewStats> for ViewStatus {
    fn from(v: &ViewStats) -> Self {
        let s = &v.stats;
        ViewStatus {
            name: v.name.clone(),
            events: v.events,
            skipped: s.events_skipped,
            keys_marked: s.keys_marked,
            unscoped: v.unscoped,
            rebuilds_ok: s.rebuilds_ok,
            sweep_rebuilds: s.sweep_rebuilds,
            rebuilds_failed: s.rebuilds_failed,
            reconciles: s.reconciles,
            dirty: s.dirty,
            poisoned: s.poisoned,
            in_flight: s.in_flight,
            oldest_in_flight_s: age(s.oldest_in_flight),
            sweep_for_s: age(s.sweep_since),
            sweep_listed: s.sweep_listed,
            unacked_batches: s.unacked_batches,
            freshness_p50_ms: ms(s.freshness.p50()),
            freshness_p99_ms: ms(s.freshness.p99()),
            recent_p50_ms: ms(v.recent.as_ref().and_then(|h| h.p50())),
            recent_p99_ms: ms(v.recent.as_ref().and_then(|h| h.p99())),
            last_rebuild_age_s: age(s.last_rebuild),
            oldest_waiting_s: age(s.oldest_waiting),
            path_failures: s.path_failures,
            stalled_for_s: age(s.stalled_since),
            stall_error: s.stall.as_ref().map(|(_, e)| freshen::redact_text(e)),
            last_error: s.last_error.as_deref().map(freshen::redact_text),
            poisoned_holding: s.poisoned_holding,
            quarantine_releases: s.quarantine_releases,
            quarantined: v
                .quarantined
                .iter()
                .map(|q| QuarantinedKey {
                    key: q.key.to_string(),
                    since_s: age(Some(q.since)).unwrap_or(0.0),
                    error: freshen::redact_text(&q.error),
                    holding: q.holding,
                })
                .collect(),
            paused: s.paused.clone(),
            unhealed_gaps: s.unhealed_gaps.clone(),
            schema_changes: s.schema_changes,
            gaps: s.gaps,
            paths: PathStatus::from(s),
        }
    }
}

/// The current status document.
pub fn status(o: &dyn Readout) -> Status {
    let mut source = o.source();
    source.last_error = source.last_error.map(|e| freshen::redact_text(&e));
    let activity = o.activity();
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        role: activity.name().into(),
        standby_for: match activity {
            Activity::Standby(who) => Some(freshen::redact_text(&who)),
            _ => None,
        },
        source,
        views: o.views().iter().map(ViewStatus::from).collect(),
        snapshots: o.snapshots(),
        sink_snapshots: o.sink_snapshots(),
    }
}

/// Why the pipeline is unhealthy, one line each; empty when it is healthy.
pub fn problems(o: &dyn Readout) -> Vec<String> {
    match o.activity() {
        Activity::Active => {}
        Activity::Standby(who) => {
            return vec![freshen::redact_text(&format!(
                "standby: another process is active on this configuration ({who}); this one takes over when it stops"
            ))];
        }
        Activity::Starting => {
            let mut out = vec!["starting: not yet active".to_owned()];
            out.extend(o.source().last_error.map(|e| freshen::redact_text(&e)));
            return out;
        }
    }
    let s = o.source();
    let mut out = Vec::new();
    if !s.streaming {
        out.push(format!(
            "source: {}",
            s.last_error
                .as_deref()
                .unwrap_or("the source is not streaming yet")
        ));
    }
    out.extend(s.problems.iter().map(|p| format!("source: {p}")));
    for v in o.views() {
        out.extend(v.problems());
    }
    // Errors from libraries may quote what they were given: no secrets.
    out.iter().map(|p| freshen::redact_text(p)).collect()
}
