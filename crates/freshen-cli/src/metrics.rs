//! Prometheus exposition of the refreshers' [`Stats`] and the source's health. Every
//! metric name is a constant here; labels are bounded (view names, never keys).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::Stats;
use serde::{Deserialize, Serialize};

/// Names of every exported metric.
pub(crate) mod names {
    /// Row events of the tables a view watches, per view.
    pub(crate) const EVENTS: &str = "freshen_events_total";
    /// Undecodable messages skipped, per view.
    pub(crate) const SKIPPED: &str = "freshen_events_skipped_total";
    /// 1 while this process is the active one on its configuration (0: a standby, or
    /// starting).
    pub(crate) const ACTIVE: &str = "freshen_active";
    /// Keys rebuilt that no change made due (listed by a sweep, or asked for), per view.
    pub(crate) const SWEEP_REBUILDS: &str = "freshen_sweep_rebuilds_total";
    /// Seconds the longest-running rebuild call now running has run, per view.
    pub(crate) const OLDEST_IN_FLIGHT: &str = "freshen_oldest_rebuild_running_seconds";
    /// Seconds the longest-waiting change has waited for its rebuild (0: nothing
    /// waits), per view.
    pub(crate) const OLDEST_WAITING: &str = "freshen_oldest_change_waiting_seconds";
    /// The view's `stale_after` bound in seconds (0: none), per view: an alert compares
    /// [`OLDEST_WAITING`] with it, as `/healthz` does.
    pub(crate) const STALE_AFTER: &str = "freshen_view_stale_after_seconds";
    /// Keys the reconcile sweep now listing has listed so far, per view.
    pub(crate) const SWEEP_LISTED: &str = "freshen_sweep_keys_listed";
    /// Keys marked dirty, per view.
    pub(crate) const KEYS_MARKED: &str = "freshen_keys_marked_total";
    /// Quarantined keys whose held transactions were confirmed without a successful
    /// rebuild (the one exception to after-rebuild acks), per view.
    pub(crate) const QUARANTINE_RELEASES: &str = "freshen_quarantine_releases_total";
    /// Failed rebuilds that were not the key's fault (an outage, a timeout), per view.
    pub(crate) const PATH_FAILURES: &str = "freshen_rebuild_path_failures_total";
    /// Rebuilds abandoned (cancelled) at shutdown, per view.
    pub(crate) const ABANDONED: &str = "freshen_rebuilds_abandoned_total";
    /// 1 while a view's rebuilds fail for a reason that is not the key's, per view.
    pub(crate) const STALLED: &str = "freshen_view_stalled";
    /// Quarantined keys holding their transactions unconfirmed, per view.
    pub(crate) const POISONED_HOLDING: &str = "freshen_poisoned_keys_holding";
    /// Changes of a watched table that carried no value for the view's key columns
    /// (typically a DELETE under the default replica identity), per view.
    pub(crate) const UNSCOPED: &str = "freshen_events_unscoped_total";
    /// 1 while a schema change that broke the view's key pauses it, per view.
    pub(crate) const PAUSED: &str = "freshen_view_paused";
    /// Schema changes of the tables a view watches, per view.
    pub(crate) const SCHEMA_CHANGES: &str = "freshen_schema_changes_total";
    /// Changes that reached a view's table without their rows (key-only messages,
    /// statements, dropped partitions), each answered by a sweep, per view.
    pub(crate) const GAPS: &str = "freshen_gaps_total";
    /// Tables with a gap that no sweep heals (the view has no reconcile), per view:
    /// the view is unhealthy until a person rebuilds and acknowledges.
    pub(crate) const UNHEALED_GAPS: &str = "freshen_view_unhealed_gaps";
    /// Key rebuilds by outcome (`ok`, `failed`), per view.
    pub(crate) const REBUILDS: &str = "freshen_rebuilds_total";
    /// Rebuild round trips, per view.
    pub(crate) const REBUILD_CALLS: &str = "freshen_rebuild_calls_total";
    /// Rebuild calls and whole-table runs by `path` (`per-key`: calls of the
    /// rebuild's batch; `set`: calls grown to work through a backlog; `whole`: the
    /// whole table at once), per view.
    pub(crate) const CALLS_BY_PATH: &str = "freshen_rebuild_path_calls_total";
    /// Keys rebuilt by `path` (as [`CALLS_BY_PATH`]), per view.
    pub(crate) const KEYS_BY_PATH: &str = "freshen_rebuild_path_keys_total";
    /// Whole-table runs by outcome (`ok`, `failed`), per view.
    pub(crate) const WHOLE_RUNS: &str = "freshen_whole_runs_total";
    /// Rows whole-table runs inserted, updated or deleted, per view.
    pub(crate) const WHOLE_WRITTEN: &str = "freshen_whole_rows_written_total";
    /// 1 while a whole-table run (a first build, a backlog past the threshold) runs,
    /// per view.
    pub(crate) const WHOLE_RUNNING: &str = "freshen_whole_running";
    /// Waiting keys at or above which a view's backlog is recomputed as the whole table
    /// (0: never, or not known yet), per view.
    pub(crate) const WHOLE_THRESHOLD: &str = "freshen_whole_threshold_keys";
    /// Rows the derived table holds, last known (0: not known), per view.
    pub(crate) const TABLE_ROWS: &str = "freshen_view_table_rows";
    /// Fan-out calls finished (parent rows mapped to view keys), per view.
    pub(crate) const FANOUT_CALLS: &str = "freshen_fanout_calls_total";
    /// View keys sent by fan-outs, per view.
    pub(crate) const FANOUT_KEYS: &str = "freshen_fanout_keys_total";
    /// Keys quarantined, per view.
    pub(crate) const POISONINGS: &str = "freshen_keys_poisoned_total";
    /// Reconcile sweeps by outcome, per view.
    pub(crate) const RECONCILES: &str = "freshen_reconciles_total";
    /// Keys waiting for a rebuild, per view.
    pub(crate) const DIRTY: &str = "freshen_dirty_keys";
    /// Keys quarantined now, per view.
    pub(crate) const POISONED: &str = "freshen_poisoned_keys";
    /// Rebuilds running now, per view.
    pub(crate) const IN_FLIGHT: &str = "freshen_rebuilds_in_flight";
    /// Batches received and not yet acknowledged, per view.
    pub(crate) const UNACKED: &str = "freshen_unacked_batches";
    /// First change → rebuilt, per view (histogram, seconds).
    pub(crate) const FRESHNESS: &str = "freshen_freshness_lag_seconds";
    /// Unix time of the last batch, per view.
    pub(crate) const LAST_EVENT: &str = "freshen_last_event_timestamp_seconds";
    /// Unix time of the last successful rebuild, per view.
    pub(crate) const LAST_REBUILD: &str = "freshen_last_rebuild_timestamp_seconds";
    /// Times a view's run loop woke up, per view.
    pub(crate) const WAKEUPS: &str = "freshen_loop_wakeups_total";
    /// 1 while the source streams changes.
    pub(crate) const SOURCE_UP: &str = "freshen_source_streaming";
    /// Highest position received from the source (PostgreSQL LSN as a number).
    pub(crate) const SOURCE_RECEIVED: &str = "freshen_source_received_lsn";
    /// Highest position confirmed to the source.
    pub(crate) const SOURCE_CONFIRMED: &str = "freshen_source_confirmed_lsn";
    /// Bytes of WAL the slot retains behind the server's current position.
    pub(crate) const SOURCE_LAG: &str = "freshen_source_lag_bytes";
    /// Age of the oldest change received and not yet confirmed.
    pub(crate) const SOURCE_LAG_SECONDS: &str = "freshen_source_lag_seconds";
    /// Seconds the source has read nothing while the server's position was ahead of it
    /// (0 while it reads): a stalled reader.
    pub(crate) const SOURCE_STALLED: &str = "freshen_source_stalled_seconds";
    /// Reconnects of the source.
    pub(crate) const SOURCE_RECONNECTS: &str = "freshen_source_reconnects_total";
    /// Row events the source delivered.
    pub(crate) const SOURCE_EVENTS: &str = "freshen_source_events_total";
    /// Gauge: partitions of the key stream this worker owns now (key stream workers).
    pub(crate) const KEY_STREAM_PARTITIONS: &str = "freshen_key_stream_partitions_owned";
    /// Records the destination acknowledged (a Kafka broker: every in-sync replica),
    /// per sink.
    pub(crate) const SINK_DELIVERED: &str = "freshen_sink_records_delivered_total";
    /// Records whose delivery failed for good (after the client's own retries, within
    /// `delivery_timeout_ms`): the batch stays unconfirmed and the sink stops, per sink.
    pub(crate) const SINK_FAILURES: &str = "freshen_sink_delivery_failures_total";
    /// Errors the sink's client reported and retried by itself (a broker down, a
    /// connection refused), per sink: an outage shows here before anything fails.
    pub(crate) const SINK_CLIENT_ERRORS: &str = "freshen_sink_client_errors_total";
    /// Rows sent to the dead-letter topic, per sink and `reason` (a fixed set:
    /// `missing_id`, `missing_aggregate_type`, `missing_aggregate_id`,
    /// `missing_payload`, `invalid_payload`).
    pub(crate) const SINK_DEAD_LETTERS: &str = "freshen_sink_dead_letters_total";
    /// Batches handed to the destination and not yet acknowledged by it, per sink.
    pub(crate) const SINK_WAITING: &str = "freshen_sink_batches_waiting";
    /// Seconds the oldest batch waiting for the destination's acknowledgement has
    /// waited (0: none waits), per sink: a stuck relay grows it.
    pub(crate) const SINK_OLDEST_WAITING: &str = "freshen_sink_oldest_waiting_seconds";
    /// Unix time of the last record the destination acknowledged (0: none yet), per
    /// sink.
    pub(crate) const SINK_LAST_DELIVERY: &str = "freshen_sink_last_delivery_timestamp_seconds";
    /// Values a `[[redact]]` rule rewrote or dropped, per `table`, `column` and
    /// `action`: once per row image and per output that published it.
    pub(crate) const REDACTED: &str = "freshen_redacted_values_total";
}

