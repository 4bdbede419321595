//! `DirtySet`: the per-key debounce scheduler, a pure state machine with an explicit clock.
//!
//! Every key is in one of five states:
//!
//! ```text
//!            mark                 pop_ready             complete(Rebuilt)
//!   idle ──────────► dirty ──────────────────► running ─────────────────► idle
//!                     ▲  ▲                     │  │ mark                   (or dirty again
//!                     │  │  retry time          │  ▼                         if re-dirtied)
//!                     │  └──── backoff ◄────────┴─ running+redirty
//!                     │     complete(Failed(_)) ▲  │
//!                     │                   mark  │  │ poison_after key failures in a row
//!                     └── revive (reconcile) ── poisoned
//! ```
//!
//! Failures count toward quarantine only when they blame the key ([`Retry::Key`]); a
//! failure of the path (an outage) backs off without counting, so an outage of any
//! length never quarantines a key. A quarantined key is not deaf: a new change gives it
//! one fresh attempt after a backoff (one more failure quarantines it again), and a
//! reconcile sweep revives it with a clean count.
//!
//! | event on a key in state | dirty                  | backoff | running / +redirty | poisoned            |
//! |-------------------------|------------------------|---------|--------------------|---------------------|
//! | `mark` (a change)       | quiet period restarts  | –       | → running+redirty  | → backoff, 1 attempt |
//! | `revive` (a sweep)      | – (never delays it)    | –       | → running+redirty  | → dirty, count 0    |
//!
//! A dirty key fires once it has been quiet for `coalesce` or dirty for `max_wait`,
//! whichever is first. Queued keys sit in one deadline queue (`deadlines.rs`): a FIFO
//! ring takes every entry pushed at or after the latest one — a first mark, on a clock
//! that never runs backwards, always is — and a 4-ary min-heap the rest (retries,
//! deadlines cut by `max_wait`); a pop takes the smaller front. A mark that pushes a
//! deadline later does not touch the queue: the key's entry surfaces at the old
//! deadline and is pushed again with the new one (lazy invalidation). Each queued key
//! has exactly one entry, so the queue never outgrows the dirty set; mark, pop,
//! complete and the next wake-up are O(1) in order and O(log n) out of order.
//!
//! ```text
//!   key ──hash (hash.rs: keyed fold hash)──► index (8-byte buckets) ──► slot (56 bytes)
//!                                                                        ▲
//!   deadline queue: ring (in order) + heap (out of order), 16-byte entries ┘ by slot
//! ```
//!
//! A batch of keys is marked at once with [`DirtySet::mark_many`] (the run loop marks
//! every key a batch of changes dirties this way): the same as [`DirtySet::mark`] on
//! each in turn — same states, deadlines and tie order — but the keys are hashed
//! `MARK_AHEAD` ahead of their probes and their index buckets prefetched, so the cache
//! misses of new keys (the largest cost of a big mark) overlap instead of queueing.
//!
//! A popped key carries a [`Ticket`] naming its slot, so the caller completes it
//! ([`DirtySet::complete_ticket`]) without hashing the key and searching the index a
//! second time. A ticket holds the slot's generation, which moves on with every pop: a
//! stale ticket (of a run already completed) is refused (`NotRunning`), never applied
//! to a later run of the key or to whichever key holds the slot now.
//!
//! A clean completion by ticket forgets the key at once (the slot drops it, so the
//! index bucket matches nothing) but removes the bucket later, in a batch sorted by
//! bucket (a quarter of the index, at least 1024, or whenever the set goes idle): one
//! walk through the index in order instead of a cache miss per key. Until its batch
//! the slot is not reused. Invariants: a slot with a key is in the index exactly once;
//! a slot without one is in the free list or in the forgotten batch, never both.

use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Jitter};
use crate::deadlines::Deadlines;
use crate::index::{Hash32, Index, Probe};
use crate::{Key, Retry};

/// Timing of a [`DirtySet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyConfig {
    /// A key fires once no event has touched it for this long.
    pub coalesce: Duration,
    /// …or once it has been dirty this long, however hot it is.
    pub max_wait: Duration,
    /// Delay between a failed rebuild and its retry.
    pub backoff: Backoff,
    /// Consecutive failures that blame the key after which it is quarantined (at most
    /// 65535).
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
    /// A sweep listed a key that is already queued; its deadline is untouched (a sweep
    /// never delays a waiting key).
    Unchanged,
    /// A change to a quarantined key: it gets one fresh attempt after a backoff.
    Retried,
    /// A reconcile revived a poisoned key; it is queued with a clean failure count.
    Revived,
}

/// Names the slot of a running key, from [`Ready::ticket`]: what
/// [`DirtySet::complete_ticket`] takes to complete it without looking the key up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    slot: u32,
    /// The slot's generation when the key was popped; every pop moves it on.
    generation: u32,
}

/// A key due for rebuild, from [`DirtySet::pop_ready`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The key; it is now running until [`DirtySet::complete_ticket`] (or
    /// [`DirtySet::complete`]).
    pub key: Key,
    /// When the oldest change this rebuild covers made the key dirty.
    pub first_dirty: Instant,
    /// Failed rebuilds of this key in a row before this one, of any kind (0 = first
    /// try).
    pub failures: u32,
    /// Whether a change made this rebuild due; `false` when only a reconcile sweep (or
    /// a request) listed the key. Freshness and amplification count changes only.
    pub by_change: bool,
    /// Completes this run by its slot.
    pub ticket: Ticket,
}

/// How a rebuild ended, for [`DirtySet::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The key was rebuilt.
    Rebuilt,
    /// The rebuild failed; the directive says whether the key is to blame.
    Failed(Retry),
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
        /// Consecutive failures so far, of any kind.
        failures: u32,
    },
    /// Failed `poison_after` times in a row by its own fault: quarantined until a new
    /// change or a reconcile revives it.
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
/// time fields depends on the state, which keeps a slot at 56 bytes:
///
/// | state            | `first`             | `last`               | `job_first`       |
/// |------------------|---------------------|----------------------|-------------------|
/// | Dirty            | first mark          | latest mark          | –                 |
/// | Backoff          | first mark          | retry time           | –                 |
/// | Running          | –                   | –                    | rebuild's first   |
/// | RunningRedirty   | first re-mark       | latest re-mark       | rebuild's first   |
/// | Poisoned         | –                   | –                    | –                 |
///
/// `failures` counts failures that blamed the key, `stalls` those that blamed the path
/// (they only lengthen the backoff); both reset on success. `changed` says whether a
/// change (not only a sweep) dirtied the pending work, `job_changed` the same of the
/// running job (kept by its retries); both fit in the slot's padding. `hash` is the
/// key's index hash, kept so that completing by ticket queues the index bucket for its
/// sorted removal without hashing the key; `generation` moves on with each pop (and survives the slot's reuse
/// by another key), which is what makes a stale [`Ticket`] harmless.
#[derive(Debug)]
struct Slot {
    key: Option<Key>,
    first: u64,
    last: u64,
    job_first: u64,
    hash: Hash32,
    generation: u32,
    failures: u16,
    stalls: u16,
    state: State,
    /// A change (not only a sweep) dirtied the pending work.
    changed: bool,
    /// The running (or retried) job was made due by a change.
    job_changed: bool,
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
    /// Slots whose key was forgotten, their buckets still in the index:
    /// `(hash << 32) | slot`.
    forgotten: Vec<u64>,
    index: Index,
    deadlines: Deadlines<Entry>,
    seq: u32,
    rng: Jitter,
    queued: usize,
    running: usize,
    poisoned: usize,
    poison_after: u16,
}

