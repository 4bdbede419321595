//! What the reader may confirm to the server: a pure state machine, no I/O.
//!
//! A confirmed position tells the server that every transaction committing before it
//! is done with; a new session starts there, and the server may recycle the WAL behind
//! it. Two kinds of position may be confirmed:
//!
//! - **acked**: the `end_lsn` of the newest acknowledged commit batch (acks arrive in
//!   batch order, so everything before it was rebuilt);
//! - **idle**: a position after which the server has sent nothing we hold (a keepalive's
//!   `wal_end`, an empty or filtered commit). It is confirmed only while nothing is
//!   pending: no open transaction, no unsent rows, every handed-over batch acknowledged.
//!   That holds traffic the publication filters out from retaining WAL.
//!
//! An idle position is a statement about *one session's* stream: "everything before it
//! was received". It says nothing about what happened to those rows afterwards, and a
//! session that ends drops its unsent rows (the assembler forgets them: the server
//! resends them). So an idle position from a session that ended is forgotten at the
//! next session's start; kept, it would be confirmed as soon as the new session's first
//! ack made nothing pending — before the replay resent the dropped rows — and a second
//! fault then started the stream past them, losing them for good.
//!
//! ```text
//!                      keepalive / empty commit: idle = max(idle, pos)
//!                   ┌─────────┐
//!                   ▼         │
//!   session start ─► streaming ─── advance(acked, pending) ──► confirm max(acked, idle if !pending)
//!        ▲              │
//!        └── ended ─────┘   (idle := confirmed: the old session's promises end with it)
//! ```
//!
//! | event                         | `idle`                  | may confirm                    |
//! |-------------------------------|-------------------------|--------------------------------|
//! | session starts                | `confirmed`             | —                              |
//! | keepalive, empty commit `pos` | `max(idle, pos)`        | `pos`, if nothing is pending   |
//! | batch acked (`end`)           | unchanged               | `end`; `idle` if nothing pends |
//!
//! The confirmed position only ever rises.

/// The reader's feedback state across its sessions.
#[derive(Debug, Default)]
pub(crate) struct Feedback {
    /// The position given to the server as confirmed.
    confirmed: u64,
    /// The newest position of this session known to hold nothing unsent.
    idle: u64,
    /// Sequence number of the newest commit batch handed over (in any session).
    handed: u64,
}

/// The acknowledgements received so far: the newest acked commit batch's sequence
/// number and `end_lsn`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Acked {
    pub(crate) seq: u64,
    pub(crate) end: u64,
}

impl Feedback {
    /// The position confirmed so far.
    pub(crate) fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// A new session starts: idle positions of earlier sessions no longer hold.
    pub(crate) fn session_started(&mut self) {
        self.idle = self.confirmed;
    }

    /// The server says nothing we hold lies before `pos`.
    pub(crate) fn idle_at(&mut self, pos: u64) {
        self.idle = self.idle.max(pos);
    }

    /// A batch completing a commit is handed over; returns its sequence number.
    pub(crate) fn handed(&mut self) -> u64 {
        self.handed += 1;
        self.handed
    }

    /// Whether a handed-over commit batch is not yet acknowledged.
    pub(crate) fn awaiting(&self, acked: Acked) -> bool {
        acked.seq < self.handed
    }

    /// The position to confirm now, if it rose: `unsent` says whether the session holds
    /// rows not yet handed over (an open transaction, a batch under construction).
    pub(crate) fn advance(&mut self, acked: Acked, unsent: bool) -> Option<u64> {
        let mut target = acked.end;
        if !unsent && !self.awaiting(acked) {
            target = target.max(self.idle);
        }
        (target > self.confirmed).then(|| {
            self.confirmed = target;
            target
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(seq: u64, end: u64) -> Acked {
        Acked { seq, end }
    }

    #[test]
    fn an_idle_position_is_confirmed_only_when_nothing_is_pending() {
        let mut f = Feedback::default();
        f.session_started();
        f.idle_at(100);
        assert_eq!(f.advance(Acked::default(), true), None, "rows unsent");
        let seq = f.handed();
        assert_eq!(f.advance(Acked::default(), false), None, "a batch unacked");
        assert_eq!(f.advance(acked(seq, 80), false), Some(100));
        assert_eq!(f.confirmed(), 100);
        assert_eq!(
            f.advance(acked(seq, 80), false),
            None,
            "never lower, never twice"
        );
    }

    #[test]
    fn acked_positions_are_confirmed_while_other_work_pends() {
        let mut f = Feedback::default();
        f.session_started();
        let first = f.handed();
        f.handed();
        f.idle_at(500);
        assert_eq!(f.advance(acked(first, 40), true), Some(40));
        assert_eq!(f.confirmed(), 40, "idle waits for the second batch");
    }

    /// The loss that two quick faults caused: a keepalive arrived while a committed
    /// transaction's rows were still gathering, the session ended before they were handed
    /// over, and in the next session an old batch's ack made nothing pending. Confirming
    /// the old keepalive's position then would let a third session start past the
    /// dropped transaction.
    #[test]
    fn an_idle_position_of_an_ended_session_is_never_confirmed() {
        let mut f = Feedback::default();
        f.session_started();
        let old = f.handed();
        // The dropped transaction commits at 200; the keepalive says 300.
        f.idle_at(300);
        assert_eq!(f.advance(Acked::default(), true), None);
        // The session ends; the rows are dropped; a new session starts.
        f.session_started();
        assert_eq!(
            f.advance(acked(old, 150), false),
            Some(150),
            "the ack is confirmed, the old idle position is not"
        );
        // The new session's own keepalive, once the replay resent everything before it.
        f.idle_at(320);
        assert_eq!(f.advance(acked(old, 150), false), Some(320));
    }
}
