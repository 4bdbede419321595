//! `Refresher`: what a built configuration is, and the [`Handle`] that watches and
//! steers it while [`Refresher::run`] drives the [`runner`](crate::runner).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use crate::ack::AckPolicy;
use crate::dirty::DirtyConfig;
use crate::rebuild::{Enumerate, Expand, Rebuild};
use crate::runner::Runner;
use crate::stats::Recorder;
use crate::{Builder, Key, Report, RowEvent, RunError, Source, Stats};

pub(crate) type ScopeFn = Arc<dyn Fn(&RowEvent, &mut Vec<Key>) + Send + Sync>;
pub(crate) type ReportFn = Arc<dyn Fn(&Report<'_>) + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Reconcile {
    pub(crate) every: Duration,
    pub(crate) enumerate: Arc<dyn Enumerate>,
    /// Whether the first sweep runs at start (else one interval later).
    pub(crate) at_start: bool,
}

/// A key fan-out: its own scope (parent keys) and what maps them to view keys.
#[derive(Clone)]
pub(crate) struct FanOut {
    pub(crate) scope: ScopeFn,
    pub(crate) expand: Arc<dyn Expand>,
}

/// Everything a run needs, from the builder.
pub(crate) struct Parts {
    pub(crate) source: Box<dyn Source>,
    pub(crate) scope: ScopeFn,
    pub(crate) rebuild: Arc<dyn Rebuild>,
    pub(crate) fanouts: Vec<FanOut>,
    pub(crate) dirty: DirtyConfig,
    pub(crate) workers: usize,
    pub(crate) reconcile: Option<Reconcile>,
    pub(crate) report: Option<ReportFn>,
    pub(crate) ack: AckPolicy,
    pub(crate) grace: Duration,
    pub(crate) release_quarantined_after: Option<Duration>,
    pub(crate) watched: Vec<crate::schema::Watched>,
}

/// A quarantined key, from [`Handle::quarantined`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The key.
    pub key: Key,
    /// When it was quarantined.
    pub since: SystemTime,
    /// Failed rebuilds in a row that blamed it.
    pub failures: u32,
    /// The last error.
    pub error: String,
    /// Whether it holds back the acknowledgement of the transactions that dirtied it.
    pub holding: bool,
}

/// Requests from a [`Handle`] to the run loop.
#[derive(Debug)]
pub(crate) enum Command {
    Sweep,
    Readmit(Key),
    Rebuild(Key),
    /// Drops these lines of the unhealed gaps (those a person saw).
    AcknowledgeGaps(Vec<String>),
}

/// State shared by the run loop and every handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) stats: Recorder,
    pub(crate) has_reconcile: bool,
    pub(crate) quarantine: Mutex<BTreeMap<Key, Quarantined>>,
    commands: Mutex<Vec<Command>>,
    pub(crate) wake: Notify,
}

impl Shared {
    pub(crate) fn new(has_reconcile: bool) -> Shared {
        Shared {
            stats: Recorder::new(),
            has_reconcile,
            quarantine: Mutex::new(BTreeMap::new()),
            commands: Mutex::new(Vec::new()),
            wake: Notify::new(),
        }
    }

    fn command(&self, c: Command) {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c);
        self.wake.notify_one();
    }

    pub(crate) fn take_commands(&self) -> Vec<Command> {
        std::mem::take(&mut *self.commands.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn quarantine(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Quarantined>> {
        self.quarantine.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps derived tables fresh: reads batches from a source, maps events to keys,
/// debounces them and runs the rebuilds, acknowledging batches by its [`AckPolicy`].
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
    /// A builder with the default options.
    pub fn builder() -> Builder {
        Builder::default()
    }

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
