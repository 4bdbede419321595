//! `Builder`: a refresher's configuration, checked all at once.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::ack::AckPolicy;
use crate::backoff::Backoff;
use crate::dirty::DirtyConfig;
use crate::parts::{FanOut, Parts, Reconcile, ReportFn, ScopeFn};
use crate::rebuild::{Batched, Enumerate, Expand, ListAll, PerKey, Rebuild, RebuildBy};
use crate::schema::Watched;
use crate::shared::Shared;
use crate::{BoxError, BuildError, Key, Refresher, Report, RowEvent, Source};

// Here rather than in `refresher.rs`, so that the refresher never names its builder:
// the builder depends on what it builds, not the reverse.
impl Refresher {
    /// A builder with the default options.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

/// Configures a [`Refresher`]. `source`, `scope` and `rebuild` are required.
pub struct Builder {
    source: Option<Box<dyn Source>>,
    scope: Option<ScopeFn>,
    rebuild: Option<Arc<dyn Rebuild>>,
    fanouts: Vec<FanOut>,
    coalesce: Duration,
    max_wait: Duration,
    workers: usize,
    backoff: Backoff,
    poison_after: u32,
    reconcile: Option<Reconcile>,
    sweep_at_start: bool,
    on_error: Option<ReportFn>,
    ack: AckPolicy,
    shutdown_grace: Duration,
    release_quarantined_after: Option<Duration>,
    watched: Vec<Watched>,
    rebuild_by: RebuildBy,
    problems: Vec<String>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("source", &self.source.is_some())
            .field("scope", &self.scope.is_some())
            .field("rebuild", &self.rebuild.is_some())
            .field("fanouts", &self.fanouts.len())
            .field("coalesce", &self.coalesce)
            .field("max_wait", &self.max_wait)
            .field("workers", &self.workers)
            .field("backoff", &self.backoff)
            .field("poison_after", &self.poison_after)
            .field("reconcile_every", &self.reconcile.as_ref().map(|r| r.every))
            .field("ack", &self.ack)
            .finish_non_exhaustive()
    }
}

impl Default for Builder {
    fn default() -> Builder {
        let d = DirtyConfig::default();
        Builder {
            source: None,
            scope: None,
            rebuild: None,
            fanouts: Vec::new(),
            coalesce: d.coalesce,
            max_wait: d.max_wait,
            workers: 4,
            backoff: d.backoff,
            poison_after: d.poison_after,
            reconcile: None,
            sweep_at_start: true,
            on_error: None,
            ack: AckPolicy::default(),
            shutdown_grace: Duration::from_secs(10),
            release_quarantined_after: None,
            watched: Vec::new(),
            rebuild_by: RebuildBy::default(),
            problems: Vec::new(),
        }
    }
}

impl Builder {
    /// Where changes come from.
    pub fn source(mut self, source: impl Source) -> Builder {
        self.source = Some(Box::new(source));
        self
    }

    /// Maps one row change to the keys it dirties (none, one, or several — an update
    /// that moves a row between scopes dirties the old and the new). Runs inline on the
    /// receive path: keep it pure and quick. [`RowEvent::scope_keys`] does the usual case.
    pub fn scope<F, I>(mut self, scope: F) -> Builder
    where
        F: Fn(&RowEvent) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = Key>,
    {
        self.scope = Some(Arc::new(move |e: &RowEvent, out: &mut Vec<Key>| {
            out.extend(scope(e))
        }));
        self
    }

    /// Adds a key fan-out: `scope` maps a row change to *parent* keys (a changed plan's
    /// id, old and new), which are debounced like keys and then mapped to the view's keys
    /// by `expand`, off the receive path. See [`Expand`] for what is acknowledged when.
    /// Call once per parent table; parent keys of different fan-outs never mix.
    pub fn fan_out<F, I>(mut self, scope: F, expand: impl Expand) -> Builder
    where
        F: Fn(&RowEvent) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = Key>,
    {
        if expand.max_batch() == 0 {
            self.problems
                .push("a fan-out's max_batch must be at least 1".to_string());
        }
        self.fanouts.push(FanOut {
            scope: Arc::new(move |e: &RowEvent, out: &mut Vec<Key>| out.extend(scope(e))),
            expand: Arc::new(expand),
        });
        self
    }

