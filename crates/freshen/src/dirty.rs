//! `DirtySet`: the per-key debounce scheduler, a pure state machine with an explicit clock.
//!
//! Every key is in one of five states:
//!
//! ```text
//!            mark                 pop_ready               complete(Ok)
//!   idle ──────────► dirty ──────────────────► running ─────────────────► idle
//!                     ▲  ▲                     │  │ mark                   (or dirty again
//!                     │  │  retry time          │  ▼                         if re-dirtied)
//!                     │  └──── backoff ◄────────┴─ running+redirty
//!                     │          complete(Failed)  │
//!                     │                            │ poison_after failures in a row
//!                     └──── revive (reconcile) ── poisoned   (marks ignored)
//! ```
//!
//! A dirty key fires once it has been quiet for `coalesce` or dirty for `max_wait`,
//! whichever is first. Queued keys sit in one min-heap ordered by deadline. A mark that
//! pushes a deadline later does not touch the heap: the key's entry surfaces at the old
//! deadline and is pushed again with the new one (lazy invalidation). Each queued key
//! has exactly one heap entry, so the heap never outgrows the dirty set, and mark, pop,
//! complete and the next wake-up are all O(log n).

use std::time::{Duration, Instant};

use crate::Key;
use crate::backoff::{Backoff, Rng};
use crate::heap::QuadHeap;
use crate::index::{Hash32, Index, Probe};

/// Timing of a [`DirtySet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyConfig {
    /// A key fires once no event has touched it for this long.
    pub coalesce: Duration,
    /// …or once it has been dirty this long, however hot it is.
    pub max_wait: Duration,
    /// Delay between a failed rebuild and its retry.
    pub backoff: Backoff,
    /// Consecutive failures after which a key is quarantined.
    pub poison_after: u32,
    /// Seed of the jitter generator.
    pub seed: u64,
}

impl Default for DirtyConfig {
    fn default() -> DirtyConfig {
        DirtyConfig {
            coalesce: Duration::from_millis(100),
            max_wait: Duration::from_secs(5),
            backoff: Backoff::default(),
            poison_after: 5,
            seed: 0x5eed,
        }
    }
}

/// What [`DirtySet::mark`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The key was clean and is now queued.
    Queued,
    /// The key was already queued (dirty or waiting to retry); its quiet period restarts.
    Pending,
    /// The key's rebuild is running; the key re-enters the queue when it ends.
    Redirtied,
    /// The key is poisoned: the event is ignored until a reconcile revives it.
    Ignored,
    /// A reconcile revived a poisoned key; it is queued with a clean failure count.
    Revived,
}

/// A key due for rebuild, from [`DirtySet::pop_ready`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The key; it is now running until [`DirtySet::complete`].
    pub key: Key,
    /// When the oldest change this rebuild covers made the key dirty.
    pub first_dirty: Instant,
    /// Failed rebuilds of this key in a row before this one (0 = first try).
    pub failures: u32,
}

/// What [`DirtySet::complete`] did with a finished key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Rebuilt and clean.
    Clean,
    /// Rebuilt, but changed again meanwhile: queued again.
    Requeued,
    /// Failed; retried at this time.
    Retry {
        /// When the retry becomes ready.
        at: Instant,
        /// Consecutive failures so far.
        failures: u32,
    },
    /// Failed `poison_after` times in a row: quarantined until a reconcile revives it.
    /// Reported exactly once per quarantine.
    Poisoned,
    /// The key was not running (a caller bug); nothing changed.
    NotRunning,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Dirty,
    Backoff,
    Running,
    RunningRedirty,
    Poisoned,
}

