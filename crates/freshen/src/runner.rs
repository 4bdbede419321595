//! The run loop: joins the source, the scheduler ([`DirtySet`]), the rebuilds, the
//! sweeps ([`Sweeper`]) and the acks ([`AckTracker`]).
//!
//! One task owns all of that state; rebuilds run on spawned tasks and report back. The
//! loop wakes for a batch, a finished rebuild, a swept key, a timer or a [`Handle`]
//! command, and never polls.
//!
//! Failures, by whose fault they are ([`Retry`]):
//!
//! | failure       | the key                               | the view                                   |
//! |---------------|---------------------------------------|--------------------------------------------|
//! | `Key`         | backoff; quarantined after `poison_after` | goes on                                |
//! | `Path`, `Fix` | backoff, never quarantined            | stalled: one rebuild at a time until one succeeds |
//!
//! A quarantined key releases the acknowledgements it holds only when a reconcile sweep
//! will heal it; without one its transactions stay unconfirmed until a change to it
//! rebuilds it (or [`Builder::release_quarantined_after`](crate::Builder) passes).
//!
//! The loop owns its parts, each with its own state and tests, and delegates to them:
//!
//! | part | what it keeps |
//! |---|---|
//! | [`jobs`] | the running calls (rebuilds and fan-out calls), their keys, the workers |
//! | [`fanout`] | the fan-outs, the keys their calls send, the holds those keys take over |
//! | [`quarantine`] | the quarantine list's count, the quarantined keys holding acks |
//! | [`pause`] | watched tables, schema pauses and the batches they hold, gaps |
//! | [`progress`] | the listing sweep's keys and start |
//! | [`txids`] | the transaction ids behind each dirty key |
//! | [`gauges`] | what the gauges last published |
//! | [`choice`] | the view's rates, and whether a backlog goes to the whole table |
//! | [`whole`] | whole-table runs (a first build, a backlog or fan-out past the threshold) and the keys they cover |
//!
//! The scheduler ([`DirtySet`]), the sweeps ([`Sweeper`]) and the acks ([`AckTracker`])
//! are parts of their own outside this folder; what joins them — which batch a key
//! holds, when a hold moves from one to another — stays here, in one place.
//!
//! [`Handle`]: crate::Handle

mod bisect;
mod choice;
mod fanout;
mod gauges;
mod jobs;
mod marking;
mod pause;
mod progress;
mod quarantine;
mod txids;
mod whole;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::bisect::Halves;
use self::choice::Choice;
use self::fanout::{FanOutStage, takes_fanned};
use self::gauges::{Gauges, Readings};
use self::jobs::{AbortOnDrop, JobKey, JobOutput, Jobs};
use self::marking::Marking;
use self::pause::Pauses;
use self::progress::SweepProgress;
use self::quarantine::Quarantine;
use self::txids::Txids;
use self::whole::{LargeFanOut, Reason, WholeRun};
use crate::ack::{AckPolicy, AckTracker, BatchId};
use crate::dirty::{Completion, DirtySet, Mark, Outcome, Ready};
use crate::parts::{Parts, ReportFn, ScopeFn};
use crate::pump::pump;
use crate::rebuild::{Due, Whole, WholeDone, WholeWay};
use crate::shared::{Command, Quarantined, Shared};
use crate::stats::Recorder;
use crate::sweep::{Finished, Sweeper};
use crate::{
    Ack, Batch, BoxError, Gap, Key, Op, Report, Retry, RowEvent, RunError, SchemaChange, Source,
};

/// The user's report callback, if any.
struct Reporter(Option<ReportFn>);

impl Reporter {
    fn report(&self, r: Report<'_>) {
        if let Some(f) = &self.0 {
            f(&r);
        }
    }
}

/// Rebuilds fail for a reason that is not the key's.
struct Stall {
    since: std::time::Instant,
}

/// The loop's state. Fields drop in declaration order, the order the loop has always
/// torn down in when its future is dropped (a crash): the fan-out channel, then the
/// acks, then the running calls, then the sweep.
pub(crate) struct Runner {
    gauges: Gauges,
    /// Keys the running sweep listed so far, and when it began (for its report).
    progress: SweepProgress,
    scope: ScopeFn,
    fanout: FanOutStage,
    report: Reporter,
    grace: Duration,
    shared: Arc<Shared>,
    dirty: DirtySet,
    /// `None` under `OnEnqueue`.
    tracker: Option<AckTracker<Ack>>,
    /// Transaction ids behind each dirty key, for the rebuild's visibility check.
    txids: Txids,
    /// The running calls.
    jobs: Jobs,
    /// A retrying key popped while gathering a batch; it runs alone next.
    solo: Option<Ready>,
    /// Failed calls' keys waiting to be retried in halves; they run before new keys.
    halves: Halves<(JobKey, Due)>,
    sweeper: Sweeper,
    stall: Option<Stall>,
    quarantine: Quarantine,
    source_done: bool,
    scratch: Vec<Key>,
    /// The keys one batch (of changes, or of fanned keys) dirties, marked at once.
    marking: Marking,
    pauses: Pauses,
    /// Which way a backlog goes, from what was measured.
    choice: Choice,
    /// The rebuild's whole-table way, if it has one.
    whole_way: Option<Arc<dyn Whole>>,
    /// Whole-table runs and the keys they cover.
    whole: WholeRun,
}

