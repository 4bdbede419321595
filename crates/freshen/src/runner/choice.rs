//! `Choice`: which way a view's waiting keys are rebuilt — per key, as sets, or as the
//! whole table — from what the refresher measured. Pure: counts and durations in, a
//! decision out.
//!
//! ```text
//!   backlog of K keys, derived table of N rows
//!     set work:   K × seconds per key   (measured on set calls: calls grown past the
//!                                        rebuild's batch, all workers overlapping)
//!     whole:      N × seconds per row   (measured on whole-table runs; a prior before)
//!   whole when  K ≥ threshold(N) = N × per_row / per_key / MARGIN,  and K ≥ MIN_WHOLE_KEYS
//! ```
//!
//! | mode      | a trickle       | a backlog              | past the threshold | empty table at start |
//! |-----------|-----------------|------------------------|--------------------|----------------------|
//! | `auto`    | per-key batches | set calls (grown)      | whole table        | built whole          |
//! | `set`     | set calls       | set calls              | whole table        | built whole          |
//! | `per-key` | per-key batches | per-key batches        | per-key batches    | left to a sweep      |
//!
//! The margin keeps the incremental way unless the whole table is clearly cheaper: a
//! whole run writes every row of the table (or reads every one, to diff), and its
//! estimate is the rougher one.

use std::time::Duration;

use crate::rebuild::RebuildBy;

/// A whole run must be estimated this much cheaper than set work to be chosen.
const MARGIN: f64 = 0.8;

/// Fewer waiting keys than this never go whole: set work on them takes a moment
/// whatever the table's size, and a whole run of a small table is no saving.
pub(crate) const MIN_WHOLE_KEYS: u64 = 1000;

/// Seconds per key of set work before any was measured: about what a merge of 10 000
/// keys a statement does on a laptop-class server (BENCHMARKS.md, fanout).
const PRIOR_PER_KEY: f64 = 10e-6;

/// Seconds per row of a whole-table run before any was measured: a recompute writing
/// half a million rows a second.
const PRIOR_PER_ROW: f64 = 2e-6;

/// Calls of fewer keys say more about a statement's fixed cost than about its rate.
const SAMPLE_KEYS: usize = 1000;

/// Weight of a new measurement in the running averages.
const ALPHA: f64 = 0.3;

/// A view's rates and what they decide.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    mode: RebuildBy,
    /// Whether the rebuild can recompute its whole table.
    whole: bool,
    /// Seconds per key of set work (wall clock, the workers overlapping).
    per_key: f64,
    /// Seconds per row of a whole-table run.
    per_row: f64,
    /// Whether `per_key` / `per_row` were measured (else they are the priors).
    measured: (bool, bool),
    /// Rows the derived table holds, last known.
    rows: Option<u64>,
}

impl Choice {
    pub(crate) fn new(mode: RebuildBy, whole: bool) -> Choice {
        Choice {
            mode,
            whole,
            per_key: PRIOR_PER_KEY,
            per_row: PRIOR_PER_ROW,
            measured: (false, false),
            rows: None,
        }
    }

    /// Whether whole-table runs are possible at all (the rebuild has one, the mode
    /// allows it).
    pub(crate) fn whole_possible(&self) -> bool {
        self.whole && self.mode != RebuildBy::PerKey
    }

    /// Whether calls grow into set calls under a backlog.
    pub(crate) fn grows(&self) -> bool {
        self.mode != RebuildBy::PerKey
    }

    /// Whether every call is a set call, trickle or not.
    pub(crate) fn always_sets(&self) -> bool {
        self.mode == RebuildBy::Set
    }

    /// Waiting keys at or above which the whole table is recomputed instead: `None`
    /// while it never is (no whole way, per-key mode, the table's size unknown).
    pub(crate) fn threshold(&self) -> Option<u64> {
        if !self.whole_possible() {
            return None;
        }
        let rows = self.rows? as f64;
        let (per_key, per_row) = self.costs();
        let keys = rows * per_row / per_key / MARGIN;
        Some((keys.ceil() as u64).max(MIN_WHOLE_KEYS))
    }

    /// Seconds per key of set work and per row of a whole run. Where only one was
    /// measured, the other follows it at the priors' ratio: a measurement says how fast
    /// this server is, and a prior measured on another would skew the comparison.
    fn costs(&self) -> (f64, f64) {
        let ratio = PRIOR_PER_KEY / PRIOR_PER_ROW;
        match self.measured {
            (true, false) => (self.per_key, self.per_key / ratio),
            (false, true) => (self.per_row * ratio, self.per_row),
            _ => (self.per_key, self.per_row),
        }
    }

    /// Whether a backlog of `keys` goes whole.
    pub(crate) fn goes_whole(&self, keys: u64) -> bool {
        self.threshold().is_some_and(|t| keys >= t)
    }

    /// The table holds `rows` rows.
    pub(crate) fn set_rows(&mut self, rows: u64) {
        self.rows = Some(rows);
    }

    /// Rows the table holds, last known.
    pub(crate) fn rows(&self) -> Option<u64> {
        self.rows
    }

