//! What the binlog reader shares with the store task, the source, its handles and the
//! acknowledgements: counters for health, the positions received and confirmed (each a
//! [`Mark`]), and the newest acknowledged commit batch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::{Checkpoint, FilePos};

/// A resume point, numbered in the order the reader saw it, with how many transactions
/// other than the position table's own writes lie behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) cp: Checkpoint,
    pub(crate) serial: u64,
    pub(crate) foreign: u64,
}

/// State shared by the reader, the store task, the source, its handles and the acks.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) running: AtomicBool,
    pub(crate) streaming: AtomicBool,
    pub(crate) events: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) schema_changes: AtomicU64,
    pub(crate) truncates: AtomicU64,
    pub(crate) queued_events: AtomicU64,
    pub(crate) peak_queued_events: AtomicU64,
    pub(crate) stores: AtomicU64,
    pub(crate) store_failures: AtomicU64,
    /// Server timestamp (seconds) of the newest event received.
    pub(crate) last_event_ts: AtomicU64,
    /// Whether the newest thing received was a heartbeat (caught up).
    pub(crate) caught_up: AtomicBool,
    pub(crate) last_error: Mutex<Option<String>>,
    pub(crate) received: Mutex<Option<FilePos>>,
    /// The server's binlog end, from its latest heartbeat.
    pub(crate) server_end: Mutex<Option<FilePos>>,
    /// Highest acknowledged commit batch: its sequence number and mark.
    pub(super) acked: Mutex<(u64, Option<Arc<Mark>>)>,
    pub(crate) ack_notify: Notify,
    /// The position that is safe to resume from; the store task persists it.
    pub(crate) safe: Mutex<Option<Arc<Mark>>>,
    pub(crate) stored: Mutex<Option<Checkpoint>>,
    /// `(serial, foreign)` of the stored mark.
    pub(super) stored_mark: Mutex<Option<(u64, u64)>>,
    pub(crate) store_notify: Notify,
}

impl Shared {
    pub(crate) fn set_error(&self, e: &dyn std::fmt::Display) {
        *lock(&self.last_error) = Some(e.to_string());
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The source-side view of queued events (decremented as batches are taken).
pub(crate) fn taken(shared: &Shared, events: usize) {
    shared
        .queued_events
        .fetch_sub(events as u64, Ordering::Relaxed);
}