/// Per-key state. Times are nanoseconds since the set's epoch. The meaning of the three
/// time fields depends on the state, which keeps a slot at 48 bytes:
///
/// | state            | `first`             | `last`               | `job_first`       |
/// |------------------|---------------------|----------------------|-------------------|
/// | Dirty            | first mark          | latest mark          | –                 |
/// | Backoff          | first mark          | retry time           | –                 |
/// | Running          | –                   | –                    | rebuild's first   |
/// | RunningRedirty   | first re-mark       | latest re-mark       | rebuild's first   |
#[derive(Debug)]
struct Slot {
    key: Option<Key>,
    first: u64,
    last: u64,
    job_first: u64,
    failures: u32,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    deadline: u64,
    /// Breaks deadline ties first-in first-out (wraps after 4G pushes, harmlessly).
    seq: u32,
    slot: u32,
}

/// The per-key debounce scheduler: which keys are dirty, when each becomes ready, which
/// are running, backing off or poisoned.
///
/// Pure: no I/O, no clock of its own — every operation takes `now`. See the module
/// docs for the state machine.
///
/// ```
/// use std::time::{Duration, Instant};
/// use freshen::{DirtyConfig, DirtySet, Key};
///
/// let t0 = Instant::now();
/// let ms = Duration::from_millis;
/// let mut set = DirtySet::new(DirtyConfig { coalesce: ms(100), ..Default::default() }, t0);
/// set.mark(&Key::from("a"), t0);
/// set.mark(&Key::from("a"), t0 + ms(50)); // restarts the quiet period
/// assert_eq!(set.next_deadline(), Some(t0 + ms(150)));
/// assert!(set.pop_ready(t0 + ms(149)).is_none());
/// let ready = set.pop_ready(t0 + ms(150)).unwrap();
/// assert_eq!(ready.key, Key::from("a"));
/// ```
#[derive(Debug)]
pub struct DirtySet {
    cfg: DirtyConfig,
    coalesce: u64,
    max_wait: u64,
    epoch: Instant,
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: Index,
    heap: QuadHeap<Entry>,
    seq: u32,
    rng: Rng,
    queued: usize,
    running: usize,
    poisoned: usize,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl DirtySet {
    /// An empty set; `epoch` is any instant at or before the first `now` it will see.
    pub fn new(cfg: DirtyConfig, epoch: Instant) -> DirtySet {
        DirtySet {
            coalesce: nanos(cfg.coalesce),
            max_wait: nanos(cfg.max_wait),
            rng: Rng::new(cfg.seed),
            cfg,
            epoch,
            slots: Vec::new(),
            free: Vec::new(),
            index: Index::new(),
            heap: QuadHeap::new(),
            seq: 0,
            queued: 0,
            running: 0,
            poisoned: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DirtyConfig {
        &self.cfg
    }

    fn ns(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.epoch))
    }

    fn instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }

    fn find(&self, key: &Key) -> (Hash32, Probe) {
        let hash = self.index.hash(key);
        let slots = &self.slots;
        let probe = self.index.find(key, hash, |s| {
            slots[s as usize]
                .key
                .as_ref()
                .expect("the index only points at live slots")
        });
        (hash, probe)
    }

    fn dirty_deadline(&self, s: &Slot) -> u64 {
        s.last
            .saturating_add(self.coalesce)
            .min(s.first.saturating_add(self.max_wait))
    }

    fn push(&mut self, slot: u32, deadline: u64) {
        self.seq = self.seq.wrapping_add(1);
        self.heap.push(Entry {
            deadline,
            seq: self.seq,
            slot,
        });
    }

