//! `Stats`: a plain snapshot of a refresher's counters and gauges.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Retry;

use crate::histogram::{Histogram, HistogramSnapshot};

/// A point-in-time view of a refresher, from [`Handle::stats`](crate::Handle::stats).
///
/// Counters only grow; gauges are the value at the snapshot. There is no metrics client
/// here: the `freshen` binary exports these to Prometheus.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Batches received from the source.
    pub batches_received: u64,
    /// Batches acknowledged to the source.
    pub batches_acked: u64,
    /// Row events received.
    pub events_received: u64,
    /// Messages the source could not decode (skipped, counted, reported).
    pub events_skipped: u64,
    /// TRUNCATE events received.
    pub truncates: u64,
    /// [`Gap`](crate::Gap)s in tables this view watches (rows changed that the stream
    /// did not carry): each asked for a sweep.
    pub gaps: u64,
    /// [`SchemaChange`](crate::SchemaChange)s of tables this view watches.
    pub schema_changes: u64,
    /// Keys marked dirty by events and sweeps (one per key per event).
    pub keys_marked: u64,
    /// Keys rebuilt successfully.
    pub rebuilds_ok: u64,
    /// Of `rebuilds_ok`, keys that no change made due: listed by a reconcile sweep (or
    /// asked for by hand). They are left out of `freshness`, and amplification
    /// (rebuilds per change) is `rebuilds_ok - sweep_rebuilds` over the events.
    pub sweep_rebuilds: u64,
    /// Key rebuilds that failed.
    pub rebuilds_failed: u64,
    /// Calls of the rebuild callback (less than keys when rebuilds are batched).
    pub rebuild_calls: u64,
    /// Keys quarantined after repeated failures (counted once per quarantine).
    pub keys_poisoned: u64,
    /// Quarantined keys whose held acknowledgements were released without a successful
    /// rebuild: their transactions were confirmed upstream, and only a reconcile sweep
    /// (or a later change) heals them. The one exception to the after-rebuild guarantee.
    pub quarantine_releases: u64,
    /// Failed rebuilds that blamed the path (an outage, a timeout, a conflict), not the
    /// key; they never quarantine. Included in `rebuilds_failed`.
    pub path_failures: u64,
    /// Rebuilds abandoned at shutdown past the grace period (they are cancelled; their
    /// keys stay unacknowledged and are replayed after a restart).
    pub abandoned: u64,
    /// Reconcile sweeps completed.
    pub reconciles: u64,
    /// Reconcile sweeps that failed to list keys.
    pub reconcile_failures: u64,
    /// Keys listed by reconcile sweeps.
    pub reconcile_keys: u64,
    /// Fan-out calls that finished (each maps up to a batch of parent keys).
    pub fanout_calls: u64,
    /// View keys sent by fan-outs (before merging with keys already dirty).
    pub fanout_keys: u64,
    /// Of `rebuild_calls`, set calls: calls grown past the rebuild's batch to work
    /// through a backlog as sets (the rest are per-key batches).
    pub set_calls: u64,
    /// Keys rebuilt by set calls.
    pub set_keys: u64,
    /// Whole-table runs that finished: first builds, backlogs past the threshold,
    /// fan-outs to a large share of the table.
    pub whole_runs: u64,
    /// Whole-table runs that failed.
    pub whole_failures: u64,
    /// Keys covered by whole-table runs that finished.
    pub whole_keys: u64,
    /// Rows whole-table runs inserted, updated or deleted.
    pub whole_written: u64,
    /// The whole-table run now running: why (`build`, `backlog`, `fan-out`), how
    /// (`build`, `replace`, `diff`), since when and how many keys it covers.
    pub whole_running: Option<WholeRunning>,
    /// Waiting keys at or above which the view's backlog is recomputed as the whole
    /// table (`None`: never, or not known yet).
    pub whole_threshold: Option<u64>,
    /// Rows the derived table holds, last known (from a whole-table run or the
    /// target's estimate).
    pub table_rows: Option<u64>,
    /// Keys per second of set work and rows per second of whole-table runs, as the
    /// choice between them now assumes (measured, or the priors before).
    pub rates: (f64, f64),
    /// Why the first build of the (empty) derived table failed by its data; it then
    /// holds only the keys rebuilt since. `None` when it did not fail.
    pub build_failed: Option<String>,
    /// Keys waiting for a rebuild (dirty or waiting to retry). Gauge.
    pub dirty: u64,
    /// When the longest-running rebuild call now running started (`None`: none runs).
    pub oldest_in_flight: Option<SystemTime>,
    /// When the reconcile sweep now listing keys started (`None`: none is).
    pub sweep_since: Option<SystemTime>,
    /// Keys the sweep now listing has listed so far.
    pub sweep_listed: u64,
    /// Keys quarantined now. Gauge.
    pub poisoned: u64,
    /// Quarantined keys still holding back acknowledgements (a view without reconcile):
    /// their transactions stay unconfirmed until the key rebuilds. Gauge.
    pub poisoned_holding: u64,
    /// Keys being rebuilt now. Gauge.
    pub in_flight: u64,
    /// Batches received but not yet acknowledged. Gauge.
    pub unacked_batches: u64,
    /// When the last batch arrived.
    pub last_event: Option<SystemTime>,
    /// When the last rebuild succeeded.
    pub last_rebuild: Option<SystemTime>,
    /// When the change that has waited longest for its rebuild dirtied its key
    /// (sampled about once a second). `None` when nothing waits.
    pub oldest_waiting: Option<SystemTime>,
    /// Since when rebuilds fail for a reason that is not the key's (an outage): no
    /// rebuild has succeeded since. `None` when the way to the database works.
    pub stalled_since: Option<SystemTime>,
    /// What the stall is: the directive and the last error.
    pub stall: Option<(Retry, String)>,
    /// The last rebuild failure of any kind, for status pages.
    pub last_error: Option<String>,
    /// Why the view is paused: one line per table whose schema change broke its key
    /// (`public.readings: column device dropped`). Empty while it runs.
    pub paused: Vec<String>,
    /// Tables whose rows changed in a way the stream did not carry (a [`Gap`](crate::Gap))
    /// while the view has no reconcile sweep to find what they dirtied: one line per
    /// table (`public.readings: <what the stream left out>`). Its derived rows may be
    /// stale until a person rebuilds them and says so
    /// ([`Handle::acknowledge_gaps`](crate::Handle::acknowledge_gaps)). Empty when none.
    pub unhealed_gaps: Vec<String>,
    /// Times the run loop woke up (batches, finished rebuilds, timers): an idle or
    /// saturated refresher should not wake much more often than it has work.
    pub wakeups: u64,
    /// Freshness lag: from the first change that dirtied a key to the end of the rebuild
    /// that covered it.
    pub freshness: HistogramSnapshot,
}

