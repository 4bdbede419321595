//! `WholeRun`: a recompute of the view's whole derived table — its first build, a
//! backlog past the [`Choice`](super::choice::Choice)'s threshold, a fan-out to a large
//! share of the table — and the keys it covers.
//!
//! ```text
//!            want(reason)                 no call runs               it ends
//!   idle ─────────────────► wanted ───────────────────────► running ─────────► idle
//!     ▲   (no call starts while wanted or running:              │ failed by the path:
//!     │    the run writes every row, so nothing else            │ wanted again after
//!     └──  of the view may run beside it)                       ▼ a backoff
//! ```
//!
//! | reason    | keys it covers                                        | way               |
//! |-----------|-------------------------------------------------------|-------------------|
//! | `Build`   | none (keys dirtied meanwhile are rebuilt after it)    | build, if empty   |
//! | `Backlog` | every waiting key                                      | replace, or diff for a sweep's keys |
//! | `FanOut`  | the parent keys whose fan-out was too large, and every waiting key | replace |
//! | `Sweep`   | every waiting key (a reconcile sweep came due: its keys are not listed) | diff |
//!
//! A covered key is in flight while the run runs (single flight): a change to it
//! re-queues it, and its transactions are confirmed only once the run commits. A run
//! that fails falls back to set work: by a key's data its view keys go to the halving
//! retries (so the one failing key is found and quarantined), by the path (an outage,
//! its timeout, a lock) they back off as any call's; its parent keys go back to their
//! fan-out, which then expands them key by key. No run is tried again until that
//! backlog is worked off (no key waits or runs) and no key is quarantined. A first
//! build has no keys to fall back to: by the path it is tried
//! again after a backoff; by data the table is left to the keys that change.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::jobs::{AbortOnDrop, JobKey};
use crate::rebuild::{Due, WholeDone, WholeWay};
use crate::{BoxError, Key};

/// Why the whole table is recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The table was empty (or new) at start.
    Build,
    /// More keys wait than the threshold.
    Backlog,
    /// A fan-out estimated to reach more keys than the threshold.
    FanOut,
    /// A reconcile sweep came due: the whole table, diffed, instead of its keys listed.
    Sweep,
}

impl Reason {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reason::Build => "build",
            Reason::Backlog => "backlog",
            Reason::FanOut => "fan-out",
            Reason::Sweep => "sweep",
        }
    }
}

/// A fan-out call's answer that it would reach too many keys: its parent keys are
/// covered by a whole-table run instead.
#[derive(Debug)]
pub(crate) struct LargeFanOut {
    /// The fan-out's estimate.
    pub(crate) keys: u64,
}

impl std::fmt::Display for LargeFanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a fan-out to about {} keys", self.keys)
    }
}

impl std::error::Error for LargeFanOut {}

/// A running whole-table run.
pub(crate) struct Running {
    pub(crate) reason: Reason,
    pub(crate) way: WholeWay,
    pub(crate) since: Instant,
    /// The sweep it covers, if one was due when it started: its TRUNCATE batches.
    pub(crate) sweep: Option<Vec<crate::ack::BatchId>>,
    /// The keys it covers, with what was due for each.
    pub(crate) keys: Vec<(JobKey, Due)>,
    task: JoinHandle<Result<WholeDone, BoxError>>,
    _abort: AbortOnDrop,
}

enum State {
    Idle,
    Wanted {
        reason: Reason,
        not_before: Option<Instant>,
    },
    Running(Running),
}

/// The view's whole-table runs.
pub(crate) struct WholeRun {
    state: State,
    /// Parent keys whose fan-out was too large: the next run covers them.
    parked: Vec<(JobKey, Due)>,
    /// Parent keys to expand key by key (a run that covered them failed by data).
    expand_anyway: HashSet<Key>,
    /// A run failed: none is tried again until its backlog has been worked off by
    /// set work (no key waits or runs) and no key is quarantined.
    fell_back: bool,
    /// The first build failed by data: the table holds only the keys rebuilt since.
    build_failed: Option<String>,
    /// Path failures in a row (for the backoff of a keyless build).
    failures: u32,
    /// A sweep came due and waits for the next run to start (which covers it).
    sweep_due: bool,
    /// The TRUNCATE batches that sweep must see covered.
    sweep_pins: Vec<crate::ack::BatchId>,
}