/// Freshness histogram bucket bounds, in seconds.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// What a source says about itself, for `/metrics`, `/healthz` and `/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Source kind (`postgres`).
    pub kind: String,
    /// Whether changes are streaming now.
    pub streaming: bool,
    /// Highest position received.
    pub received_lsn: Option<u64>,
    /// Highest position confirmed upstream.
    pub confirmed_lsn: Option<u64>,
    /// The server's current position.
    pub server_lsn: Option<u64>,
    /// Bytes retained behind the server's position.
    pub lag_bytes: Option<u64>,
    /// Age of the oldest change received and not yet confirmed, in seconds.
    #[serde(default)]
    pub lag_seconds: Option<f64>,
    /// Seconds the source has read nothing while the server's position was ahead of it
    /// (0 while it reads; absent for sources that do not watch for this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_seconds: Option<f64>,
    /// Slot state (`reserved`, `extended`, `unreserved`, `lost`).
    pub slot_status: Option<String>,
    /// Reconnects so far.
    pub reconnects: u64,
    /// Row events delivered.
    pub events: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// What is wrong with the source's setup now (e.g. a watched table dropped from the
    /// publication while running); any entry makes `/healthz` unhealthy.
    #[serde(default)]
    pub problems: Vec<String>,
    /// A key stream worker: the partitions of the key stream it owns now (`None` for
    /// a source that is not split between instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<i32>>,
    /// Tables found while running through a `[source] tables` pattern
    /// (`schema.table`, in the order found).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovered: Vec<String>,
}

