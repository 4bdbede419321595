//! The scheduler's deadline queue: a FIFO ring for entries pushed in order, a 4-ary
//! heap for the rest.
//!
//! Every mark with the same `coalesce` on a clock that never runs backwards gives a
//! deadline at or after the one before, so nearly every push is the largest so far.
//! Such an entry goes to the back of a ring, which stays sorted by construction and
//! pops from its front in O(1) without sifting; only an entry smaller than the ring's
//! back (a retry after a backoff, a deadline moved by `max_wait`, a lazy re-push)
//! goes to the heap. The smaller of the two fronts is the queue's minimum.
//!
//! ```text
//!   push e:  e >= ring.back ? ──yes──► ring  [d1 ≤ d2 ≤ … ≤ dn]  ─┐
//!                  │                                              ├─ min of the fronts ─► pop
//!                  └──no──────────► heap (4-ary, O(log n))  ─────┘
//! ```
//!
//! The 1M-key mark + drain spent 12 % of its time sifting the heap; in order, it now
//! sifts nothing.

use std::collections::VecDeque;

use crate::heap::QuadHeap;

/// A min-queue that is a ring while pushes come in order (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Deadlines<T> {
    ring: VecDeque<T>,
    heap: QuadHeap<T>,
}

impl<T: Ord + Copy> Deadlines<T> {
    pub(crate) fn new() -> Deadlines<T> {
        Deadlines {
            ring: VecDeque::new(),
            heap: QuadHeap::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ring.len() + self.heap.len()
    }

    /// Entries the two parts have room for (for heap accounting).
    pub(crate) fn capacity(&self) -> usize {
        self.ring.capacity() + self.heap.capacity()
    }

    pub(crate) fn push(&mut self, item: T) {
        match self.ring.back() {
            Some(back) if item < *back => self.heap.push(item),
            _ => self.ring.push_back(item),
        }
    }

    /// Whether the minimum is the ring's front (else the heap's top).
    fn ring_first(&self) -> Option<bool> {
        match (self.ring.front(), self.heap.peek()) {
            (None, None) => None,
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (Some(r), Some(h)) => Some(r <= h),
        }
    }

    pub(crate) fn peek(&self) -> Option<&T> {
        if self.ring_first()? {
            self.ring.front()
        } else {
            self.heap.peek()
        }
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.ring_first()? {
            self.ring.pop_front()
        } else {
            self.heap.pop()
        }
    }

    /// Entries in the heap, not the ring (tests).
    #[cfg(test)]
    pub(crate) fn in_heap(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Jitter;

    /// Runs of in-order pushes broken by out-of-order ones, pops interleaved: every pop
    /// agrees with std's heap, whichever part it comes from.
    #[test]
    fn agrees_with_a_binary_heap_on_mixed_order() {
        for seed in 1..=50u64 {
            let mut rng = Jitter::new(seed);
            let mut q = Deadlines::new();
            let mut model = std::collections::BinaryHeap::new();
            let mut clock = 0u64;
            let mut seq = 0u64;
            let mut from_ring = 0;
            for _ in 0..2000 {
                match rng.below(10) {
                    0..=4 => {
                        // In order: the clock moves on, a deadline a fixed delay ahead.
                        clock += rng.below(3);
                        seq += 1;
                        q.push((clock + 100, seq));
                        model.push(std::cmp::Reverse((clock + 100, seq)));
                    }
                    5 => {
                        // Out of order: a shorter delay (a max_wait cap) or a retry.
                        seq += 1;
                        let d = clock + rng.below(200);
                        q.push((d, seq));
                        model.push(std::cmp::Reverse((d, seq)));
                    }
                    _ => {
                        let in_heap = q.in_heap();
                        let got = q.pop();
                        assert_eq!(got, model.pop().map(|r| r.0), "seed {seed}");
                        if got.is_some() && q.in_heap() == in_heap {
                            from_ring += 1;
                        }
                    }
                }
                assert_eq!(q.peek().copied(), model.peek().map(|r| r.0));
                assert_eq!(q.len(), model.len());
            }
            assert!(from_ring > 0, "seed {seed}: the ring served no pop");
        }
    }

    #[test]
    fn in_order_pushes_never_touch_the_heap() {
        let mut q = Deadlines::new();
        for d in [1u64, 1, 2, 5, 5, 9] {
            q.push(d);
        }
        assert_eq!(q.in_heap(), 0);
        q.push(3);
        assert_eq!(q.in_heap(), 1, "smaller than the back");
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [1, 1, 2, 3, 5, 5, 9]);
    }
}
