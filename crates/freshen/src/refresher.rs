//! `Refresher`: what a built configuration is, and the [`Handle`] that watches and
//! steers it while [`Refresher::run`] drives the [`runner`](crate::runner).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::parts::Parts;
use crate::runner::Runner;
use crate::shared::{Command, Quarantined, Shared};
use crate::{Key, RunError, Stats};

/// Keeps derived tables fresh: reads batches from a source, maps events to keys,
/// debounces them and runs the rebuilds, acknowledging batches by its
/// [`AckPolicy`](crate::AckPolicy).
///
/// See the [crate docs](crate) for an example.
pub struct Refresher {
    pub(crate) parts: Parts,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Refresher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresher").finish_non_exhaustive()
    }
}

/// A cloneable view of a running [`Refresher`]: stats, quarantined keys, on-demand
/// sweeps and re-admissions.
#[derive(Debug, Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl Handle {
    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    /// Asks for a reconcile sweep now (after the running one, if any). Returns false when
    /// no reconcile is configured.
    pub fn reconcile_now(&self) -> bool {
        if self.shared.has_reconcile {
            self.shared.command(Command::Sweep);
        }
        self.shared.has_reconcile
    }

    /// The quarantined keys, in key order.
    pub fn quarantined(&self) -> Vec<Quarantined> {
        self.shared.quarantine().values().cloned().collect()
    }

    /// Re-admits a quarantined key with a clean failure count (it is rebuilt after the
    /// debounce). Returns false when the key is not quarantined.
    pub fn readmit(&self, key: &Key) -> bool {
        let quarantined = self.shared.quarantine().contains_key(key);
        if quarantined {
            self.shared.command(Command::Readmit(key.clone()));
        }
        quarantined
    }

    /// Asks for `key` to be rebuilt: it is marked as a reconcile sweep marks the keys it
    /// lists (a key already waiting keeps its deadline, a running one runs again after,
    /// a quarantined one is re-admitted with a clean failure count), so it is rebuilt
    /// after the debounce.
    pub fn rebuild(&self, key: &Key) {
        self.shared.command(Command::Rebuild(key.clone()));
    }

    /// Says that a person healed the view's unhealed gaps ([`Stats::unhealed_gaps`]:
    /// rows changed that the stream did not carry, in a view without a reconcile sweep),
    /// for instance by rebuilding the keys they touched: the view stops reporting them.
    /// Returns the lines it acknowledged; a gap that arrives later is reported anew.
    pub fn acknowledge_gaps(&self) -> Vec<String> {
        let seen = self.stats().unhealed_gaps;
        if !seen.is_empty() {
            self.shared.command(Command::AcknowledgeGaps(seen.clone()));
        }
        seen
    }
}

impl Refresher {
    /// A handle for stats, quarantined keys and on-demand sweeps, usable while `run`
    /// runs and after it returns.
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        self.shared.stats.snapshot()
    }

    /// Runs until `shutdown` completes, the source fails for good, or the source ends
    /// and every dirty key has been rebuilt (poisoned keys aside).
    ///
    /// On shutdown or failure it stops taking batches, lets running rebuilds finish
    /// within the shutdown grace (then drops, that is cancels, the rest), releases the
    /// acks they earned and closes the source. Dirty keys not yet rebuilt stay
    /// unacknowledged, so a restart replays them.
    pub async fn run<S>(self, shutdown: S) -> Result<(), RunError>
    where
        S: Future<Output = ()> + Send,
    {
        let (runner, source) = Runner::new(self.parts, self.shared);
        runner.run(source, shutdown).await
    }
}