/// Forgotten slots that wait for a batched removal from the index, at least: below a
/// quarter of the index (when that is larger) a batch gains no locality.
const FORGET_BATCH: usize = 1024;

/// How many keys ahead of its probe [`DirtySet::mark_many`] hashes a key and prefetches
/// its index bucket: enough misses in flight to cover a memory round trip (~100 ns)
/// with the work of the marks between, few enough that the lines stay in L1.
const MARK_AHEAD: usize = 16;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl DirtySet {
    /// An empty set; `epoch` is any instant at or before the first `now` it will see.
    pub fn new(cfg: DirtyConfig, epoch: Instant) -> DirtySet {
        DirtySet {
            coalesce: nanos(cfg.coalesce),
            max_wait: nanos(cfg.max_wait),
            rng: Jitter::new(cfg.seed),
            cfg,
            epoch,
            slots: Vec::new(),
            free: Vec::new(),
            forgotten: Vec::new(),
            index: Index::new(),
            deadlines: Deadlines::new(),
            seq: 0,
            queued: 0,
            running: 0,
            poisoned: 0,
            poison_after: u16::try_from(cfg.poison_after.max(1)).unwrap_or(u16::MAX),
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
        let probe = self
            .index
            .find(key, hash, |s| slots[s as usize].key.as_ref());
        (hash, probe)
    }

    fn dirty_deadline(&self, s: &Slot) -> u64 {
        s.last
            .saturating_add(self.coalesce)
            .min(s.first.saturating_add(self.max_wait))
    }

    fn push(&mut self, slot: u32, deadline: u64) {
        self.seq = self.seq.wrapping_add(1);
        self.deadlines.push(Entry {
            deadline,
            seq: self.seq,
            slot,
        });
    }

    fn alloc(&mut self, key: &Key, hash: Hash32, vacant: usize, now: u64, changed: bool) -> u32 {
        let mut slot = Slot {
            key: Some(key.clone()),
            first: now,
            last: now,
            job_first: 0,
            hash,
            generation: 0,
            failures: 0,
            stalls: 0,
            state: State::Dirty,
            changed,
            job_changed: false,
        };
        let i = match self.free.pop() {
            Some(i) => {
                slot.generation = self.slots[i as usize].generation;
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
        let s = &mut self.slots[i as usize];
        s.key = None;
        self.index.remove(bucket);
        self.free.push(i);
    }

    /// Forgets slot `i`'s key now and removes its index bucket later, in a batch
    /// ([`flush_forgotten`](Self::flush_forgotten)): one random access into the index
    /// per completion was a third of a 1M-key drain. Until then the bucket matches no
    /// key (its slot has none) and the slot is not reused, so its generation — what
    /// refuses a stale ticket — stays put.
    fn forget(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.key = None;
        self.forgotten
            .push((u64::from(s.hash.bits()) << 32) | u64::from(i));
        // A batch a quarter of the index walks it in order; an idle set owes nothing.
        let batch = (self.index.len() / 4).max(FORGET_BATCH);
        if self.forgotten.len() >= batch || self.is_idle() {
            self.flush_forgotten();
        }
    }

    /// Removes the buckets of every forgotten slot, walking the index in order, and
    /// frees the slots.
    fn flush_forgotten(&mut self) {
        self.index.remove_sorted(&mut self.forgotten);
        self.free
            .extend(self.forgotten.drain(..).map(|w| (w & 0xffff_ffff) as u32));
    }

    /// Records that `key` changed at `now`.
    pub fn mark(&mut self, key: &Key, now: Instant) -> Mark {
        self.mark_inner(key, now, false)
    }

    /// Like [`mark`](Self::mark), for a key listed by a reconcile sweep: a queued key
    /// keeps its deadline, a running one is marked to run again, a poisoned key is
    /// revived with a clean failure count.
    pub fn revive(&mut self, key: &Key, now: Instant) -> Mark {
        self.mark_inner(key, now, true)
    }

    /// Records that every key of `keys` changed at `now`: exactly [`mark`](Self::mark)
    /// on each in turn (the same states, the same deadlines, ties in the same order),
    /// faster for a batch. Each new key's index probe is a cache miss once the set
    /// outgrows the cache; here the keys are hashed 16 ahead of their probes and their
    /// buckets prefetched, so the misses overlap instead of queueing.
    pub fn mark_many(&mut self, keys: &[Key], now: Instant) {
        self.mark_batch(keys, now, false, |_, _| {});
    }

    /// [`revive`](Self::revive) on each key of `keys` in turn, batched as
    /// [`mark_many`](Self::mark_many) is; `each` hears every key's [`Mark`], in order.
    pub fn revive_many(&mut self, keys: &[Key], now: Instant, mut each: impl FnMut(&Key, Mark)) {
        self.mark_batch(keys, now, true, |i, m| each(&keys[i], m));
    }

    /// Marks `keys` in order, hashing and prefetching [`MARK_AHEAD`] keys ahead; `each`
    /// gets each key's position and outcome.
    fn mark_batch(
        &mut self,
        keys: &[Key],
        now: Instant,
        revive: bool,
        mut each: impl FnMut(usize, Mark),
    ) {
        let now = self.ns(now);
        // Hashes of the keys in flight: key i's sits at i % MARK_AHEAD until its probe.
        let mut ahead = [Hash32::default(); MARK_AHEAD];
        for (h, key) in ahead.iter_mut().zip(keys) {
            *h = self.index.hash(key);
            self.index.prefetch(*h);
        }
        for (i, key) in keys.iter().enumerate() {
            let hash = ahead[i % MARK_AHEAD];
            if let Some(next) = keys.get(i + MARK_AHEAD) {
                let h = self.index.hash(next);
                self.index.prefetch(h);
                ahead[i % MARK_AHEAD] = h;
            }
            each(i, self.mark_hashed(key, hash, now, revive));
        }
    }

    fn mark_inner(&mut self, key: &Key, now: Instant, revive: bool) -> Mark {
        let now = self.ns(now);
        let hash = self.index.hash(key);
        self.mark_hashed(key, hash, now, revive)
    }

    /// The mark of `key`, whose index hash is `hash`, at `now` (nanoseconds).
    fn mark_hashed(&mut self, key: &Key, hash: Hash32, now: u64, revive: bool) -> Mark {
        if self.index.full() && !self.forgotten.is_empty() {
            // Room from forgotten buckets before the table doubles for them.
            self.flush_forgotten();
        }
        let slots = &self.slots;
        let probe = self
            .index
            .find(key, hash, |s| slots[s as usize].key.as_ref());
        let i = match probe {
            Probe::Found { slot, .. } => slot,
            Probe::Vacant(vacant) => {
                let i = self.alloc(key, hash, vacant, now, !revive);
                let d = self.dirty_deadline(&self.slots[i as usize]);
                self.push(i, d);
                self.queued += 1;
                return Mark::Queued;
            }
        };
        let s = &mut self.slots[i as usize];
        if !revive {
            s.changed = true;
        }
        match s.state {
            // A sweep says "this key should be right", not "this key just changed": a key
            // already waiting is due soon anyway, and restarting its quiet period would
            // delay it (and, under after-rebuild acks, its confirmations).
            State::Dirty | State::Backoff if revive => Mark::Unchanged,
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
                s.stalls = 0;
                s.first = now;
                s.last = now;
                let d = self.dirty_deadline(&self.slots[i as usize]);
                self.push(i, d);
                self.poisoned -= 1;
                self.queued += 1;
                Mark::Revived
            }
            State::Poisoned => {
                // A change may be the fix (the bad row corrected): try once more, after
                // the backoff the failures earned, and never sooner than the debounce.
                let earned = u32::from(s.failures);
                let delay = self.cfg.backoff.delay(earned, self.rng.unit());
                let s = &mut self.slots[i as usize];
                s.failures = self.poison_after - 1;
                s.state = State::Backoff;
                s.first = now;
                s.last = now.saturating_add(nanos(delay).max(self.coalesce));
                let at = s.last;
                self.push(i, at);
                self.poisoned -= 1;
                self.queued += 1;
                Mark::Retried
            }
        }
    }

    /// Moves the top heap entry to the key's true deadline while it is stale, so that
    /// the top is exact. Amortized O(log n): an entry is pushed again only when its
    /// key's deadline moved.
    fn settle_top(&mut self) -> Option<Entry> {
        loop {
            let top = *self.deadlines.peek()?;
            let s = &self.slots[top.slot as usize];
            let real = match s.state {
                State::Dirty => self.dirty_deadline(s),
                State::Backoff => s.last,
                _ => {
                    debug_assert!(false, "heap entry for an unqueued key");
                    self.deadlines.pop();
                    continue;
                }
            };
            if real <= top.deadline {
                return Some(top);
            }
            self.deadlines.pop();
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
        self.deadlines.pop();
        let s = &mut self.slots[top.slot as usize];
        s.job_first = s.first;
        // A retry keeps the flag of the job it retries, unless a change came since.
        if s.state == State::Dirty || s.changed {
            s.job_changed = s.changed;
        }
        s.changed = false;
        s.state = State::Running;
        s.generation = s.generation.wrapping_add(1);
        self.queued -= 1;
        self.running += 1;
        let ready = Ready {
            key: s.key.clone().expect("queued slots hold a key"),
            first_dirty: self.epoch + Duration::from_nanos(s.job_first),
            failures: u32::from(s.failures) + u32::from(s.stalls),
            by_change: s.job_changed,
            ticket: Ticket {
                slot: top.slot,
                generation: s.generation,
            },
        };
        Some(ready)
    }

    /// When the next queued key becomes ready, if any is queued.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let top = self.settle_top()?;
        Some(self.instant(top.deadline))
    }

    /// Records how the running rebuild of `key` ended. Looks the key up; prefer
    /// [`complete_ticket`](Self::complete_ticket) with the ticket `pop_ready` gave.
    pub fn complete(&mut self, key: &Key, outcome: Outcome, now: Instant) -> Completion {
        let Probe::Found { slot, bucket } = self.find(key).1 else {
            return Completion::NotRunning;
        };
        self.finish(slot, Some(bucket), outcome, now)
    }

    /// Records how the running rebuild named by `ticket` ended, going straight to its
    /// slot. A ticket whose run already completed is refused with `NotRunning`.
    pub fn complete_ticket(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        now: Instant,
    ) -> Completion {
        match self.slots.get(ticket.slot as usize) {
            Some(s) if s.generation == ticket.generation && s.key.is_some() => {
                self.finish(ticket.slot, None, outcome, now)
            }
            _ => Completion::NotRunning,
        }
    }

    /// Ends the run in slot `i`; `bucket` is its index bucket when the caller knows it.
    fn finish(
        &mut self,
        i: u32,
        bucket: Option<usize>,
        outcome: Outcome,
        now: Instant,
    ) -> Completion {
        let now = self.ns(now);
        let s = &mut self.slots[i as usize];
        let redirty = match s.state {
            State::Running => false,
            State::RunningRedirty => true,
            _ => return Completion::NotRunning,
        };
        self.running -= 1;
        let retry = match outcome {
            Outcome::Rebuilt => None,
            Outcome::Failed(r) => Some(r),
        };
        let Some(retry) = retry else {
            s.failures = 0;
            s.stalls = 0;
            if !redirty {
                match bucket {
                    Some(bucket) => self.release(i, bucket),
                    None => self.forget(i),
                }
                return Completion::Clean;
            }
            s.state = State::Dirty;
            // Behind every key that is already due: never earlier than now.
            let d = self.dirty_deadline(&self.slots[i as usize]).max(now);
            self.push(i, d);
            self.queued += 1;
            return Completion::Requeued;
        };
        if retry.blames_key() {
            s.failures = s.failures.saturating_add(1);
            if s.failures >= self.poison_after {
                s.state = State::Poisoned;
                self.poisoned += 1;
                return Completion::Poisoned;
            }
        } else {
            s.stalls = s.stalls.saturating_add(1);
        }
        let failures = u32::from(s.failures) + u32::from(s.stalls);
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

    /// When `key` becomes ready, if it is queued (dirty or waiting to retry).
    pub fn deadline_of(&self, key: &Key) -> Option<Instant> {
        let Probe::Found { slot, .. } = self.find(key).1 else {
            return None;
        };
        let s = &self.slots[slot as usize];
        match s.state {
            State::Dirty => Some(self.instant(self.dirty_deadline(s))),
            State::Backoff => Some(self.instant(s.last)),
            _ => None,
        }
    }

    /// Makes every key that is backing off after failures of the path due at `now`:
    /// the path works again, so their retries need not wait out a backoff that grew
    /// during the outage. Rebuilds the heap (one entry per queued key, as always):
    /// O(n log n), and only called when a stall ends.
    pub fn expedite_stalled(&mut self, now: Instant) -> usize {
        let now = self.ns(now);
        let mut moved = 0;
        for s in &mut self.slots {
            if s.key.is_some() && s.state == State::Backoff && s.stalls > 0 && s.last > now {
                s.last = now;
                moved += 1;
            }
        }
        if moved == 0 {
            return 0;
        }
        self.deadlines = Deadlines::new();
        for i in 0..self.slots.len() {
            let s = &self.slots[i];
            let deadline = match s.state {
                _ if s.key.is_none() => continue,
                State::Dirty => self.dirty_deadline(s),
                State::Backoff => s.last,
                _ => continue,
            };
            self.push(i as u32, deadline);
        }
        moved
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

    /// When the longest-waiting change still unrebuilt dirtied its key: the first mark
    /// of the oldest dirty, retrying or re-marked key (`None` when nothing waits).
    /// A scan of every slot: call it seldom (a status sample), not per event.
    pub fn oldest_waiting(&self) -> Option<Instant> {
        if self.queued == 0 {
            return None;
        }
        self.slots
            .iter()
            .filter(|s| {
                matches!(
                    s.state,
                    State::Dirty | State::Backoff | State::RunningRedirty
                ) && s.key.is_some()
            })
            .map(|s| s.first)
            .min()
            .map(|ns| self.instant(ns))
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
            + self.forgotten.capacity() * std::mem::size_of::<u64>()
            + self.deadlines.capacity() * std::mem::size_of::<Entry>()
            + self.index.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_waiting_key_is_the_first_marked_still_unrebuilt() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut set = DirtySet::new(
            DirtyConfig {
                coalesce: ms(10),
                max_wait: ms(100),
                ..Default::default()
            },
            t0,
        );
        assert_eq!(set.oldest_waiting(), None);
        set.mark(&Key::from("a"), t0 + ms(1));
        set.mark(&Key::from("b"), t0 + ms(5));
        set.mark(&Key::from("a"), t0 + ms(8));
        assert_eq!(set.oldest_waiting(), Some(t0 + ms(1)));
        // b's quiet period ends first (a was marked again at 8 ms).
        let first = set.pop_ready(t0 + ms(16)).unwrap();
        assert_eq!(first.key, Key::from("b"));
        assert_eq!(set.oldest_waiting(), Some(t0 + ms(1)), "a still waits");
        set.complete(&first.key, Outcome::Rebuilt, t0 + ms(17));
        let second = set.pop_ready(t0 + ms(20)).unwrap();
        assert_eq!(second.key, Key::from("a"));
        assert_eq!(set.oldest_waiting(), None, "a running key is not waiting");
        set.complete(&second.key, Outcome::Rebuilt, t0 + ms(21));
        assert_eq!(set.oldest_waiting(), None);
    }

    #[test]
    fn a_rebuild_is_by_change_when_a_change_made_it_due_and_not_when_only_a_sweep_did() {
        let (mut s, t0) = set(10, 100);
        let f = Outcome::Failed(Retry::Path);
        // Listed by a sweep only.
        s.revive(&k("swept"), t0);
        // Changed; a sweep listing it too changes nothing.
        s.mark(&k("changed"), t0);
        s.revive(&k("changed"), t0);
        let mut seen = std::collections::BTreeMap::new();
        while let Some(r) = s.pop_ready(t0 + 20 * MS) {
            seen.insert(r.key.clone(), r.by_change);
        }
        assert!(!seen[&k("swept")]);
        assert!(seen[&k("changed")]);
        // A sweep re-lists a running key: its next run is a sweep's, not a change's.
        s.revive(&k("changed"), t0 + 21 * MS);
        assert_eq!(
            s.complete(&k("changed"), Outcome::Rebuilt, t0 + 22 * MS),
            Completion::Requeued
        );
        // A change during the swept key's run: its next run is a change's.
        s.mark(&k("swept"), t0 + 21 * MS);
        s.complete(&k("swept"), Outcome::Rebuilt, t0 + 22 * MS);
        let mut seen = std::collections::BTreeMap::new();
        while let Some(r) = s.pop_ready(t0 + 200 * MS) {
            seen.insert(r.key.clone(), r.by_change);
        }
        assert!(!seen[&k("changed")]);
        assert!(seen[&k("swept")]);
        // A retry keeps its job's origin; a change while it backs off makes it a change's.
        s.complete(&k("changed"), f, t0 + 201 * MS);
        s.complete(&k("swept"), f, t0 + 201 * MS);
        let retried: Vec<bool> = std::iter::from_fn(|| s.pop_ready(t0 + 10_000 * MS))
            .map(|r| r.by_change)
            .collect();
        assert_eq!(retried.len(), 2);
        assert_eq!(retried.iter().filter(|b| **b).count(), 1, "{retried:?}");
        s.complete(&k("changed"), f, t0 + 10_001 * MS);
        s.mark(&k("changed"), t0 + 10_002 * MS);
        let r = std::iter::from_fn(|| s.pop_ready(t0 + 100_000 * MS))
            .find(|r| r.key == k("changed"))
            .unwrap();
        assert!(r.by_change);
    }

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
        assert_eq!(
            s.config().poison_after,
            3,
            "the set keeps its configuration"
        );
        assert_eq!(s.mark(&k("a"), t0), Mark::Queued);
        assert_eq!(s.deadline_of(&k("a")), Some(t0 + 100 * MS));
        assert_eq!(s.deadline_of(&k("b")), None);
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
            s.complete(&k("a"), Outcome::Rebuilt, t0 + 40 * MS),
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
        s2.complete(&k("a"), Outcome::Rebuilt, t0 + 13 * MS);
        assert_eq!(
            s2.pop_ready(t0 + 22 * MS).unwrap().first_dirty,
            t0 + 12 * MS
        );
    }

    #[test]
    fn a_ticket_completes_its_run_and_a_stale_one_completes_nothing() {
        let (mut s, t0) = set(10, 1000);
        s.mark(&k("a"), t0);
        let a = s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(
            s.complete_ticket(a.ticket, Outcome::Rebuilt, t0 + 11 * MS),
            Completion::Clean
        );
        assert!(s.is_idle());
        // "b" takes the slot "a" freed; a's ticket names that slot but not b's run.
        s.mark(&k("b"), t0 + 12 * MS);
        let b = s.pop_ready(t0 + 22 * MS).unwrap();
        assert_eq!(b.ticket.slot, a.ticket.slot, "the slot was reused");
        assert_eq!(
            s.complete_ticket(a.ticket, Outcome::Rebuilt, t0 + 23 * MS),
            Completion::NotRunning
        );
        assert_eq!(s.running(), 1, "b still runs");
        // A ticket's outcome is the key's: a failure backs off like `complete`'s.
        assert!(matches!(
            s.complete_ticket(b.ticket, Outcome::Failed(Retry::Key), t0 + 24 * MS),
            Completion::Retry { failures: 1, .. }
        ));
        assert_eq!(
            s.complete_ticket(b.ticket, Outcome::Rebuilt, t0 + 25 * MS),
            Completion::NotRunning,
            "a retry waiting in backoff is not running"
        );
        // The retry is a new run with a ticket of its own; the old one is stale.
        let again = s.pop_ready(t0 + 10_000 * MS).unwrap();
        assert_ne!(again.ticket, b.ticket);
        assert_eq!(
            s.complete_ticket(b.ticket, Outcome::Rebuilt, t0 + 10_000 * MS),
            Completion::NotRunning
        );
        assert_eq!(
            s.complete_ticket(again.ticket, Outcome::Rebuilt, t0 + 10_000 * MS),
            Completion::Clean
        );
        assert!(s.is_idle());
        for key in ["a", "b"] {
            assert!(
                matches!(s.find(&k(key)).1, Probe::Vacant(_)),
                "the index forgot {key}"
            );
        }
    }

    #[test]
    fn forgotten_slots_wait_for_their_batch_and_stale_tickets_stay_refused() {
        let (mut s, t0) = set(10, 1000);
        // "keep" stays queued, so completions never leave the set idle: the forgotten
        // slots wait for a batch instead of being freed at once.
        s.mark(&k("keep"), t0 + 500 * MS);
        let n = FORGET_BATCH as u32 + 10;
        let keys: Vec<Key> = (0..n).map(|i| k(&format!("k{i}"))).collect();
        for key in &keys {
            s.mark(key, t0);
        }
        let first = s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(
            s.complete_ticket(first.ticket, Outcome::Rebuilt, t0 + 10 * MS),
            Completion::Clean
        );
        assert_eq!(s.forgotten.len(), 1, "its bucket waits for the batch");
        assert!(matches!(s.find(&first.key).1, Probe::Vacant(_)));
        // A change to the forgotten key takes a new slot, never the forgotten one.
        assert_eq!(s.mark(&first.key, t0 + 11 * MS), Mark::Queued);
        let Probe::Found { slot, .. } = s.find(&first.key).1 else {
            panic!("marked again")
        };
        assert_ne!(slot, first.ticket.slot);
        assert_eq!(
            s.complete_ticket(first.ticket, Outcome::Rebuilt, t0 + 11 * MS),
            Completion::NotRunning
        );
        // Complete the rest: the batch flushes and the freed slots are reused.
        let mut tickets = vec![first.ticket];
        while let Some(r) = s.pop_ready(t0 + 30 * MS) {
            tickets.push(r.ticket);
            s.complete_ticket(r.ticket, Outcome::Rebuilt, t0 + 30 * MS);
        }
        assert_eq!(s.queued(), 1, "only keep");
        assert!(s.forgotten.len() < FORGET_BATCH, "a batch was flushed");
        for key in &keys {
            assert!(matches!(s.find(key).1, Probe::Vacant(_)), "{key} forgotten");
        }
        let fresh: Vec<Key> = (0..n).map(|i| k(&format!("new{i}"))).collect();
        for key in &fresh {
            s.mark(key, t0 + 40 * MS);
        }
        let mut reused = 0;
        while let Some(r) = s.pop_ready(t0 + 50 * MS) {
            if tickets.iter().any(|t| t.slot == r.ticket.slot) {
                reused += 1;
            }
            // Every old ticket of this slot is stale against the new run.
            for t in tickets.iter().filter(|t| t.slot == r.ticket.slot) {
                assert_eq!(
                    s.complete_ticket(*t, Outcome::Rebuilt, t0 + 50 * MS),
                    Completion::NotRunning
                );
            }
            assert_eq!(
                s.complete_ticket(r.ticket, Outcome::Rebuilt, t0 + 50 * MS),
                Completion::Clean
            );
        }
        assert!(reused > 0, "freed slots were reused");
        assert_eq!(s.queued(), 1);
        assert_eq!(s.pop_ready(t0 + 510 * MS).map(|r| r.key), Some(k("keep")));
    }

    #[test]
    fn in_order_and_out_of_order_deadlines_interleave_in_deadline_order() {
        // In-order marks go to the ring; retries after a backoff and deadlines capped
        // by max_wait arrive out of order and go to the heap. Pops follow deadlines.
        let (mut s, t0) = set(100, 150);
        let mut rng = Jitter::new(3);
        let mut now = t0;
        let mut expect: Vec<(Instant, Key)> = Vec::new();
        for i in 0..300u32 {
            now += Duration::from_micros(rng.below(2000));
            let key = k(&format!("k{i}"));
            s.mark(&key, now);
            if i % 7 == 0 {
                // Marked again 80 ms later: max_wait (150 ms) caps it at first + 150,
                // earlier than last + coalesce (180 ms), and behind later keys' marks.
                s.mark(&key, now + 80 * MS);
            }
            expect.push((s.deadline_of(&key).unwrap(), key));
        }
        // A failed key retries after a backoff: out of order too.
        expect.sort_by_key(|(d, _)| *d);
        let r = s.pop_ready(expect[0].0).unwrap();
        assert_eq!(s.deadline_of(&r.key), None, "running");
        let Completion::Retry { at, .. } =
            s.complete_ticket(r.ticket, Outcome::Failed(Retry::Key), expect[0].0)
        else {
            panic!("retry expected")
        };
        let failed = expect.iter_mut().find(|(_, e)| *e == r.key).unwrap();
        failed.0 = at;
        assert!(
            s.deadlines.in_heap() > 0,
            "some entries took the heap: {}",
            s.deadlines.in_heap()
        );
        expect.sort_by_key(|(d, _)| *d);
        let end = expect.last().unwrap().0;
        let mut got = Vec::new();
        while let Some(r) = s.pop_ready(end) {
            got.push((r.first_dirty, r.key.clone()));
            assert!(got.len() <= expect.len());
        }
        let got_keys: Vec<&Key> = got.iter().map(|(_, k)| k).collect();
        let want: Vec<&Key> = expect.iter().map(|(_, k)| k).collect();
        let mut sorted_got = got_keys.clone();
        sorted_got.sort();
        let mut sorted_want = want.clone();
        sorted_want.sort();
        assert_eq!(sorted_got, sorted_want, "every key popped once");
        // Deadlines of the popped sequence never go backwards.
        let ds: Vec<Instant> = got_keys
            .iter()
            .map(|k| expect.iter().find(|(_, e)| e == *k).unwrap().0)
            .collect();
        assert!(ds.windows(2).all(|w| w[0] <= w[1]), "popped out of order");
    }

    #[test]
    fn clean_completion_forgets_the_key() {
        let (mut s, t0) = set(10, 1000);
        s.mark(&k("a"), t0);
        s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(
            s.complete(&k("a"), Outcome::Rebuilt, t0 + 11 * MS),
            Completion::Clean
        );
        assert!(s.is_idle());
        assert_eq!(s.next_deadline(), None);
        assert_eq!(
            s.complete(&k("a"), Outcome::Rebuilt, t0 + 12 * MS),
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
            match s.complete(&k("a"), Outcome::Failed(Retry::Key), now) {
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
        let Completion::Retry { at, .. } = s.complete(&k("a"), Outcome::Failed(Retry::Key), t0)
        else {
            panic!("retry expected")
        };
        assert_eq!(s.mark(&k("a"), t0 + MS), Mark::Pending);
        assert_eq!(s.pop_ready(at - MS), None);
        assert!(s.pop_ready(at).is_some());
    }

    /// Fails `key`'s rebuilds that blame it until it is quarantined; returns the time.
    fn poison(s: &mut DirtySet, key: &Key, mut now: Instant) -> Instant {
        loop {
            s.pop_ready(now).expect("due");
            match s.complete(key, Outcome::Failed(Retry::Key), now) {
                Completion::Retry { at, .. } => now = at,
                Completion::Poisoned => return now,
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn poisons_after_n_key_failures_reported_once() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("bad"), t0);
        let mut now = t0;
        let mut outcomes = Vec::new();
        assert!(!s.is_poisoned(&k("bad")) && !s.is_poisoned(&k("other")));
        for _ in 0..3 {
            s.pop_ready(now).expect("due");
            let c = s.complete(&k("bad"), Outcome::Failed(Retry::Key), now);
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
        assert_eq!(s.pop_ready(now + 10_000 * MS), None, "no change, no retry");
        assert_eq!(s.poisoned_keys().collect::<Vec<_>>(), vec![&k("bad")]);
    }

    #[test]
    fn failures_of_the_path_never_quarantine() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("a"), t0);
        let mut now = t0;
        for attempt in 1..=50u32 {
            let r = s.pop_ready(now).expect("due");
            assert_eq!(r.failures, attempt - 1);
            let why = if attempt % 2 == 0 {
                Retry::Path
            } else {
                Retry::Fix
            };
            match s.complete(&k("a"), Outcome::Failed(why), now) {
                Completion::Retry { at, .. } => {
                    assert!(at - now <= 1000 * MS, "backoff stays capped");
                    now = at;
                }
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        assert_eq!(s.poisoned(), 0);
        // Two key failures after 50 outages still leave one attempt before quarantine.
        for _ in 0..2 {
            s.pop_ready(now).expect("due");
            let Completion::Retry { at, .. } =
                s.complete(&k("a"), Outcome::Failed(Retry::Key), now)
            else {
                panic!("two key failures of three do not quarantine");
            };
            now = at;
        }
        s.pop_ready(now).expect("due");
        assert_eq!(
            s.complete(&k("a"), Outcome::Rebuilt, now),
            Completion::Clean,
            "a success forgets every failure"
        );
    }

    #[test]
    fn a_change_gives_a_quarantined_key_one_fresh_attempt() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("bad"), t0);
        let now = poison(&mut s, &k("bad"), t0);
        assert_eq!(s.mark(&k("bad"), now), Mark::Retried);
        assert_eq!(s.poisoned(), 0);
        assert_eq!(s.pop_ready(now), None, "the retry waits for a backoff");
        let at = s.next_deadline().expect("queued");
        let r = s.pop_ready(at).expect("due after the backoff");
        assert_eq!(r.failures, 2);
        // Still broken: one failure quarantines it again.
        assert_eq!(
            s.complete(&k("bad"), Outcome::Failed(Retry::Key), at),
            Completion::Poisoned
        );
        // Fixed: the next change's attempt succeeds and the key is clean.
        assert_eq!(s.mark(&k("bad"), at), Mark::Retried);
        let at = s.next_deadline().expect("queued");
        s.pop_ready(at).expect("due");
        assert_eq!(
            s.complete(&k("bad"), Outcome::Rebuilt, at),
            Completion::Clean
        );
        assert!(s.is_idle());
        assert_eq!(s.poisoned(), 0);
    }

    #[test]
    fn keys_stalled_by_an_outage_are_due_once_it_ends() {
        let (mut s, t0) = set(0, 1000);
        for name in ["a", "b", "c"] {
            s.mark(&k(name), t0);
        }
        let mut now = t0;
        // An outage: every attempt fails by the path, backoffs grow.
        for _ in 0..4 {
            while let Some(r) = s.pop_ready(now) {
                s.complete(&r.key, Outcome::Failed(Retry::Path), now);
            }
            now = s.next_deadline().expect("queued");
        }
        s.mark(&k("d"), now); // a healthy key, dirty in the usual way
        let later = now + 200 * MS;
        assert!(s.next_deadline().unwrap() <= now);
        let r = s.pop_ready(now).unwrap();
        assert_eq!(s.complete(&r.key, Outcome::Rebuilt, now), Completion::Clean);
        // The first success: the rest go now instead of after their backoff.
        assert_eq!(s.expedite_stalled(now), 2);
        let mut keys = drain(&mut s, now);
        keys.sort();
        assert_eq!(keys.len(), 3, "{keys:?}");
        assert_eq!(s.queued(), 0);
        assert_eq!(
            s.pop_ready(later),
            None,
            "one heap entry per key: nothing left"
        );
    }

    #[test]
    fn only_keys_stalled_by_the_path_are_expedited_and_only_when_still_waiting() {
        let (mut s, t0) = set(0, 1000);
        for name in ["path", "own", "due"] {
            s.mark(&k(name), t0);
        }
        let r = s.pop_ready(t0).unwrap();
        s.complete(&r.key, Outcome::Failed(Retry::Path), t0);
        let path_at = s.deadline_of(&r.key).unwrap();
        let r2 = s.pop_ready(t0).unwrap();
        s.complete(&r2.key, Outcome::Failed(Retry::Key), t0);
        let own_at = s.deadline_of(&r2.key).unwrap();
        let r3 = s.pop_ready(t0).unwrap();
        s.complete(&r3.key, Outcome::Failed(Retry::Path), t0);
        let due_at = s.deadline_of(&r3.key).unwrap();
        s.mark(&k("fresh"), t0);
        let fresh_at = s.deadline_of(&k("fresh")).unwrap();
        // At the very deadline of one stalled key: it is due anyway, nothing to move.
        let now = due_at.min(path_at);
        let moved = s.expedite_stalled(now);
        let expected = [path_at, due_at].iter().filter(|at| **at > now).count();
        assert_eq!(moved, expected, "stalled keys still backing off at {now:?}");
        assert_eq!(
            s.deadline_of(&r2.key),
            Some(own_at),
            "its own failure keeps its backoff"
        );
        assert_eq!(
            s.deadline_of(&k("fresh")),
            Some(fresh_at),
            "a dirty key keeps its deadline"
        );
        assert_eq!(s.deadline_of(&r.key), Some(path_at.min(now)));
    }

    #[test]
    fn heap_bytes_counts_every_slot_heap_entry_and_free_slot() {
        let (mut s, t0) = set(0, 1000);
        let keys: Vec<Key> = (0..1000).map(|i| k(&format!("k{i}"))).collect();
        for key in &keys {
            s.mark(key, t0);
        }
        let queued = 1000 * (std::mem::size_of::<Slot>() + std::mem::size_of::<Entry>());
        assert!(s.heap_bytes() >= queued, "{} < {queued}", s.heap_bytes());
        while let Some(r) = s.pop_ready(t0) {
            s.complete(&r.key, Outcome::Rebuilt, t0);
        }
        let freed = 1000 * (std::mem::size_of::<Slot>() + std::mem::size_of::<u32>());
        assert!(s.heap_bytes() >= freed, "{} < {freed}", s.heap_bytes());
    }

    #[test]
    fn a_sweep_never_delays_a_waiting_key() {
        // The original library's scenario: change at t, sweep at t+800 ms, coalesce 1 s
        // → rebuilt at t+1 s, not t+1.8 s.
        let (mut s, t0) = set(1000, 5000);
        s.mark(&k("a"), t0);
        assert_eq!(s.revive(&k("a"), t0 + 800 * MS), Mark::Unchanged);
        assert_eq!(s.next_deadline(), Some(t0 + 1000 * MS));
        assert!(s.pop_ready(t0 + 1000 * MS).is_some());
        // A key backing off keeps its retry time too.
        let Completion::Retry { at, .. } =
            s.complete(&k("a"), Outcome::Failed(Retry::Key), t0 + 1000 * MS)
        else {
            panic!("retry expected")
        };
        assert_eq!(s.revive(&k("a"), t0 + 1001 * MS), Mark::Unchanged);
        assert_eq!(s.next_deadline(), Some(at));
    }

    #[test]
    fn reconcile_revives_a_poisoned_key() {
        let (mut s, t0) = set(0, 1000);
        s.mark(&k("bad"), t0);
        let now = poison(&mut s, &k("bad"), t0);
        assert_eq!(s.revive(&k("bad"), now), Mark::Revived);
        assert_eq!(s.poisoned(), 0);
        let r = s.pop_ready(now).expect("revived key is due");
        assert_eq!(r.failures, 0, "failure count starts over");
        assert_eq!(
            s.complete(&k("bad"), Outcome::Rebuilt, now),
            Completion::Clean
        );
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
        assert_eq!(s.deadlines.len(), 1);
    }

    /// Marks `keys` through the batch path, returning each key's [`Mark`].
    fn batch_marks(s: &mut DirtySet, keys: &[Key], now: Instant, revive: bool) -> Vec<Mark> {
        let mut marks = Vec::new();
        s.mark_batch(keys, now, revive, |i, m| {
            assert_eq!(i, marks.len(), "in order");
            marks.push(m);
        });
        marks
    }

    #[test]
    fn a_batch_with_duplicate_keys_queues_each_once_in_first_mark_order() {
        let (mut s, t0) = set(100, 1000);
        let batch = [k("a"), k("b"), k("a"), k("a"), k("c"), k("b")];
        let marks = batch_marks(&mut s, &batch, t0, false);
        use Mark::{Pending, Queued};
        assert_eq!(marks, [Queued, Queued, Pending, Pending, Queued, Pending]);
        assert_eq!(s.queued(), 3);
        assert_eq!(s.deadlines.len(), 3, "one queue entry per key");
        assert_eq!(s.pop_ready(t0 + 99 * MS), None);
        assert_eq!(drain(&mut s, t0 + 100 * MS), vec![k("a"), k("b"), k("c")]);
    }

    #[test]
    fn a_batch_mixing_new_and_dirty_keys_restarts_the_dirty_ones() {
        let (mut s, t0) = set(100, 1000);
        s.mark(&k("old"), t0);
        s.mark(&k("other"), t0 + 10 * MS);
        s.mark_many(&[k("new1"), k("old"), k("new2")], t0 + 50 * MS);
        assert_eq!(s.queued(), 4);
        assert_eq!(s.deadline_of(&k("old")), Some(t0 + 150 * MS), "restarted");
        assert_eq!(s.deadline_of(&k("other")), Some(t0 + 110 * MS), "untouched");
        assert_eq!(s.deadline_of(&k("new1")), Some(t0 + 150 * MS));
        // "old" ties with the batch's new keys at 150 ms; its entry surfaces at 100 ms
        // and is pushed again behind them, exactly as marking one by one does.
        assert_eq!(
            drain(&mut s, t0 + 150 * MS),
            vec![k("other"), k("new1"), k("new2"), k("old")]
        );
    }

    #[test]
    fn keys_marked_in_a_batch_while_running_keep_their_ticket_rules() {
        let (mut s, t0) = set(10, 1000);
        s.mark_many(&[k("a"), k("b")], t0);
        let a = s.pop_ready(t0 + 10 * MS).unwrap();
        let b = s.pop_ready(t0 + 10 * MS).unwrap();
        assert_eq!(a.key, k("a"));
        let marks = batch_marks(&mut s, &[k("a"), k("c"), k("a")], t0 + 11 * MS, false);
        assert_eq!(marks, [Mark::Redirtied, Mark::Queued, Mark::Redirtied]);
        assert_eq!(s.running(), 2);
        assert_eq!(s.pop_ready(t0 + 100 * MS).map(|r| r.key), Some(k("c")));
        assert_eq!(s.pop_ready(t0 + 100 * MS), None, "a still runs");
        // a's run ends; its re-mark queues it again, and the first ticket is spent.
        assert_eq!(
            s.complete_ticket(a.ticket, Outcome::Rebuilt, t0 + 12 * MS),
            Completion::Requeued
        );
        assert_eq!(
            s.complete_ticket(a.ticket, Outcome::Rebuilt, t0 + 12 * MS),
            Completion::NotRunning
        );
        let again = s.pop_ready(t0 + 21 * MS).unwrap();
        assert_eq!(
            (again.key.clone(), again.first_dirty),
            (k("a"), t0 + 11 * MS)
        );
        assert_ne!(again.ticket, a.ticket);
        // b finishes clean; a batch marking it again starts a fresh run.
        assert_eq!(
            s.complete_ticket(b.ticket, Outcome::Rebuilt, t0 + 22 * MS),
            Completion::Clean
        );
        assert_eq!(
            batch_marks(&mut s, &[k("b")], t0 + 23 * MS, false),
            [Mark::Queued]
        );
        assert_eq!(
            s.complete_ticket(b.ticket, Outcome::Rebuilt, t0 + 23 * MS),
            Completion::NotRunning,
            "a stale ticket does not complete the new run"
        );
    }

    /// What a pop hands out, but its ticket: slot numbers depend on the order in which
    /// freed slots return, which follows each set's own secret hash.
    fn run(r: &Option<Ready>) -> Option<(Key, Instant, u32, bool)> {
        r.as_ref()
            .map(|r| (r.key.clone(), r.first_dirty, r.failures, r.by_change))
    }

    /// Two sets fed the same random history, one marking key by key, the other in
    /// batches (`mark_many` / `revive_many`): every mark, every pop (key, first
    /// change, failures, origin) and every completion by ticket agree. Batches hold
    /// duplicates, dirty, running, backing-off and quarantined keys; the key space
    /// makes the index grow and the forgotten buckets flush in batches.
    #[test]
    fn batched_marks_agree_with_marking_one_by_one() {
        let mut poisoned = 0;
        let mut marks = std::collections::BTreeMap::new();
        for seed in 1..=12u64 {
            let mut rng = Jitter::new(seed);
            let (mut one, t0) = set(10, 40);
            let mut many = DirtySet::new(*one.config(), t0);
            let universe: Vec<Key> = (0..3000).map(|i| k(&format!("key-{i}"))).collect();
            let mut now = t0;
            let mut running: Vec<(Ticket, Ticket)> = Vec::new();
            for step in 0..400 {
                now += Duration::from_micros(rng.below(3000));
                match rng.below(4) {
                    0 | 1 => {
                        // A batch from a small hot range (duplicates, dirty and running
                        // keys) or from the whole space (new keys).
                        let span = if rng.below(2) == 0 {
                            40
                        } else {
                            universe.len()
                        };
                        let len = rng.below(300) as usize;
                        let batch: Vec<Key> = (0..len)
                            .map(|_| universe[rng.below(span as u64) as usize].clone())
                            .collect();
                        let revive = rng.below(5) == 0;
                        let expect: Vec<Mark> = batch
                            .iter()
                            .map(|key| {
                                if revive {
                                    one.revive(key, now)
                                } else {
                                    one.mark(key, now)
                                }
                            })
                            .collect();
                        // The public `mark_many` says nothing per key: the states
                        // compared after each step and the pops check it.
                        let got = if revive {
                            let mut got = Vec::new();
                            many.revive_many(&batch, now, |key, m| got.push((key.clone(), m)));
                            let keys: Vec<Key> = got.iter().map(|(key, _)| key.clone()).collect();
                            assert_eq!(keys, batch, "seed {seed} step {step}: each key heard");
                            Some(got.into_iter().map(|(_, m)| m).collect())
                        } else if rng.below(2) == 0 {
                            many.mark_many(&batch, now);
                            None
                        } else {
                            Some(batch_marks(&mut many, &batch, now, false))
                        };
                        if let Some(got) = got {
                            assert_eq!(got, expect, "seed {seed} step {step}");
                        }
                        for key in &batch {
                            let (a, b) = (one.deadline_of(key), many.deadline_of(key));
                            assert_eq!(a, b, "seed {seed} step {step}: {key}");
                        }
                        for m in expect {
                            *marks.entry(format!("{m:?}")).or_insert(0) += 1;
                        }
                    }
                    2 => {
                        for _ in 0..rng.below(400) {
                            let (a, b) = (one.pop_ready(now), many.pop_ready(now));
                            assert_eq!(run(&a), run(&b), "seed {seed} step {step}");
                            match (a, b) {
                                (Some(a), Some(b)) => running.push((a.ticket, b.ticket)),
                                _ => break,
                            }
                        }
                    }
                    _ => {
                        for _ in 0..rng.below(running.len() as u64 + 1) {
                            let at = rng.below(running.len() as u64) as usize;
                            let (a, b) = running.swap_remove(at);
                            let outcome = match rng.below(8) {
                                0 => Outcome::Failed(Retry::Key),
                                1 => Outcome::Failed(Retry::Path),
                                _ => Outcome::Rebuilt,
                            };
                            let c = one.complete_ticket(a, outcome, now);
                            assert_eq!(c, many.complete_ticket(b, outcome, now), "seed {seed}");
                            poisoned += usize::from(c == Completion::Poisoned);
                            // A completed run's ticket is spent, in both.
                            let again = one.complete_ticket(a, outcome, now);
                            assert_eq!(again, Completion::NotRunning);
                            assert_eq!(again, many.complete_ticket(b, outcome, now));
                        }
                    }
                }
                assert_eq!(
                    (one.queued(), one.running(), one.poisoned()),
                    (many.queued(), many.running(), many.poisoned()),
                    "seed {seed} step {step}"
                );
                assert_eq!(one.next_deadline(), many.next_deadline(), "seed {seed}");
            }
            for key in &universe {
                assert_eq!(
                    one.deadline_of(key),
                    many.deadline_of(key),
                    "seed {seed} {key}"
                );
                assert_eq!(
                    one.is_poisoned(key),
                    many.is_poisoned(key),
                    "seed {seed} {key}"
                );
            }
            let end = now + 100_000 * MS;
            loop {
                let a = one.pop_ready(end);
                assert_eq!(run(&a), run(&many.pop_ready(end)), "seed {seed}: the drain");
                if a.is_none() {
                    break;
                }
            }
        }
        // The histories reached every state a mark can meet.
        assert!(poisoned > 0, "no key was quarantined");
        assert_eq!(marks.len(), 6, "every kind of mark: {marks:?}");
    }
}