impl WholeRun {
    pub(crate) fn new() -> WholeRun {
        WholeRun {
            state: State::Idle,
            parked: Vec::new(),
            expand_anyway: HashSet::new(),
            fell_back: false,
            build_failed: None,
            failures: 0,
            sweep_due: false,
            sweep_pins: Vec::new(),
        }
    }

    /// Whether a run is wanted or running: no call of the view may start.
    pub(crate) fn blocks(&self) -> bool {
        !matches!(self.state, State::Idle)
    }

    /// Whether a run is running.
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// The running run, if any.
    pub(crate) fn running(&self) -> Option<&Running> {
        match &self.state {
            State::Running(r) => Some(r),
            _ => None,
        }
    }

    /// Asks for a run (kept if one is wanted or running already).
    pub(crate) fn want(&mut self, reason: Reason) {
        if let State::Idle = self.state {
            self.state = State::Wanted {
                reason,
                not_before: None,
            };
        }
    }

    /// The reason of the wanted run, when it may start at `now`.
    pub(crate) fn startable(&self, now: Instant) -> Option<Reason> {
        match self.state {
            State::Wanted { reason, not_before } if not_before.is_none_or(|t| t <= now) => {
                Some(reason)
            }
            _ => None,
        }
    }

    /// When a wanted run backing off may start.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        match self.state {
            State::Wanted { not_before, .. } => not_before,
            _ => None,
        }
    }

    /// Whether a new run may be wanted now (none failed, or its backlog was worked
    /// off: see [`settled`](Self::settled)).
    pub(crate) fn may_want(&self) -> bool {
        !self.fell_back
    }

    /// Clears a failed run's fallback once its backlog is worked off (`drained`: no key
    /// waits or runs, no halves wait) and no key is quarantined.
    pub(crate) fn settled(&mut self, drained: bool, quarantine_empty: bool) {
        if self.fell_back && drained && quarantine_empty {
            self.fell_back = false;
        }
    }

    /// Wants a run for a sweep that came due, covering its TRUNCATE batches. A run
    /// already running started before them and covers nothing of them: the sweep waits
    /// for the next run, wanted as soon as this one ends.
    pub(crate) fn want_sweep(&mut self, pins: Vec<crate::ack::BatchId>) {
        self.sweep_due = true;
        self.sweep_pins.extend(pins);
        self.want(Reason::Sweep);
    }

    /// Parks parent keys whose fan-out would reach too many keys, and wants a run.
    pub(crate) fn park(&mut self, keys: impl IntoIterator<Item = (JobKey, Due)>) {
        self.parked.extend(keys);
        self.want(Reason::FanOut);
    }

    /// Whether `key` (a parent key) is to be expanded key by key.
    pub(crate) fn expands_anyway(&self, key: &Key) -> bool {
        self.expand_anyway.contains(key)
    }

    /// `key` was expanded: the next change to it may go whole again.
    pub(crate) fn expanded(&mut self, key: &Key) {
        if !self.expand_anyway.is_empty() {
            self.expand_anyway.remove(key);
        }
    }

    /// Starts the wanted run: `way` over `keys` (with [`take_parked`](Self::take_parked)'s),
    /// on `task`.
    pub(crate) fn start(
        &mut self,
        way: WholeWay,
        keys: Vec<(JobKey, Due)>,
        task: JoinHandle<Result<WholeDone, BoxError>>,
    ) {
        let reason = match self.state {
            State::Wanted { reason, .. } => reason,
            _ => Reason::Backlog,
        };
        let abort = AbortOnDrop(task.abort_handle());
        let sweep =
            std::mem::take(&mut self.sweep_due).then(|| std::mem::take(&mut self.sweep_pins));
        self.state = State::Running(Running {
            reason,
            way,
            since: Instant::now(),
            sweep,
            keys,
            task,
            _abort: abort,
        });
    }

    /// The parked parent keys, to cover in the run being started.
    pub(crate) fn take_parked(&mut self) -> Vec<(JobKey, Due)> {
        std::mem::take(&mut self.parked)
    }

    /// Waits for the running run to end (never, while none runs).
    pub(crate) async fn join(&mut self) -> Result<Result<WholeDone, BoxError>, BoxError> {
        match &mut self.state {
            State::Running(r) => (&mut r.task).await.map_err(|e| -> BoxError {
                format!("the whole-table run's task failed: {e}").into()
            }),
            _ => std::future::pending().await,
        }
    }

    /// The run ended: it leaves the state and is returned. A sweep that came due while
    /// it ran wants the next run.
    pub(crate) fn ended(&mut self) -> Option<Running> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Running(r) => {
                if self.sweep_due {
                    self.want(Reason::Sweep);
                }
                Some(r)
            }
            other => {
                self.state = other;
                None
            }
        }
    }

    /// It succeeded.
    pub(crate) fn succeeded(&mut self, reason: Reason) {
        self.failures = 0;
        if reason == Reason::Build {
            self.build_failed = None;
        }
    }

    /// It failed by the path: wanted again for `reason` after `backoff`, never sooner
    /// than `now + backoff`.
    pub(crate) fn retry_after(&mut self, reason: Reason, now: Instant, backoff: Duration) {
        self.failures = self.failures.saturating_add(1);
        self.state = State::Wanted {
            reason,
            not_before: Some(now + backoff),
        };
    }

    /// Path failures in a row.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// A run over a backlog failed: set work takes over — `parents` expand key by
    /// key from now on — and no run is tried until that backlog is worked off.
    pub(crate) fn fall_back(&mut self, parents: &[Key]) {
        self.fell_back = true;
        self.expand_anyway.extend(parents.iter().cloned());
    }

    /// The first build failed by data: the table holds only the keys rebuilt since.
    pub(crate) fn build_failed_by_data(&mut self, error: &str) {
        self.build_failed = Some(error.to_owned());
    }

    /// Why the first build failed, while the table may be incomplete.
    pub(crate) fn build_failed(&self) -> Option<&str> {
        self.build_failed.as_deref()
    }

    /// Cancels a running run (shutdown past the grace period): its keys are returned.
    pub(crate) fn abandon(&mut self) -> usize {
        match self.ended() {
            Some(r) => {
                r.task.abort();
                r.keys.len()
            }
            None => 0,
        }
    }
}

