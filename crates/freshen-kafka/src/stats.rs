//! Counters of the source and the sink, read as plain snapshots.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a [`KafkaSource`](crate::KafkaSource) has done so far; from
/// [`KafkaSource::stats`](crate::KafkaSource::stats). Counters only grow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStats {
    /// Messages read (decodable or not, control messages included).
    pub messages: u64,
    /// Row events handed to the refresher.
    pub events: u64,
    /// Messages skipped because they could not be decoded.
    pub skipped: u64,
    /// Messages that changed rows without carrying them (a TiCDC key-only message, a
    /// Canal partial image or statement, a dropped partition): each became a
    /// [`Gap`](freshen::Gap) that sweeps the views over its table.
    pub gaps: u64,
    /// Undecodable messages copied to the dead-letter topic.
    pub dead_lettered: u64,
    /// Undecodable messages the dead-letter topic did not take (still skipped).
    pub dead_letter_failures: u64,
    /// Messages dropped because their partition was revoked before they were handed out.
    pub dropped_revoked: u64,
    /// Offset commits requested.
    pub commits: u64,
    /// Offset commits that failed (retried with the next one).
    pub commit_failures: u64,
    /// Errors the consumer reported and recovered from (broker down, …).
    pub consumer_errors: u64,
    /// Partition assignments and revocations.
    pub rebalances: u64,
    /// Key stream workers: rebuilds of keys whose partition had moved to another
    /// instance, skipped (the new owner rebuilds them).
    pub fenced: u64,
    /// Key stream workers: revocations that found rebuilds of their keys running and
    /// waited for them.
    pub revoke_waits: u64,
    /// Key stream workers: revocations whose running rebuilds outlasted
    /// `revoke_timeout_ms` (see the README's "Scaling out" for what that risks).
    pub revoke_timeouts: u64,
    /// The last consumer error recovered from, if any.
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct SourceCounters {
    pub(crate) messages: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) gaps: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) dead_letter_failures: AtomicU64,
    pub(crate) dropped_revoked: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) commit_failures: AtomicU64,
    pub(crate) consumer_errors: AtomicU64,
    pub(crate) rebalances: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) revoke_waits: AtomicU64,
    pub(crate) revoke_timeouts: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

impl SourceCounters {
    pub(crate) fn snapshot(&self) -> SourceStats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        SourceStats {
            messages: g(&self.messages),
            events: g(&self.events),
            skipped: g(&self.skipped),
            gaps: g(&self.gaps),
            dead_lettered: g(&self.dead_lettered),
            dead_letter_failures: g(&self.dead_letter_failures),
            dropped_revoked: g(&self.dropped_revoked),
            commits: g(&self.commits),
            commit_failures: g(&self.commit_failures),
            consumer_errors: g(&self.consumer_errors),
            rebalances: g(&self.rebalances),
            fenced: g(&self.fenced),
            revoke_waits: g(&self.revoke_waits),
            revoke_timeouts: g(&self.revoke_timeouts),
            last_error: None,
        }
    }
}

/// What a [`KafkaSink`](crate::KafkaSink) has done so far; from
/// [`KafkaSink::stats`](crate::KafkaSink::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStats {
    /// Batches published and acknowledged.
    pub batches: u64,
    /// Records delivered (acknowledged by every in-sync replica).
    pub delivered: u64,
    /// Records that could not be delivered.
    pub failed: u64,
}

#[derive(Debug, Default)]
pub(crate) struct SinkCounters {
    pub(crate) batches: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl SinkCounters {
    pub(crate) fn snapshot(&self) -> SinkStats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        SinkStats {
            batches: g(&self.batches),
            delivered: g(&self.delivered),
            failed: g(&self.failed),
        }
    }
}
