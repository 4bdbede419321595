//! Test support around a [`Refresher`]: running one on its own task, and polling a
//! condition with a deadline (never a sleep as synchronization).

use std::time::Duration;

use freshen::{Handle, Refresher, RunError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a condition may take before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A refresher running on its own task, stopped by [`Running::stop`].
#[derive(Debug)]
pub struct Running {
    /// Its handle: stats, quarantined keys.
    pub handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RunError>>,
}

impl Running {
    /// Spawns `refresher.run` until [`stop`](Self::stop).
    pub fn spawn(refresher: Refresher) -> Running {
        let handle = refresher.handle();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            refresher
                .run(async {
                    let _ = rx.await;
                })
                .await
        });
        Running {
            handle,
            stop: Some(tx),
            task,
        }
    }

    /// Stops the refresher and waits for it (its source is closed by then); panics if
    /// it does not stop within [`DEADLINE`] or its run failed.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the refresher stops")
            .expect("the refresher task")
            .expect("the refresher run");
    }
}

/// Polls the async `check` every 20 ms until it returns `Some`, and returns that; panics
/// naming `what` after `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs}s waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `step`; panics naming `what` if it is not done within `secs` seconds, so that
/// a test stalled in a step without a deadline of its own (a stop, a kill, a start)
/// says where, instead of running into the test runner's limit without a word.
pub async fn within<T>(secs: u64, what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), step)
        .await
        .unwrap_or_else(|_| panic!("not done within {secs}s: {what}"))
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after [`DEADLINE`].
pub async fn until(what: &str, cond: impl FnMut() -> bool) {
    until_within(what, DEADLINE, cond).await;
}

/// [`until`] with a deadline of its own.
pub async fn until_within(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() <= deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
