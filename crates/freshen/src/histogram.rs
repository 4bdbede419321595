//! A lock-free log-linear latency histogram (microsecond resolution, ~6% error).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Eight linear sub-buckets per power of two: relative error under 1/16 either way.
const SUB: u32 = 8;
const SUB_BITS: u32 = 3;
/// 2^40 µs ≈ 12.7 days; anything longer lands in the last bucket.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = ((MAX_EXP - SUB_BITS + 2) * SUB) as usize;

fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros();
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (us >> (exp - SUB_BITS)) & (SUB as u64 - 1);
    ((exp - SUB_BITS + 1) * SUB) as usize + sub as usize
}

/// Smallest value (µs) that falls in bucket `b`.
fn lower_bound(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB as u64 {
        return b;
    }
    let exp = b / SUB as u64 + SUB_BITS as u64 - 1;
    let sub = b % SUB as u64;
    (SUB as u64 + sub) << (exp - SUB_BITS as u64)
}

/// Records durations from many threads without locks.
#[derive(Debug)]
pub(crate) struct Histogram {
    counts: Box<[AtomicU64]>,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }

    pub(crate) fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(us)].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
            max_us: self.max_us.load(Relaxed),
        }
    }
}

/// A point-in-time copy of a latency histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    counts: Vec<u64>,
    sum_us: u64,
    max_us: u64,
}

impl HistogramSnapshot {
    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Sum of recorded values.
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us)
    }

    /// Largest recorded value.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// The value at quantile `q` (0.0–1.0), as the upper edge of its bucket (never more
    /// than the maximum); `None` when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let upper = lower_bound(b + 1).saturating_sub(1);
                return Some(Duration::from_micros(upper.min(self.max_us)));
            }
        }
        Some(self.max())
    }

    /// What was recorded after `earlier` (a snapshot of the same histogram taken
    /// before): the distribution of a recent window. Its maximum is the lifetime one,
    /// an upper bound (quantiles never exceed it).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .enumerate()
                .map(|(i, &n)| n.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)))
                .collect(),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
            max_us: self.max_us,
        }
    }

    /// Median.
    pub fn p50(&self) -> Option<Duration> {
        self.quantile(0.5)
    }

    /// 99th percentile.
    pub fn p99(&self) -> Option<Duration> {
        self.quantile(0.99)
    }

    /// Cumulative counts at or below each of `bounds` (for a Prometheus histogram).
    /// A bucket is counted under a bound when its whole range lies below it, so counts
    /// are exact at bucket edges and conservative in between.
    pub fn cumulative(&self, bounds: &[Duration]) -> Vec<u64> {
        bounds
            .iter()
            .map(|bound| {
                let bound_us = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX);
                self.counts
                    .iter()
                    .enumerate()
                    .take_while(|(b, _)| lower_bound(b + 1) <= bound_us.saturating_add(1))
                    .map(|(_, &n)| n)
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotone() {
        for b in 0..BUCKETS - 1 {
            assert!(lower_bound(b) < lower_bound(b + 1), "bucket {b}");
            assert_eq!(bucket_of(lower_bound(b)), b);
            assert_eq!(bucket_of(lower_bound(b + 1) - 1), b);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_window_holds_only_what_came_after_the_earlier_snapshot() {
        let h = Histogram::new();
        for _ in 0..1000 {
            h.record(Duration::from_secs(5)); // a start-up sweep's slow rebuilds
        }
        let before = h.snapshot();
        for _ in 0..10 {
            h.record(Duration::from_millis(20));
        }
        let recent = h.snapshot().since(&before);
        assert_eq!(recent.count(), 10);
        let p99 = recent.p99().unwrap();
        assert!(p99 <= Duration::from_millis(22), "{p99:?}");
        assert!(
            h.snapshot().p50().unwrap() >= Duration::from_secs(4),
            "lifetime"
        );
        assert_eq!(recent.sum(), Duration::from_millis(200));
    }

    #[test]
    fn quantiles_within_bucket_error() {
        let h = Histogram::new();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        let p50 = s.p50().unwrap().as_secs_f64() * 1000.0;
        let p99 = s.p99().unwrap().as_secs_f64() * 1000.0;
        assert!((50.0..=50.0 * 1.07).contains(&p50), "p50 = {p50}");
        assert!((99.0..=100.0).contains(&p99), "p99 = {p99}");
        assert_eq!(s.max(), Duration::from_millis(100));
        assert_eq!(s.sum(), Duration::from_millis(5050));
    }

    #[test]
    fn empty_has_no_quantiles() {
        assert_eq!(Histogram::new().snapshot().p99(), None);
    }

    #[test]
    fn cumulative_counts_at_bounds() {
        let h = Histogram::new();
        h.record(Duration::from_micros(3));
        h.record(Duration::from_millis(2));
        h.record(Duration::from_secs(2));
        let c = h.snapshot().cumulative(&[
            Duration::from_micros(3),
            Duration::from_millis(1),
            Duration::from_millis(10),
            Duration::from_secs(10),
        ]);
        assert_eq!(c, vec![1, 1, 2, 3]);
    }
}