    fn alloc(&mut self, key: &Key, hash: Hash32, vacant: usize, now: u64) -> u32 {
        let slot = Slot {
            key: Some(key.clone()),
            first: now,
            last: now,
            job_first: 0,
            failures: 0,
            state: State::Dirty,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).expect("fewer than 4G dirty keys")
            }
        };
        self.index.insert(hash, i, vacant);
        i
    }

    fn release(&mut self, i: u32, bucket: usize) {
        self.slots[i as usize].key = None;
        self.index.remove(bucket);
        self.free.push(i);
    }

    /// Records that `key` changed at `now`.
    pub fn mark(&mut self, key: &Key, now: Instant) -> Mark {
        self.mark_inner(key, now, false)
    }

    /// Like [`mark`](Self::mark), for a key listed by a reconcile sweep: a poisoned key is
    /// revived with a clean failure count.
    pub fn revive(&mut self, key: &Key, now: Instant) -> Mark {
        self.mark_inner(key, now, true)
    }

    fn mark_inner(&mut self, key: &Key, now: Instant, revive: bool) -> Mark {
        let now = self.ns(now);
        let i = match self.find(key) {
            (_, Probe::Found { slot, .. }) => slot,
            (hash, Probe::Vacant(vacant)) => {
                let i = self.alloc(key, hash, vacant, now);
                let d = self.dirty_deadline(&self.slots[i as usize]);
                self.push(i, d);
                self.queued += 1;
                return Mark::Queued;
            }
        };
        let s = &mut self.slots[i as usize];
        match s.state {
            State::Dirty => {
                // The heap entry keeps the earlier deadline; pop_ready pushes it again.
                s.last = now.max(s.last);
                Mark::Pending
            }
            State::Backoff => Mark::Pending,
            State::Running => {
                s.state = State::RunningRedirty;
                s.first = now;
                s.last = now;
                Mark::Redirtied
            }
            State::RunningRedirty => {
                s.last = now.max(s.last);
                Mark::Redirtied
            }
            State::Poisoned if revive => {
                s.state = State::Dirty;
                s.failures = 0;
                s.first = now;
                s.last = now;
                let d = self.dirty_deadline(&self.slots[i as usize]);
                self.push(i, d);
                self.poisoned -= 1;
                self.queued += 1;
                Mark::Revived
            }
            State::Poisoned => Mark::Ignored,
        }
    }

    /// Moves the top heap entry to the key's true deadline while it is stale, so that
    /// the top is exact. Amortized O(log n): an entry is pushed again only when its
    /// key's deadline moved.
    fn settle_top(&mut self) -> Option<Entry> {
        loop {
            let top = *self.heap.peek()?;
            let s = &self.slots[top.slot as usize];
            let real = match s.state {
                State::Dirty => self.dirty_deadline(s),
                State::Backoff => s.last,
                _ => {
                    debug_assert!(false, "heap entry for an unqueued key");
                    self.heap.pop();
                    continue;
                }
            };
            if real <= top.deadline {
                return Some(top);
            }
            self.heap.pop();
            self.push(top.slot, real);
        }
    }

    /// The next key due at `now`, earliest deadline first; it becomes running.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Ready> {
        let now = self.ns(now);
        let top = self.settle_top()?;
        if top.deadline > now {
            return None;
        }
        self.heap.pop();
        let s = &mut self.slots[top.slot as usize];
        s.job_first = s.first;
        s.state = State::Running;
        self.queued -= 1;
        self.running += 1;
        let ready = Ready {
            key: s.key.clone().expect("queued slots hold a key"),
            first_dirty: self.epoch + Duration::from_nanos(s.job_first),
            failures: s.failures,
        };
        Some(ready)
    }

    /// When the next queued key becomes ready, if any is queued.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let top = self.settle_top()?;
        Some(self.instant(top.deadline))
    }

    /// Records how the running rebuild of `key` ended.
    pub fn complete(&mut self, key: &Key, ok: bool, now: Instant) -> Completion {
        let now = self.ns(now);
        let Probe::Found { slot: i, bucket } = self.find(key).1 else {
            return Completion::NotRunning;
        };
        let s = &mut self.slots[i as usize];
        let redirty = match s.state {
            State::Running => false,
            State::RunningRedirty => true,
            _ => return Completion::NotRunning,
        };
        self.running -= 1;
        if ok {
            s.failures = 0;
            if !redirty {
                self.release(i, bucket);
                return Completion::Clean;
            }
            s.state = State::Dirty;
            // Behind every key that is already due: never earlier than now.
            let d = self.dirty_deadline(&self.slots[i as usize]).max(now);
            self.push(i, d);
            self.queued += 1;
            return Completion::Requeued;
        }
        s.failures += 1;
        let failures = s.failures;
        if failures >= self.cfg.poison_after {
            s.state = State::Poisoned;
            self.poisoned += 1;
            return Completion::Poisoned;
        }
        let delay = self.cfg.backoff.delay(failures, self.rng.unit());
        let s = &mut self.slots[i as usize];
        let at = now.saturating_add(nanos(delay));
        s.state = State::Backoff;
        s.first = s.job_first;
        s.last = at;
        self.push(i, at);
        self.queued += 1;
        Completion::Retry {
            at: self.instant(at),
            failures,
        }
    }

    /// Whether `key` is quarantined.
    pub fn is_poisoned(&self, key: &Key) -> bool {
        match self.find(key).1 {
            Probe::Found { slot, .. } => self.slots[slot as usize].state == State::Poisoned,
            Probe::Vacant(_) => false,
        }
    }

    /// The quarantined keys.
    pub fn poisoned_keys(&self) -> impl Iterator<Item = &Key> {
        self.slots
            .iter()
            .filter(|s| s.state == State::Poisoned)
            .filter_map(|s| s.key.as_ref())
    }

    /// Keys waiting to be rebuilt (dirty or waiting to retry).
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Keys being rebuilt.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Keys quarantined.
    pub fn poisoned(&self) -> usize {
        self.poisoned
    }

    /// Whether nothing is queued or running (poisoned keys do not count).
    pub fn is_idle(&self) -> bool {
        self.queued == 0 && self.running == 0
    }

    /// Bytes of heap the set holds, excluding the keys' own text and reference counts.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + self.heap.capacity() * std::mem::size_of::<Entry>()
            + self.index.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn k(s: &str) -> Key {
        Key::from(s)
    }

    fn set(coalesce_ms: u32, max_wait_ms: u32) -> (DirtySet, Instant) {
        let t0 = Instant::now();
        let cfg = DirtyConfig {
            coalesce: coalesce_ms * MS,
            max_wait: max_wait_ms * MS,
            backoff: Backoff::new(100 * MS, 1000 * MS),
            poison_after: 3,
            seed: 7,
        };
        (DirtySet::new(cfg, t0), t0)
    }

    fn drain(s: &mut DirtySet, now: Instant) -> Vec<Key> {
        std::iter::from_fn(|| s.pop_ready(now).map(|r| r.key)).collect()
    }

    #[test]
    fn fires_after_the_quiet_period() {
        let (mut s, t0) = set(100, 1000);
        assert_eq!(s.mark(&k("a"), t0), Mark::Queued);
        assert_eq!(s.pop_ready(t0 + 99 * MS), None);
        let r = s.pop_ready(t0 + 100 * MS).expect("ready at coalesce");
        assert_eq!(r.key, k("a"));
        assert_eq!(r.first_dirty, t0);
        assert_eq!(r.failures, 0);
        assert_eq!(s.running(), 1);
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn a_new_event_extends_the_quiet_period() {
        let (mut s, t0) = set(100, 1000);
        s.mark(&k("a"), t0);
        assert_eq!(s.mark(&k("a"), t0 + 80 * MS), Mark::Pending);
        assert_eq!(s.pop_ready(t0 + 150 * MS), None);
        assert_eq!(s.next_deadline(), Some(t0 + 180 * MS));
        assert!(s.pop_ready(t0 + 180 * MS).is_some());
    }

    #[test]
    fn a_hot_key_fires_at_max_wait() {
        let (mut s, t0) = set(100, 300);
        let mut t = t0;
        // An event every 50 ms never leaves 100 ms of quiet.
        while t < t0 + 300 * MS {
            s.mark(&k("hot"), t);
            assert_eq!(s.pop_ready(t), None, "not before max_wait at {:?}", t - t0);
            t += 50 * MS;
        }
        assert_eq!(s.next_deadline(), Some(t0 + 300 * MS));
        let r = s.pop_ready(t0 + 300 * MS).expect("fires at max_wait");
        assert_eq!(r.first_dirty, t0);
    }

    #[test]
    fn ready_keys_fire_earliest_deadline_first() {
        let (mut s, t0) = set(100, 1000);
        s.mark(&k("c"), t0 + 20 * MS);
        s.mark(&k("a"), t0);
        s.mark(&k("b"), t0 + 10 * MS);
        s.mark(&k("a"), t0 + 30 * MS); // a's deadline moves behind c's
        assert_eq!(drain(&mut s, t0 + 500 * MS), vec![k("b"), k("c"), k("a")]);
    }

    #[test]
    fn equal_deadlines_fire_in_mark_order() {
        let (mut s, t0) = set(100, 1000);
        for name in ["x", "y", "z", "w"] {
            s.mark(&k(name), t0);
        }
        assert_eq!(
            drain(&mut s, t0 + 100 * MS),
            vec![k("x"), k("y"), k("z"), k("w")]
        );
    }

    #[test]
    fn single_flight_a_running_key_is_not_popped_again() {
        let (mut s, t0) = set(10, 1000);
        s.mark(&k("a"), t0);
        assert!(s.pop_ready(t0 + 10 * MS).is_some());
        assert_eq!(s.mark(&k("a"), t0 + 11 * MS), Mark::Redirtied);
        assert_eq!(s.pop_ready(t0 + 900 * MS), None, "still running");
        assert_eq!(s.running(), 1);
    }

    #[test]
    fn redirty_during_rebuild_is_kept_and_reenters_behind_others() {
        let (mut s, t0) = set(10, 1000);
        s.mark(&k("a"), t0);
        let first = s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(first.key, k("a"));
        s.mark(&k("a"), t0 + 12 * MS); // during the rebuild
        s.mark(&k("b"), t0 + 15 * MS);
        s.mark(&k("c"), t0 + 16 * MS);
        // a's re-dirty would be due at 22 ms, before b (25) and c (26); the rebuild ends
        // at 40 ms when all three are due, and a goes behind the others.
        assert_eq!(
            s.complete(&k("a"), true, t0 + 40 * MS),
            Completion::Requeued
        );
        assert_eq!(s.queued(), 3);
        let again = drain(&mut s, t0 + 40 * MS);
        assert_eq!(again, vec![k("b"), k("c"), k("a")]);
        // Lag of the second rebuild counts from the re-dirty, not the first mark.
        let (mut s2, t0) = set(10, 1000);
        s2.mark(&k("a"), t0);
        s2.pop_ready(t0 + 10 * MS).unwrap();
        s2.mark(&k("a"), t0 + 12 * MS);
        s2.complete(&k("a"), true, t0 + 13 * MS);
        assert_eq!(
            s2.pop_ready(t0 + 22 * MS).unwrap().first_dirty,
            t0 + 12 * MS
        );
    }

    #[test]
    fn clean_completion_forgets_the_key() {
        let (mut s, t0) = set(10, 1000);
        s.mark(&k("a"), t0);
        s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(s.complete(&k("a"), true, t0 + 11 * MS), Completion::Clean);
        assert!(s.is_idle());
        assert_eq!(s.next_deadline(), None);
        assert_eq!(
            s.complete(&k("a"), true, t0 + 12 * MS),
            Completion::NotRunning
        );
        assert_eq!(s.mark(&k("a"), t0 + 20 * MS), Mark::Queued);
    }

    #[test]
    fn backoff_schedule_doubles_with_jitter() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("a"), t0);
        let mut now = t0;
        let mut delays = Vec::new();
        for attempt in 1..=2u32 {
            let r = s.pop_ready(now).expect("due");
            assert_eq!(r.failures, attempt - 1);
            assert_eq!(r.first_dirty, t0, "lag keeps counting across retries");
            match s.complete(&k("a"), false, now) {
                Completion::Retry { at, failures } => {
                    assert_eq!(failures, attempt);
                    assert_eq!(s.pop_ready(at - Duration::from_nanos(1)), None);
                    delays.push(at - now);
                    now = at;
                }
                other => panic!("expected a retry, got {other:?}"),
            }
        }
        assert!((50 * MS..100 * MS).contains(&delays[0]), "{delays:?}");
        assert!((100 * MS..200 * MS).contains(&delays[1]), "{delays:?}");
    }

    #[test]
    fn a_mark_during_backoff_does_not_cut_the_wait() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("a"), t0);
        s.pop_ready(t0).unwrap();
        let Completion::Retry { at, .. } = s.complete(&k("a"), false, t0) else {
            panic!("retry expected")
        };
        assert_eq!(s.mark(&k("a"), t0 + MS), Mark::Pending);
        assert_eq!(s.pop_ready(at - MS), None);
        assert!(s.pop_ready(at).is_some());
    }

    #[test]
    fn poisons_after_n_failures_reported_once_and_ignores_events() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("bad"), t0);
        let mut now = t0;
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            s.pop_ready(now).expect("due");
            let c = s.complete(&k("bad"), false, now);
            if let Completion::Retry { at, .. } = c {
                now = at;
            }
            outcomes.push(c);
        }
        let poisoned = outcomes
            .iter()
            .filter(|c| **c == Completion::Poisoned)
            .count();
        assert_eq!(poisoned, 1);
        assert_eq!(*outcomes.last().unwrap(), Completion::Poisoned);
        assert_eq!(s.poisoned(), 1);
        assert!(s.is_poisoned(&k("bad")));
        assert!(s.is_idle());
        assert_eq!(s.mark(&k("bad"), now), Mark::Ignored);
        assert_eq!(s.pop_ready(now + 10_000 * MS), None);
        assert_eq!(s.poisoned_keys().collect::<Vec<_>>(), vec![&k("bad")]);
    }

    #[test]
    fn reconcile_revives_a_poisoned_key() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("bad"), t0);
        let mut now = t0;
        loop {
            s.pop_ready(now).unwrap();
            match s.complete(&k("bad"), false, now) {
                Completion::Retry { at, .. } => now = at,
                Completion::Poisoned => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(s.revive(&k("bad"), now), Mark::Revived);
        assert_eq!(s.poisoned(), 0);
        let r = s.pop_ready(now).expect("revived key is due");
        assert_eq!(r.failures, 0, "failure count starts over");
        assert_eq!(s.complete(&k("bad"), true, now), Completion::Clean);
    }

    #[test]
    fn next_wakeup_tracks_the_earliest_deadline() {
        let (mut s, t0) = set(100, 1000);
        assert_eq!(s.next_deadline(), None);
        s.mark(&k("a"), t0 + 50 * MS);
        s.mark(&k("b"), t0);
        assert_eq!(s.next_deadline(), Some(t0 + 100 * MS));
        s.mark(&k("b"), t0 + 120 * MS);
        assert_eq!(s.next_deadline(), Some(t0 + 150 * MS));
        s.pop_ready(t0 + 150 * MS).unwrap();
        assert_eq!(s.next_deadline(), Some(t0 + 220 * MS));
    }

    #[test]
    fn heap_holds_one_entry_per_queued_key() {
        let (mut s, t0) = set(100, 1_000_000);
        for i in 0..10_000u64 {
            s.mark(&k("hot"), t0 + Duration::from_micros(i));
        }
        assert_eq!(s.heap.len(), 1);
    }
}