/// A whole-table run in progress, in [`Stats::whole_running`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WholeRunning {
    /// Why: `build` (the table was empty at start), `backlog` or `fan-out`.
    pub reason: &'static str,
    /// How: `build`, `replace` or `diff`.
    pub way: &'static str,
    /// When it started.
    pub since: SystemTime,
    /// Keys it covers.
    pub keys: u64,
}

/// The live counters behind [`Stats`], shared by the run loop and every handle.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) batches_received: AtomicU64,
    pub(crate) batches_acked: AtomicU64,
    pub(crate) events_received: AtomicU64,
    pub(crate) events_skipped: AtomicU64,
    pub(crate) truncates: AtomicU64,
    pub(crate) gaps: AtomicU64,
    pub(crate) schema_changes: AtomicU64,
    pub(crate) keys_marked: AtomicU64,
    pub(crate) rebuilds_ok: AtomicU64,
    pub(crate) rebuilds_failed: AtomicU64,
    pub(crate) rebuild_calls: AtomicU64,
    pub(crate) keys_poisoned: AtomicU64,
    pub(crate) quarantine_releases: AtomicU64,
    pub(crate) path_failures: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) reconciles: AtomicU64,
    pub(crate) reconcile_failures: AtomicU64,
    pub(crate) reconcile_keys: AtomicU64,
    pub(crate) fanout_calls: AtomicU64,
    pub(crate) fanout_keys: AtomicU64,
    pub(crate) set_calls: AtomicU64,
    pub(crate) set_keys: AtomicU64,
    pub(crate) whole_runs: AtomicU64,
    pub(crate) whole_failures: AtomicU64,
    pub(crate) whole_keys: AtomicU64,
    pub(crate) whole_written: AtomicU64,
    pub(crate) dirty: AtomicU64,
    pub(crate) poisoned: AtomicU64,
    pub(crate) poisoned_holding: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) unacked_batches: AtomicU64,
    /// Nanoseconds since the Unix epoch (full precision: a reading never precedes the
    /// activity it records); 0 = never.
    pub(crate) last_event_ns: AtomicU64,
    pub(crate) last_rebuild_ns: AtomicU64,
    /// Nanoseconds since the Unix epoch of the oldest waiting change; 0 = none.
    pub(crate) oldest_waiting_ns: AtomicU64,
    pub(crate) oldest_in_flight_ns: AtomicU64,
    pub(crate) sweep_since_ns: AtomicU64,
    pub(crate) sweep_listed: AtomicU64,
    pub(crate) sweep_rebuilds: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) freshness: Histogram,
    /// Rarely written: on a failure, on a stall's start and end.
    pub(crate) trouble: Mutex<Trouble>,
}

