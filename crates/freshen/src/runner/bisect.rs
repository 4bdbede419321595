//! `Halves`: a rebuild call of several keys that failed by data is retried in halves.
//!
//! One key whose data a statement rejects fails the whole call. Retrying each of the
//! call's keys alone (what a failed call of a few keys did) costs one call per key: up
//! to a bulk batch of 10 000 statements for one bad key. Halving isolates a bad key in
//! about 2·log2(n) calls instead (both halves of each failing half run), while the
//! halves without it settle at once. The keys stay running in the dirty set meanwhile
//! (their tickets open, a change re-dirties them as for any running call), and a key is
//! counted toward quarantine only when it fails alone, as before.

use std::collections::VecDeque;

/// The halves of failed calls waiting for a worker, oldest first; `T` is what one key
/// of a call carries (the loop's bookkeeping and the key's `Due`).
pub(super) struct Halves<T> {
    waiting: VecDeque<Vec<T>>,
}

impl<T> Default for Halves<T> {
    fn default() -> Self {
        Halves {
            waiting: VecDeque::new(),
        }
    }
}

impl<T> Halves<T> {
    /// A failed call's keys: more than one, so they wait as two halves (the first half
    /// the larger); one key is returned, to be failed on its own.
    pub(super) fn split(&mut self, mut keys: Vec<T>) -> Option<Vec<T>> {
        if keys.len() < 2 {
            return Some(keys);
        }
        let second = keys.split_off(keys.len().div_ceil(2));
        self.waiting.push_back(keys);
        self.waiting.push_back(second);
        None
    }

    /// The oldest waiting half, to run next.
    pub(super) fn next(&mut self) -> Option<Vec<T>> {
        self.waiting.pop_front()
    }

    /// Whether no half waits.
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Keys in the waiting halves.
    pub(super) fn keys(&self) -> usize {
        self.waiting.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs calls over `n` keys the way the loop does — a call fails when it holds a
    /// bad key and then splits — and returns the calls made and the keys that failed
    /// alone.
    fn isolate(n: usize, bad: &[usize]) -> (usize, Vec<usize>) {
        let mut halves = Halves::default();
        let mut alone = Vec::new();
        let mut calls = 1;
        let first: Vec<usize> = (0..n).collect();
        let mut failed = first.iter().any(|k| bad.contains(k)).then_some(first);
        loop {
            if let Some(keys) = failed.take()
                && let Some(one) = halves.split(keys)
            {
                alone.extend(one);
            }
            let Some(call) = halves.next() else { break };
            calls += 1;
            if call.iter().any(|k| bad.contains(k)) {
                failed = Some(call);
            }
        }
        (calls, alone)
    }

    #[test]
    fn one_bad_key_of_a_bulk_batch_is_isolated_in_log_calls() {
        let (calls, alone) = isolate(10_000, &[6_789]);
        assert_eq!(alone, vec![6_789]);
        // One call, then two per level of a 14-level halving (ceil(log2 10 000) = 14).
        assert!(calls <= 1 + 2 * 14, "{calls} calls");
        assert!(
            calls < 10_000 / 100,
            "far fewer than one call per key: {calls}"
        );
    }

    #[test]
    fn every_bad_key_is_isolated_and_no_good_one() {
        for n in [2, 3, 7, 1000] {
            let bad = [0, n / 2, n - 1];
            let (_, mut alone) = isolate(n, &bad);
            alone.sort_unstable();
            alone.dedup();
            let mut want = bad.to_vec();
            want.dedup();
            assert_eq!(alone, want, "n = {n}");
        }
    }

    #[test]
    fn halves_cover_the_call_in_order_the_first_the_larger() {
        let mut h = Halves::default();
        assert_eq!(h.split(vec![1]), Some(vec![1]), "one key is not split");
        assert_eq!(h.split(Vec::<u8>::new()), Some(vec![]));
        assert!(h.is_empty());
        assert_eq!(h.split(vec![1, 2, 3, 4, 5]), None);
        assert_eq!(h.keys(), 5);
        assert_eq!(h.next(), Some(vec![1, 2, 3]));
        assert_eq!(h.next(), Some(vec![4, 5]));
        assert_eq!(h.next(), None);
        assert!(h.is_empty());
    }
}
