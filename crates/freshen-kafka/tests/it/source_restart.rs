//! A consumer stopped after it consumed but before its rebuilds finished: under
//! AfterRebuild the next consumer of the group replays and rebuilds every key; under
//! OnEnqueue the offsets are gone and the startup reconcile heals it.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use freshen::{AckPolicy, Key, Refresher, RowEvent};
use freshen_codec::Format;
use freshen_kafka::{KafkaSource, KafkaSourceConfig};
use freshen_testenv::KafkaFlavor;
use support::*;
use tokio::sync::Semaphore;

const KEYS: [&str; 3] = ["dev-0", "dev-1", "dev-2"];

async fn setup(topic: &str) -> (freshen_testenv::KafkaServer, String) {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, topic, 1).await;
    let p = producer(&bootstrap);
    for i in 0..6 {
        let device = KEYS[i % 3];
        send(&p, topic, 0, device, &ticdc_insert(i as i64, device, 1)).await;
    }
    (kafka, bootstrap)
}

fn source(bootstrap: &str, topic: &str) -> KafkaSource {
    let config = KafkaSourceConfig::new(bootstrap, [topic], "restart", Format::CanalJson)
        .session_timeout_ms(session_ms(KafkaFlavor::Noida));
    KafkaSource::new(&config).unwrap()
}

/// A refresher whose rebuilds never finish (they wait on a gate nobody opens).
fn stuck(source: KafkaSource, ack: AckPolicy) -> Refresher {
    let gate = Arc::new(Semaphore::new(0));
    Refresher::builder()
        .source(source)
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

fn universe() -> Vec<Key> {
    KEYS.iter().map(|k| Key::from(*k)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_rebuild_replays_to_the_next_consumer() {
    let (_kafka, bootstrap) = setup("ar").await;
    let first = Running::spawn(stuck(source(&bootstrap, "ar"), AckPolicy::AfterRebuild));
    until("the first consumer read everything", || {
        first.handle.stats().events_received == 6
    })
    .await;
    first.stop().await;
    assert_eq!(
        committed(&bootstrap, "restart", "ar", 1),
        [None],
        "no rebuild finished, so nothing was committed"
    );

    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let second = Refresher::builder()
        .source(source(&bootstrap, "ar"))
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::from_millis(20))
        .build()
        .unwrap();
    let second = Running::spawn(second);
    until("the replay is rebuilt and committed", || {
        committed(&bootstrap, "restart", "ar", 1) == [Some(6)]
    })
    .await;
    assert_eq!(
        second.handle.stats().events_received,
        6,
        "everything replayed"
    );
    assert_eq!(rebuilt.distinct().into_iter().collect::<Vec<_>>(), KEYS);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_enqueue_is_healed_by_the_startup_reconcile() {
    let (_kafka, bootstrap) = setup("oe").await;
    let first = Running::spawn(stuck(source(&bootstrap, "oe"), AckPolicy::OnEnqueue));
    until("the first consumer committed on enqueue", || {
        committed(&bootstrap, "restart", "oe", 1) == [Some(6)]
    })
    .await;
    assert_eq!(
        first.handle.stats().rebuilds_ok,
        0,
        "stopped before any rebuild"
    );
    first.stop().await;

    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let second = Refresher::builder()
        .source(source(&bootstrap, "oe"))
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .reconcile(Duration::from_secs(3600), || async {
            Ok::<_, std::io::Error>(universe())
        })
        .ack(AckPolicy::OnEnqueue)
        .coalesce(Duration::from_millis(20))
        .build()
        .unwrap();
    let second = Running::spawn(second);
    until("the sweep rebuilt every key", || {
        rebuilt.distinct().len() == 3
    })
    .await;
    let stats = second.handle.stats();
    assert_eq!(
        stats.events_received, 0,
        "the committed offsets replay nothing"
    );
    assert!(stats.reconciles >= 1);
    second.stop().await;
}
