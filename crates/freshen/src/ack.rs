//! Acknowledgement policies and the after-rebuild tracker (a pure state machine).
//!
//! Under [`AckPolicy::AfterRebuild`] a batch may be acknowledged only when every key it
//! dirtied has been rebuilt by a rebuild that *started after* the batch arrived, and
//! acks leave in batch order. Rather than a list of batches per key, the tracker keeps
//! one *hold* per key — the oldest batch still waiting on that key — and one per running
//! rebuild. Batch `b` is releasable exactly when `b` is older than every hold, so the
//! release point is the minimum of a multiset: O(log n) per operation, O(1) memory per
//! key however many batches touch it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::Key;

/// When a batch is acknowledged to its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckPolicy {
    /// Once every key the batch dirtied has been rebuilt by a rebuild that started after
    /// the batch arrived; in batch order. A crash loses nothing: the source replays from
    /// the last acknowledged position. The default.
    ///
    /// One exception, counted in [`Stats::quarantine_releases`](crate::Stats): a key
    /// quarantined (its own rebuilds failed `poison_after` times) in a refresher *with*
    /// a reconcile sweep releases its holds, so its transactions are confirmed without a
    /// successful rebuild and the sweep (or its next change) heals it. Without a sweep a
    /// quarantined key keeps its transactions unconfirmed until it rebuilds, unless
    /// [`Builder::release_quarantined_after`](crate::Builder::release_quarantined_after)
    /// bounds that. An outage never quarantines: only failures that blame the key count.
    #[default]
    AfterRebuild,
    /// As soon as the batch's keys are marked dirty. Stateless and quick to release the
    /// source; a crash loses the in-memory dirty set, which the reconcile sweep heals.
    OnEnqueue,
}

/// A batch's place in arrival order.
pub(crate) type BatchId = u64;

#[derive(Debug)]
pub(crate) struct AckTracker<A> {
    next: BatchId,
    /// Batches not yet released, oldest first.
    pending: VecDeque<(BatchId, A)>,
    /// Multiset of holds: batch id → how many holds name it.
    holds: BTreeMap<BatchId, usize>,
    /// Each key's oldest hold not yet covered by a running rebuild.
    keys: HashMap<Key, BatchId>,
}

impl<A> AckTracker<A> {
    pub(crate) fn new() -> AckTracker<A> {
        AckTracker {
            next: 0,
            pending: VecDeque::new(),
            holds: BTreeMap::new(),
            keys: HashMap::new(),
        }
    }

    /// Registers an arriving batch.
    pub(crate) fn receive(&mut self, ack: A) -> BatchId {
        let id = self.next;
        self.next += 1;
        self.pending.push_back((id, ack));
        id
    }

    fn add(&mut self, id: BatchId) {
        *self.holds.entry(id).or_default() += 1;
    }

