//! `Refresher`: the run loop joining a source, the scheduler, the rebuilds and the acks.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::ack::{AckPolicy, AckTracker, BatchId};
use crate::backoff::Backoff;
use crate::dirty::{Completion, DirtyConfig, DirtySet, Mark, Ready};
use crate::rebuild::{Batched, Due, Enumerate, KeySink, ListAll, PerKey, Rebuild};
use crate::stats::Recorder;
use crate::{Ack, Batch, BoxError, Key, Op, RowEvent, Source, SourceError, Stats};

type ScopeFn = Arc<dyn Fn(&RowEvent, &mut Vec<Key>) + Send + Sync>;
type ReportFn = Arc<dyn Fn(&Report<'_>) + Send + Sync>;

/// Something a refresher wants a person to know; passed to
/// [`Builder::on_error`]. The run goes on after every report.
#[derive(Debug)]
#[non_exhaustive]
pub enum Report<'a> {
    /// A rebuild failed; the key is retried after `retry_in`.
    RebuildFailed {
        /// The key.
        key: &'a Key,
        /// Consecutive failures so far.
        failures: u32,
        /// Delay before the retry.
        retry_in: Duration,
        /// What went wrong.
        error: &'a BoxError,
    },
    /// A key failed `poison_after` times in a row and is quarantined until a reconcile
    /// sweep lists it again. Reported once per quarantine.
    Poisoned {
        /// The key.
        key: &'a Key,
        /// Consecutive failures.
        failures: u32,
        /// The last error.
        error: &'a BoxError,
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
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::RebuildFailed {
                key,
                failures,
                retry_in,
                error,
            } => write!(
                f,
                "rebuild of {key} failed ({failures} in a row), retrying in {retry_in:?}: {error}"
            ),
            Report::Poisoned {
                key,
                failures,
                error,
            } => write!(
                f,
                "key {key} quarantined after {failures} failed rebuilds (a reconcile sweep re-admits it): {error}"
            ),
            Report::Skipped { error } => write!(f, "skipped an undecodable message: {error}"),
            Report::ReconcileFailed { error, retry_in } => {
                write!(
                    f,
                    "reconcile sweep failed, retrying in {retry_in:?}: {error}"
                )
            }
            Report::TruncateIgnored { schema, table } => write!(
                f,
                "{schema}.{table} was truncated but no reconcile sweep is configured: its derived rows may be stale"
            ),
        }
    }
}

/// Why [`Refresher::run`] stopped with an error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunError {
    /// `run` was called a second time; a refresher runs once.
    AlreadyRan,
    /// The source failed for good.
    Source(SourceError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::AlreadyRan => f.write_str("this refresher has already run; build a new one"),
            RunError::Source(e) => write!(f, "source failed: {e}"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::AlreadyRan => None,
            RunError::Source(e) => Some(e),
        }
    }
}

/// Every problem [`Builder::build`] found, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    problems: Vec<String>,
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

#[derive(Clone)]
struct Reconcile {
    every: Duration,
    enumerate: Arc<dyn Enumerate>,
}

/// Configures a [`Refresher`]. `source`, `scope` and `rebuild` are required.
pub struct Builder {
    source: Option<Box<dyn Source>>,
    scope: Option<ScopeFn>,
    rebuild: Option<Arc<dyn Rebuild>>,
    coalesce: Duration,
    max_wait: Duration,
    workers: usize,
    backoff: Backoff,
    poison_after: u32,
    reconcile: Option<Reconcile>,
    on_error: Option<ReportFn>,
    ack: AckPolicy,
    shutdown_grace: Duration,
    problems: Vec<String>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("source", &self.source.is_some())
            .field("scope", &self.scope.is_some())
            .field("rebuild", &self.rebuild.is_some())
            .field("coalesce", &self.coalesce)
            .field("max_wait", &self.max_wait)
            .field("workers", &self.workers)
            .field("backoff", &self.backoff)
            .field("poison_after", &self.poison_after)
            .field("reconcile_every", &self.reconcile.as_ref().map(|r| r.every))
            .field("ack", &self.ack)
            .finish_non_exhaustive()
    }
}

