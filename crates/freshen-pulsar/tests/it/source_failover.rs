//! Two consumers on one failover subscription: one is active, the standby waits and
//! takes over — from the first unacknowledged message — when the active one stops.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use freshen::{Key, Refresher, RowEvent};
use freshen_pulsar::{PulsarSource, PulsarSourceConfig, SourceStatsHandle};
use support::*;
use tokio::sync::Semaphore;

fn consumer(
    config: PulsarSourceConfig,
    rebuilt: &Rebuilt,
    gate: Arc<Semaphore>,
) -> (Running, SourceStatsHandle) {
    let source = PulsarSource::new(config).unwrap();
    let stats = source.stats_handle();
    let log = rebuilt.clone();
    let refresher = Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            let (log, gate) = (log.clone(), gate.clone());
            async move {
                let _pass = gate.acquire().await;
                log.push(k);
                Ok::<_, std::io::Error>(())
            }
        })
        .coalesce(Duration::ZERO)
        .shutdown_grace(Duration::from_millis(50))
        .build()
        .unwrap();
    (Running::spawn(refresher), stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_waits_then_takes_over_what_was_not_acknowledged() {
    let pulsar = broker();
    let mut p = producer(&pulsar, "fo").await;
    let base = PulsarSourceConfig::new(pulsar.url(), "fo", "failover");

    // "a" sorts first: the broker makes it the active consumer.
    let open = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let (ra, rb) = (Rebuilt::default(), Rebuilt::default());
    let held = Arc::new(Semaphore::new(0));
    let (a, a_stats) = consumer(base.clone().consumer_name("a"), &ra, open.clone());
    p.send(Some("k"), &ticdc_insert(1, "dev-1", 1))
        .await
        .unwrap();
    until("A rebuilt the first change", || ra.len() == 1).await;
    let (b, b_stats) = consumer(base.clone().consumer_name("b"), &rb, held.clone());
    until("B subscribed", || b_stats.stats().subscribes == 1).await;

    // Two more: A reads them, B (the standby) gets nothing. A's rebuilds now hang.
    open.forget_permits(Semaphore::MAX_PERMITS);
    for i in 2..=3 {
        p.send(Some("k"), &ticdc_insert(i, &format!("dev-{i}"), 1))
            .await
            .unwrap();
    }
    // At least three: the broker may deliver an unacknowledged message to A again when
    // B joins (seen once at the end of a full suite: A had 4 events, B none), which
    // at-least-once allows. On a timeout, say what each consumer had seen, so a failure
    // tells a slow broker from a switched active consumer.
    let read = tokio::time::timeout(DEADLINE, async {
        while a_stats.stats().events < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    if read.await.is_err() {
        panic!(
            "timed out after {DEADLINE:?} waiting for A to read them; A: {:?}, B: {:?}",
            a_stats.stats(),
            b_stats.stats()
        );
    }
    assert_eq!(b_stats.stats().messages, 0, "the standby receives nothing");

    // A stops with two changes unacknowledged: B takes over from there.
    a.stop().await;
    held.add_permits(Semaphore::MAX_PERMITS);
    until("B rebuilt what A had not finished", || {
        rb.distinct().len() == 2
    })
    .await;
    assert_eq!(
        rb.distinct().into_iter().collect::<Vec<_>>(),
        ["dev-2", "dev-3"],
        "the acknowledged change is not delivered again"
    );
    b.stop().await;
}