/// One view's name and its refresher's stats.
#[derive(Debug, Clone)]
pub struct ViewStats {
    /// View name.
    pub name: String,
    /// Snapshot.
    pub stats: Stats,
    /// Row events of the tables this view watches.
    pub events: u64,
    /// A change waiting longer than this makes the view unhealthy (`stale_after`).
    pub stale_after: Option<std::time::Duration>,
    /// Freshness over the last minute (`pipeline::RECENT`).
    pub recent: Option<freshen::HistogramSnapshot>,
    /// Changes that could not be scoped (`freshen_events_unscoped_total`).
    pub unscoped: u64,
    /// Quarantined keys (the first 20).
    pub quarantined: Vec<freshen::Quarantined>,
}

/// How many quarantined keys a view shows in `/status` and `/healthz`.
pub(crate) const QUARANTINE_SHOWN: usize = 20;

impl ViewStats {
    /// Why this view is unhealthy, if it is: rebuilds stalled by an outage, a change
    /// waiting longer than `stale_after`, or keys quarantined while holding their
    /// transactions unconfirmed.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(bound), Some(since)) = (self.stale_after, self.stats.oldest_waiting) {
            let age = SystemTime::now().duration_since(since).unwrap_or_default();
            if age > bound {
                out.push(format!(
                    "view {}: a change has waited {:.0}s for its rebuild (stale_after is {:.0}s; {} key(s) waiting, {} rebuilding)",
                    self.name,
                    age.as_secs_f64(),
                    bound.as_secs_f64(),
                    self.stats.dirty,
                    self.stats.in_flight
                ));
            }
        }
        if let (Some(since), Some((retry, error))) = (self.stats.stalled_since, &self.stats.stall) {
            let age = SystemTime::now().duration_since(since).unwrap_or_default();
            let what = match retry {
                freshen::Retry::Fix => "rebuilds fail until something is fixed",
                _ => "rebuilds cannot reach the database",
            };
            out.push(format!(
                "view {}: {what} (for {:.0}s; no key is quarantined meanwhile): {error}",
                self.name,
                age.as_secs_f64()
            ));
        }
        for why in &self.stats.paused {
            out.push(format!(
                "view {}: paused by a schema change that broke its key ({why}); no rebuild runs and its changes stay unconfirmed until the change is undone or freshen restarts with a fixed configuration",
                self.name
            ));
        }
        for gap in &self.stats.unhealed_gaps {
            out.push(format!(
                "view {0}: rows changed that the stream did not carry ({gap}) and the view has no reconcile sweep: its derived rows may be stale for good. Rebuild them (POST /admin/views/{0}/rebuild with their keys, or add a reconcile and POST /admin/views/{0}/sweep), then POST /admin/views/{0}/gaps/acknowledge",
                self.name
            ));
        }
        if let Some(error) = &self.stats.build_failed {
            out.push(format!(
                "view {}: the first build of its empty derived table failed by its data, so the table holds only the keys rebuilt since: {error}. Fix the data and restart freshen (the build runs again while the table is empty), or add a reconcile sweep",
                self.name
            ));
        }
        for q in self.quarantined.iter().filter(|q| q.holding) {
            out.push(format!(
                "view {}: key {} is quarantined and holds its transactions unconfirmed (WAL is retained until it rebuilds): {}",
                self.name,
                q.key.quoted(),
                q.error
            ));
        }
        let shown = self.quarantined.iter().filter(|q| q.holding).count() as u64;
        if self.stats.poisoned_holding > shown {
            out.push(format!(
                "view {}: {} more quarantined keys hold their transactions unconfirmed",
                self.name,
                self.stats.poisoned_holding - shown
            ));
        }
        out
    }
}