    fn remove(&mut self, id: BatchId) {
        if let Some(n) = self.holds.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.holds.remove(&id);
            }
        }
    }

    /// `key` was dirtied by batch `id`: the batch waits for a rebuild starting from now.
    pub(crate) fn hold(&mut self, key: &Key, id: BatchId) {
        match self.keys.get_mut(key) {
            // The older hold already pins everything from `*h` on.
            Some(h) if *h <= id => {}
            Some(h) => {
                let newer = std::mem::replace(h, id);
                self.remove(newer);
                self.add(id);
            }
            None => {
                self.keys.insert(key.clone(), id);
                self.add(id);
            }
        }
    }

    /// Pins batch `id` itself (until [`unhold_batch`](Self::unhold_batch)); used while a
    /// TRUNCATE's reconcile sweep is still listing keys.
    pub(crate) fn hold_batch(&mut self, id: BatchId) {
        self.add(id);
    }

    /// Removes a pin from [`hold_batch`](Self::hold_batch).
    pub(crate) fn unhold_batch(&mut self, id: BatchId) {
        self.remove(id);
    }

    /// A rebuild of `key` starts: it covers the key's hold, which it returns.
    pub(crate) fn start(&mut self, key: &Key) -> Option<BatchId> {
        self.keys.remove(key)
    }

    /// The rebuild that covered `covered` succeeded.
    pub(crate) fn succeeded(&mut self, covered: Option<BatchId>) {
        if let Some(id) = covered {
            self.remove(id);
        }
    }

    /// The rebuild of `key` that covered `covered` failed: the hold goes back to the key,
    /// to be covered by the retry.
    pub(crate) fn failed(&mut self, key: &Key, covered: Option<BatchId>) {
        if let Some(id) = covered {
            // `hold` keeps the older of the two; the job's own count moves to the key.
            self.hold(key, id);
            self.remove(id);
        }
    }

    /// `key` is quarantined and will be healed otherwise (a reconcile sweep): it
    /// releases every hold. Returns whether it held any.
    pub(crate) fn forget(&mut self, key: &Key, covered: Option<BatchId>) -> bool {
        let mut held = false;
        if let Some(id) = self.keys.remove(key) {
            self.remove(id);
            held = true;
        }
        if let Some(id) = covered {
            self.remove(id);
            held = true;
        }
        held
    }

    /// Acks that may leave now, oldest first.
    pub(crate) fn release(&mut self) -> Vec<A> {
        let limit = self.holds.keys().next().copied().unwrap_or(BatchId::MAX);
        let mut out = Vec::new();
        while let Some((id, _)) = self.pending.front() {
            if *id >= limit {
                break;
            }
            out.push(self.pending.pop_front().expect("front exists").1);
        }
        out
    }

    /// Batches received and not yet released.
    pub(crate) fn unreleased(&self) -> usize {
        self.pending.len()
    }

    /// Keys holding a batch back (not counting running rebuilds).
    #[cfg(test)]
    pub(crate) fn held_keys(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Key {
        Key::from(s)
    }

    #[test]
    fn a_batch_waits_for_a_rebuild_started_after_it() {
        let mut t = AckTracker::new();
        let b0 = t.receive("b0");
        t.hold(&k("a"), b0);
        let job = t.start(&k("a"));
        let b1 = t.receive("b1");
        t.hold(&k("a"), b1); // arrives while a's rebuild runs
        t.succeeded(job);
        assert_eq!(t.release(), vec!["b0"]);
        assert!(t.release().is_empty(), "b1 needs a second rebuild");
        let job2 = t.start(&k("a"));
        t.succeeded(job2);
        assert_eq!(t.release(), vec!["b1"]);
    }

    #[test]
    fn releases_strictly_in_order() {
        let mut t = AckTracker::new();
        let b0 = t.receive(0);
        t.hold(&k("slow"), b0);
        let b1 = t.receive(1);
        t.hold(&k("fast"), b1);
        let b2 = t.receive(2); // dirtied nothing
        let _ = b2;
        let fast = t.start(&k("fast"));
        t.succeeded(fast);
        assert!(t.release().is_empty(), "b1 and b2 wait for b0");
        let slow = t.start(&k("slow"));
        t.succeeded(slow);
        assert_eq!(t.release(), vec![0, 1, 2]);
        assert_eq!(t.unreleased(), 0);
    }

    #[test]
    fn an_empty_batch_leaves_once_earlier_ones_have() {
        let mut t = AckTracker::new();
        t.receive("empty");
        assert_eq!(t.release(), vec!["empty"]);
    }

    #[test]
    fn a_failed_rebuild_keeps_the_hold_until_the_retry_succeeds() {
        let mut t = AckTracker::new();
        let b0 = t.receive("b0");
        t.hold(&k("a"), b0);
        let job = t.start(&k("a"));
        let b1 = t.receive("b1");
        t.hold(&k("a"), b1);
        t.failed(&k("a"), job);
        assert!(t.release().is_empty());
        assert_eq!(t.held_keys(), 1);
        let retry = t.start(&k("a"));
        assert_eq!(retry, Some(b0), "the retry covers the oldest hold");
        t.succeeded(retry);
        assert_eq!(t.release(), vec!["b0", "b1"]);
        assert!(t.holds.is_empty());
    }

    #[test]
    fn a_poisoned_key_releases_its_holds() {
        let mut t = AckTracker::new();
        let b0 = t.receive("b0");
        t.hold(&k("bad"), b0);
        let job = t.start(&k("bad"));
        let b1 = t.receive("b1");
        t.hold(&k("bad"), b1);
        assert!(t.forget(&k("bad"), job));
        assert_eq!(t.release(), vec!["b0", "b1"]);
        assert!(t.holds.is_empty());
    }

    #[test]
    fn a_batch_pin_holds_until_removed() {
        let mut t = AckTracker::new();
        let b0 = t.receive("truncate");
        t.hold_batch(b0);
        t.receive("later");
        assert!(t.release().is_empty());
        // The sweep marks keys on behalf of the pinned batch, then unpins it.
        t.hold(&k("x"), b0);
        t.unhold_batch(b0);
        assert!(t.release().is_empty());
        let job = t.start(&k("x"));
        t.succeeded(job);
        assert_eq!(t.release(), vec!["truncate", "later"]);
    }

    #[test]
    fn a_second_change_to_a_waiting_key_keeps_the_first_batch_held() {
        let mut t = AckTracker::new();
        let b0 = t.receive(0);
        t.hold(&k("x"), b0);
        let b1 = t.receive(1);
        t.hold(&k("x"), b1); // before any rebuild of x started
        assert!(t.release().is_empty(), "b0 waits for x's rebuild");
        let job = t.start(&k("x"));
        assert_eq!(job, Some(b0), "the rebuild covers the oldest hold");
        t.succeeded(job);
        assert_eq!(t.release(), vec![0, 1]);
    }

    #[test]
    fn an_older_hold_replaces_a_newer_one() {
        let mut t = AckTracker::new();
        let b0 = t.receive(0);
        let b1 = t.receive(1);
        t.hold(&k("x"), b1);
        t.hold(&k("x"), b0);
        assert_eq!(t.holds.len(), 1);
        let job = t.start(&k("x"));
        assert_eq!(job, Some(b0));
        t.succeeded(job);
        assert_eq!(t.release(), vec![0, 1]);
    }
}
