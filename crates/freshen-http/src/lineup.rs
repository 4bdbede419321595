//! Which connection to close when the connection limit is reached: the oldest of those
//! that have not yet sent a whole request head.
//!
//! Without it a flood of connections that never send a request (half-open: connected,
//! silent or slow) fills every place under the limit, and a health probe waits in the
//! kernel's listen queue until a header timeout frees one — seconds, which an
//! orchestrator reads as a dead process. Closing a waiting connection costs its client
//! nothing it had: no request of it was read. A connection that has sent a request head
//! is never chosen (it may be streaming a response or be an upgraded WebSocket); kept
//! alive between requests it is bounded by the header timeout, as before.
//!
//! Oldest first, not "silent before partial": a probe is accepted the moment its
//! handshake ends and its request may land a moment later, so it must outlive the
//! arrivals right after it. Under the limit `n` it is closed only after `n` newer
//! connections arrive before its request head does; a flood's connections are old.
//!
//! Pure bookkeeping on explicit calls; `serve` holds one per listener behind a mutex.

use std::collections::BTreeMap;

/// The connections that may be closed to make room, each with `T`, what closes it.
#[derive(Debug)]
pub(crate) struct Lineup<T> {
    /// Waiting connections by arrival (ids only grow).
    waiting: BTreeMap<u64, T>,
    next: u64,
}

impl<T> Default for Lineup<T> {
    fn default() -> Self {
        Lineup {
            waiting: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<T> Lineup<T> {
    /// A connection arrives; its id, for the calls below.
    pub(crate) fn join(&mut self, closer: T) -> u64 {
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, closer);
        id
    }

    /// Connection `id` sent a whole request head, or closed: never chosen again.
    pub(crate) fn leave(&mut self, id: u64) {
        self.waiting.remove(&id);
    }

    /// Takes the connection to close, the oldest waiting one; `None` when every
    /// connection has sent a request.
    pub(crate) fn pick(&mut self) -> Option<T> {
        self.waiting.pop_first().map(|(_, closer)| closer)
    }

    /// How many connections may be chosen.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_waiting_connection_goes_first() {
        let mut l = Lineup::default();
        let a = l.join("a");
        let _b = l.join("b");
        let _c = l.join("c");
        assert_eq!(l.pick(), Some("a"));
        l.leave(a);
        assert_eq!(l.pick(), Some("b"));
        let _d = l.join("d");
        assert_eq!(l.pick(), Some("c"));
        assert_eq!(l.pick(), Some("d"));
        assert_eq!(l.pick(), None);
    }

    #[test]
    fn a_connection_that_sent_its_request_or_closed_is_never_chosen() {
        let mut l = Lineup::default();
        let a = l.join("a");
        let b = l.join("b");
        let c = l.join("c");
        l.leave(b);
        l.leave(a);
        assert_eq!(l.len(), 1);
        assert_eq!(l.pick(), Some("c"));
        assert_eq!(l.pick(), None);
        // Leaving twice, or after being picked, changes nothing.
        l.leave(c);
        l.leave(a);
        let d = l.join("d");
        assert!(d > c, "ids are not reused");
        assert_eq!(l.len(), 1);
        assert_eq!(l.pick(), Some("d"));
    }
}