impl Default for Builder {
    fn default() -> Builder {
        let d = DirtyConfig::default();
        Builder {
            source: None,
            scope: None,
            rebuild: None,
            coalesce: d.coalesce,
            max_wait: d.max_wait,
            workers: 4,
            backoff: d.backoff,
            poison_after: d.poison_after,
            reconcile: None,
            on_error: None,
            ack: AckPolicy::default(),
            shutdown_grace: Duration::from_secs(10),
            problems: Vec::new(),
        }
    }
}

impl Builder {
    /// Where changes come from.
    pub fn source(mut self, source: impl Source) -> Builder {
        self.source = Some(Box::new(source));
        self
    }

    /// Maps one row change to the keys it dirties (none, one, or several — an update
    /// that moves a row between scopes dirties the old and the new). Runs inline on the
    /// receive path: keep it pure and quick. [`RowEvent::scope_keys`] does the usual case.
    pub fn scope<F, I>(mut self, scope: F) -> Builder
    where
        F: Fn(&RowEvent) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = Key>,
    {
        self.scope = Some(Arc::new(move |e: &RowEvent, out: &mut Vec<Key>| {
            out.extend(scope(e))
        }));
        self
    }

    /// Recomputes one key from the source tables (idempotently).
    pub fn rebuild<F, Fut, E>(mut self, rebuild: F) -> Builder
    where
        F: Fn(Key) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.rebuild = Some(Arc::new(PerKey::new(rebuild)));
        self
    }

    /// Recomputes up to `max` ready keys in one call (one round trip for many keys).
    /// Single flight still holds per key; when a call fails, each of its keys is retried
    /// in a call of its own, so one bad key cannot keep failing its neighbours.
    pub fn rebuild_batch<F, Fut, E>(mut self, max: usize, rebuild: F) -> Builder
    where
        F: Fn(Vec<Key>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        if max == 0 {
            self.problems
                .push("rebuild_batch size must be at least 1".to_string());
        }
        self.rebuild = Some(Arc::new(Batched::new(max, rebuild)));
        self
    }

    /// Uses a [`Rebuild`] implementation (which also sees transaction ids).
    pub fn rebuild_with(mut self, rebuild: impl Rebuild) -> Builder {
        if rebuild.max_batch() == 0 {
            self.problems
                .push("the rebuild's max_batch must be at least 1".to_string());
        }
        self.rebuild = Some(Arc::new(rebuild));
        self
    }

    /// Quiet period: a key fires once no change has touched it for this long
    /// (default 100 ms). Zero rebuilds at once.
    pub fn coalesce(mut self, d: Duration) -> Builder {
        self.coalesce = d;
        self
    }

    /// Cap: a key fires once it has been dirty this long, however often it changes
    /// (default 5 s). Must be at least `coalesce`.
    pub fn max_wait(mut self, d: Duration) -> Builder {
        self.max_wait = d;
        self
    }

    /// Rebuild calls running at once (default 4).
    pub fn workers(mut self, n: usize) -> Builder {
        self.workers = n;
        self
    }

    /// Retry delays after failed rebuilds (default 100 ms doubling to 30 s, jittered).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Builder {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// Consecutive failures after which a key is quarantined (default 5).
    pub fn poison_after(mut self, n: u32) -> Builder {
        self.poison_after = n;
        self
    }

    /// A reconcile sweep: once at start, then `every`, and at once after a TRUNCATE.
    /// `enumerate` returns every key that should be rebuilt (the live key universe).
    pub fn reconcile<F, Fut, E>(self, every: Duration, enumerate: F) -> Builder
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Key>, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.reconcile_with(every, ListAll::new(enumerate))
    }

    /// A reconcile sweep whose keys are streamed by an [`Enumerate`] (large universes).
    pub fn reconcile_with(mut self, every: Duration, enumerate: impl Enumerate) -> Builder {
        self.reconcile = Some(Reconcile {
            every,
            enumerate: Arc::new(enumerate),
        });
        self
    }

    /// Called for every [`Report`]: failed rebuilds, quarantined keys, skipped messages,
    /// failed sweeps. Without it reports are only counted in [`Stats`].
    pub fn on_error(mut self, f: impl Fn(&Report<'_>) + Send + Sync + 'static) -> Builder {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// When batches are acknowledged to the source (default [`AckPolicy::AfterRebuild`]).
    pub fn ack(mut self, policy: AckPolicy) -> Builder {
        self.ack = policy;
        self
    }

    /// How long a stopping refresher waits for running rebuilds (default 10 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Builder {
        self.shutdown_grace = d;
        self
    }

    /// Checks the configuration and builds the refresher, listing every problem at once.
    pub fn build(self) -> Result<Refresher, BuildError> {
        let mut problems = self.problems;
        if self.source.is_none() {
            problems.push("a source is required (Builder::source)".into());
        }
        if self.scope.is_none() {
            problems.push("a scope function is required (Builder::scope)".into());
        }
        if self.rebuild.is_none() {
            problems.push("a rebuild is required (Builder::rebuild)".into());
        }
        if self.coalesce > self.max_wait {
            problems.push(format!(
                "coalesce ({:?}) must not exceed max_wait ({:?})",
                self.coalesce, self.max_wait
            ));
        }
        if self.workers == 0 {
            problems.push("workers must be at least 1".into());
        }
        if self.poison_after == 0 {
            problems.push("poison_after must be at least 1".into());
        }
        if self.backoff.base.is_zero() {
            problems.push("backoff base must be greater than zero".into());
        }
        if self.backoff.base > self.backoff.max {
            problems.push(format!(
                "backoff base ({:?}) must not exceed backoff max ({:?})",
                self.backoff.base, self.backoff.max
            ));
        }
        if self.reconcile.as_ref().is_some_and(|r| r.every.is_zero()) {
            problems.push("reconcile interval must be greater than zero".into());
        }
        let (Some(source), Some(scope), Some(rebuild), true) =
            (self.source, self.scope, self.rebuild, problems.is_empty())
        else {
            return Err(BuildError { problems });
        };
        let shared = Arc::new(Shared {
            stats: Recorder::new(),
            reconcile: Notify::new(),
            has_reconcile: self.reconcile.is_some(),
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Ok(Refresher {
            parts: Mutex::new(Some(Parts {
                source,
                scope,
                rebuild,
                dirty: DirtyConfig {
                    coalesce: self.coalesce,
                    max_wait: self.max_wait,
                    backoff: self.backoff,
                    poison_after: self.poison_after,
                    seed,
                },
                workers: self.workers,
                reconcile: self.reconcile,
                report: self.on_error,
                ack: self.ack,
                grace: self.shutdown_grace,
            })),
            shared,
        })
    }
}

struct Parts {
    source: Box<dyn Source>,
    scope: ScopeFn,
    rebuild: Arc<dyn Rebuild>,
    dirty: DirtyConfig,
    workers: usize,
    reconcile: Option<Reconcile>,
    report: Option<ReportFn>,
    ack: AckPolicy,
    grace: Duration,
}

#[derive(Debug)]
struct Shared {
    stats: Recorder,
    reconcile: Notify,
    has_reconcile: bool,
}

/// Keeps derived tables fresh: reads batches from a source, maps events to keys,
/// debounces them and runs the rebuilds, acknowledging batches by its [`AckPolicy`].
///
/// See the [crate docs](crate) for an example.
pub struct Refresher {
    parts: Mutex<Option<Parts>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Refresher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresher").finish_non_exhaustive()
    }
}

/// A cloneable view of a running [`Refresher`]: stats and on-demand sweeps.
#[derive(Debug, Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl Handle {
    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    /// Asks for a reconcile sweep now (after the running one, if any). Returns false when
    /// no reconcile is configured.
    pub fn reconcile_now(&self) -> bool {
        if self.shared.has_reconcile {
            self.shared.reconcile.notify_one();
        }
        self.shared.has_reconcile
    }
}

