//! `SweepProgress`: how far the listing sweep has got, for its reports and gauges.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Default)]
pub(super) struct SweepProgress {
    /// Keys the running sweep listed so far.
    listed: u64,
    /// When it began (for its report).
    began: Option<Instant>,
}

impl SweepProgress {
    /// When the listing sweep began; `None` when none is listing.
    pub(super) fn began(&self) -> Option<Instant> {
        self.began
    }

    /// Keys the listing sweep listed so far.
    pub(super) fn listed(&self) -> u64 {
        self.listed
    }

    /// A sweep began listing at `now`.
    pub(super) fn begin(&mut self, now: Instant) {
        self.began = Some(now);
    }

    /// `n` more keys were listed: the keys listed so far and how long that took, when
    /// they crossed a multiple of [`SWEEP_PROGRESS_EVERY`](crate::SWEEP_PROGRESS_EVERY)
    /// (then a progress line is due).
    pub(super) fn listed_more(&mut self, n: u64) -> Option<(u64, Duration)> {
        let before = self.listed;
        self.listed += n;
        if self.listed / crate::SWEEP_PROGRESS_EVERY > before / crate::SWEEP_PROGRESS_EVERY {
            let took = self.began.map_or(Duration::ZERO, |t| t.elapsed());
            return Some((self.listed, took));
        }
        None
    }

    /// The listing ended: how many keys it listed and how long it took.
    pub(super) fn end(&mut self) -> (u64, Duration) {
        let keys = std::mem::take(&mut self.listed);
        let took = self.began.take().map_or(Duration::ZERO, |t| t.elapsed());
        (keys, took)
    }

    /// The listing failed: the retry starts from nothing.
    pub(super) fn reset(&mut self) {
        self.listed = 0;
        self.began = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SWEEP_PROGRESS_EVERY as EVERY;

    const SEC: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn progress_is_due_each_time_the_count_crosses_a_multiple() {
        let mut p = SweepProgress::default();
        p.begin(Instant::now());
        assert_eq!(p.listed_more(EVERY - 1), None);
        tokio::time::advance(3 * SEC).await;
        assert_eq!(p.listed_more(1), Some((EVERY, 3 * SEC)));
        assert_eq!(p.listed_more(EVERY - 1), None);
        assert_eq!(p.listed_more(2 * EVERY), Some((4 * EVERY - 1, 3 * SEC)));
        assert_eq!(p.listed(), 4 * EVERY - 1);
        tokio::time::advance(SEC).await;
        assert_eq!(p.end(), (4 * EVERY - 1, 4 * SEC));
        assert_eq!((p.listed(), p.began()), (0, None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_listing_starts_again_from_nothing() {
        let mut p = SweepProgress::default();
        assert_eq!(
            p.listed_more(EVERY),
            Some((EVERY, Duration::ZERO)),
            "never began"
        );
        p.begin(Instant::now());
        p.reset();
        assert_eq!((p.listed(), p.began()), (0, None));
        assert_eq!(p.end(), (0, Duration::ZERO));
    }
}
