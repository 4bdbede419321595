//! `Jobs`: the calls running on spawned tasks — rebuilds of view keys and fan-out calls
//! of parent keys — with the keys each one runs, how many may run, and how a call is
//! filled.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{AbortHandle, Id, JoinError, JoinSet};

use crate::ack::BatchId;
use crate::dirty::Ticket;
use crate::rebuild::{Due, Rebuild};
use crate::{BoxError, Key, Retry};

/// Aborts a spawned task when dropped (a dropped run future is a crash, not a leak).
pub(super) struct AbortOnDrop(pub(super) AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) struct JobKey {
    pub(super) key: Key,
    /// Completes the key in the dirty set without a second lookup.
    pub(super) ticket: Ticket,
    pub(super) first_dirty: std::time::Instant,
    pub(super) by_change: bool,
    pub(super) covered: Option<BatchId>,
}

pub(super) type JobOutput = (Vec<Due>, Result<(), BoxError>);

/// A running call: its keys, and for a fan-out call which fan-out and which call (the
/// tag its keys arrive with).
pub(super) struct Job {
    pub(super) keys: Vec<JobKey>,
    pub(super) stage: Option<usize>,
    pub(super) call: u64,
    pub(super) started: std::time::Instant,
}

/// A batch takes along keys due within `coalesce / BATCH_WINDOW_DIVISOR` of now: wide
/// enough to gather the keys that fall due while a call runs (a statement's fixed cost
/// then spreads over many keys), narrow enough that the debounce still collapses bursts.
const BATCH_WINDOW_DIVISOR: u32 = 10;

/// How many keys the next rebuild call takes at most, with `waiting` keys in the dirty
/// set: `max_batch` normally; with a backlog of at least one bulk call (`bulk` keys: a
/// large fan-out, a capture far behind), the backlog's share of one worker, up to
/// `bulk`. A statement's fixed cost (planning, the round trip, the visibility check, the
/// index descents it shares) then spreads over many more keys, while the workers still
/// split the backlog between them. The threshold is the bulk size, not the workers'
/// batches together: a steady workload over a thousand hot keys keeps that many dirty
/// all the time, and growing there would rebuild keys early (see
/// [`Jobs::fill_window`]) while they still change — more rebuilds for nothing.
pub(super) fn batch_size(max_batch: usize, bulk: usize, waiting: usize, workers: usize) -> usize {
    let max_batch = max_batch.max(1);
    let bulk = bulk.max(max_batch);
    if waiting < bulk {
        return max_batch;
    }
    waiting.div_ceil(workers.max(1)).clamp(max_batch, bulk)
}

/// The running calls, and what they run.
pub(super) struct Jobs {
    rebuild: Arc<dyn Rebuild>,
    max_batch: usize,
    /// How many keys one call may take while a backlog waits: see [`batch_size`].
    bulk_batch: usize,
    /// A batch that starts takes along keys due within this much of now (a tenth of
    /// `coalesce`): see the run loop's `dispatch`.
    batch_window: Duration,
    /// The debounce's quiet period: how far ahead a grown call takes along keys.
    coalesce: Duration,
    workers: usize,
    set: JoinSet<JobOutput>,
    running: HashMap<Id, Job>,
    calls: u64,
    /// Fan-out calls running (they share `workers` with rebuilds).
    fanning: usize,
}

impl Jobs {
    pub(super) fn new(rebuild: Arc<dyn Rebuild>, coalesce: Duration, workers: usize) -> Jobs {
        Jobs {
            max_batch: rebuild.max_batch().max(1),
            bulk_batch: rebuild.bulk_batch().max(rebuild.max_batch()).max(1),
            batch_window: coalesce / BATCH_WINDOW_DIVISOR,
            coalesce,
            rebuild,
            workers,
            set: JoinSet::new(),
            running: HashMap::new(),
            calls: 0,
            fanning: 0,
        }
    }

    /// How many keys the next rebuild call takes at most with `waiting` keys in the
    /// dirty set and `capacity` calls allowed: see [`batch_size`].
    pub(super) fn batch_for(&self, waiting: usize, capacity: usize) -> usize {
        batch_size(self.max_batch, self.bulk_batch, waiting, capacity)
    }

    /// The most keys a call takes: the rebuild's batch for a trickle.
    pub(super) fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// How many keys a set call takes, whatever waits (`rebuild_by = "set"`).
    pub(super) fn set_batch(&self) -> usize {
        self.bulk_batch
    }

    /// How far ahead of now a call of up to `batch` keys takes along keys due by then:
    /// a tenth of `coalesce`, or for a call grown past `max_batch` (a backlog) the
    /// whole quiet period. A fan-out marks its keys a page at a time, each due
    /// `coalesce` later; with a tenth of it a free worker starts a call on the one page
    /// just due, and a large fan-out runs in many small calls. A key is then rebuilt up
    /// to `coalesce` early, never late.
    pub(super) fn fill_window(&self, batch: usize) -> Duration {
        if batch > self.max_batch {
            self.coalesce
        } else {
            self.batch_window
        }
    }