impl Refresher {
    /// A builder with the default options.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A handle for stats and on-demand sweeps, usable while `run` runs.
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    /// Runs until `shutdown` completes, the source fails for good, or the source ends
    /// and every dirty key has been rebuilt (poisoned keys aside).
    ///
    /// On shutdown or failure it stops taking batches, lets running rebuilds finish
    /// within the shutdown grace, releases the acks they earned and closes the source.
    /// Dirty keys not yet rebuilt stay unacknowledged, so a restart replays them.
    /// A refresher runs once: a second call returns [`RunError::AlreadyRan`].
    pub async fn run<S>(&self, shutdown: S) -> Result<(), RunError>
    where
        S: Future<Output = ()> + Send,
    {
        let parts = self
            .parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(RunError::AlreadyRan)?;
        let (runner, source) = Runner::new(parts, self.shared.clone());
        runner.run(source, shutdown).await
    }
}

/// Aborts a spawned task when dropped (a dropped run future is a crash, not a leak).
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads the source on its own task so that a slow source never stalls the scheduler
/// and the scheduler never cancels a half-read batch.
async fn pump(
    mut source: Box<dyn Source>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut stopped = false;
    loop {
        let item = tokio::select! {
            biased;
            _ = &mut stop => {
                stopped = true;
                break;
            }
            item = source.next_batch() => item,
        };
        let Some(item) = item else { break };
        let fatal = item.is_err();
        tokio::select! {
            biased;
            _ = &mut stop => {
                stopped = true;
                break;
            }
            sent = tx.send(item) => if sent.is_err() { break },
        }
        if fatal {
            break;
        }
    }
    drop(tx);
    if !stopped {
        // Close only once the refresher has released its last acks.
        let _ = stop.await;
    }
    source.close().await;
}

