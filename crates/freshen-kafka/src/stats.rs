//! Counters of the source and the sink, read as plain snapshots.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::plug::SinkReport;
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;

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
    /// `revoke_timeout_ms` (see docs/scaling.md for what that risks).
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
    /// Errors the producer reported and retried by itself (a broker down, a
    /// connection refused).
    pub client_errors: u64,
}

#[derive(Debug, Default)]
pub(crate) struct SinkCounters {
    pub(crate) batches: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) client_errors: AtomicU64,
    /// Unix milliseconds of the last delivery (0: none yet).
    pub(crate) last_delivery_ms: AtomicU64,
    /// When each batch waiting for the broker was handed over, oldest first (written
    /// by the delivery loop only).
    pub(crate) waiting: Mutex<Vec<SystemTime>>,
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SinkCounters {
    pub(crate) fn snapshot(&self) -> SinkStats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        SinkStats {
            batches: g(&self.batches),
            delivered: g(&self.delivered),
            failed: g(&self.failed),
            client_errors: g(&self.client_errors),
        }
    }

    /// One record acknowledged by the broker.
    pub(crate) fn delivered_one(&self) {
        add(&self.delivered, 1);
        self.last_delivery_ms.store(now_ms(), Relaxed);
    }

    /// The delivery loop's batches waiting for the broker, as handed-over times.
    pub(crate) fn set_waiting(&self, times: impl Iterator<Item = SystemTime>) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.clear();
        w.extend(times);
    }

    /// The report the binary exports; `dead_lettered` is the caller's (by reason).
    pub(crate) fn report(&self, dead_lettered: Vec<(&'static str, u64)>) -> SinkReport {
        let s = self.snapshot();
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let last = self.last_delivery_ms.load(Relaxed);
        let mut r = SinkReport::default();
        r.delivered = s.delivered;
        r.failed = s.failed;
        r.client_errors = s.client_errors;
        r.dead_lettered = dead_lettered;
        r.batches_waiting = waiting.len() as u64;
        r.oldest_waiting = waiting.first().copied();
        r.last_delivery = (last > 0).then(|| UNIX_EPOCH + Duration::from_millis(last));
        r
    }
}

/// The producer's callbacks: errors it reports (and retries by itself) are counted,
/// then logged as rdkafka's default does.
#[derive(Debug, Clone, Default)]
pub(crate) struct CountingContext {
    pub(crate) counters: std::sync::Arc<SinkCounters>,
}

impl ClientContext for CountingContext {
    fn error(&self, error: KafkaError, reason: &str) {
        add(&self.counters.client_errors, 1);
        rdkafka::client::DefaultClientContext.error(error, reason);
    }
}