impl Runner {
    pub(crate) fn new(p: Parts, shared: Arc<Shared>) -> (Runner, Box<dyn Source>) {
        let now = Instant::now();
        let whole_way = p.rebuild.whole();
        let choice = Choice::new(p.rebuild_by, whole_way.is_some());
        let mut whole = WholeRun::new();
        if choice.whole_possible() {
            // An empty (or new) derived table is built in one statement before any key
            // is rebuilt; a table that holds rows only reports its size.
            whole.want(Reason::Build);
        }
        let runner = Runner {
            jobs: Jobs::new(p.rebuild, p.dirty.coalesce, p.workers),
            scope: p.scope,
            fanout: FanOutStage::new(p.fanouts),
            sweeper: Sweeper::new(p.reconcile, p.dirty.backoff, now),
            progress: SweepProgress::default(),
            gauges: Gauges::default(),
            report: Reporter(p.report),
            grace: p.grace,
            shared,
            dirty: DirtySet::new(p.dirty, now.into_std()),
            tracker: match p.ack {
                AckPolicy::AfterRebuild => Some(AckTracker::new()),
                AckPolicy::OnEnqueue => None,
            },
            txids: Txids::default(),
            solo: None,
            halves: Halves::default(),
            stall: None,
            quarantine: Quarantine::new(p.release_quarantined_after),
            source_done: false,
            scratch: Vec::new(),
            marking: Marking::default(),
            pauses: Pauses::new(p.watched),
            choice,
            whole_way,
            whole,
        };
        (runner, p.source)
    }

    fn report(&self, r: Report<'_>) {
        self.report.report(r);
    }

    pub(crate) async fn run<S>(
        mut self,
        source: Box<dyn Source>,
        shutdown: S,
    ) -> Result<(), RunError>
    where
        S: Future<Output = ()> + Send,
    {
        let (batch_tx, mut batch_rx) = mpsc::channel(4);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // The source is read on its own task: a slow source never stalls the scheduler,
        // and the scheduler never cancels a half-read batch.
        let pump_task = tokio::spawn(pump(source, vec![batch_tx], async {
            let _ = stop_rx.await;
        }));
        let _pump_guard = AbortOnDrop(pump_task.abort_handle());
        tokio::pin!(shutdown);
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        let mut keybuf = Vec::with_capacity(1024);
        let mut fanbuf = Vec::with_capacity(1024);
        let fanning = self.fanout.stages() > 0;
        let mut failure = None;
        let mut armed: Option<Instant> = None;
        let shared = self.shared.clone();

        loop {
            Recorder::add(&self.shared.stats.wakeups, 1);
            let now = Instant::now();
            self.commands(now);
            if !self.pauses.is_paused() {
                // A view that can recompute its whole table takes a due sweep whole: one
                // diff of the table, no key listed.
                if self.may_go_whole()
                    && let Some(pins) = self.sweeper.take_due(now)
                {
                    self.report(Report::SweepStarted);
                    self.whole.want_sweep(pins);
                }
                self.sweeper.maybe_start(now);
            }
            if self.sweeper.is_listing() && self.progress.began().is_none() {
                // Its report says how long listing took, from here.
                self.progress.begin(now);
                self.report(Report::SweepStarted);
            }
            self.release_expired_holds(now.into_std());
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
            let listing = self.sweeper.is_listing();
            let take_fanned = fanning && self.takes_fanned();
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(done) = self.jobs.join_next() => self.finish_job(done),
                done = self.whole.join(), if self.whole.is_running() => self.finish_whole(done),
                n = self.fanout.recv(&mut fanbuf), if take_fanned => {
                    if n > 0 {
                        self.mark_fanned(&mut fanbuf);
                    }
                }
                n = self.sweeper.recv(&mut keybuf), if listing => {
                    if n == 0 {
                        self.finish_sweep().await;
                    } else {
                        self.mark_swept(&mut keybuf);
                    }
                }
                msg = batch_rx.recv(), if !self.source_done => match msg {
                    Some(Ok(batch)) => self.on_batch(batch),
                    // An outage the source retries by itself: said, and read on.
                    Some(Err(e)) if !e.is_final() => self.report(Report::SourceFailed { error: &e }),
                    Some(Err(e)) => {
                        failure = Some(RunError::Source(e));
                        break;
                    }
                    None => self.source_ended(),
                },
                _ = &mut sleep, if wake.is_some() => armed = None,
                _ = shared.wake.notified() => {}
            }
        }

