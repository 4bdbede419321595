//! A consumer stopped after it consumed but before its rebuilds finished: under
//! AfterRebuild the next consumer of the subscription rebuilds every key; under
//! OnEnqueue the messages are acknowledged and gone, and the startup reconcile heals it.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use freshen::{AckPolicy, Key, Refresher, RowEvent};
use freshen_pulsar::{PulsarSource, PulsarSourceConfig};
use support::*;
use tokio::sync::Semaphore;

const KEYS: [&str; 3] = ["dev-0", "dev-1", "dev-2"];

async fn setup(name: &str) -> (freshen_testenv::PulsarServer, PulsarSourceConfig) {
    let pulsar = broker();
    let mut p = producer(&pulsar, name).await;
    for i in 0..6 {
        let device = KEYS[i % 3];
        p.send(Some(device), &ticdc_insert(i as i64, device, 1))
            .await
            .unwrap();
    }
    let config = PulsarSourceConfig::new(pulsar.url(), name, "restart");
    (pulsar, config)
}

/// A refresher whose rebuilds never finish.
fn stuck(config: &PulsarSourceConfig, ack: AckPolicy) -> Refresher {
    let gate = Arc::new(Semaphore::new(0));
    Refresher::builder()
        .source(PulsarSource::new(config.clone()).unwrap())
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |_k: Key| {
            let gate = gate.clone();
            async move {
                let _never = gate.acquire().await;
                Ok::<_, std::io::Error>(())
            }
        })
        .coalesce(Duration::ZERO)
        .ack(ack)
        .shutdown_grace(Duration::from_millis(50))
        .build()
        .unwrap()
}

fn recording(config: &PulsarSourceConfig, rebuilt: &Rebuilt, ack: AckPolicy) -> freshen::Builder {
    let log = rebuilt.clone();
    Refresher::builder()
        .source(PulsarSource::new(config.clone()).unwrap())
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::from_millis(20))
        .ack(ack)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_rebuild_redelivers_to_the_next_consumer() {
    let (_pulsar, config) = setup("ar").await;
    let first = Running::spawn(stuck(&config, AckPolicy::AfterRebuild));
    until("the first consumer read everything", || {
        first.handle.stats().events_received == 6
    })
    .await;
    first.stop().await;

    let rebuilt = Rebuilt::default();
    let second = Running::spawn(
        recording(&config, &rebuilt, AckPolicy::AfterRebuild)
            .build()
            .unwrap(),
    );
    until("every key rebuilt after the redelivery", || {
        rebuilt.distinct().len() == 3
    })
    .await;
    assert_eq!(
        second.handle.stats().events_received,
        6,
        "nothing had been acknowledged"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_enqueue_is_healed_by_the_startup_reconcile() {
    let (pulsar, config) = setup("oe").await;
    let first = Running::spawn(stuck(&config, AckPolicy::OnEnqueue));
    until("the first consumer read everything", || {
        first.handle.stats().events_received == 6
    })
    .await;
    first.stop().await;

    // A marker after the stop: the next consumer's first delivery shows where the
    // subscription stood.
    let mut p = producer(&pulsar, "oe").await;
    p.send(Some("m"), &ticdc_insert(99, "dev-marker", 1))
        .await
        .unwrap();
    let rebuilt = Rebuilt::default();
    let second = recording(&config, &rebuilt, AckPolicy::OnEnqueue)
        .reconcile(Duration::from_secs(3600), || async {
            Ok::<_, std::io::Error>(KEYS.iter().map(|k| Key::from(*k)).collect::<Vec<_>>())
        })
        .build()
        .unwrap();
    let second = Running::spawn(second);
    until("the sweep and the marker rebuilt", || {
        rebuilt.distinct().len() == 4
    })
    .await;
    let stats = second.handle.stats();
    assert_eq!(
        stats.events_received, 1,
        "only the marker: the rest was acknowledged on enqueue"
    );
    assert!(stats.reconciles >= 1);
    second.stop().await;
}
