//! The worker's fence: which key-stream partitions this instance owns, and how many
//! rebuilds of each are running — so that a revoked partition's keys stop starting at
//! once and the revocation waits for the ones already running.
//!
//! [`Fence`] is the state machine (pure, tested without I/O); [`Fences`] shares it
//! between the rebuild tasks and the consumer's rebalance callback, which blocks on it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Owned partitions and running rebuilds per partition.
#[derive(Debug, Default)]
pub(crate) struct Fence {
    owned: BTreeSet<i32>,
    running: HashMap<i32, usize>,
    /// The topic's partition count (what [`partition_of`](crate::keys::partition_of)
    /// divides by); `None` until known.
    partitions: Option<i32>,
}

impl Fence {
    pub(crate) fn set_partitions(&mut self, n: i32) {
        self.partitions = Some(n);
    }

    pub(crate) fn partitions(&self) -> Option<i32> {
        self.partitions
    }

    pub(crate) fn assign(&mut self, parts: impl IntoIterator<Item = i32>) {
        self.owned.extend(parts);
    }

    /// From now on no rebuild of these partitions' keys starts here.
    pub(crate) fn revoke(&mut self, parts: impl IntoIterator<Item = i32>) {
        for p in parts {
            self.owned.remove(&p);
        }
    }

    pub(crate) fn revoke_all(&mut self) -> Vec<i32> {
        std::mem::take(&mut self.owned).into_iter().collect()
    }

    /// A rebuild of a key of `part` may start: counted as running until
    /// [`leave`](Self::leave). `false` when the partition is not owned here.
    pub(crate) fn enter(&mut self, part: i32) -> bool {
        if !self.owned.contains(&part) {
            return false;
        }
        *self.running.entry(part).or_default() += 1;
        true
    }

    pub(crate) fn leave(&mut self, part: i32) {
        if let Some(n) = self.running.get_mut(&part) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(&part);
            }
        }
    }

    /// Rebuilds of `parts`' keys running now.
    pub(crate) fn running(&self, parts: &[i32]) -> usize {
        parts
            .iter()
            .map(|p| self.running.get(p).copied().unwrap_or(0))
            .sum()
    }

    pub(crate) fn owned(&self) -> Vec<i32> {
        self.owned.iter().copied().collect()
    }
}

/// The fence, shared.
#[derive(Debug, Default)]
pub(crate) struct Fences {
    fence: Mutex<Fence>,
    idle: Condvar,
}

impl Fences {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Fence> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A rebuild of `parts`' keys ended.
    pub(crate) fn leave(&self, parts: &[i32]) {
        let mut f = self.lock();
        for p in parts {
            f.leave(*p);
        }
        drop(f);
        self.idle.notify_all();
    }

    /// Blocks until no rebuild of `parts`' keys runs, or `timeout` passes; how many
    /// still run (0: drained).
    pub(crate) fn wait_idle(&self, parts: &[i32], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut f = self.lock();
        loop {
            let n = f.running(parts);
            let now = Instant::now();
            if n == 0 || now >= deadline {
                return n;
            }
            f = self
                .idle
                .wait_timeout(f, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn only_owned_partitions_start_rebuilds() {
        let mut f = Fence::default();
        assert!(!f.enter(0), "nothing is owned before an assignment");
        f.assign([0, 2]);
        assert!(f.enter(0));
        assert!(f.enter(0));
        assert!(f.enter(2));
        assert!(!f.enter(1));
        assert_eq!(f.running(&[0]), 2);
        f.revoke([0]);
        assert!(!f.enter(0), "a revoked partition starts nothing more");
        assert_eq!(f.running(&[0]), 2, "what runs is still counted");
        f.leave(0);
        assert_eq!(f.running(&[0]), 1, "one of the two still runs");
        f.leave(0);
        assert_eq!(f.running(&[0, 2]), 1);
        assert_eq!(f.owned(), vec![2]);
        assert_eq!(f.revoke_all(), vec![2]);
        assert!(!f.enter(2));
    }

    #[test]
    fn the_partition_count_is_unknown_until_set() {
        // What a key's partition is computed with (key_source.rs): a wrong count would
        // fence keys by partitions this instance never owned.
        let mut f = Fence::default();
        assert_eq!(f.partitions(), None);
        f.set_partitions(6);
        assert_eq!(f.partitions(), Some(6));
    }

    #[test]
    fn a_revocation_waits_for_running_rebuilds_and_no_longer() {
        let fences = Arc::new(Fences::default());
        fences.lock().assign([3]);
        assert!(fences.lock().enter(3));
        fences.lock().revoke([3]);
        // Times out while the rebuild runs.
        assert_eq!(fences.wait_idle(&[3], Duration::from_millis(20)), 1);
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fences.clone();
        let waiter = std::thread::spawn(move || {
            tx.send(()).unwrap();
            f.wait_idle(&[3], Duration::from_secs(30))
        });
        rx.recv().unwrap();
        fences.leave(&[3]);
        assert_eq!(waiter.join().unwrap(), 0, "woken by the rebuild's end");
        assert_eq!(fences.wait_idle(&[4], Duration::ZERO), 0);
    }
}