        // Stop: no new batches or rebuilds; running rebuilds get the grace period.
        drop(batch_rx);
        self.sweeper.stop();
        let deadline = Instant::now() + self.grace;
        while !self.jobs.is_empty() || self.whole.is_running() {
            tokio::select! {
                Some(done) = self.jobs.join_next() => self.finish_job(done),
                done = self.whole.join(), if self.whole.is_running() => self.finish_whole(done),
                // A fan-out call finishing in the grace period must not block on a full
                // buffer; its keys keep its holds (nothing is rebuilt any more).
                n = self.fanout.recv(&mut fanbuf), if fanning => {
                    if n > 0 {
                        self.mark_fanned(&mut fanbuf);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.release_acks();
        // Dropping a rebuild future cancels it (SqlRebuild cancels on the server).
        let abandoned = self.jobs.abandoned() + self.halves.keys() + self.whole.abandon();
        Recorder::add(&self.shared.stats.abandoned, abandoned as u64);
        self.jobs.abort_all().await;
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(self.grace, pump_task).await;
        self.publish_gauges();
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether fanned keys are taken in now: see [`takes_fanned`].
    fn takes_fanned(&self) -> bool {
        takes_fanned(self.dirty.queued(), self.jobs.fanning(), self.capacity())
    }

    fn drained(&self) -> bool {
        self.dirty.is_idle()
            && self.jobs.is_empty()
            && self.solo.is_none()
            && self.halves.is_empty()
            && self.sweeper.is_idle()
            && !self.whole.blocks()
    }

    /// How many rebuild calls may run now: none while paused, one while the view is
    /// stalled (a probe, so that an outage is not hammered by every worker), else
    /// `workers`.
    fn capacity(&self) -> usize {
        // A whole-table run writes every row: nothing else of the view runs beside it.
        if self.whole.blocks() {
            return 0;
        }
        self.jobs
            .capacity(self.pauses.is_paused(), self.stall.is_some())
    }

    fn next_wake(&mut self) -> Option<Instant> {
        // With every worker busy a due key cannot start: a finishing rebuild wakes the
        // loop instead. Arming the timer for a deadline already past would spin.
        let workers_free = self.jobs.len() < self.capacity() && self.solo.is_none();
        let due = if workers_free {
            self.dirty.next_deadline().map(Instant::from_std)
        } else {
            None
        };
        let release = self.quarantine.next_release();
        // A paused view starts no sweep: waking for one would spin.
        let sweep = if !self.pauses.is_paused() {
            self.sweeper.next_wake()
        } else {
            None
        };
        [
            due,
            sweep,
            release,
            self.whole.next_wake().map(Instant::from_std),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn commands(&mut self, now: Instant) {
        for c in self.shared.take_commands() {
            match c {
                Command::Sweep => self.sweeper.request(now),
                Command::Readmit(key) => {
                    if self.dirty.revive(&key, now.into_std()) == Mark::Revived {
                        self.unquarantine(&key);
                        Recorder::add(&self.shared.stats.keys_marked, 1);
                    }
                }
                Command::Rebuild(key) => {
                    match self.dirty.revive(&key, now.into_std()) {
                        Mark::Revived => {
                            self.unquarantine(&key);
                        }
                        Mark::Unchanged => continue,
                        _ => {}
                    }
                    Recorder::add(&self.shared.stats.keys_marked, 1);
                }
                Command::AcknowledgeGaps(seen) => {
                    self.pauses.acknowledge_gaps(&seen, &self.shared.stats);
                }
            }
        }
    }

    fn on_batch(&mut self, batch: Batch) {
        let now = Instant::now().into_std();
        let gaps = batch.gaps().to_vec();
        let changes = batch.schema_changes().to_vec();
        let mut batch = batch;
        let scoped = batch.take_keys();
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
        for change in &changes {
            self.on_schema_change(change);
        }
        for gap in &gaps {
            self.on_gap(gap, id);
        }
        if self.pauses.is_paused()
            && let (Some(t), Some(id)) = (&mut self.tracker, id)
        {
            t.hold_batch(id);
            self.pauses.hold(id);
        }
        // Every key the batch dirties is marked in one `mark_many`, which overlaps the
        // index probes of the batch's new keys instead of waiting for each in turn.
        let mut keys = std::mem::take(&mut self.scratch);
        let mut marking = std::mem::take(&mut self.marking);
        for event in events.iter() {
            if event.op == Op::Truncate {
                self.on_truncate(event, id);
                continue;
            }
            let txid = event.tx.map(|t| t.id);
            keys.clear();
            (self.scope)(event, &mut keys);
            for key in keys.drain(..) {
                marking.push(key, id, txid);
            }
            for stage in 0..self.fanout.stages() {
                self.fanout.scope(stage, event, &mut keys);
                for parent in keys.drain(..) {
                    marking.push(Key::staged(stage, &parent), id, txid);
                }
            }
        }
        self.scratch = keys;
        for k in scoped {
            marking.push(k.key, id, k.txid);
        }
        self.mark_all(&mut marking, now);
        self.marking = marking;
        if let Some(ack) = ack {
            ack.ack();
            Recorder::add(&self.shared.stats.batches_acked, 1);
        }
    }

    /// Marks every key of `marking` at once (`DirtySet::mark_many`), then holds each
    /// one's batch and records its transaction id; empties `marking`.
    fn mark_all(&mut self, marking: &mut Marking, now: std::time::Instant) {
        Recorder::add(&self.shared.stats.keys_marked, marking.len() as u64);
        self.dirty.mark_many(marking.keys(), now);
        for (key, hold, txid) in marking.drain() {
            if let (Some(t), Some(id)) = (&mut self.tracker, hold) {
                t.hold(&key, id);
            }
            if let Some(txid) = txid {
                self.txids.add(key, txid);
            }
        }
    }

    /// Marks keys sent by fan-out calls, each taking over its call's hold. A call that
    /// already finished left no entry: it failed or was abandoned, and its parent keys
    /// kept their holds, so its stragglers need none.
    fn mark_fanned(&mut self, keys: &mut Vec<(u64, Key)>) {
        let now = Instant::now().into_std();
        Recorder::add(&self.shared.stats.fanout_keys, keys.len() as u64);
        let mut marking = std::mem::take(&mut self.marking);
        for (call, key) in keys.drain(..) {
            marking.push(key, self.fanout.hold(call), None);
        }
        self.mark_all(&mut marking, now);
        self.marking = marking;
    }

    fn on_truncate(&mut self, event: &RowEvent, batch: Option<BatchId>) {
        if !self.pauses.concerns(&event.schema, &event.table) {
            return;
        }
        Recorder::add(&self.shared.stats.truncates, 1);
        if !self.sweeper.is_configured() {
            self.report(Report::TruncateIgnored {
                schema: &event.schema,
                table: &event.table,
            });
            return;
        }
        self.sweep_covering(batch);
    }

    /// Rows of a table changed that the stream did not carry: sweep, as after a TRUNCATE.
    fn on_gap(&mut self, gap: &Gap, batch: Option<BatchId>) {
        if !self.pauses.concerns(&gap.schema, &gap.table) {
            return;
        }
        Recorder::add(&self.shared.stats.gaps, 1);
        let swept = self.sweeper.is_configured();
        if swept {
            self.sweep_covering(batch);
        } else {
            // Nothing will find the keys it dirtied: the view says so until a person
            // acts, and never looks healthy meanwhile.
            self.pauses.unhealed(gap, &self.shared.stats);
        }
        if self.pauses.first_gap(gap) {
            self.report(Report::Gap { gap, swept });
        }
    }

    /// A table's shape changed: pause the view when the change breaks its key, resume it
    /// when a later change undoes that.
    fn on_schema_change(&mut self, change: &SchemaChange) {
        if self
            .pauses
            .on_schema_change(change, &self.shared.stats, &self.report)
        {
            self.resume();
        }
    }

    /// The last pause ended. Changes that arrived while a key column was gone gave no
    /// key: a sweep finds them, and the batches they came in wait for it (without a
    /// sweep they go, and only later changes heal those scopes).
    fn resume(&mut self) {
        let held = self.pauses.take_holds();
        if self.sweeper.is_configured() {
            for id in held {
                self.sweeper.pin(id);
            }
            self.sweeper.request(Instant::now());
        } else if let Some(t) = &mut self.tracker {
            for id in held {
                t.unhold_batch(id);
            }
        }
    }

    /// Asks for a sweep that `batch` waits for before it may be acknowledged.
    fn sweep_covering(&mut self, batch: Option<BatchId>) {
        if let (Some(t), Some(id)) = (&mut self.tracker, batch) {
            // The batch stays unacknowledged until a sweep that starts after it has listed
            // its keys and they have been rebuilt.
            t.hold_batch(id);
            self.sweeper.pin(id);
        }
        self.sweeper.request(Instant::now());
    }

    fn source_ended(&mut self) {
        self.source_done = true;
        self.sweeper.source_ended();
    }

    fn mark_swept(&mut self, keys: &mut Vec<Key>) {
        let now = Instant::now().into_std();
        let pin = self.sweeper.covering();
        let st = &self.shared.stats;
        Recorder::add(&st.reconcile_keys, keys.len() as u64);
        if let Some((keys, took)) = self.progress.listed_more(keys.len() as u64) {
            self.report(Report::SweepProgress { keys, took });
        }
        let (mut revived, mut marked) = (Vec::new(), 0);
        self.dirty.revive_many(keys, now, |key, mark| {
            if mark == Mark::Revived {
                revived.push(key.clone());
            }
            if mark != Mark::Unchanged {
                marked += 1;
            }
        });
        Recorder::add(&self.shared.stats.keys_marked, marked);
        for key in &revived {
            self.unquarantine(key);
        }
        for key in keys.drain(..) {
            if let (Some(t), Some(id)) = (&mut self.tracker, pin) {
                t.hold(&key, id);
            }
        }
    }

    async fn finish_sweep(&mut self) {
        match self.sweeper.finish(self.source_done).await {
            Finished::Listed { unpin } => {
                Recorder::add(&self.shared.stats.reconciles, 1);
                self.pauses.swept();
                let (keys, took) = self.progress.end();
                self.report(Report::Swept { keys, took });
                if let Some(t) = &mut self.tracker {
                    for id in unpin {
                        t.unhold_batch(id);
                    }
                }
            }
            Finished::Failed { error, retry_in } => {
                Recorder::add(&self.shared.stats.reconcile_failures, 1);
                self.progress.reset();
                self.report(Report::ReconcileFailed {
                    error: &error,
                    retry_in,
                });
            }
        }
    }

    fn start_key(&mut self, ready: Ready) -> (JobKey, Due) {
        let covered = self.tracker.as_mut().and_then(|t| t.start(&ready.key));
        let txids = self.txids.take(&ready.key);
        let due = Due {
            key: ready.key.clone(),
            txids,
        };
        let job = JobKey {
            key: ready.key,
            ticket: ready.ticket,
            first_dirty: ready.first_dirty,
            by_change: ready.by_change,
            covered,
        };
        (job, due)
    }

    fn dispatch(&mut self, now: Instant) {
        let now = now.into_std();
        self.consider_whole();
        if self.whole.blocks() {
            self.start_whole(now);
            return;
        }
        while self.jobs.len() < self.capacity() {
            if let Some(half) = self.halves.next() {
                let (meta, due): (Vec<JobKey>, Vec<Due>) = half.into_iter().unzip();
                Recorder::add(&self.shared.stats.rebuild_calls, 1);
                let call = self.jobs.next_call();
                let rebuild = self.jobs.rebuild_call(due);
                self.jobs.spawn(meta, None, call, rebuild);
                continue;
            }
            let first = match self.solo.take() {
                Some(r) => r,
                None => match self.dirty.pop_ready(now) {
                    Some(r) => r,
                    None => break,
                },
            };
            let alone = first.failures > 0;
            let stage = first.key.stage_index();
            let (max_batch, window) = match stage {
                // The keys still waiting after this one, split over the workers.
                None => {
                    let n = if self.choice.always_sets() {
                        self.jobs.set_batch()
                    } else if self.choice.grows() {
                        self.jobs
                            .batch_for(self.dirty.queued() + 1, self.capacity())
                    } else {
                        self.jobs.batch_for(0, self.capacity())
                    };
                    (n, self.jobs.fill_window(n))
                }
                Some(i) => (self.fanout.max_batch(i), self.jobs.fill_window(0)),
            };
            let (mut meta, mut due) = (Vec::new(), Vec::new());
            let (m, d) = self.start_key(first);
            meta.push(m);
            due.push(d);
            // Keys fall due one by one, so without a window a batch holds the few that
            // fell due during the last call and every statement pays its fixed cost for
            // them. A key due within the window is rebuilt a little early instead: it
            // has been quiet for nine tenths of `coalesce` already, and a rebuild never
            // comes later than the debounce promised.
            let fill_until = now + window;
            while !alone && due.len() < max_batch {
                match self.dirty.pop_ready(fill_until) {
                    // A retrying key runs alone; a key of another kind (a view key among
                    // parent keys, or another fan-out's) starts the next call.
                    Some(r) if r.failures > 0 || r.key.stage_index() != stage => {
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
            let call = self.jobs.next_call();
            match stage {
                None => {
                    Recorder::add(&self.shared.stats.rebuild_calls, 1);
                    let rebuild = self.jobs.rebuild_call(due);
                    self.jobs.spawn(meta, stage, call, rebuild);
                }
                Some(i) => {
                    let hold = meta.iter().filter_map(|m| m.covered).min();
                    // A fan-out that would reach the threshold's keys is covered by a
                    // whole-table run instead (unless such a run just failed for them).
                    let limit = self
                        .choice
                        .threshold()
                        .filter(|_| self.may_go_whole())
                        .filter(|_| !due.iter().any(|d| self.whole.expands_anyway(&d.key)));
                    let expand = self.fanout.call(call, i, hold, due, limit);
                    self.jobs.spawn(meta, stage, call, expand);
                }
            }
        }
    }

    /// Whether a whole-table run may be wanted now: the view runs (not paused), and no
    /// earlier run's data failure is still being settled key by key.
    fn may_go_whole(&self) -> bool {
        self.choice.whole_possible() && !self.pauses.is_paused() && self.whole.may_want()
    }

    /// Wants a whole-table run when the backlog has reached the threshold. Not while a
    /// fan-out streams: its keys are still arriving (a fan-out estimated large never
    /// starts streaming: see `FanOutStage::call`).
    fn consider_whole(&mut self) {
        // A failed run's backlog is worked off once nothing waits or runs (and no key
        // is quarantined: its data would fail the next run too).
        self.whole.settled(
            self.dirty.queued() == 0 && self.dirty.running() == 0 && self.halves.is_empty(),
            self.dirty.poisoned() == 0,
        );
        let queued = self.dirty.queued() as u64;
        if self.whole.blocks() || self.jobs.fanning() > 0 || !self.may_go_whole() {
            return;
        }
        if self.choice.goes_whole(queued) {
            self.whole.want(Reason::Backlog);
        }
    }

    /// Starts the wanted whole-table run once no call of the view runs: it takes every
    /// waiting key (in flight until it ends), and the parent keys parked for it.
    fn start_whole(&mut self, now: std::time::Instant) {
        if !self.jobs.is_empty() {
            return;
        }
        let Some(reason) = self.whole.startable(now) else {
            return;
        };
        let Some(run) = self.whole_way.clone() else {
            return;
        };
        let mut keys = Vec::new();
        if reason != Reason::Build {
            if let Some(r) = self.solo.take() {
                keys.push(self.start_key(r));
            }
            // Every waiting key, due or not: the run covers its changes.
            let all = now + Duration::from_secs(365 * 24 * 3600);
            while let Some(r) = self.dirty.pop_ready(all) {
                keys.push(self.start_key(r));
            }
        }
        let way = match reason {
            Reason::Build => WholeWay::Build,
            Reason::FanOut => WholeWay::Replace,
            Reason::Backlog => whole::backlog_way(&keys),
            Reason::Sweep => WholeWay::Diff,
        };
        // The parent keys whose fan-out was too large: covered too, their changes seen.
        keys.extend(self.whole.take_parked());
        self.report(Report::WholeStarted {
            reason: reason.name(),
            way,
            keys: keys.len(),
        });
        let txids = whole::txids(&keys);
        let task = tokio::spawn(async move { run.rebuild_all(way, &txids).await });
        self.whole.start(way, keys, task);
        self.publish_whole();
    }

    /// A whole-table run ended.
    fn finish_whole(&mut self, done: Result<Result<WholeDone, BoxError>, BoxError>) {
        let Some(run) = self.whole.ended() else {
            return;
        };
        let now = std::time::Instant::now();
        let took = now.saturating_duration_since(run.since);
        let st = self.shared.clone();
        let st = &st.stats;
        let (mut view, mut parents) = (Vec::new(), Vec::new());
        for (m, d) in run.keys {
            if m.key.stage_index().is_some() {
                parents.push((m, d));
            } else {
                view.push((m, d));
            }
        }
        match done.and_then(|r| r) {
            Ok(done) => {
                self.whole.succeeded(run.reason);
                if run.way == WholeWay::Build && !done.built {
                    self.choice.set_rows(done.rows);
                } else {
                    Recorder::add(&st.whole_runs, 1);
                    Recorder::add(&st.whole_keys, (view.len() + parents.len()) as u64);
                    Recorder::add(&st.whole_written, done.written);
                    self.choice.whole_run(done.rows, took);
                }
                self.report(Report::WholeDone {
                    reason: run.reason.name(),
                    way: run.way,
                    done,
                    took,
                });
                if let Some(pins) = run.sweep {
                    if run.way == WholeWay::Build && !done.built {
                        // Only a look at a table that holds rows: the sweep is still due.
                        self.whole.want_sweep(pins);
                    } else {
                        self.swept_whole(pins);
                    }
                }
                let (meta, _): (Vec<JobKey>, Vec<Due>) = parents.into_iter().unzip();
                self.succeeded(meta, true, now);
                let (meta, _): (Vec<JobKey>, Vec<Due>) = view.into_iter().unzip();
                self.succeeded(meta, false, now);
            }
            Err(error) => {
                Recorder::add(&st.whole_failures, 1);
                let retry = self
                    .whole_way
                    .as_ref()
                    .map_or(Retry::Path, |w| w.classify(&error));
                self.report(Report::WholeFailed {
                    reason: run.reason.name(),
                    retry,
                    error: &error,
                });
                if let Some(pins) = run.sweep {
                    // The sweep is due again (whole again, or listed if runs fell back).
                    Recorder::add(&st.reconcile_failures, 1);
                    self.sweeper.uncovered(pins, Instant::from_std(now));
                }
                if run.reason == Reason::Build {
                    // No keys to fall back to: by the path, the build is tried again
                    // (the view stalls meanwhile); by data, the table is left to the
                    // keys that change, and says so.
                    if retry.blames_key() {
                        self.whole.build_failed_by_data(&error.to_string());
                    } else {
                        self.failed(Vec::new(), Vec::new(), retry, &error, now);
                        let wait = self
                            .dirty
                            .config()
                            .backoff
                            .ceiling(self.whole.failures() + 1);
                        self.whole.retry_after(Reason::Build, now, wait);
                    }
                } else {
                    // Set work takes over: the parent keys expand key by key (no count
                    // against them), the view keys are halved (by data: the failing key
                    // is found) or back off as any call's (by the path).
                    let keys: Vec<Key> = parents.iter().map(|(m, _)| m.key.clone()).collect();
                    self.whole.fall_back(&keys);
                    for (m, d) in parents {
                        self.requeue(m, d, now);
                    }
                    let (meta, dues): (Vec<JobKey>, Vec<Due>) = view.into_iter().unzip();
                    if retry.blames_key() && !meta.is_empty() {
                        self.halve(meta, dues, retry, &error, now);
                    } else {
                        self.failed(meta, dues, retry, &error, now);
                    }
                }
            }
        }
        self.publish_whole();
    }

    /// A whole-table run covered a sweep (its own report says what it wrote): counted
    /// as one, its TRUNCATE batches released.
    fn swept_whole(&mut self, pins: Vec<BatchId>) {
        Recorder::add(&self.shared.stats.reconciles, 1);
        self.pauses.swept();
        if let Some(t) = &mut self.tracker {
            for id in pins {
                t.unhold_batch(id);
            }
        }
    }

    /// Puts a key a whole-table run covered back in the queue without blaming it.
    fn requeue(&mut self, m: JobKey, due: Due, now: std::time::Instant) {
        // A failure of the path never quarantines: the key waits for its retry.
        self.dirty
            .complete_ticket(m.ticket, Outcome::Failed(Retry::Path), now);
        if let Some(t) = &mut self.tracker {
            t.failed(&m.key, m.covered);
        }
        self.txids.restore(&m.key, due.txids);
    }

    /// Publishes the whole-table runs' state and the choice's for `/status`.
    fn publish_whole(&self) {
        let running = self.whole.running().map(|r| crate::stats::WholeRunning {
            reason: r.reason.name(),
            way: r.way.name(),
            since: SystemTime::now() - r.since.elapsed(),
            keys: r.keys.len() as u64,
        });
        let state = crate::stats::WholeState {
            running,
            threshold: self.choice.threshold(),
            rows: self.choice.rows(),
            rates: self.choice.rates(),
            build_failed: self.whole.build_failed().map(str::to_owned),
        };
        self.shared.stats.trouble(|t| t.whole = state);
    }

    /// Marks every key fan-out calls have sent so far: a call's keys are all in the
    /// buffer once it has returned, and must take its hold before the call releases it.
    fn drain_fanned(&mut self) {
        let mut keys = Vec::new();
        while let Some(item) = self.fanout.try_recv() {
            keys.push(item);
            if keys.len() >= 1024 {
                self.mark_fanned(&mut keys);
            }
        }
        self.mark_fanned(&mut keys);
    }

    fn finish_job(&mut self, done: Result<(tokio::task::Id, JobOutput), tokio::task::JoinError>) {
        let (id, dues, result) = match done {
            Ok((id, (dues, result))) => (id, dues, result),
            Err(e) => {
                let error: BoxError = format!("rebuild task failed: {e}").into();
                (e.id(), Vec::new(), Err(error))
            }
        };
        let Some(job) = self.jobs.finished(id) else {
            return;
        };
        if job.stage.is_some() {
            self.drain_fanned();
            self.fanout.finished(job.call);
        }
        let meta = job.keys;
        let now = Instant::now().into_std();
        match result {
            Ok(()) => {
                if job.stage.is_some() {
                    Recorder::add(&self.shared.stats.fanout_calls, 1);
                    for m in &meta {
                        self.whole.expanded(&m.key);
                    }
                } else if self.choice.always_sets() || meta.len() > self.jobs.max_batch() {
                    let st = &self.shared.stats;
                    Recorder::add(&st.set_calls, 1);
                    Recorder::add(&st.set_keys, meta.len() as u64);
                    self.choice.set_call(
                        meta.len(),
                        now.saturating_duration_since(job.started),
                        self.jobs.len() + 1,
                    );
                    self.publish_whole();
                }
                self.succeeded(meta, job.stage.is_some(), now)
            }
            Err(error) if job.stage.is_some() && error.is::<LargeFanOut>() => {
                // Its parent keys stay in flight, their holds with them, until a
                // whole-table run covers them.
                self.whole.park(meta.into_iter().zip(dues));
            }
            Err(error) => {
                let retry = match job.stage.and_then(|i| self.fanout.classify(i, &error)) {
                    Some(retry) => retry,
                    None => self.jobs.classify(&error),
                };
                // A rebuild call of several keys that failed by data runs again in
                // halves (see `bisect`); a fan-out call's or a lone key's failure, or
                // one not the data's, goes the usual way.
                if job.stage.is_none() && retry.blames_key() && dues.len() == meta.len() {
                    self.halve(meta, dues, retry, &error, now);
                } else {
                    self.failed(meta, dues, retry, &error, now);
                }
            }
        }
    }
    fn succeeded(&mut self, meta: Vec<JobKey>, fanout: bool, now: std::time::Instant) {
        let shared = self.shared.clone();
        let st = &shared.stats;
        if let Some(stall) = self.stall.take() {
            st.trouble(|t| {
                t.stalled_since = None;
                t.stall = None;
            });
            self.report(Report::Recovered {
                stalled_for: now.saturating_duration_since(stall.since),
            });
            // The path works: keys backing off from the outage go now.
            self.dirty.expedite_stalled(now);
        }
        for m in meta {
            self.dirty.complete_ticket(m.ticket, Outcome::Rebuilt, now);
            if let Some(t) = &mut self.tracker {
                t.succeeded(m.covered);
            }
            if self.unquarantine(&m.key) {
                self.report(Report::Revived { key: &m.key });
            }
            // A fan-out rebuilt nothing yet: freshness is the view keys' own.
            if !fanout {
                // Freshness is a change's: a key only a sweep listed waited for nothing.
                if m.by_change {
                    st.freshness
                        .record(now.saturating_duration_since(m.first_dirty));
                } else {
                    Recorder::add(&st.sweep_rebuilds, 1);
                }
                Recorder::add(&st.rebuilds_ok, 1);
            }
        }
        st.touch_rebuild();
    }

    /// A rebuild call failed by data: with several keys they wait as two halves (each
    /// key's failed attempt counted, none toward quarantine); one key fails as usual.
    fn halve(
        &mut self,
        meta: Vec<JobKey>,
        dues: Vec<Due>,
        retry: Retry,
        error: &BoxError,
        now: std::time::Instant,
    ) {
        let keys = meta.len();
        let Some(one) = self.halves.split(meta.into_iter().zip(dues).collect()) else {
            let st = &self.shared.stats;
            Recorder::add(&st.rebuilds_failed, keys as u64);
            let text = error.to_string();
            st.trouble(|t| t.last_error = Some(text));
            return;
        };
        let (meta, dues) = one.into_iter().unzip();
        self.failed(meta, dues, retry, error, now);
    }

    fn failed(
        &mut self,
        meta: Vec<JobKey>,
        dues: Vec<Due>,
        retry: Retry,
        error: &BoxError,
        now: std::time::Instant,
    ) {
        let shared = self.shared.clone();
        let st = &shared.stats;
        let text = error.to_string();
        if !retry.blames_key() {
            Recorder::add(&st.path_failures, meta.len() as u64);
            if self.stall.is_none() {
                self.stall = Some(Stall { since: now });
                st.trouble(|t| t.stalled_since = Some(SystemTime::now()));
                self.report(Report::Stalled { retry, error });
            }
            st.trouble(|t| t.stall = Some((retry, text.clone())));
        }
        st.trouble(|t| t.last_error = Some(text.clone()));
        // A call of several keys that failed by data is no evidence against any one of
        // them: none is counted toward quarantine, and each is retried alone (a rebuild
        // call's keys are halved instead, in `halve`; this is a fan-out call's).
        let counted = if retry.blames_key() && meta.len() > 1 {
            Retry::Path
        } else {
            retry
        };
        let mut dues = dues.into_iter();
        for m in meta {
            let txids = dues.next().map(|d| d.txids).unwrap_or_default();
            Recorder::add(&st.rebuilds_failed, 1);
            match self
                .dirty
                .complete_ticket(m.ticket, Outcome::Failed(counted), now)
            {
                Completion::Poisoned => self.poisoned(m, txids, error, &text),
                Completion::Retry { at, failures } => {
                    if let Some(t) = &mut self.tracker {
                        t.failed(&m.key, m.covered);
                    }
                    self.txids.restore(&m.key, txids);
                    self.report(Report::RebuildFailed {
                        key: &m.key,
                        failures,
                        retry_in: at.saturating_duration_since(now),
                        retry,
                        error,
                    });
                }
                _ => {}
            }
        }
    }

    /// A key was quarantined. With a reconcile sweep to heal it, its holds go; without
    /// one they stay (its transactions unconfirmed) until a change rebuilds it.
    fn poisoned(&mut self, m: JobKey, txids: Vec<u64>, error: &BoxError, text: &str) {
        let shared = self.shared.clone();
        let st = &shared.stats;
        let holding = self.tracker.is_some() && !self.sweeper.is_configured();
        if holding {
            if let Some(t) = &mut self.tracker {
                t.failed(&m.key, m.covered);
            }
            self.txids.restore(&m.key, txids);
            self.quarantine.hold(&m.key, std::time::Instant::now());
        } else {
            if let Some(t) = &mut self.tracker
                && t.forget(&m.key, m.covered)
            {
                Recorder::add(&st.quarantine_releases, 1);
            }
            self.txids.forget(&m.key);
        }
        let failures = self.dirty.config().poison_after;
        let first = self.quarantine.enter(
            &shared,
            Quarantined {
                key: m.key.clone(),
                since: SystemTime::now(),
                failures,
                error: text.to_string(),
                holding,
            },
        );
        if first {
            Recorder::add(&st.keys_poisoned, 1);
            self.report(Report::Poisoned {
                key: &m.key,
                failures,
                holding,
                error,
            });
        }
    }

    /// Removes `key` from the quarantine list; true when it was there.
    fn unquarantine(&mut self, key: &Key) -> bool {
        self.quarantine.leave(&self.shared, key)
    }

    /// Releases the holds of keys quarantined longer than the configured bound.
    fn release_expired_holds(&mut self, now: std::time::Instant) {
        while let Some((key, held)) = self.quarantine.expired(now) {
            if !self.dirty.is_poisoned(&key) {
                continue;
            }
            if let Some(t) = &mut self.tracker
                && t.forget(&key, None)
            {
                Recorder::add(&self.shared.stats.quarantine_releases, 1);
            }
            self.txids.forget(&key);
            self.quarantine.released(&self.shared, &key);
            self.report(Report::QuarantineReleased {
                key: &key,
                after: held,
            });
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

    fn publish_gauges(&mut self) {
        let readings = Readings {
            dirty: &self.dirty,
            oldest_call: self.jobs.oldest_start(),
            sweep: (self.progress.began(), self.progress.listed()),
            holding: self.quarantine.holding(),
            unacked: self.tracker.as_ref().map_or(0, |t| t.unreleased()),
        };
        self.gauges.publish(&self.shared.stats, readings);
    }
}
