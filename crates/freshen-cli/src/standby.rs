//! Active or standby: two `freshen run` processes on one configuration, one working and
//! one waiting its turn (the source's [`lead`](freshen::plug::SourcePlug::lead) decides;
//! for PostgreSQL an advisory lock keyed by the slot).
//!
//! ```text
//!  Starting ──lease granted──▶ Active ──lease lost, re-taken──▶ Active
//!     │  ▲                       │
//!     │  └─────── 1 s ─────┐     └─lease lost, another holds it──▶ stop (exit 1)
//!     └──held elsewhere──▶ Standby
//! ```
//!
//! The HTTP listener serves from the start, through [`Process`]: a standby answers
//! `/healthz` with 503 naming the process it waits for, and `/status` says `standby`.

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use freshen::plug::{Lease, SourcePlug};
use freshen::{BoxError, BoxFuture};

use crate::metrics::{Redacted, SinkStatus, SourceStatus, ViewStats};
use crate::pipeline::Observer;
use crate::readout::{Activity, Change, Readout, Refused, SinkSnapshotStatus, SinkSnapshots};
use crate::supervisor::{Answer, Reacquire, ReacquireStep, Standby, StandbyStep};

/// The observer the HTTP listener reads from the start: the pipeline's once active,
/// this process's activity before.
pub(crate) struct Process {
    kind: &'static str,
    activity: Mutex<Activity>,
    last_error: Mutex<Option<String>>,
    active: RwLock<Option<Arc<Observer>>>,
    reloader: OnceLock<Arc<crate::reload::Reloader>>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("activity", &self.activity())
            .finish_non_exhaustive()
    }
}

impl Process {
    /// A process of a `kind` source that has not started yet.
    pub(crate) fn new(kind: &'static str) -> Process {
        Process {
            kind,
            activity: Mutex::new(Activity::Starting),
            last_error: Mutex::new(None),
            active: RwLock::new(None),
            reloader: OnceLock::new(),
        }
    }

    /// What `POST /admin/reload` calls.
    pub(crate) fn set_reloader(&self, r: Arc<crate::reload::Reloader>) {
        let _ = self.reloader.set(r);
    }

    fn active(&self) -> Option<Arc<Observer>> {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, activity: Activity) {
        *self.activity.lock().unwrap_or_else(|p| p.into_inner()) = activity;
    }

    /// The pipeline runs: everything is read from its observer now (after a reload,
    /// the new pipeline's).
    pub(crate) fn activate(&self, observer: Arc<Observer>) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
        self.set(Activity::Active);
    }
}

impl Readout for Process {
    fn views(&self) -> Vec<ViewStats> {
        self.active().map(|o| o.views()).unwrap_or_default()
    }

    fn source(&self) -> SourceStatus {
        match self.active() {
            Some(o) => o.source(),
            None => SourceStatus {
                kind: self.kind.into(),
                last_error: self
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
                ..SourceStatus::default()
            },
        }
    }

    fn snapshots(&self) -> Vec<freshen_changefeed::SnapshotProgress> {
        self.active().map(|o| o.snapshots()).unwrap_or_default()
    }

    fn sink_snapshots(&self) -> Vec<SinkSnapshotStatus> {
        self.active()
            .map(|o| o.sink_snapshots())
            .unwrap_or_default()
    }

    fn sink(&self, index: usize) -> Option<SinkSnapshots> {
        self.active().and_then(|o| o.sink(index))
    }

    fn sinks(&self) -> Vec<SinkStatus> {
        self.active().map(|o| o.sinks()).unwrap_or_default()
    }

    fn redactions(&self) -> Vec<Redacted> {
        self.active().map(|o| o.redactions()).unwrap_or_default()
    }

    fn view(&self, view: &str) -> Option<crate::readout::AdminView> {
        self.active().and_then(|o| o.view(view))
    }

    fn reload(&self) -> Option<Result<Change, Refused>> {
        self.reloader.get().map(|r| r.reload())
    }

    fn activity(&self) -> Activity {
        self.activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Waits until this process may be active. `Ok(None)`: `stop` came first (a standby
/// asked to stop). The granted lease's loss future comes with `Ok(Some)`.
pub(crate) async fn lead(
    source: &dyn SourcePlug,
    process: &Process,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<Option<BoxFuture<'static, BoxError>>>, BoxError> {
    let mut standby = Standby::default();
    loop {
        let answer = source.lead().await;
        let pause = match standby.answered(Answer::of(&answer)) {
            StandbyStep::Lead { took_over } => {
                if took_over {
                    tracing::info!("taking over: the active process is gone");
                }
                return Ok(Some(match answer {
                    Ok(Lease::Granted(lost)) => Some(lost),
                    _ => None,
                }));
            }
            StandbyStep::Wait {
                holder,
                announce,
                after,
            } => {
                if announce {
                    tracing::info!(active = %holder, "standby: another process is active on this configuration; taking over when it stops");
                }
                process.set(Activity::Standby(holder));
                after
            }
            StandbyStep::Fail => {
                return Err(answer.expect_err("a failure is an unreachable source"));
            }
            StandbyStep::Retry(after) => {
                let e = answer.err().map(|e| e.to_string()).unwrap_or_default();
                let e = freshen::redact_text(&e);
                tracing::warn!("cannot tell whether another process is active, retrying: {e}");
                *process.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                after
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return Ok(None),
        }
    }
}

/// While active: when the lease is lost, takes it again; resolves only when another
/// process holds it (then this one must stop), with who.
pub(crate) async fn keep(
    source: Arc<dyn SourcePlug>,
    mut lost: BoxFuture<'static, BoxError>,
) -> String {
    loop {
        let why = lost.await;
        tracing::warn!(
            "the active lease was lost ({}); taking it again",
            freshen::redact_text(&why.to_string())
        );
        let reacquire = Reacquire::lost_at(std::time::Instant::now());
        loop {
            let answer = source.lead().await;
            match reacquire.answered(Answer::of(&answer), std::time::Instant::now()) {
                ReacquireStep::Held => {
                    tracing::info!("the active lease is held again");
                    let Ok(Lease::Granted(again)) = answer else {
                        unreachable!("held again means granted");
                    };
                    lost = again;
                    break;
                }
                ReacquireStep::Unneeded => return std::future::pending().await,
                ReacquireStep::Retry(after) => tokio::time::sleep(after).await,
                ReacquireStep::TakenBy(who) => return who,
            }
        }
    }
}
