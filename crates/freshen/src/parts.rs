//! `Parts`: what a built configuration hands the run loop — the source, the user's
//! scope and rebuild callbacks, the fan-outs, the reconcile sweep and the options.
//!
//! The [`Builder`](crate::Builder) makes them, the [`Refresher`](crate::Refresher)
//! carries them, the [`runner`](crate::runner) and the [`Sweeper`](crate::sweep) use
//! them; they live here so that none of those has to import another for its types.

use std::sync::Arc;
use std::time::Duration;

use crate::ack::AckPolicy;
use crate::dirty::DirtyConfig;
use crate::rebuild::{Enumerate, Expand, Rebuild, RebuildBy};
use crate::schema::Watched;
use crate::{Key, Report, RowEvent, Source};

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
    pub(crate) watched: Vec<Watched>,
    pub(crate) rebuild_by: RebuildBy,
}
