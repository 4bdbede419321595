//! `Gauges`: publishes the loop's gauges to the [`Stats`](crate::Stats) after every
//! wake-up, doing the costly parts (a scan of every dirty key, reading two clocks)
//! only when they can have changed.

use std::time::Duration;

use tokio::time::Instant;

use crate::dirty::DirtySet;
use crate::stats::Recorder;

/// How often the oldest waiting change is looked up for [`Stats`](crate::Stats).
const OLDEST_SAMPLE: Duration = Duration::from_secs(1);

/// What the gauges read from the loop's other parts.
pub(super) struct Readings<'a> {
    pub(super) dirty: &'a DirtySet,
    /// When the longest-running call started.
    pub(super) oldest_call: Option<std::time::Instant>,
    /// When the listing sweep began, and how many keys it listed so far.
    pub(super) sweep: (Option<Instant>, u64),
    /// Quarantined keys holding acks.
    pub(super) holding: usize,
    /// Batches received and not acknowledged yet.
    pub(super) unacked: usize,
}

#[derive(Default)]
pub(super) struct Gauges {
    /// When the oldest waiting change was last looked up.
    oldest_sampled: Option<Instant>,
    /// The longest-running call's start and the listing sweep's start as last published:
    /// turning an instant into wall-clock time reads two clocks, so it is done only when
    /// they change, not on every wake-up.
    published_starts: (Option<std::time::Instant>, Option<Instant>),
}

impl Gauges {
    pub(super) fn publish(&mut self, st: &Recorder, r: Readings<'_>) {
        // The oldest waiting change takes a scan of every key: once a second at most.
        // (Nothing waiting is known at once: a stale reading must not outlive it.)
        if r.dirty.queued() == 0 {
            st.set_oldest_waiting(None);
        } else if self.sample_oldest(Instant::now()) {
            st.set_oldest_waiting(r.dirty.oldest_waiting());
        }
        Recorder::set(&st.dirty, r.dirty.queued() as u64);
        Recorder::set(&st.in_flight, r.dirty.running() as u64);
        let starts = (r.oldest_call, r.sweep.0);
        if self.starts_changed(starts) {
            st.set_oldest_in_flight(starts.0);
            st.set_sweep_since(starts.1.map(Instant::into_std));
        }
        Recorder::set(
            &st.sweep_listed,
            if starts.1.is_some() { r.sweep.1 } else { 0 },
        );
        Recorder::set(&st.poisoned, r.dirty.poisoned() as u64);
        Recorder::set(&st.poisoned_holding, r.holding as u64);
        Recorder::set(&st.unacked_batches, r.unacked as u64);
    }

    /// Whether the oldest waiting change is looked up at `now` (then it is noted).
    fn sample_oldest(&mut self, now: Instant) -> bool {
        if self.oldest_sampled.is_none_or(|t| now >= t + OLDEST_SAMPLE) {
            self.oldest_sampled = Some(now);
            return true;
        }
        false
    }

    /// Whether `starts` differ from those last published (then they are noted).
    fn starts_changed(&mut self, starts: (Option<std::time::Instant>, Option<Instant>)) -> bool {
        if starts != self.published_starts {
            self.published_starts = starts;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Key;
    use crate::dirty::DirtyConfig;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_oldest_change_is_sampled_once_a_second_at_most() {
        let mut g = Gauges::default();
        let t0 = Instant::now();
        assert!(g.sample_oldest(t0));
        assert!(!g.sample_oldest(t0 + 999 * MS));
        assert!(g.sample_oldest(t0 + 1000 * MS));
        assert!(!g.sample_oldest(t0 + 1999 * MS));
    }

    #[test]
    fn starts_are_published_when_they_change() {
        let mut g = Gauges::default();
        assert!(
            !g.starts_changed((None, None)),
            "nothing published is nothing"
        );
        let call = std::time::Instant::now();
        assert!(g.starts_changed((Some(call), None)));
        assert!(!g.starts_changed((Some(call), None)));
        let sweep = Instant::now();
        assert!(g.starts_changed((Some(call), Some(sweep))));
        assert!(g.starts_changed((None, None)));
    }

    fn readings(dirty: &DirtySet) -> Readings<'_> {
        Readings {
            dirty,
            oldest_call: None,
            sweep: (Some(Instant::now()), 7),
            holding: 2,
            unacked: 3,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gauges_follow_the_dirty_set_and_a_stale_oldest_never_outlives_it() {
        let st = Recorder::new();
        let mut g = Gauges::default();
        let now = Instant::now().into_std();
        let mut dirty = DirtySet::new(DirtyConfig::default(), now);
        dirty.mark(&Key::new("a"), now);
        g.publish(&st, readings(&dirty));
        let s = st.snapshot();
        assert_eq!((s.dirty, s.in_flight, s.sweep_listed), (1, 0, 7));
        assert_eq!((s.poisoned_holding, s.unacked_batches), (2, 3));
        assert!(s.oldest_waiting.is_some());
        assert!(s.sweep_since.is_some());
        assert_eq!(s.oldest_in_flight, None);

        // Taken within the second: the sample is not retaken, but an empty set is
        // known at once.
        let ready = dirty
            .pop_ready(now + Duration::from_secs(3600))
            .expect("due");
        g.publish(&st, readings(&dirty));
        assert_eq!(st.snapshot().oldest_waiting, None);
        assert_eq!((st.snapshot().dirty, st.snapshot().in_flight), (0, 1));
        drop(ready);

        let no_sweep = Readings {
            dirty: &dirty,
            oldest_call: Some(now),
            sweep: (None, 7),
            holding: 0,
            unacked: 0,
        };
        g.publish(&st, no_sweep);
        let s = st.snapshot();
        assert_eq!(s.sweep_listed, 0, "no sweep lists");
        assert_eq!(s.sweep_since, None);
        assert!(s.oldest_in_flight.is_some());
    }
}
