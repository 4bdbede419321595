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
//! The HTTP listener serves from the start, through [`Roles`]: a standby answers
//! `/healthz` with 503 naming the process it waits for, and `/status` says `standby`.

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use freshen::plug::{Lease, SourcePlug};
use freshen::{BoxError, BoxFuture};

use crate::http::Observe;
use crate::metrics::{SourceStatus, ViewStats};
use crate::pipeline::Observer;

/// What this process is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Connecting, not yet known.
    Starting,
    /// Waiting for the active process (named) to go away.
    Standby(String),
    /// Running the pipeline.
    Active,
}

impl Role {
    /// `starting`, `standby` or `active`.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Standby(_) => "standby",
            Role::Active => "active",
        }
    }
}

/// The observer the HTTP listener reads from the start: the pipeline's once active,
/// this process's role before.
pub struct Roles {
    kind: &'static str,
    role: Mutex<Role>,
    last_error: Mutex<Option<String>>,
    active: RwLock<Option<Arc<Observer>>>,
    reloader: OnceLock<Arc<crate::reload::Reloader>>,
}

impl std::fmt::Debug for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Roles")
            .field("role", &self.role())
            .finish_non_exhaustive()
    }
}

impl Roles {
    /// A process of a `kind` source that has not started yet.
    pub fn new(kind: &'static str) -> Roles {
        Roles {
            kind,
            role: Mutex::new(Role::Starting),
            last_error: Mutex::new(None),
            active: RwLock::new(None),
            reloader: OnceLock::new(),
        }
    }

    /// What `POST /admin/reload` calls.
    pub fn set_reloader(&self, r: Arc<crate::reload::Reloader>) {
        let _ = self.reloader.set(r);
    }

    fn active(&self) -> Option<Arc<Observer>> {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, role: Role) {
        *self.role.lock().unwrap_or_else(|p| p.into_inner()) = role;
    }

    /// The pipeline runs: everything is read from its observer now (after a reload,
    /// the new pipeline's).
    pub fn activate(&self, observer: Arc<Observer>) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
        self.set(Role::Active);
    }
}

impl Observe for Roles {
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

    fn sink_snapshots(&self) -> Vec<crate::sink_snapshot::SinkSnapshotStatus> {
        self.active()
            .map(|o| o.sink_snapshots())
            .unwrap_or_default()
    }

    fn sink(&self, index: usize) -> Option<freshen_postgres::SinkSnapshots> {
        self.active().and_then(|o| o.sink(index))
    }

    fn handle(&self, view: &str) -> Option<freshen::Handle> {
        self.active().and_then(|o| o.handle(view))
    }

    fn reload(&self) -> Option<Result<crate::reload::Change, crate::reload::Refused>> {
        self.reloader.get().map(|r| r.reload())
    }

    fn role(&self) -> Role {
        self.role.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How often a standby tries to take over: the takeover delay after the active process
/// dies.
const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// How long to wait between tries when the upstream cannot be reached at all.
const UNREACHABLE_RETRY: Duration = Duration::from_secs(2);
/// How long a re-taken lease may show as held before this process concludes that
/// another one holds it.
const REACQUIRE_GRACE: Duration = Duration::from_secs(10);

/// Waits until this process may be active. `Ok(None)`: `stop` came first (a standby
/// asked to stop). The granted lease's loss future comes with `Ok(Some)`.
pub async fn lead(
    source: &dyn SourcePlug,
    roles: &Roles,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<Option<BoxFuture<'static, BoxError>>>, BoxError> {
    let mut announced = None::<String>;
    loop {
        let pause = match source.lead().await {
            Ok(Lease::Unneeded) => return Ok(Some(None)),
            Ok(Lease::Granted(lost)) => {
                if announced.is_some() {
                    tracing::info!("taking over: the active process is gone");
                }
                return Ok(Some(Some(lost)));
            }
            Ok(Lease::Held(who)) => {
                if announced.as_deref() != Some(who.as_str()) {
                    tracing::info!(active = %who, "standby: another process is active on this configuration; taking over when it stops");
                    announced = Some(who.clone());
                }
                roles.set(Role::Standby(who));
                STANDBY_RETRY
            }
            // Unusable from the start (unreachable, wrong password, bad URL): fail as
            // starting the pipeline would. A standby that loses the database retries.
            Err(e) if announced.is_none() => return Err(e),
            Err(e) => {
                let e = freshen::redact_text(&e.to_string());
                tracing::warn!("cannot tell whether another process is active, retrying: {e}");
                *roles.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                UNREACHABLE_RETRY
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
pub async fn keep(source: Arc<dyn SourcePlug>, mut lost: BoxFuture<'static, BoxError>) -> String {
    loop {
        let why = lost.await;
        tracing::warn!(
            "the active lease was lost ({}); taking it again",
            freshen::redact_text(&why.to_string())
        );
        // The lease may still show as held by this process's own previous session
        // until the server has noticed that session end (a probe that timed out on a
        // slow server, a socket not yet closed): only a holder that stays past the grace
        // is another process.
        let grace = std::time::Instant::now() + REACQUIRE_GRACE;
        loop {
            match source.lead().await {
                Ok(Lease::Granted(again)) => {
                    tracing::info!("the active lease is held again");
                    lost = again;
                    break;
                }
                Ok(Lease::Unneeded) => return std::future::pending().await,
                Ok(Lease::Held(_)) if std::time::Instant::now() < grace => {
                    tokio::time::sleep(STANDBY_RETRY).await;
                }
                Ok(Lease::Held(who)) => return who,
                Err(_) => tokio::time::sleep(UNREACHABLE_RETRY).await,
            }
        }
    }
}