/// A monotonic instant as wall-clock nanoseconds since the Unix epoch, for readers in
/// other processes; 0 = none (and a real instant is never 0).
fn wall_ns(at: Option<std::time::Instant>) -> u64 {
    at.map_or(0, |t| {
        let wall = SystemTime::now() - t.elapsed();
        wall.duration_since(UNIX_EPOCH).map_or(1, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
        })
    })
}

/// The failure state behind `stalled_since`, `stall` and `last_error`.
#[derive(Debug, Default)]
pub(crate) struct Trouble {
    pub(crate) stalled_since: Option<SystemTime>,
    pub(crate) stall: Option<(Retry, String)>,
    pub(crate) last_error: Option<String>,
    pub(crate) paused: Vec<String>,
    pub(crate) unhealed_gaps: Vec<String>,
    pub(crate) whole: WholeState,
}

/// What the run loop last published of its whole-table runs and their choice.
#[derive(Debug, Default, Clone)]
pub(crate) struct WholeState {
    pub(crate) running: Option<WholeRunning>,
    pub(crate) threshold: Option<u64>,
    pub(crate) rows: Option<u64>,
    pub(crate) rates: (f64, f64),
    pub(crate) build_failed: Option<String>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn time_of(ns: u64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns))
}

impl Recorder {
    pub(crate) fn new() -> Recorder {
        let z = || AtomicU64::new(0);
        Recorder {
            batches_received: z(),
            batches_acked: z(),
            events_received: z(),
            events_skipped: z(),
            truncates: z(),
            gaps: z(),
            schema_changes: z(),
            keys_marked: z(),
            rebuilds_ok: z(),
            rebuilds_failed: z(),
            rebuild_calls: z(),
            keys_poisoned: z(),
            quarantine_releases: z(),
            path_failures: z(),
            abandoned: z(),
            reconciles: z(),
            reconcile_failures: z(),
            reconcile_keys: z(),
            fanout_calls: z(),
            fanout_keys: z(),
            set_calls: z(),
            set_keys: z(),
            whole_runs: z(),
            whole_failures: z(),
            whole_keys: z(),
            whole_written: z(),
            dirty: z(),
            poisoned: z(),
            poisoned_holding: z(),
            in_flight: z(),
            unacked_batches: z(),
            last_event_ns: z(),
            last_rebuild_ns: z(),
            oldest_waiting_ns: z(),
            oldest_in_flight_ns: z(),
            sweep_since_ns: z(),
            sweep_listed: z(),
            sweep_rebuilds: z(),
            wakeups: z(),
            freshness: Histogram::new(),
            trouble: Mutex::new(Trouble::default()),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Relaxed);
    }

