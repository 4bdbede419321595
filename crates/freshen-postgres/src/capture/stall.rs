//! Whether the replication reader stalled, judged from outside it: a pure state machine
//! with an explicit clock.
//!
//! The reader's own figures cannot expose a reader that stopped reading: the server
//! position it reports comes from the stream it no longer reads. So the server's WAL
//! position is read on an independent connection (every few seconds, by
//! [`PgHandle::sample`](crate::PgHandle)), and the reader is stalled when the server had
//! WAL beyond the reader's position at some moment and the reader has taken no message
//! from its session since — for `bound`. A reader catching up a long backlog takes
//! messages all along and is never stalled; an idle reader is at the server's position
//! (keepalives carry it), so is never behind for long.
//!
//! ```text
//!             behind (server WAL w > reader position), clock starts at t
//!   ┌────────┐ ──────────────────────────────────────────► ┌─────────────┐
//!   │ moving │                                             │ behind(t,w) │── now - t ≥ bound ──► stalled
//!   └────────┘ ◄────────────────────────────────────────── └─────────────┘
//!               the reader took a message, or reached w,
//!               or the session is down (reported apart)
//! ```
//!
//! | observation                                | next state                      |
//! |--------------------------------------------|---------------------------------|
//! | not streaming                              | moving (the outage is reported as such) |
//! | messages taken since the last observation  | moving, then behind(now, w) if still behind |
//! | no message taken, reader position ≥ w       | moving                          |
//! | no message taken, behind, none recorded     | behind(now, server WAL)         |
//! | no message taken, behind(t, w)              | unchanged; stalled once `now - t ≥ bound` |

use std::time::{Duration, Instant};

/// One look at the reader and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observation {
    /// A replication session is up.
    pub(crate) streaming: bool,
    /// The server's WAL position, read on another connection.
    pub(crate) server: u64,
    /// The furthest position the reader has seen (rows, commits, keepalives).
    pub(crate) reader: u64,
    /// Messages the reader has taken from its sessions so far (any kind).
    pub(crate) messages: u64,
}

/// The stall watch of one source.
#[derive(Debug)]
pub(crate) struct StallWatch {
    bound: Duration,
    messages: u64,
    /// When the reader was first seen behind without moving, and the server's position
    /// then.
    behind: Option<(Instant, u64)>,
}

/// A stalled reader: how long, and the positions that show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub(crate) for_: Duration,
    /// The server's position the reader has not reached.
    pub(crate) server: u64,
    /// Where the reader is.
    pub(crate) reader: u64,
}

impl StallWatch {
    /// A watch that reports a reader that took nothing for `bound` while behind
    /// (a zero `bound` turns it off).
    pub(crate) fn new(bound: Duration) -> StallWatch {
        StallWatch {
            bound,
            messages: 0,
            behind: None,
        }
    }

    /// Takes one observation at `now`; returns the stall it shows, if any.
    pub(crate) fn observe(&mut self, now: Instant, o: Observation) -> Option<Stalled> {
        let moved = o.messages != self.messages;
        self.messages = o.messages;
        if !o.streaming || self.bound.is_zero() || moved || o.reader >= o.server {
            self.behind = None;
        }
        if o.streaming && o.reader < o.server && self.behind.is_none() {
            self.behind = Some((now, o.server));
        }
        let (since, server) = self.behind?;
        let for_ = now.saturating_duration_since(since);
        (!self.bound.is_zero() && o.reader < server && for_ >= self.bound).then_some(Stalled {
            for_,
            server,
            reader: o.reader,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn seen(server: u64, reader: u64, messages: u64) -> Observation {
        Observation {
            streaming: true,
            server,
            reader,
            messages,
        }
    }

    #[test]
    fn a_reader_that_takes_nothing_while_the_server_moves_on_is_stalled_after_the_bound() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        assert_eq!(w.observe(t0, seen(100, 100, 5)), None);
        assert_eq!(
            w.observe(at(t0, 1), seen(200, 100, 5)),
            None,
            "behind from 1 s"
        );
        assert_eq!(w.observe(at(t0, 6), seen(300, 100, 5)), None);
        assert_eq!(
            w.observe(at(t0, 11), seen(400, 100, 5)),
            Some(Stalled {
                for_: BOUND,
                server: 200,
                reader: 100
            }),
            "the position the server had when the clock started"
        );
    }

    #[test]
    fn a_reader_catching_up_is_never_stalled() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        for s in 0..60 {
            // Far behind, but taking messages every time it is looked at.
            assert_eq!(w.observe(at(t0, s), seen(10_000, s * 10, s)), None);
        }
    }

    #[test]
    fn an_idle_reader_at_the_servers_position_is_never_stalled() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        for s in 0..60 {
            assert_eq!(w.observe(at(t0, s), seen(500, 500, 3)), None);
        }
        // Briefly behind (WAL the walsender has not decoded yet), then a keepalive.
        assert_eq!(w.observe(at(t0, 60), seen(600, 500, 3)), None);
        assert_eq!(w.observe(at(t0, 65), seen(600, 600, 4)), None);
        assert_eq!(w.observe(at(t0, 80), seen(600, 600, 4)), None);
    }

    #[test]
    fn moving_restarts_the_clock_and_an_outage_is_not_a_stall() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        w.observe(t0, seen(200, 100, 1));
        w.observe(at(t0, 9), seen(300, 150, 2));
        assert_eq!(
            w.observe(at(t0, 15), seen(300, 150, 2)),
            None,
            "clock from 9 s"
        );
        let mut down = seen(300, 150, 2);
        down.streaming = false;
        assert_eq!(w.observe(at(t0, 30), down), None, "down is reported apart");
        assert_eq!(w.observe(at(t0, 31), seen(300, 150, 2)), None);
        assert!(w.observe(at(t0, 41), seen(300, 150, 2)).is_some());
    }

    #[test]
    fn a_zero_bound_turns_the_watch_off() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(Duration::ZERO);
        w.observe(t0, seen(200, 100, 1));
        assert_eq!(w.observe(at(t0, 3600), seen(900, 100, 1)), None);
    }
}