    /// How many rebuild calls may run now: one while the view is stalled (a probe, so
    /// that an outage is not hammered by every worker), else `workers`.
    pub(super) fn capacity(&self, paused: bool, stalled: bool) -> usize {
        if paused {
            0
        } else if stalled {
            1
        } else {
            self.workers
        }
    }

    pub(super) fn len(&self) -> usize {
        self.set.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Fan-out calls running.
    pub(super) fn fanning(&self) -> usize {
        self.fanning
    }

    /// The next call's number (the tag a fan-out call's keys arrive with).
    pub(super) fn next_call(&mut self) -> u64 {
        let call = self.calls;
        self.calls += 1;
        call
    }

    /// A call of the view's rebuild on `due`.
    pub(super) fn rebuild_call(
        &self,
        due: Vec<Due>,
    ) -> impl Future<Output = JobOutput> + Send + 'static {
        let rebuild = self.rebuild.clone();
        async move {
            let result = rebuild.rebuild(&due).await;
            (due, result)
        }
    }

    /// Whose fault a failed rebuild call was.
    pub(super) fn classify(&self, error: &BoxError) -> Retry {
        self.rebuild.classify(error)
    }

    /// Runs `call` on a task; `stage` is its fan-out's (`None`: a rebuild).
    pub(super) fn spawn<F>(&mut self, keys: Vec<JobKey>, stage: Option<usize>, call: u64, f: F)
    where
        F: Future<Output = JobOutput> + Send + 'static,
    {
        if stage.is_some() {
            self.fanning += 1;
        }
        let handle = self.set.spawn(f);
        self.running.insert(
            handle.id(),
            Job {
                keys,
                stage,
                call,
                started: std::time::Instant::now(),
            },
        );
    }

    /// Waits for a call to end (never, while none runs).
    pub(super) async fn join_next(&mut self) -> Option<Result<(Id, JobOutput), JoinError>> {
        self.set.join_next_with_id().await
    }

    /// Takes the ended task's call; `None` when it is not one of ours.
    pub(super) fn finished(&mut self, id: Id) -> Option<Job> {
        let job = self.running.remove(&id)?;
        if job.stage.is_some() {
            self.fanning -= 1;
        }
        Some(job)
    }

    /// When the longest-running call started. At most `workers` calls run: the scan is
    /// cheap.
    pub(super) fn oldest_start(&self) -> Option<std::time::Instant> {
        self.running.values().map(|j| j.started).min()
    }

    /// Keys of the calls still running.
    pub(super) fn abandoned(&self) -> usize {
        self.running.values().map(|j| j.keys.len()).sum()
    }

    /// Cancels every running call and waits until each task has ended.
    pub(super) async fn abort_all(&mut self) {
        self.set.abort_all();
        while self.set.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::BoxFuture;
    use crate::dirty::{DirtyConfig, DirtySet};

    struct Fails(usize);

    impl Rebuild for Fails {
        fn rebuild<'a>(&'a self, _: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
            Box::pin(async { Err("no".into()) })
        }

        fn max_batch(&self) -> usize {
            self.0
        }

        fn bulk_batch(&self) -> usize {
            self.0 * 10
        }

        fn classify(&self, _: &BoxError) -> Retry {
            Retry::Path
        }
    }

    fn jobs(max_batch: usize, workers: usize) -> Jobs {
        Jobs::new(Arc::new(Fails(max_batch)), Duration::from_secs(1), workers)
    }

    /// `n` keys popped from a dirty set, as the loop starts them.
    fn keys(n: usize) -> Vec<JobKey> {
        let now = Instant::now();
        let mut dirty = DirtySet::new(DirtyConfig::default(), now);
        for i in 0..n {
            dirty.mark(&Key::from(format!("k{i}")), now);
        }
        let later = now + Duration::from_secs(3600);
        std::iter::from_fn(|| dirty.pop_ready(later))
            .map(|r| JobKey {
                key: r.key,
                ticket: r.ticket,
                first_dirty: r.first_dirty,
                by_change: r.by_change,
                covered: None,
            })
            .collect()
    }

    #[test]
    fn a_call_is_filled_by_the_rebuilds_batch_and_a_tenth_of_coalesce() {
        let j = jobs(0, 4);
        assert_eq!(j.batch_for(0, 4), 1, "a batch of 0 still takes one key");
        assert_eq!(jobs(50, 4).batch_for(0, 4), 50);
        assert_eq!(j.fill_window(1), Duration::from_millis(100));
    }

