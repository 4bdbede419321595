//! Which binlog position is safe to resume from, and when it is worth storing: the
//! acknowledgement rule, with no I/O.
//!
//! A batch holding the commit of a transaction whose rows were delivered carries an
//! [`Ack`] for the position after that commit; acks arrive in batch order, so the newest
//! acked position is safe. When nothing is pending — no open transaction, nothing
//! gathered, every handed-out commit acked — the position after the last transaction
//! seen (filtered out, or the position table's own writes) is safe too, so a source
//! watching quiet tables still moves on. The store task persists the safe position, but
//! only once it has moved past a transaction other than the position table's own writes
//! (which the binlog carries too: storing after each of them would write forever).

use std::sync::Arc;

use freshen::Ack;

use super::shared::{Mark, Shared, lock};

/// The reader's side of the rule: the commit batches it handed out, in order, and the
/// safe position it published last (into [`Shared::safe`]).
#[derive(Debug)]
pub(super) struct Progress {
    shared: Arc<Shared>,
    /// Commit batches handed out so far; each one's ack carries its number.
    handed: u64,
    /// The serial of the last published safe mark.
    published: u64,
}

impl Progress {
    pub(super) fn new(shared: Arc<Shared>) -> Progress {
        Progress {
            shared,
            handed: 0,
            published: 0,
        }
    }

    /// The acknowledgement of the next batch handed out, holding the commit `mark`.
    pub(super) fn ack(&mut self, mark: Arc<Mark>) -> Ack {
        self.handed += 1;
        let seq = self.handed;
        let shared = Arc::clone(&self.shared);
        Ack::new(move || {
            let mut a = lock(&shared.acked);
            if seq > a.0 {
                *a = (seq, Some(mark));
            }
            drop(a);
            shared.ack_notify.notify_one();
        })
    }

    /// Publishes the safe position: the newest acknowledged commit, or — when nothing is
    /// pending (`busy`: an open transaction or gathered output; nor a handed-out commit
    /// unacknowledged) — `resume`, the position after the last transaction seen.
    pub(super) fn advance(&mut self, resume: &Arc<Mark>, busy: bool) {
        let (acked_seq, acked) = lock(&self.shared.acked).clone();
        let mut target = acked;
        let pending = busy || acked_seq < self.handed;
        if !pending && target.as_ref().is_none_or(|t| t.serial < resume.serial) {
            target = Some(Arc::clone(resume));
        }
        if let Some(t) = target
            && (t.serial > self.published || self.published == 0)
        {
            self.published = t.serial;
            *lock(&self.shared.safe) = Some(t);
        }
    }
}

/// Whether the safe mark `m` is worth storing over the stored `(serial, foreign)`: it
/// must lie past the stored one and past a transaction other than the position table's
/// own writes.
pub(super) fn worth_storing(stored: Option<(u64, u64)>, m: &Mark) -> bool {
    match stored {
        None => true,
        Some((serial, foreign)) => m.serial > serial && m.foreign > foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checkpoint, FilePos};

    fn mark(serial: u64, foreign: u64) -> Arc<Mark> {
        Arc::new(Mark {
            cp: Checkpoint {
                file_pos: FilePos::new("binlog.000001", 100 * serial + 4),
                gtids: None,
            },
            serial,
            foreign,
        })
    }

    fn safe(shared: &Shared) -> Option<u64> {
        lock(&shared.safe).as_ref().map(|m| m.serial)
    }

    #[test]
    fn with_nothing_pending_the_last_transaction_seen_is_safe() {
        let shared = Arc::new(Shared::default());
        let mut p = Progress::new(Arc::clone(&shared));
        p.advance(&mark(0, 0), false);
        assert_eq!(safe(&shared), Some(0), "the starting point is published");
        p.advance(&mark(3, 1), false);
        assert_eq!(safe(&shared), Some(3));
        // An open transaction or gathered rows hold it where it is.
        p.advance(&mark(4, 2), true);
        assert_eq!(safe(&shared), Some(3));
    }

    #[test]
    fn a_handed_out_commit_holds_the_position_until_acknowledged() {
        let shared = Arc::new(Shared::default());
        let mut p = Progress::new(Arc::clone(&shared));
        p.advance(&mark(0, 0), false);
        let first = p.ack(mark(1, 1));
        let second = p.ack(mark(2, 2));
        // Later transactions were filtered out, but the batches before are not acked.
        p.advance(&mark(5, 3), false);
        assert_eq!(safe(&shared), Some(0));
        first.ack();
        p.advance(&mark(5, 3), false);
        assert_eq!(
            safe(&shared),
            Some(1),
            "the newest acked commit, not past it"
        );
        second.ack();
        p.advance(&mark(5, 3), false);
        assert_eq!(
            safe(&shared),
            Some(5),
            "all acked: the last transaction seen"
        );
    }

    #[test]
    fn acks_out_of_order_never_move_the_position_back() {
        let shared = Arc::new(Shared::default());
        let mut p = Progress::new(Arc::clone(&shared));
        let first = p.ack(mark(1, 1));
        let second = p.ack(mark(2, 2));
        second.ack();
        first.ack();
        p.advance(&mark(2, 2), true);
        assert_eq!(safe(&shared), Some(2));
        p.advance(&mark(1, 1), false);
        assert_eq!(
            safe(&shared),
            Some(2),
            "a published position never goes back"
        );
    }

    #[test]
    fn the_position_tables_own_writes_are_not_worth_storing() {
        assert!(worth_storing(None, &mark(0, 0)));
        // Past the stored mark only through the position table's writes (foreign same).
        assert!(!worth_storing(Some((3, 2)), &mark(7, 2)));
        assert!(worth_storing(Some((3, 2)), &mark(7, 3)));
        assert!(!worth_storing(Some((3, 2)), &mark(3, 2)));
    }
}