struct JobKey {
    key: Key,
    first_dirty: std::time::Instant,
    covered: Option<BatchId>,
}

type JobOutput = (Vec<Due>, Result<(), BoxError>);

struct Sweep {
    rx: mpsc::Receiver<Key>,
    task: JoinHandle<Result<(), BoxError>>,
    /// TRUNCATE batches this sweep must cover before they may be acknowledged.
    pins: Vec<BatchId>,
}

impl Drop for Sweep {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Runner {
    scope: ScopeFn,
    rebuild: Arc<dyn Rebuild>,
    max_batch: usize,
    workers: usize,
    reconcile: Option<Reconcile>,
    report: Option<ReportFn>,
    grace: Duration,
    shared: Arc<Shared>,
    dirty: DirtySet,
    backoff: Backoff,
    /// `None` under `OnEnqueue`.
    tracker: Option<AckTracker<Ack>>,
    /// Transaction ids behind each dirty key, for the rebuild's visibility check.
    txids: HashMap<Key, Vec<u64>>,
    jobs: JoinSet<JobOutput>,
    job_keys: HashMap<tokio::task::Id, Vec<JobKey>>,
    /// A retrying key popped while gathering a batch; it runs alone next.
    solo: Option<Ready>,
    sweep: Option<Sweep>,
    sweep_again: bool,
    sweep_pins: Vec<BatchId>,
    sweep_failures: u32,
    next_sweep: Option<Instant>,
    source_done: bool,
    scratch: Vec<Key>,
}

impl Runner {
    fn new(p: Parts, shared: Arc<Shared>) -> (Runner, Box<dyn Source>) {
        let now = Instant::now();
        let runner = Runner {
            max_batch: p.rebuild.max_batch().max(1),
            scope: p.scope,
            rebuild: p.rebuild,
            workers: p.workers,
            next_sweep: p.reconcile.as_ref().map(|_| now),
            reconcile: p.reconcile,
            report: p.report,
            grace: p.grace,
            shared,
            dirty: DirtySet::new(p.dirty, now.into_std()),
            backoff: p.dirty.backoff,
            tracker: match p.ack {
                AckPolicy::AfterRebuild => Some(AckTracker::new()),
                AckPolicy::OnEnqueue => None,
            },
            txids: HashMap::new(),
            jobs: JoinSet::new(),
            job_keys: HashMap::new(),
            solo: None,
            sweep: None,
            sweep_again: false,
            sweep_pins: Vec::new(),
            sweep_failures: 0,
            source_done: false,
            scratch: Vec::new(),
        };
        (runner, p.source)
    }

    fn report(&self, r: Report<'_>) {
        if let Some(f) = &self.report {
            f(&r);
        }
    }

