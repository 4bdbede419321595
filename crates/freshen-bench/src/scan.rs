//! The rival: a dirty set that keeps keys in a FIFO and scans it on every pop, as the Go
//! original (cdcfresh) does. Same debounce rules as `DirtySet`; O(n) per pop.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use freshen::Key;

struct Entry {
    first: Instant,
    last: Instant,
}

/// FIFO-scan dirty set (debounce + max-wait, no retries: enough for the drain benchmarks).
pub(crate) struct ScanSet {
    coalesce: Duration,
    max_wait: Duration,
    entries: HashMap<Key, Entry>,
    /// Removing from the front is O(1), like re-slicing a Go slice; from the middle, O(n).
    fifo: VecDeque<Key>,
}

impl ScanSet {
    pub(crate) fn new(coalesce: Duration, max_wait: Duration) -> ScanSet {
        ScanSet {
            coalesce,
            max_wait,
            entries: HashMap::new(),
            fifo: VecDeque::new(),
        }
    }

    pub(crate) fn mark(&mut self, key: &Key, now: Instant) {
        match self.entries.get_mut(key) {
            Some(e) => e.last = now,
            None => {
                self.entries.insert(
                    key.clone(),
                    Entry {
                        first: now,
                        last: now,
                    },
                );
                self.fifo.push_back(key.clone());
            }
        }
    }

    /// The first key in FIFO order whose deadline has passed.
    pub(crate) fn pop_ready(&mut self, now: Instant) -> Option<Key> {
        let i = self.fifo.iter().position(|k| {
            let e = &self.entries[k];
            (e.last + self.coalesce).min(e.first + self.max_wait) <= now
        })?;
        let key = self.fifo.remove(i)?;
        self.entries.remove(&key);
        Some(key)
    }
}