/// The transaction ids a run over `keys` must see: each once, in order.
pub(crate) fn txids(keys: &[(JobKey, Due)]) -> Vec<u64> {
    let mut out: Vec<u64> = keys
        .iter()
        .flat_map(|(_, d)| d.txids.iter().copied())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// How a backlog run writes: a sweep's keys rarely changed (diff: a table that did not
/// change is not written); keys dirtied by changes mostly did (replace).
pub(crate) fn backlog_way(keys: &[(JobKey, Due)]) -> WholeWay {
    let changed = keys.iter().filter(|(k, _)| k.by_change).count();
    if changed * 2 >= keys.len() {
        WholeWay::Replace
    } else {
        WholeWay::Diff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dirty::{DirtyConfig, DirtySet};

    fn keys(n: usize, by_change: bool, txid: u64) -> Vec<(JobKey, Due)> {
        let now = Instant::now();
        let mut dirty = DirtySet::new(DirtyConfig::default(), now);
        for i in 0..n {
            let k = Key::from(format!("k{txid}-{i}"));
            if by_change {
                dirty.mark(&k, now);
            } else {
                dirty.revive(&k, now);
            }
        }
        std::iter::from_fn(|| dirty.pop_ready(now + Duration::from_secs(60)))
            .map(|r| {
                let due = Due {
                    key: r.key.clone(),
                    txids: vec![txid, txid + 1],
                };
                (
                    JobKey {
                        key: r.key,
                        ticket: r.ticket,
                        first_dirty: r.first_dirty,
                        by_change: r.by_change,
                        covered: None,
                    },
                    due,
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_run_is_wanted_then_runs_then_ends() {
        let mut w = WholeRun::new();
        assert!(!w.blocks());
        w.want(Reason::Build);
        w.want(Reason::Backlog);
        assert!(w.blocks() && !w.is_running());
        let now = Instant::now();
        assert_eq!(
            w.startable(now),
            Some(Reason::Build),
            "the first want stays"
        );
        w.park(keys(2, true, 7));
        let mut covered = keys(1, true, 9);
        covered.extend(w.take_parked());
        assert!(w.take_parked().is_empty(), "taken once");
        assert_eq!(txids(&covered), vec![7, 8, 9, 10]);
        let task = tokio::spawn(async {
            Ok(WholeDone {
                rows: 3,
                written: 3,
                built: true,
            })
        });
        w.start(WholeWay::Build, covered, task);
        assert!(w.is_running() && w.blocks());
        assert_eq!(w.running().map(|r| r.keys.len()), Some(3));
        let done = w.join().await.expect("no panic").expect("built");
        assert_eq!(done.rows, 3);
        let r = w.ended().expect("it ran");
        assert_eq!((r.reason, r.way), (Reason::Build, WholeWay::Build));
        assert!(!w.blocks());
        assert!(w.ended().is_none());
    }

    #[tokio::test]
    async fn a_build_backs_off_and_a_failed_run_falls_back_until_worked_off() {
        let mut w = WholeRun::new();
        let now = Instant::now();
        w.retry_after(Reason::Backlog, now, Duration::from_secs(5));
        assert_eq!(w.failures(), 1);
        assert_eq!(w.startable(now), None, "not before the backoff");
        assert_eq!(w.next_wake(), Some(now + Duration::from_secs(5)));
        assert_eq!(
            w.startable(now + Duration::from_secs(5)),
            Some(Reason::Backlog)
        );
        w.succeeded(Reason::Backlog);
        assert_eq!(w.failures(), 0);

        let mut w = WholeRun::new();
        let parent = Key::from("plan-1");
        w.fall_back(std::slice::from_ref(&parent));
        assert!(w.expands_anyway(&parent));
        assert!(!w.may_want());
        w.settled(false, true);
        assert!(!w.may_want(), "keys still wait or run");
        w.settled(true, false);
        assert!(!w.may_want(), "a key is quarantined");
        w.settled(true, true);
        assert!(w.may_want(), "worked off");
        w.expanded(&parent);
        assert!(!w.expands_anyway(&parent));
        w.build_failed_by_data("division by zero");
        assert_eq!(w.build_failed(), Some("division by zero"));
        w.succeeded(Reason::Build);
        assert_eq!(w.build_failed(), None);
    }

    #[tokio::test]
    async fn a_sweep_is_covered_by_the_next_run_to_start_never_by_one_running() {
        let mut w = WholeRun::new();
        w.want(Reason::Backlog);
        w.start(
            WholeWay::Replace,
            Vec::new(),
            tokio::spawn(std::future::pending()),
        );
        // Due while a run runs: the running one started before its TRUNCATEs.
        w.want_sweep(vec![3]);
        let r = w.ended().expect("it ran");
        assert_eq!(r.sweep, None);
        assert_eq!(
            w.startable(Instant::now()),
            Some(Reason::Sweep),
            "wanted next"
        );
        w.start(
            WholeWay::Diff,
            Vec::new(),
            tokio::spawn(std::future::pending()),
        );
        w.want_sweep(vec![4]);
        let r = w.ended().expect("it ran");
        assert_eq!(
            r.sweep,
            Some(vec![3]),
            "the sweep it covered, with its pins"
        );
        assert_eq!(
            w.startable(Instant::now()),
            Some(Reason::Sweep),
            "then the next"
        );
        w.start(
            WholeWay::Diff,
            Vec::new(),
            tokio::spawn(std::future::pending()),
        );
        assert_eq!(w.ended().and_then(|r| r.sweep), Some(vec![4]));
        assert!(!w.blocks(), "nothing due any more");
    }

    #[test]
    fn txids_are_each_once_in_order() {
        let mut k = keys(3, true, 9);
        k.extend(keys(2, true, 4));
        assert_eq!(txids(&k), vec![4, 5, 9, 10]);
        assert!(txids(&[]).is_empty());
    }

    #[test]
    fn changed_keys_replace_and_a_sweeps_keys_diff() {
        assert_eq!(backlog_way(&keys(3, true, 1)), WholeWay::Replace);
        assert_eq!(backlog_way(&keys(3, false, 1)), WholeWay::Diff);
        let mut half = keys(2, true, 1);
        half.extend(keys(2, false, 3));
        assert_eq!(backlog_way(&half), WholeWay::Replace);
    }

    #[tokio::test]
    async fn abandoning_cancels_the_run() {
        let mut w = WholeRun::new();
        assert_eq!(w.abandon(), 0);
        w.want(Reason::Backlog);
        let task = tokio::spawn(std::future::pending());
        w.start(WholeWay::Replace, keys(2, true, 1), task);
        assert_eq!(w.abandon(), 2);
        assert!(!w.blocks());
    }
}