    #[test]
    fn a_grown_call_takes_keys_due_within_the_whole_quiet_period() {
        let j = jobs(50, 4);
        assert_eq!(j.fill_window(50), Duration::from_millis(100));
        assert_eq!(j.fill_window(51), Duration::from_secs(1));
    }

    #[test]
    fn a_backlog_is_split_over_the_workers_up_to_the_bulk_batch() {
        // A trickle: the configured batch, never less than one key.
        assert_eq!(batch_size(64, 10_000, 0, 4), 64);
        assert_eq!(batch_size(64, 10_000, 256, 4), 64);
        assert_eq!(batch_size(0, 0, 0, 4), 1);
        // A thousand hot keys dirty all the time is no backlog: no growing, so no key
        // is rebuilt early while it still changes.
        assert_eq!(batch_size(64, 10_000, 1000, 4), 64);
        assert_eq!(batch_size(64, 10_000, 9_999, 4), 64);
        // A backlog of one bulk call or more: each worker's share, at least the batch.
        assert_eq!(batch_size(64, 10_000, 10_000, 4), 2500);
        assert_eq!(batch_size(64, 10_000, 10_000, 400), 64);
        assert_eq!(batch_size(1000, 10_000, 20_000, 4), 5000);
        // Never past the bulk batch, whatever waits.
        assert_eq!(batch_size(1000, 10_000, 65_536, 4), 10_000);
        assert_eq!(batch_size(1000, 10_000, 1_000_000, 1), 10_000);
        // A rebuild that does not grow (bulk below max_batch) keeps max_batch.
        assert_eq!(batch_size(1000, 1, 1_000_000, 4), 1000);
        // No capacity (paused) is taken as one worker, not a division by zero.
        assert_eq!(batch_size(10, 100, 500, 0), 100);
    }

    #[test]
    fn a_call_grows_with_the_backlog_only_as_far_as_the_rebuild_allows() {
        let j = jobs(50, 4);
        assert_eq!(j.batch_for(0, 4), 50);
        assert_eq!(j.batch_for(1000, 4), 250);
        assert_eq!(j.batch_for(1_000_000, 4), 500, "the rebuild's bulk_batch");
        assert_eq!(j.batch_for(1_000_000, 1), 500);
    }

    #[test]
    fn capacity_is_none_paused_one_stalled_else_every_worker() {
        let j = jobs(1, 4);
        assert_eq!(j.capacity(false, false), 4);
        assert_eq!(j.capacity(false, true), 1);
        assert_eq!(j.capacity(true, true), 0);
        assert_eq!(j.capacity(true, false), 0);
    }

    #[test]
    fn calls_are_numbered_in_order() {
        let mut j = jobs(1, 1);
        assert_eq!((j.next_call(), j.next_call(), j.next_call()), (0, 1, 2));
    }

    #[tokio::test]
    async fn a_finished_call_gives_back_its_keys_and_its_fan_out_slot() {
        let mut j = jobs(1, 4);
        let call = j.next_call();
        j.spawn(keys(2), Some(0), call, async { (Vec::new(), Ok(())) });
        let rebuild = j.rebuild_call(Vec::new());
        let call = j.next_call();
        j.spawn(keys(3), None, call, rebuild);
        assert_eq!((j.len(), j.fanning(), j.abandoned()), (2, 1, 5));
        let mut ended = Vec::new();
        while let Some(done) = j.join_next().await {
            let (id, (_, result)) = done.expect("no panic");
            let job = j.finished(id).expect("ours");
            ended.push((job.stage, job.keys.len(), result.is_ok()));
            assert!(j.finished(id).is_none(), "taken once");
        }
        ended.sort();
        assert_eq!(ended, vec![(None, 3, false), (Some(0), 2, true)]);
        assert_eq!((j.fanning(), j.abandoned()), (0, 0));
        assert!(j.is_empty());
        assert_eq!(j.classify(&"x".into()), Retry::Path);
    }

    #[tokio::test]
    async fn the_oldest_start_is_the_longest_running_calls() {
        let mut j = jobs(1, 4);
        assert_eq!(j.oldest_start(), None);
        let before = Instant::now();
        j.spawn(keys(1), None, 0, std::future::pending());
        let first = j.oldest_start().expect("one runs");
        j.spawn(keys(1), None, 1, std::future::pending());
        assert!(first >= before);
        assert_eq!(j.oldest_start(), Some(first));
        j.abort_all().await;
        assert!(j.is_empty());
        assert_eq!(j.abandoned(), 2, "aborting leaves the keys to count");
    }

    #[tokio::test]
    async fn abort_on_drop_cancels_the_task() {
        let task = tokio::spawn(std::future::pending::<()>());
        drop(AbortOnDrop(task.abort_handle()));
        assert!(task.await.expect_err("aborted").is_cancelled());
    }
}
