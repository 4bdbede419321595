//! Shared helpers for the core's integration tests: events, recording rebuilds, acks.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{Ack, Batch, Key, Op, Row, RowEvent, Tx, Value};

/// A reading of `device` (the scope column) with `value`.
pub fn reading(device: &str, value: i64) -> RowEvent {
    RowEvent::new("public", "readings", Op::Insert).with_new(Row::from_pairs([
        ("device", Value::from(device)),
        ("value", Value::Int(value)),
    ]))
}

/// The same reading, stamped with a transaction id.
pub fn reading_in_tx(device: &str, value: i64, xid: u64) -> RowEvent {
    reading(device, value).with_tx(Tx {
        id: xid,
        commit: xid * 100,
        index: 0,
    })
}

pub fn truncate(table: &str) -> RowEvent {
    RowEvent::new("public", table, Op::Truncate)
}

pub fn scope(e: &RowEvent) -> impl Iterator<Item = Key> + use<> {
    e.scope_keys(&["device"])
}

/// Records acknowledgements by batch number, in the order they arrive.
#[derive(Clone, Default)]
pub struct Acks(Arc<Mutex<Vec<u32>>>);

impl Acks {
    pub fn batch(&self, n: u32, events: Vec<RowEvent>) -> Batch {
        let log = self.0.clone();
        Batch::new(events, Ack::new(move || log.lock().unwrap().push(n)))
    }

    pub fn list(&self) -> Vec<u32> {
        self.0.lock().unwrap().clone()
    }
}

/// Records rebuilt keys in the order their rebuilds finished.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().unwrap().push(s.into());
    }

    pub fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn sorted(&self) -> Vec<String> {
        let mut v = self.list();
        v.sort();
        v
    }

    pub fn count(&self, s: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|x| *x == s).count()
    }
}

/// Polls `cond` until it holds or `within` passes (virtual time under a paused clock).
pub async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits for `fut` while the refresher's `run` future keeps running; fails the test if
/// `run` ends first.
pub async fn meanwhile<R, T>(run: &mut R, fut: impl Future<Output = T>) -> T
where
    R: Future + Unpin,
{
    tokio::select! {
        _ = run => panic!("the refresher stopped early"),
        v = fut => v,
    }
}

/// Polls `cond` (as [`eventually`]) while the refresher's `run` future keeps running.
pub async fn waiting<R>(run: &mut R, what: &str, within: Duration, cond: impl FnMut() -> bool)
where
    R: Future + Unpin,
{
    meanwhile(run, eventually(what, within, cond)).await
}

/// Runs `fut` to completion or fails the test after `within`.
pub async fn within<T>(what: &str, within: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(within, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out: {what}"),
    }
}

pub const MS: Duration = Duration::from_millis(1);
