//! `Shared`: the state the run loop and every [`Handle`](crate::Handle) share — the
//! stats, the quarantine list ([`Quarantined`]) and the [`Command`]s a handle sends.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use tokio::sync::Notify;

use crate::Key;
use crate::stats::Recorder;

/// A quarantined key, from [`Handle::quarantined`](crate::Handle::quarantined).
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

/// Requests from a [`Handle`](crate::Handle) to the run loop.
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

    pub(crate) fn command(&self, c: Command) {
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