    /// A set call of `keys` keys took `took` while `overlapping` calls ran (itself
    /// included): its share of the wall clock is `took / overlapping`.
    pub(crate) fn set_call(&mut self, keys: usize, took: Duration, overlapping: usize) {
        if keys < SAMPLE_KEYS {
            return;
        }
        let rate = took.as_secs_f64() / overlapping.max(1) as f64 / keys as f64;
        self.per_key = blend(self.per_key, rate, self.measured.0);
        self.measured.0 = true;
    }

    /// A whole-table run over `rows` rows took `took`.
    pub(crate) fn whole_run(&mut self, rows: u64, took: Duration) {
        self.rows = Some(rows);
        if rows < SAMPLE_KEYS as u64 {
            return;
        }
        let rate = took.as_secs_f64() / rows as f64;
        self.per_row = blend(self.per_row, rate, self.measured.1);
        self.measured.1 = true;
    }

    /// Keys per second of set work and rows per second of whole runs, as now assumed.
    pub(crate) fn rates(&self) -> (f64, f64) {
        let (per_key, per_row) = self.costs();
        (1.0 / per_key, 1.0 / per_row)
    }
}

/// A running average: the first measurement replaces the prior.
fn blend(old: f64, new: f64, measured: bool) -> f64 {
    if measured {
        old + ALPHA * (new - old)
    } else {
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_threshold_without_a_whole_way_a_size_or_in_per_key_mode() {
        let mut c = Choice::new(RebuildBy::Auto, false);
        c.set_rows(1_000_000);
        assert_eq!(c.threshold(), None);
        let mut c = Choice::new(RebuildBy::PerKey, true);
        c.set_rows(1_000_000);
        assert_eq!(c.threshold(), None);
        assert!(!c.grows());
        let c = Choice::new(RebuildBy::Auto, true);
        assert_eq!(c.threshold(), None, "the table's size is not known yet");
        assert!(!c.goes_whole(u64::MAX));
    }

    #[test]
    fn the_priors_put_the_threshold_at_a_quarter_of_the_table() {
        let mut c = Choice::new(RebuildBy::Auto, true);
        c.set_rows(2_000_000);
        // 2e-6 / 10e-6 / 0.8 = 0.25
        assert_eq!(c.threshold(), Some(500_000));
        assert!(!c.goes_whole(499_999));
        assert!(c.goes_whole(500_000));
    }

    #[test]
    fn a_small_table_never_goes_whole_for_a_few_keys() {
        let mut c = Choice::new(RebuildBy::Set, true);
        c.set_rows(40);
        assert_eq!(c.threshold(), Some(MIN_WHOLE_KEYS));
        assert!(c.always_sets() && c.grows());
    }

    #[test]
    fn measurements_move_the_threshold() {
        let mut c = Choice::new(RebuildBy::Auto, true);
        // 10 000 keys in 100 ms with two calls overlapping: 5 µs a key.
        c.set_call(10_000, ms(100), 2);
        // A whole run of 1M rows in 1 s: 1 µs a row.
        c.whole_run(1_000_000, Duration::from_secs(1));
        assert_eq!(c.rows(), Some(1_000_000));
        let (keys, rows) = c.rates();
        assert!((keys - 200_000.0).abs() < 1.0, "{keys}");
        assert!((rows - 1_000_000.0).abs() < 1.0, "{rows}");
        // 1e-6 / 5e-6 / 0.8 = 0.25 of the table
        assert_eq!(c.threshold(), Some(250_000));
        // A slower whole run moves it up, by the running average.
        c.whole_run(1_000_000, Duration::from_secs(3));
        let t = c.threshold().unwrap();
        assert!(t > 250_000 && t < 750_000, "{t}");
    }

    #[test]
    fn one_measurement_sets_the_other_at_the_priors_ratio() {
        // A slow server: a whole run of 100 000 rows in 1 s (10 µs a row). Set work is
        // assumed as slow, relative to it, as the priors say: the threshold stays a
        // quarter of the table rather than past the table's size.
        let mut c = Choice::new(RebuildBy::Auto, true);
        c.whole_run(100_000, Duration::from_secs(1));
        assert_eq!(c.threshold(), Some(25_000));
        let (keys, rows) = c.rates();
        assert!((rows - 100_000.0).abs() < 1.0 && (keys - 20_000.0).abs() < 1.0);
        // Set work measured alone: the whole run follows it.
        let mut c = Choice::new(RebuildBy::Auto, true);
        c.set_rows(100_000);
        c.set_call(10_000, Duration::from_secs(1), 1);
        assert_eq!(c.threshold(), Some(25_000));
    }

    #[test]
    fn small_samples_are_left_out() {
        let mut c = Choice::new(RebuildBy::Auto, true);
        c.set_call(SAMPLE_KEYS - 1, Duration::from_secs(60), 1);
        c.whole_run(10, Duration::from_secs(60));
        assert_eq!(c.rates(), (1.0 / PRIOR_PER_KEY, 1.0 / PRIOR_PER_ROW));
        assert_eq!(c.rows(), Some(10), "the size is kept all the same");
    }
}