    /// Recomputes one key from the source tables (idempotently).
    pub fn rebuild<F, Fut, E>(mut self, rebuild: F) -> Builder
    where
        F: Fn(Key) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.rebuild = Some(Arc::new(PerKey::new(rebuild)));
        self
    }

    /// Recomputes up to `max` ready keys in one call (one round trip for many keys).
    /// Single flight still holds per key; when a call fails, each of its keys is retried
    /// in a call of its own, so one bad key cannot keep failing its neighbours.
    pub fn rebuild_batch<F, Fut, E>(mut self, max: usize, rebuild: F) -> Builder
    where
        F: Fn(Vec<Key>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        if max == 0 {
            self.problems
                .push("rebuild_batch size must be at least 1".to_string());
        }
        self.rebuild = Some(Arc::new(Batched::new(max, rebuild)));
        self
    }

    /// Uses a [`Rebuild`] implementation (which also sees transaction ids).
    pub fn rebuild_with(mut self, rebuild: impl Rebuild) -> Builder {
        if rebuild.max_batch() == 0 {
            self.problems
                .push("the rebuild's max_batch must be at least 1".to_string());
        }
        self.rebuild = Some(Arc::new(rebuild));
        self
    }

    /// Quiet period: a key fires once no change has touched it for this long
    /// (default 100 ms). Zero rebuilds at once.
    pub fn coalesce(mut self, d: Duration) -> Builder {
        self.coalesce = d;
        self
    }

    /// Cap: a key fires once it has been dirty this long, however often it changes
    /// (default 5 s). Must be at least `coalesce`.
    pub fn max_wait(mut self, d: Duration) -> Builder {
        self.max_wait = d;
        self
    }

    /// Rebuild calls running at once (default 4).
    pub fn workers(mut self, n: usize) -> Builder {
        self.workers = n;
        self
    }

    /// Retry delays after failed rebuilds (default 100 ms doubling to 30 s, jittered).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Builder {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// Consecutive failures that blame the key ([`Retry::Key`](crate::Retry)) after which
    /// it is quarantined (default 5, at most 65535). Failures of the path — an outage —
    /// never count.
    pub fn poison_after(mut self, n: u32) -> Builder {
        self.poison_after = n;
        self
    }

    /// A reconcile sweep: once at start, then `every`, and at once after a TRUNCATE.
    /// `enumerate` returns every key that should be rebuilt (the live key universe).
    pub fn reconcile<F, Fut, E>(self, every: Duration, enumerate: F) -> Builder
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Key>, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.reconcile_with(every, ListAll::new(enumerate))
    }

    /// A reconcile sweep whose keys are streamed by an [`Enumerate`] (large universes).
    pub fn reconcile_with(mut self, every: Duration, enumerate: impl Enumerate) -> Builder {
        self.reconcile = Some(Reconcile {
            every,
            enumerate: Arc::new(enumerate),
            at_start: true,
        });
        self
    }

    /// Whether the reconcile sweep also runs at start (default true). A program that
    /// restarts a refresher whose derived table is known to be right — an unchanged view
    /// across a configuration reload — skips it; the periodic and TRUNCATE sweeps stay.
    pub fn sweep_at_start(mut self, yes: bool) -> Builder {
        self.sweep_at_start = yes;
        self
    }

    /// Called for every [`Report`]: failed rebuilds, quarantined keys, skipped messages,
    /// failed sweeps. Without it reports are only counted in [`Stats`](crate::Stats).
    pub fn on_error(mut self, f: impl Fn(&Report<'_>) + Send + Sync + 'static) -> Builder {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// When batches are acknowledged to the source (default [`AckPolicy::AfterRebuild`]).
    pub fn ack(mut self, policy: AckPolicy) -> Builder {
        self.ack = policy;
        self
    }

    /// How long a stopping refresher waits for running rebuilds (default 10 s); then it
    /// drops (cancels) them and their keys stay unacknowledged.
    pub fn shutdown_grace(mut self, d: Duration) -> Builder {
        self.shutdown_grace = d;
        self
    }

    /// Without a reconcile sweep, a quarantined key keeps the transactions that dirtied
    /// it unacknowledged (under [`AckPolicy::AfterRebuild`]) until a change to it
    /// rebuilds it — nothing else would heal it. This bounds that: past `d` the holds are
    /// released and [`Report::QuarantineReleased`](crate::Report) says so (default: no
    /// bound). With a reconcile sweep, holds are released at quarantine.
    pub fn release_quarantined_after(mut self, d: Duration) -> Builder {
        self.release_quarantined_after = Some(d);
        self
    }

    /// Declares a table the view reads and the columns its scope takes keys from there
    /// (call once per table, fan-out tables included). With declarations, a TRUNCATE or
    /// a [`Gap`](crate::Gap) sweeps the view only when it concerns a declared table, and
    /// a [`SchemaChange`](crate::SchemaChange) that drops or retypes a declared key
    /// column, or renames or drops a declared table, pauses the view
    /// ([`Report::Paused`](crate::Report)) until a later change undoes it. Without any,
    /// every table concerns the view and schema changes are only reported.
    pub fn watches(mut self, schema: &str, table: &str, key: &[&str]) -> Builder {
        self.watched.push(Watched {
            schema: schema.into(),
            table: table.into(),
            key: key.iter().map(|c| Box::from(*c)).collect(),
        });
        self
    }

    /// Which ways keys are rebuilt (default [`RebuildBy::Auto`]: per-key batches for a
    /// trickle, set calls for a backlog, and — where the rebuild can
    /// ([`Rebuild::whole`](crate::Rebuild::whole)) — the whole table past a measured
    /// share of it, and a first build of an empty table).
    pub fn rebuild_by(mut self, by: RebuildBy) -> Builder {
        self.rebuild_by = by;
        self
    }

    /// Checks the configuration and builds the refresher, listing every problem at once.
    pub fn build(self) -> Result<Refresher, BuildError> {
        let mut problems = self.problems;
        if self.source.is_none() {
            problems.push("a source is required (Builder::source)".into());
        }
        if self.scope.is_none() {
            problems.push("a scope function is required (Builder::scope)".into());
        }
        if self.rebuild.is_none() {
            problems.push("a rebuild is required (Builder::rebuild)".into());
        }
        // Nothing a refresher waits for needs more than a year, and bounding every
        // duration keeps `now + d` far from the clock's end.
        const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
        for (what, d) in [
            ("coalesce", Some(self.coalesce)),
            ("max_wait", Some(self.max_wait)),
            ("backoff max", Some(self.backoff.max)),
            ("shutdown_grace", Some(self.shutdown_grace)),
            (
                "reconcile interval",
                self.reconcile.as_ref().map(|r| r.every),
            ),
            ("release_quarantined_after", self.release_quarantined_after),
        ] {
            if let Some(d) = d
                && d > YEAR
            {
                problems.push(format!("{what} ({d:?}) must be at most a year"));
            }
        }
        if self.coalesce > self.max_wait {
            problems.push(format!(
                "coalesce ({:?}) must not exceed max_wait ({:?})",
                self.coalesce, self.max_wait
            ));
        }
        if self.workers == 0 {
            problems.push("workers must be at least 1".into());
        }
        if self.poison_after == 0 || self.poison_after > u32::from(u16::MAX) {
            problems.push(format!(
                "poison_after must be between 1 and {} (got {})",
                u16::MAX,
                self.poison_after
            ));
        }
        if self.backoff.base.is_zero() {
            problems.push("backoff base must be greater than zero".into());
        }
        if self.backoff.base > self.backoff.max {
            problems.push(format!(
                "backoff base ({:?}) must not exceed backoff max ({:?})",
                self.backoff.base, self.backoff.max
            ));
        }
        if self.reconcile.as_ref().is_some_and(|r| r.every.is_zero()) {
            problems.push("reconcile interval must be greater than zero".into());
        }
        let (Some(source), Some(scope), Some(rebuild), true) =
            (self.source, self.scope, self.rebuild, problems.is_empty())
        else {
            return Err(BuildError { problems });
        };
        let shared = Arc::new(Shared::new(self.reconcile.is_some()));
        let seed = crate::Jitter::from_clock().next_u64();
        Ok(Refresher {
            parts: Parts {
                source,
                scope,
                rebuild,
                fanouts: self.fanouts,
                dirty: DirtyConfig {
                    coalesce: self.coalesce,
                    max_wait: self.max_wait,
                    backoff: self.backoff,
                    poison_after: self.poison_after,
                    seed,
                },
                workers: self.workers,
                reconcile: self.reconcile.map(|r| Reconcile {
                    at_start: self.sweep_at_start,
                    ..r
                }),
                report: self.on_error,
                ack: self.ack,
                grace: self.shutdown_grace,
                release_quarantined_after: self.release_quarantined_after,
                watched: self.watched,
                rebuild_by: self.rebuild_by,
            },
            shared,
        })
    }
}