    pub(crate) fn touch_event(&self) {
        self.last_event_ns.store(now_ns(), Relaxed);
    }

    /// Records the oldest waiting change's first mark (a monotonic instant, stored as
    /// wall-clock time for readers).
    pub(crate) fn set_oldest_waiting(&self, at: Option<std::time::Instant>) {
        self.oldest_waiting_ns.store(wall_ns(at), Relaxed);
    }

    /// Records when the longest-running rebuild call started.
    pub(crate) fn set_oldest_in_flight(&self, at: Option<std::time::Instant>) {
        self.oldest_in_flight_ns.store(wall_ns(at), Relaxed);
    }

    /// Records when the listing sweep started.
    pub(crate) fn set_sweep_since(&self, since: Option<std::time::Instant>) {
        self.sweep_since_ns.store(wall_ns(since), Relaxed);
    }

    pub(crate) fn touch_rebuild(&self) {
        self.last_rebuild_ns.store(now_ns(), Relaxed);
    }

    /// Changes the failure state.
    pub(crate) fn trouble(&self, f: impl FnOnce(&mut Trouble)) {
        f(&mut self.trouble.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        let trouble = Trouble {
            stalled_since: trouble.stalled_since,
            stall: trouble.stall.clone(),
            last_error: trouble.last_error.clone(),
            paused: trouble.paused.clone(),
            unhealed_gaps: trouble.unhealed_gaps.clone(),
            whole: trouble.whole.clone(),
        };
        Stats {
            batches_received: g(&self.batches_received),
            batches_acked: g(&self.batches_acked),
            events_received: g(&self.events_received),
            events_skipped: g(&self.events_skipped),
            truncates: g(&self.truncates),
            gaps: g(&self.gaps),
            schema_changes: g(&self.schema_changes),
            keys_marked: g(&self.keys_marked),
            rebuilds_ok: g(&self.rebuilds_ok),
            sweep_rebuilds: g(&self.sweep_rebuilds),
            rebuilds_failed: g(&self.rebuilds_failed),
            rebuild_calls: g(&self.rebuild_calls),
            keys_poisoned: g(&self.keys_poisoned),
            quarantine_releases: g(&self.quarantine_releases),
            path_failures: g(&self.path_failures),
            abandoned: g(&self.abandoned),
            reconciles: g(&self.reconciles),
            reconcile_failures: g(&self.reconcile_failures),
            reconcile_keys: g(&self.reconcile_keys),
            fanout_calls: g(&self.fanout_calls),
            fanout_keys: g(&self.fanout_keys),
            set_calls: g(&self.set_calls),
            set_keys: g(&self.set_keys),
            whole_runs: g(&self.whole_runs),
            whole_failures: g(&self.whole_failures),
            whole_keys: g(&self.whole_keys),
            whole_written: g(&self.whole_written),
            whole_running: trouble.whole.running,
            whole_threshold: trouble.whole.threshold,
            table_rows: trouble.whole.rows,
            rates: trouble.whole.rates,
            build_failed: trouble.whole.build_failed,
            dirty: g(&self.dirty),
            oldest_in_flight: time_of(g(&self.oldest_in_flight_ns)),
            sweep_since: time_of(g(&self.sweep_since_ns)),
            sweep_listed: g(&self.sweep_listed),
            poisoned: g(&self.poisoned),
            poisoned_holding: g(&self.poisoned_holding),
            in_flight: g(&self.in_flight),
            unacked_batches: g(&self.unacked_batches),
            last_event: time_of(g(&self.last_event_ns)),
            last_rebuild: time_of(g(&self.last_rebuild_ns)),
            oldest_waiting: time_of(g(&self.oldest_waiting_ns)),
            stalled_since: trouble.stalled_since,
            stall: trouble.stall,
            last_error: trouble.last_error,
            paused: trouble.paused,
            unhealed_gaps: trouble.unhealed_gaps,
            wakeups: g(&self.wakeups),
            freshness: self.freshness.snapshot(),
        }
    }
}
