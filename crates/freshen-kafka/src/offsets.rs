//! `Offsets`: per-partition acknowledgement tracking (a pure state machine).
//!
//! Batches are acknowledged strictly in the order they were handed out, so for each
//! partition the acknowledged position only moves forward: it is the highest
//! acknowledged offset + 1, the offset Kafka expects in a commit. Every assignment of
//! a partition gets a new *epoch*; an acknowledgement carries the epoch its messages
//! were read under, and one from an earlier assignment is ignored — after a rebalance
//! the partition may belong to another consumer, whose commits must not be overwritten.

use std::collections::HashMap;
use std::sync::Arc;

/// A topic and partition.
pub(crate) type Tp = (Arc<str>, i32);

#[derive(Debug, Clone, Copy)]
struct Part {
    epoch: u64,
    /// Next offset to commit: highest acknowledged offset + 1.
    acked: Option<i64>,
    /// What the last commit that was not known to fail wrote.
    committed: Option<i64>,
}

/// One partition's share of an acknowledged batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) tp: Tp,
    pub(crate) epoch: u64,
    /// Offset of the batch's last message from this partition, + 1.
    pub(crate) next: i64,
}

#[derive(Debug, Default)]
pub(crate) struct Offsets {
    parts: HashMap<Tp, Part>,
    epochs: u64,
    /// Bumped on every revocation, so that a batch being gathered can tell.
    revocations: u64,
}

impl Offsets {
    /// Partitions assigned to this consumer: each starts a new epoch.
    pub(crate) fn assign(&mut self, tps: impl IntoIterator<Item = Tp>) {
        for tp in tps {
            self.epochs += 1;
            self.parts.insert(
                tp,
                Part {
                    epoch: self.epochs,
                    acked: None,
                    committed: None,
                },
            );
        }
    }

    /// Partitions taken away: returns what was acknowledged and not yet committed, to
    /// commit before they go; later acknowledgements for them are ignored.
    pub(crate) fn revoke(&mut self, tps: impl IntoIterator<Item = Tp>) -> Vec<(Tp, i64)> {
        self.revocations += 1;
        let mut out = Vec::new();
        for tp in tps {
            if let Some(p) = self.parts.remove(&tp)
                && let Some(next) = p.acked
                && p.committed != Some(next)
            {
                out.push((tp, next));
            }
        }
        out
    }

    /// Every partition taken away (a lost assignment, an unsubscribe).
    pub(crate) fn revoke_all(&mut self) -> Vec<(Tp, i64)> {
        let all: Vec<Tp> = self.parts.keys().cloned().collect();
        self.revoke(all)
    }

    /// The epoch of `tp`'s current assignment; `None` when it is not assigned here.
    pub(crate) fn epoch(&self, tp: &Tp) -> Option<u64> {
        self.parts.get(tp).map(|p| p.epoch)
    }

    /// How many revocations have happened.
    pub(crate) fn revocations(&self) -> u64 {
        self.revocations
    }

    /// Records an acknowledged batch.
    pub(crate) fn ack(&mut self, marks: &[Mark]) {
        for m in marks {
            if let Some(p) = self.parts.get_mut(&m.tp)
                && p.epoch == m.epoch
            {
                p.acked = Some(p.acked.map_or(m.next, |a| a.max(m.next)));
            }
        }
    }

    /// Positions acknowledged but not committed yet; they count as committed from now
    /// (call [`failed`](Self::failed) when the commit fails).
    pub(crate) fn take_commits(&mut self) -> Vec<(Tp, i64)> {
        let mut out = Vec::new();
        for (tp, p) in &mut self.parts {
            if let Some(next) = p.acked
                && p.committed != Some(next)
            {
                p.committed = Some(next);
                out.push((tp.clone(), next));
            }
        }
        out
    }

    /// A commit of `tp` at `next` failed: it is retried with the next commit.
    pub(crate) fn failed(&mut self, tp: &Tp, next: i64) {
        if let Some(p) = self.parts.get_mut(tp)
            && p.committed == Some(next)
        {
            p.committed = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        (Arc::from("t"), p)
    }

    fn mark(o: &Offsets, p: i32, next: i64) -> Mark {
        Mark {
            tp: tp(p),
            epoch: o.epoch(&tp(p)).unwrap(),
            next,
        }
    }

    #[test]
    fn commits_follow_acks_per_partition() {
        let mut o = Offsets::default();
        o.assign([tp(0), tp(1)]);
        assert!(o.take_commits().is_empty(), "nothing acknowledged yet");
        o.ack(&[mark(&o, 0, 5)]);
        o.ack(&[mark(&o, 0, 9), mark(&o, 1, 3)]);
        let mut c = o.take_commits();
        c.sort();
        assert_eq!(c, vec![(tp(0), 9), (tp(1), 3)]);
        assert!(o.take_commits().is_empty(), "already committed");
    }

    #[test]
    fn a_stale_ack_after_reassignment_is_ignored() {
        let mut o = Offsets::default();
        o.assign([tp(0)]);
        let old = mark(&o, 0, 7);
        assert!(o.revoke([tp(0)]).is_empty());
        o.ack(std::slice::from_ref(&old));
        assert!(o.take_commits().is_empty(), "not ours any more");
        o.assign([tp(0)]);
        o.ack(&[old]);
        assert!(
            o.take_commits().is_empty(),
            "read under an earlier assignment"
        );
    }

    #[test]
    fn revocation_hands_back_uncommitted_acks() {
        let mut o = Offsets::default();
        o.assign([tp(0), tp(1), tp(2)]);
        o.ack(&[mark(&o, 0, 4), mark(&o, 1, 2)]);
        let _ = o.take_commits();
        o.ack(&[mark(&o, 1, 6)]);
        let back = o.revoke([tp(0), tp(1), tp(2)]);
        assert_eq!(back, vec![(tp(1), 6)], "0 is committed, 2 never acked");
        assert_eq!(o.revocations(), 1);
        assert_eq!(o.epoch(&tp(0)), None);
    }

    #[test]
    fn a_failed_commit_is_retried() {
        let mut o = Offsets::default();
        o.assign([tp(0)]);
        o.ack(&[mark(&o, 0, 4)]);
        assert_eq!(o.take_commits(), vec![(tp(0), 4)]);
        o.failed(&tp(0), 4);
        assert_eq!(o.take_commits(), vec![(tp(0), 4)]);
        o.ack(&[mark(&o, 0, 8)]);
        o.failed(&tp(0), 4); // an old failure no longer matters
        assert_eq!(o.take_commits(), vec![(tp(0), 8)]);
    }

    #[test]
    fn acks_never_move_backwards() {
        let mut o = Offsets::default();
        o.assign([tp(0)]);
        o.ack(&[mark(&o, 0, 9)]);
        o.ack(&[mark(&o, 0, 3)]);
        assert_eq!(o.take_commits(), vec![(tp(0), 9)]);
    }
}
