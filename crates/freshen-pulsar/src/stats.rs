//! The source's counters, read as a plain snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a [`PulsarSource`](crate::PulsarSource) has done so far. Counters only grow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStats {
    /// Messages received (each message of a batched entry counts).
    pub messages: u64,
    /// Row events handed to the refresher.
    pub events: u64,
    /// Messages skipped because they could not be decoded.
    pub skipped: u64,
    /// Messages that changed rows without carrying them (a TiCDC key-only message, a
    /// Canal partial image or statement, a dropped partition): each became a
    /// [`Gap`](freshen::Gap) that sweeps the views over its table.
    pub gaps: u64,
    /// Cumulative acknowledgements sent.
    pub acks: u64,
    /// Successful subscribes (the first, and one after each reconnect).
    pub subscribes: u64,
    /// Connections lost or refused and tried again.
    pub reconnects: u64,
    /// Whether the broker made this consumer the active one of its failover
    /// subscription (`None`: it has not said).
    pub active: Option<bool>,
    /// The last connection error, if any.
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) messages: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) gaps: AtomicU64,
    pub(crate) acks: AtomicU64,
    pub(crate) subscribes: AtomicU64,
    pub(crate) reconnects: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> SourceStats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        SourceStats {
            messages: g(&self.messages),
            events: g(&self.events),
            skipped: g(&self.skipped),
            gaps: g(&self.gaps),
            acks: g(&self.acks),
            subscribes: g(&self.subscribes),
            reconnects: g(&self.reconnects),
            active: None,
            last_error: None,
        }
    }
}
