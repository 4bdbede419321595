//! Exponential backoff with jitter, as a pure function of the attempt and a random draw.

use std::time::Duration;

/// Exponential backoff between `base` and `max`, with "equal jitter": the delay before
/// retry `n` is uniformly drawn from `[d/2, d)` where `d = min(max, base · 2^(n-1))`.
/// Half fixed keeps retries from hammering; half random keeps many failing keys from
/// retrying in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay scale of the first retry.
    pub base: Duration,
    /// Cap on any delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// A backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max }
    }

    /// The un-jittered delay before retry `attempt` (1 = after the first failure).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << shift;
        let nanos = (self.base.as_nanos() as u64).saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max)
    }

    /// The delay before retry `attempt`, given `unit`, a random draw in `[0, 1)`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let d = self.ceiling(attempt);
        let half = d / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// The one pseudo-random source of the workspace (xorshift64*): retry jitter in the
/// scheduler and the reconnect loops, and deterministic workloads in tests, benchmarks
/// and the demo. Deterministic for a seed, so the scheduler stays a pure function of
/// its inputs; [`Jitter::from_clock`] seeds it for production use.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// A generator seeded from the clock.
    pub fn from_clock() -> Jitter {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Jitter::new(nanos)
    }

    /// The next raw draw.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A draw in `[0, 1)` (what [`Backoff::delay`] takes).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A draw in `[0, n)` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let ceilings: Vec<_> = (1..=6).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
        assert_eq!(b.ceiling(1000), 1000 * MS, "no overflow on huge attempts");
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::new(100 * MS, 10_000 * MS);
        assert_eq!(b.delay(3, 0.0), 200 * MS);
        assert!(b.delay(3, 0.999) < 400 * MS);
        assert!(b.delay(3, 0.999) > 390 * MS);
    }

    #[test]
    fn rng_draws_spread_over_the_unit_interval() {
        let mut r = Jitter::new(42);
        let draws: Vec<f64> = (0..10_000).map(|_| r.unit()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let low = draws.iter().filter(|&&x| x < 0.5).count();
        assert!((4_500..5_500).contains(&low), "roughly uniform, got {low}");
    }
}