fn unix(t: Option<SystemTime>) -> f64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {v}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {v}");
        }
    }
}

/// A per-view sample: how to read it from a view's stats.
type Get = fn(&ViewStats) -> f64;

/// Per-view metrics with one sample each: name, type, help, value.
/// Seconds since `t` (0 for none).
fn age_s(t: Option<SystemTime>) -> f64 {
    t.and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

const PER_VIEW: &[(&str, &str, &str, Get)] = &[
    (
        names::EVENTS,
        "counter",
        "Row events of the tables the view watches.",
        |v| v.events as f64,
    ),
    (
        names::SKIPPED,
        "counter",
        "Undecodable messages skipped.",
        |v| v.stats.events_skipped as f64,
    ),
    (names::KEYS_MARKED, "counter", "Keys marked dirty.", |v| {
        v.stats.keys_marked as f64
    }),
    (
        names::QUARANTINE_RELEASES,
        "counter",
        "Quarantined keys whose transactions were confirmed without a rebuild.",
        |v| v.stats.quarantine_releases as f64,
    ),
    (
        names::PATH_FAILURES,
        "counter",
        "Failed rebuilds that were not the key's fault.",
        |v| v.stats.path_failures as f64,
    ),
    (
        names::ABANDONED,
        "counter",
        "Rebuilds abandoned at shutdown.",
        |v| v.stats.abandoned as f64,
    ),
    (
        names::STALLED,
        "gauge",
        "1 while rebuilds fail for a reason that is not the key's.",
        |v| f64::from(u8::from(v.stats.stalled_since.is_some())),
    ),
    (
        names::POISONED_HOLDING,
        "gauge",
        "Quarantined keys holding their transactions unconfirmed.",
        |v| v.stats.poisoned_holding as f64,
    ),
    (
        names::SWEEP_REBUILDS,
        "counter",
        "Keys rebuilt that no change made due (listed by a sweep, or asked for); not in freshness.",
        |v| v.stats.sweep_rebuilds as f64,
    ),
    (
        names::OLDEST_IN_FLIGHT,
        "gauge",
        "Seconds the longest-running rebuild call has run (0: none runs).",
        |v| age_s(v.stats.oldest_in_flight),
    ),
    (
        names::OLDEST_WAITING,
        "gauge",
        "Seconds the longest-waiting change has waited for its rebuild (0: nothing waits).",
        |v| age_s(v.stats.oldest_waiting),
    ),
    (
        names::STALE_AFTER,
        "gauge",
        "The view's stale_after bound in seconds (0: none).",
        |v| v.stale_after.map_or(0.0, |d| d.as_secs_f64()),
    ),
    (
        names::SWEEP_LISTED,
        "gauge",
        "Keys the reconcile sweep now listing has listed so far.",
        |v| v.stats.sweep_listed as f64,
    ),
    (
        names::REBUILD_CALLS,
        "counter",
        "Rebuild round trips.",
        |v| v.stats.rebuild_calls as f64,
    ),
    (
        names::FANOUT_CALLS,
        "counter",
        "Fan-out calls that mapped changed parent rows to view keys.",
        |v| v.stats.fanout_calls as f64,
    ),
    (
        names::WHOLE_WRITTEN,
        "counter",
        "Rows whole-table runs inserted, updated or deleted.",
        |v| v.stats.whole_written as f64,
    ),
    (
        names::WHOLE_RUNNING,
        "gauge",
        "1 while a whole-table run (a first build, a backlog past the threshold) runs.",
        |v| f64::from(u8::from(v.stats.whole_running.is_some())),
    ),
    (
        names::WHOLE_THRESHOLD,
        "gauge",
        "Waiting keys at or above which the backlog is recomputed as the whole table (0: never, or not known yet).",
        |v| v.stats.whole_threshold.unwrap_or(0) as f64,
    ),
    (
        names::TABLE_ROWS,
        "gauge",
        "Rows the derived table holds, last known (0: not known).",
        |v| v.stats.table_rows.unwrap_or(0) as f64,
    ),
    (
        names::FANOUT_KEYS,
        "counter",
        "View keys sent by fan-outs.",
        |v| v.stats.fanout_keys as f64,
    ),
    (
        names::POISONINGS,
        "counter",
        "Keys quarantined after repeated failures.",
        |v| v.stats.keys_poisoned as f64,
    ),
    (
        names::WAKEUPS,
        "counter",
        "Times the run loop woke up.",
        |v| v.stats.wakeups as f64,
    ),
    (
        names::PAUSED,
        "gauge",
        "1 while a schema change that broke the view's key pauses it.",
        |v| f64::from(u8::from(!v.stats.paused.is_empty())),
    ),
    (
        names::SCHEMA_CHANGES,
        "counter",
        "Schema changes of the tables the view watches.",
        |v| v.stats.schema_changes as f64,
    ),
    (
        names::GAPS,
        "counter",
        "Changes that arrived without their rows, each answered by a sweep.",
        |v| v.stats.gaps as f64,
    ),
    (
        names::UNHEALED_GAPS,
        "gauge",
        "Tables whose rows changed that the stream did not carry, in a view without a reconcile sweep to heal it.",
        |v| v.stats.unhealed_gaps.len() as f64,
    ),
    (
        names::UNSCOPED,
        "counter",
        "Changes of a watched table that carried no value for the key columns.",
        |v| v.unscoped as f64,
    ),
    (names::DIRTY, "gauge", "Keys waiting for a rebuild.", |v| {
        v.stats.dirty as f64
    }),
    (names::POISONED, "gauge", "Keys quarantined now.", |v| {
        v.stats.poisoned as f64
    }),
    (names::IN_FLIGHT, "gauge", "Rebuilds running now.", |v| {
        v.stats.in_flight as f64
    }),
    (
        names::UNACKED,
        "gauge",
        "Batches not yet acknowledged to the source.",
        |v| v.stats.unacked_batches as f64,
    ),
    (
        names::LAST_EVENT,
        "gauge",
        "Unix time of the last batch.",
        |v| unix(v.stats.last_event),
    ),
    (
        names::LAST_REBUILD,
        "gauge",
        "Unix time of the last successful rebuild.",
        |v| unix(v.stats.last_rebuild),
    ),
];

/// Per-view counters split by an `outcome` label.
/// An `outcome` label value and how to read its sample.
type Outcomes = [(&'static str, Get); 2];

const BY_OUTCOME: &[(&str, &str, Outcomes)] = &[
    (
        names::REBUILDS,
        "Key rebuilds by outcome.",
        [
            ("ok", |v| v.stats.rebuilds_ok as f64),
            ("failed", |v| v.stats.rebuilds_failed as f64),
        ],
    ),
    (
        names::RECONCILES,
        "Reconcile sweeps by outcome.",
        [
            ("ok", |v| v.stats.reconciles as f64),
            ("failed", |v| v.stats.reconcile_failures as f64),
        ],
    ),
    (
        names::WHOLE_RUNS,
        "Whole-table runs by outcome.",
        [
            ("ok", |v| v.stats.whole_runs as f64),
            ("failed", |v| v.stats.whole_failures as f64),
        ],
    ),
];

/// A `path` label value and how to read its sample.
type Paths = [(&'static str, Get); 3];

/// Which way keys were rebuilt: per-key batches, set calls, the whole table.
const BY_PATH: &[(&str, &str, Paths)] = &[
    (
        names::CALLS_BY_PATH,
        "Rebuild calls (per-key batches, set calls) and whole-table runs.",
        [
            ("per-key", |v| {
                v.stats.rebuild_calls.saturating_sub(v.stats.set_calls) as f64
            }),
            ("set", |v| v.stats.set_calls as f64),
            ("whole", |v| v.stats.whole_runs as f64),
        ],
    ),
    (
        names::KEYS_BY_PATH,
        "Keys rebuilt by per-key batches, set calls, and whole-table runs.",
        [
            ("per-key", |v| {
                v.stats
                    .rebuilds_ok
                    .saturating_sub(v.stats.set_keys)
                    .saturating_sub(v.stats.whole_keys) as f64
            }),
            ("set", |v| v.stats.set_keys as f64),
            ("whole", |v| v.stats.whole_keys as f64),
        ],
    ),
];

/// The Prometheus text exposition of every view and the source.
pub(crate) fn render(views: &[ViewStats], source: &SourceStatus) -> String {
    let mut o = Out(String::new());
    let label = |v: &ViewStats| format!("view=\"{}\"", escape(&v.name));
    for (name, kind, help, get) in PER_VIEW {
        o.header(name, kind, help);
        for v in views {
            o.sample(name, &label(v), get(v));
        }
    }
    for (name, help, outcomes) in BY_OUTCOME {
        o.header(name, "counter", help);
        for v in views {
            for (outcome, get) in outcomes {
                o.sample(name, &format!("{},outcome=\"{outcome}\"", label(v)), get(v));
            }
        }
    }
    for (name, help, paths) in BY_PATH {
        o.header(name, "counter", help);
        for v in views {
            for (path, get) in paths {
                o.sample(name, &format!("{},path=\"{path}\"", label(v)), get(v));
            }
        }
    }
    o.header(
        names::FRESHNESS,
        "histogram",
        "Seconds from the first change that dirtied a key to the end of its rebuild.",
    );
    let bounds: Vec<Duration> = BUCKETS
        .iter()
        .map(|s| Duration::from_secs_f64(*s))
        .collect();
    for v in views {
        let l = escape(&v.name);
        let h = &v.stats.freshness;
        for (b, n) in BUCKETS.iter().zip(h.cumulative(&bounds)) {
            o.sample(
                &format!("{}_bucket", names::FRESHNESS),
                &format!("view=\"{l}\",le=\"{b}\""),
                n,
            );
        }
        o.sample(
            &format!("{}_bucket", names::FRESHNESS),
            &format!("view=\"{l}\",le=\"+Inf\""),
            h.count(),
        );
        o.sample(
            &format!("{}_sum", names::FRESHNESS),
            &format!("view=\"{l}\""),
            h.sum().as_secs_f64(),
        );
        o.sample(
            &format!("{}_count", names::FRESHNESS),
            &format!("view=\"{l}\""),
            h.count(),
        );
    }
    let kind = format!("kind=\"{}\"", escape(&source.kind));
    o.header(
        names::SOURCE_UP,
        "gauge",
        "1 while the source streams changes.",
    );
    o.sample(names::SOURCE_UP, &kind, u8::from(source.streaming));
    o.header(names::SOURCE_RECONNECTS, "counter", "Source reconnects.");
    o.sample(names::SOURCE_RECONNECTS, &kind, source.reconnects);
    o.header(
        names::SOURCE_EVENTS,
        "counter",
        "Row events the source delivered.",
    );
    o.sample(names::SOURCE_EVENTS, &kind, source.events);
    let optional = [
        (
            names::SOURCE_RECEIVED,
            "Highest position received from the source.",
            source.received_lsn,
        ),
        (
            names::SOURCE_CONFIRMED,
            "Highest position confirmed to the source.",
            source.confirmed_lsn,
        ),
        (
            names::SOURCE_LAG,
            "Bytes retained behind the server's position.",
            source.lag_bytes,
        ),
    ];
    for (name, help, value) in optional {
        if let Some(v) = value {
            o.header(name, "gauge", help);
            o.sample(name, &kind, v);
        }
    }
    if let Some(v) = source.lag_seconds {
        let name = names::SOURCE_LAG_SECONDS;
        o.header(
            name,
            "gauge",
            "Age of the oldest change received and not yet confirmed.",
        );
        o.sample(name, &kind, v);
    }
    if let Some(v) = source.stalled_seconds {
        let name = names::SOURCE_STALLED;
        o.header(
            name,
            "gauge",
            "Seconds the source has read nothing while the server's position was ahead of it (0 while it reads).",
        );
        o.sample(name, &kind, v);
    }
    if let Some(p) = &source.partitions {
        let name = names::KEY_STREAM_PARTITIONS;
        o.header(
            name,
            "gauge",
            "Partitions of the key stream this worker owns now (0 while it owns none).",
        );
        o.sample(name, &kind, p.len());
    }
    o.0
}

/// One sink's deliveries, as `/metrics` labels them.
#[derive(Debug, Clone)]
pub struct SinkStatus {
    /// The `sink` label: where it publishes (`kafka-outbox:public.outbox`).
    pub name: String,
    /// The `kind` label, as `[[sinks]] kind` names it.
    pub kind: &'static str,
    /// What the sink reports.
    pub report: freshen::plug::SinkReport,
}

/// What one `[[redact]]` rule redacted so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// The table as the rule names it (`schema.table`, or `table` for any schema).
    pub table: String,
    /// The column.
    pub column: String,
    /// The action (`drop`, `mask`, `hash`, `truncate`).
    pub action: &'static str,
    /// Values redacted.
    pub values: u64,
}

impl Redacted {
    /// Every rule of `redactor` with its count.
    pub fn from_redactor(redactor: &freshen_codec::Redactor) -> Vec<Redacted> {
        redactor
            .counts()
            .into_iter()
            .map(|(rule, values)| Redacted {
                table: match &rule.schema {
                    Some(s) => format!("{s}.{}", rule.table),
                    None => rule.table.clone(),
                },
                column: rule.column.clone(),
                action: rule.action.name(),
                values,
            })
            .collect()
    }
}

/// The Prometheus text exposition of the sinks' deliveries and the redaction counts
/// (nothing for a configuration without either).
pub(crate) fn render_outputs(sinks: &[SinkStatus], redacted: &[Redacted]) -> String {
    let mut o = Out(String::new());
    if !sinks.is_empty() {
        type SinkGet = fn(&freshen::plug::SinkReport) -> f64;
        let per_sink: [(&str, &str, &str, SinkGet); 6] = [
            (
                names::SINK_DELIVERED,
                "counter",
                "Records the destination acknowledged.",
                |r| r.delivered as f64,
            ),
            (
                names::SINK_FAILURES,
                "counter",
                "Records whose delivery failed for good (the sink stops, its batch unconfirmed).",
                |r| r.failed as f64,
            ),
            (
                names::SINK_CLIENT_ERRORS,
                "counter",
                "Errors the sink's client reported and retried by itself (a broker down).",
                |r| r.client_errors as f64,
            ),
            (
                names::SINK_WAITING,
                "gauge",
                "Batches handed to the destination and not yet acknowledged.",
                |r| r.batches_waiting as f64,
            ),
            (
                names::SINK_OLDEST_WAITING,
                "gauge",
                "Seconds the oldest batch waiting for the destination's acknowledgement has waited (0: none waits).",
                |r| age_s(r.oldest_waiting),
            ),
            (
                names::SINK_LAST_DELIVERY,
                "gauge",
                "Unix time of the last record the destination acknowledged (0: none yet).",
                |r| unix(r.last_delivery),
            ),
        ];
        let label =
            |s: &SinkStatus| format!("sink=\"{}\",kind=\"{}\"", escape(&s.name), escape(s.kind));
        for (name, kind, help, get) in per_sink {
            o.header(name, kind, help);
            for s in sinks {
                o.sample(name, &label(s), get(&s.report));
            }
        }
        if sinks.iter().any(|s| !s.report.dead_lettered.is_empty()) {
            let name = names::SINK_DEAD_LETTERS;
            o.header(
                name,
                "counter",
                "Rows sent to the dead-letter topic, by reason.",
            );
            for s in sinks {
                for (reason, n) in &s.report.dead_lettered {
                    o.sample(
                        name,
                        &format!("{},reason=\"{}\"", label(s), escape(reason)),
                        n,
                    );
                }
            }
        }
    }
    if !redacted.is_empty() {
        let name = names::REDACTED;
        o.header(
            name,
            "counter",
            "Values a [[redact]] rule rewrote or dropped, once per row image and output.",
        );
        for r in redacted {
            o.sample(
                name,
                &format!(
                    "table=\"{}\",column=\"{}\",action=\"{}\"",
                    escape(&r.table),
                    escape(&r.column),
                    r.action
                ),
                r.values,
            );
        }
    }
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_and_redactions_are_exported_with_bounded_labels() {
        assert_eq!(
            render_outputs(&[], &[]),
            "",
            "nothing without sinks or rules"
        );
        let mut report = freshen::plug::SinkReport::default();
        report.delivered = 12;
        report.client_errors = 3;
        report.batches_waiting = 2;
        report.oldest_waiting = Some(SystemTime::now() - Duration::from_secs(40));
        report.last_delivery = Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        report.dead_lettered = vec![("missing_id", 1), ("invalid_payload", 0)];
        let plain = freshen::plug::SinkReport::default();
        let text = render_outputs(
            &[
                SinkStatus {
                    name: "kafka-outbox:public.outbox".into(),
                    kind: "kafka-outbox",
                    report,
                },
                SinkStatus {
                    name: "kafka:shop".into(),
                    kind: "kafka",
                    report: plain,
                },
            ],
            &[Redacted {
                table: "public.users".into(),
                column: "email".into(),
                action: "hash",
                values: 7,
            }],
        );
        let l = "sink=\"kafka-outbox:public.outbox\",kind=\"kafka-outbox\"";
        let value = |series: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(&format!("{series} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {series} in {text}"))
        };
        assert_eq!(value(&format!("{}{{{l}}}", names::SINK_DELIVERED)), 12.0);
        assert_eq!(value(&format!("{}{{{l}}}", names::SINK_CLIENT_ERRORS)), 3.0);
        assert_eq!(value(&format!("{}{{{l}}}", names::SINK_WAITING)), 2.0);
        let waited = value(&format!("{}{{{l}}}", names::SINK_OLDEST_WAITING));
        assert!((40.0..120.0).contains(&waited), "{waited}");
        assert_eq!(
            value(&format!("{}{{{l}}}", names::SINK_LAST_DELIVERY)),
            1_700_000_000.0
        );
        assert_eq!(
            value(&format!(
                "{}{{{l},reason=\"missing_id\"}}",
                names::SINK_DEAD_LETTERS
            )),
            1.0
        );
        let plain = "sink=\"kafka:shop\",kind=\"kafka\"";
        assert_eq!(
            value(&format!("{}{{{plain}}}", names::SINK_OLDEST_WAITING)),
            0.0,
            "nothing waits"
        );
        assert!(
            !text.contains(&format!("{}{{{plain}", names::SINK_DEAD_LETTERS)),
            "a sink without a dead-letter path has no dead-letter series"
        );
        assert_eq!(
            value(&format!(
                "{}{{table=\"public.users\",column=\"email\",action=\"hash\"}}",
                names::REDACTED
            )),
            7.0
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "not a sample: {line}");
        }
    }

    #[test]
    fn a_change_waiting_past_stale_after_makes_the_view_unhealthy() {
        let mut stats = Stats::default();
        stats.oldest_waiting = Some(SystemTime::now() - std::time::Duration::from_secs(20));
        stats.dirty = 3;
        let mut v = ViewStats {
            name: "totals".into(),
            stats,
            events: 0,
            stale_after: Some(std::time::Duration::from_secs(10)),
            recent: None,
            unscoped: 0,
            quarantined: Vec::new(),
        };
        let p = v.problems();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("view totals") && p[0].contains("3 key(s) waiting"),
            "{p:?}"
        );
        v.stale_after = Some(std::time::Duration::from_secs(60));
        assert!(v.problems().is_empty());
        v.stale_after = None;
        assert!(v.problems().is_empty(), "\"0s\" turns the bound off");
    }

    #[test]
    fn the_oldest_waiting_change_and_the_stale_bound_are_exported_for_alerts() {
        let mut stats = Stats::default();
        stats.oldest_waiting = Some(SystemTime::now() - std::time::Duration::from_secs(20));
        let text = render(
            &[ViewStats {
                name: "totals".into(),
                stats,
                events: 0,
                stale_after: Some(std::time::Duration::from_secs(10)),
                recent: None,
                unscoped: 0,
                quarantined: Vec::new(),
            }],
            &SourceStatus::default(),
        );
        let value = |name: &str| -> f64 {
            let prefix = format!("{name}{{view=\"totals\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {text}"))
        };
        let waited = value(names::OLDEST_WAITING);
        assert!((20.0..60.0).contains(&waited), "{waited}");
        assert_eq!(value(names::STALE_AFTER), 10.0);
    }

    #[test]
    fn renders_counters_gauges_and_a_histogram_per_view() {
        let mut stats = Stats::default();
        stats.events_received = 10;
        stats.rebuilds_ok = 4;
        stats.rebuilds_failed = 1;
        stats.dirty = 3;
        let text = render(
            &[ViewStats {
                name: "device\"totals".into(),
                stats,
                events: 10,
                stale_after: None,
                recent: None,
                unscoped: 2,
                quarantined: Vec::new(),
            }],
            &SourceStatus {
                kind: "postgres".into(),
                streaming: true,
                lag_bytes: Some(42),
                stalled_seconds: Some(31.5),
                ..SourceStatus::default()
            },
        );
        assert!(
            text.contains("freshen_events_total{view=\"device\\\"totals\"} 10"),
            "{text}"
        );
        assert!(
            text.contains("freshen_rebuilds_total{view=\"device\\\"totals\",outcome=\"failed\"} 1")
        );
        assert!(text.contains("freshen_dirty_keys{view=\"device\\\"totals\"} 3"));
        assert!(
            text.contains("freshen_oldest_change_waiting_seconds{view=\"device\\\"totals\"} 0")
        );
        assert!(text.contains("freshen_view_stale_after_seconds{view=\"device\\\"totals\"} 0"));
        assert!(text.contains(
            "freshen_freshness_lag_seconds_bucket{view=\"device\\\"totals\",le=\"+Inf\"} 0"
        ));
        assert!(text.contains("freshen_source_streaming{kind=\"postgres\"} 1"));
        assert!(text.contains("freshen_events_unscoped_total{view=\"device\\\"totals\"} 2"));
        assert!(text.contains("freshen_source_lag_bytes{kind=\"postgres\"} 42"));
        assert!(
            text.contains("freshen_source_stalled_seconds{kind=\"postgres\"} 31.5"),
            "{text}"
        );
        assert!(
            !text.contains("freshen_source_received_lsn"),
            "unknown values are left out"
        );
        assert!(
            !text.contains("freshen_key_stream_partitions_owned"),
            "only a key stream worker owns partitions"
        );
        let worker = render(
            &[],
            &SourceStatus {
                kind: "kafka-keys".into(),
                partitions: Some(vec![0, 3, 5]),
                ..SourceStatus::default()
            },
        );
        assert!(
            worker.contains("freshen_key_stream_partitions_owned{kind=\"kafka-keys\"} 3"),
            "{worker}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
        }
    }
}