    async fn run<S>(mut self, source: Box<dyn Source>, shutdown: S) -> Result<(), RunError>
    where
        S: Future<Output = ()> + Send,
    {
        let (batch_tx, mut batch_rx) = mpsc::channel(4);
        let (stop_tx, stop_rx) = oneshot::channel();
        let pump_task = tokio::spawn(pump(source, batch_tx, stop_rx));
        let _pump_guard = AbortOnDrop(pump_task.abort_handle());
        tokio::pin!(shutdown);
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        let mut keybuf = Vec::with_capacity(1024);
        let mut failure = None;
        let mut armed: Option<Instant> = None;

        loop {
            Recorder::add(&self.shared.stats.wakeups, 1);
            let now = Instant::now();
            self.maybe_start_sweep(now);
            self.dispatch(now);
            self.release_acks();
            self.publish_gauges();
            if self.source_done && self.drained() {
                break;
            }
            let wake = self.next_wake();
            if let Some(w) = wake
                && armed != Some(w)
            {
                sleep.as_mut().reset(w);
                armed = Some(w);
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(done) = self.jobs.join_next_with_id() => self.finish_job(done),
                n = recv_sweep(&mut self.sweep, &mut keybuf), if self.sweep.is_some() => {
                    if n == 0 {
                        self.finish_sweep().await;
                    } else {
                        self.mark_swept(&mut keybuf);
                    }
                }
                msg = batch_rx.recv(), if !self.source_done => match msg {
                    Some(Ok(batch)) => self.on_batch(batch),
                    Some(Err(e)) => {
                        failure = Some(RunError::Source(e));
                        break;
                    }
                    None => self.source_ended(),
                },
                _ = &mut sleep, if wake.is_some() => armed = None,
                _ = self.shared.reconcile.notified() => self.request_sweep(),
            }
        }

        // Stop: no new batches or rebuilds; running rebuilds get the grace period.
        drop(batch_rx);
        self.sweep = None;
        let deadline = Instant::now() + self.grace;
        while !self.jobs.is_empty() {
            tokio::select! {
                Some(done) = self.jobs.join_next_with_id() => self.finish_job(done),
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.release_acks();
        self.jobs.abort_all();
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(self.grace, pump_task).await;
        self.publish_gauges();
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn drained(&self) -> bool {
        self.dirty.is_idle()
            && self.jobs.is_empty()
            && self.solo.is_none()
            && self.sweep.is_none()
            && self.sweep_pins.is_empty()
            && !self.sweep_again
    }

    fn next_wake(&mut self) -> Option<Instant> {
        // With every worker busy a due key cannot start: a finishing rebuild wakes the
        // loop instead. Arming the timer for a deadline already past would spin.
        let workers_free = self.jobs.len() < self.workers && self.solo.is_none();
        let due = if workers_free {
            self.dirty.next_deadline().map(Instant::from_std)
        } else {
            None
        };
        let sweep = if self.sweep.is_none() {
            self.next_sweep
        } else {
            None
        };
        match (due, sweep) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_batch(&mut self, batch: Batch) {
        let now = Instant::now().into_std();
        let (events, skipped, ack) = batch.into_parts();
        let st = &self.shared.stats;
        Recorder::add(&st.batches_received, 1);
        Recorder::add(&st.events_received, events.len() as u64);
        Recorder::add(&st.events_skipped, skipped.len() as u64);
        st.touch_event();
        for error in &skipped {
            self.report(Report::Skipped { error });
        }
        let (id, ack) = match &mut self.tracker {
            Some(t) => (Some(t.receive(ack)), None),
            None => (None, Some(ack)),
        };
        let mut keys = std::mem::take(&mut self.scratch);
        for event in events.iter() {
            if event.op == Op::Truncate {
                self.on_truncate(event, id);
                continue;
            }
            keys.clear();
            (self.scope)(event, &mut keys);
            for key in keys.drain(..) {
                self.mark(key, now, id, event.tx.map(|t| t.id));
            }
        }
        self.scratch = keys;
        if let Some(ack) = ack {
            ack.ack();
            Recorder::add(&self.shared.stats.batches_acked, 1);
        }
    }

    fn mark(
        &mut self,
        key: Key,
        now: std::time::Instant,
        batch: Option<BatchId>,
        txid: Option<u64>,
    ) {
        let st = &self.shared.stats;
        if self.dirty.mark(&key, now) == Mark::Ignored {
            Recorder::add(&st.keys_ignored, 1);
            return;
        }
        Recorder::add(&st.keys_marked, 1);
        if let (Some(t), Some(id)) = (&mut self.tracker, batch) {
            t.hold(&key, id);
        }
        if let Some(txid) = txid {
            let ids = self.txids.entry(key).or_default();
            if ids.last() != Some(&txid) {
                ids.push(txid);
            }
        }
    }

    fn on_truncate(&mut self, event: &RowEvent, batch: Option<BatchId>) {
        Recorder::add(&self.shared.stats.truncates, 1);
        if self.reconcile.is_none() {
            self.report(Report::TruncateIgnored {
                schema: &event.schema,
                table: &event.table,
            });
            return;
        }
        if let (Some(t), Some(id)) = (&mut self.tracker, batch) {
            // The batch stays unacknowledged until a sweep that starts after it has listed
            // its keys and they have been rebuilt.
            t.hold_batch(id);
            self.sweep_pins.push(id);
        }
        self.request_sweep();
    }

    fn source_ended(&mut self) {
        self.source_done = true;
        // Periodic sweeps stop with the source; requested ones still run.
        if self.sweep_pins.is_empty() && !self.sweep_again {
            self.next_sweep = None;
        }
    }

    fn request_sweep(&mut self) {
        if self.reconcile.is_none() {
            return;
        }
        if self.sweep.is_some() {
            self.sweep_again = true;
        } else {
            self.next_sweep = Some(Instant::now());
        }
    }

    fn maybe_start_sweep(&mut self, now: Instant) {
        let (Some(rec), None, Some(at)) = (&self.reconcile, &self.sweep, self.next_sweep) else {
            return;
        };
        if at > now {
            return;
        }
        let (tx, rx) = mpsc::channel(1024);
        let enumerate = rec.enumerate.clone();
        let task = tokio::spawn(async move { enumerate.enumerate(KeySink::new(tx)).await });
        self.sweep = Some(Sweep {
            rx,
            task,
            pins: std::mem::take(&mut self.sweep_pins),
        });
        self.next_sweep = None;
    }

    fn mark_swept(&mut self, keys: &mut Vec<Key>) {
        let now = Instant::now().into_std();
        let pin = self
            .sweep
            .as_ref()
            .and_then(|s| s.pins.iter().min().copied());
        let st = &self.shared.stats;
        Recorder::add(&st.reconcile_keys, keys.len() as u64);
        for key in keys.drain(..) {
            if self.dirty.revive(&key, now) == Mark::Ignored {
                continue;
            }
            Recorder::add(&self.shared.stats.keys_marked, 1);
            if let (Some(t), Some(id)) = (&mut self.tracker, pin) {
                t.hold(&key, id);
            }
        }
    }

    async fn finish_sweep(&mut self) {
        let Some(mut sweep) = self.sweep.take() else {
            return;
        };
        let result = match (&mut sweep.task).await {
            Ok(r) => r,
            Err(e) => Err(format!("reconcile task failed: {e}").into()),
        };
        let now = Instant::now();
        let every = self.reconcile.as_ref().map_or(Duration::MAX, |r| r.every);
        let pins = std::mem::take(&mut sweep.pins);
        match result {
            Ok(()) => {
                Recorder::add(&self.shared.stats.reconciles, 1);
                self.sweep_failures = 0;
                if let Some(t) = &mut self.tracker {
                    for id in pins {
                        t.unhold_batch(id);
                    }
                }
                self.next_sweep = (!self.source_done).then(|| now + every);
            }
            Err(error) => {
                Recorder::add(&self.shared.stats.reconcile_failures, 1);
                self.sweep_failures += 1;
                let retry_in = self.backoff.ceiling(self.sweep_failures).min(every);
                self.report(Report::ReconcileFailed {
                    error: &error,
                    retry_in,
                });
                // Still pinned: the retry must cover these TRUNCATEs.
                self.sweep_pins.extend(pins);
                self.next_sweep = Some(now + retry_in);
            }
        }
        if std::mem::take(&mut self.sweep_again) {
            self.next_sweep = Some(now);
        }
    }

    fn start_key(&mut self, ready: Ready) -> (JobKey, Due) {
        let covered = self.tracker.as_mut().and_then(|t| t.start(&ready.key));
        let txids = self.txids.remove(&ready.key).unwrap_or_default();
        let due = Due {
            key: ready.key.clone(),
            txids,
        };
        let job = JobKey {
            key: ready.key,
            first_dirty: ready.first_dirty,
            covered,
        };
        (job, due)
    }

    fn dispatch(&mut self, now: Instant) {
        let now = now.into_std();
        while self.jobs.len() < self.workers {
            let first = match self.solo.take() {
                Some(r) => r,
                None => match self.dirty.pop_ready(now) {
                    Some(r) => r,
                    None => break,
                },
            };
            let alone = first.failures > 0;
            let (mut meta, mut due) = (Vec::new(), Vec::new());
            let (m, d) = self.start_key(first);
            meta.push(m);
            due.push(d);
            while !alone && due.len() < self.max_batch {
                match self.dirty.pop_ready(now) {
                    Some(r) if r.failures > 0 => {
                        self.solo = Some(r);
                        break;
                    }
                    Some(r) => {
                        let (m, d) = self.start_key(r);
                        meta.push(m);
                        due.push(d);
                    }
                    None => break,
                }
            }
            let rebuild = self.rebuild.clone();
            let handle = self.jobs.spawn(async move {
                let result = rebuild.rebuild(&due).await;
                (due, result)
            });
            self.job_keys.insert(handle.id(), meta);
            Recorder::add(&self.shared.stats.rebuild_calls, 1);
        }
    }

    fn finish_job(&mut self, done: Result<(tokio::task::Id, JobOutput), tokio::task::JoinError>) {
        let (id, dues, result) = match done {
            Ok((id, (dues, result))) => (id, dues, result),
            Err(e) => {
                let error: BoxError = format!("rebuild task failed: {e}").into();
                (e.id(), Vec::new(), Err(error))
            }
        };
        let Some(meta) = self.job_keys.remove(&id) else {
            return;
        };
        let now = Instant::now().into_std();
        let mut dues = dues.into_iter();
        let shared = self.shared.clone();
        let st = &shared.stats;
        match &result {
            Ok(()) => {
                for m in meta {
                    self.dirty.complete(&m.key, true, now);
                    if let Some(t) = &mut self.tracker {
                        t.succeeded(m.covered);
                    }
                    st.freshness
                        .record(now.saturating_duration_since(m.first_dirty));
                    Recorder::add(&st.rebuilds_ok, 1);
                }
                st.touch_rebuild();
            }
            Err(error) => {
                for m in meta {
                    let txids = dues.next().map(|d| d.txids).unwrap_or_default();
                    Recorder::add(&st.rebuilds_failed, 1);
                    match self.dirty.complete(&m.key, false, now) {
                        Completion::Poisoned => {
                            if let Some(t) = &mut self.tracker {
                                t.forget(&m.key, m.covered);
                            }
                            self.txids.remove(&m.key);
                            Recorder::add(&st.keys_poisoned, 1);
                            self.report(Report::Poisoned {
                                key: &m.key,
                                failures: self.dirty.config().poison_after,
                                error,
                            });
                        }
                        Completion::Retry { at, failures } => {
                            if let Some(t) = &mut self.tracker {
                                t.failed(&m.key, m.covered);
                            }
                            self.restore_txids(&m.key, txids);
                            self.report(Report::RebuildFailed {
                                key: &m.key,
                                failures,
                                retry_in: at.saturating_duration_since(now),
                                error,
                            });
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    fn restore_txids(&mut self, key: &Key, mut older: Vec<u64>) {
        if let Some(newer) = self.txids.remove(key) {
            older.extend(newer);
        }
        if !older.is_empty() {
            self.txids.insert(key.clone(), older);
        }
    }

    fn release_acks(&mut self) {
        let Some(t) = &mut self.tracker else { return };
        let acks = t.release();
        if acks.is_empty() {
            return;
        }
        let n = acks.len() as u64;
        for ack in acks {
            ack.ack();
        }
        Recorder::add(&self.shared.stats.batches_acked, n);
    }

    fn publish_gauges(&self) {
        let st = &self.shared.stats;
        Recorder::set(&st.dirty, self.dirty.queued() as u64);
        Recorder::set(&st.in_flight, self.dirty.running() as u64);
        Recorder::set(&st.poisoned, self.dirty.poisoned() as u64);
        let unacked = self.tracker.as_ref().map_or(0, |t| t.unreleased());
        Recorder::set(&st.unacked_batches, unacked as u64);
    }
}

async fn recv_sweep(sweep: &mut Option<Sweep>, buf: &mut Vec<Key>) -> usize {
    match sweep {
        Some(s) => s.rx.recv_many(buf, 1024).await,
        None => std::future::pending().await,
    }
}
