//! TiCDC-shaped canal-json on Kafka drives a refresher: keys coalesce into rebuilds, a
//! poison message is skipped, counted and dead-lettered while the rest flows, offsets
//! are committed once the rebuilds are done.

use crate::support;

use std::time::Duration;

use freshen::{AckPolicy, Key, Refresher, RowEvent};
use freshen_codec::Format;
use freshen_kafka::{KafkaSource, KafkaSourceConfig};
use freshen_testenv::KafkaFlavor;
use rdkafka::message::{Headers, Message};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_changes_on_two_keys_make_two_rebuilds_and_poison_is_skipped() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "cdc", 1).await;
    create_topic(&bootstrap, "cdc-dlq", 1).await;
    let p = producer(&bootstrap);
    send(&p, "cdc", 0, "demo.readings", &ticdc_ddl()).await;
    send(&p, "cdc", 0, "1", &ticdc_insert(1, "dev-a", 10)).await;
    send(&p, "cdc", 0, "poison", b"{not canal-json").await;
    send(&p, "cdc", 0, "2", &ticdc_insert(2, "dev-b", 5)).await;
    send(&p, "cdc", 0, "1", &ticdc_update(1, "dev-a", "dev-a", 12)).await;
    let produced = 5;

    let config = KafkaSourceConfig::new(&bootstrap, ["cdc"], "g1", Format::CanalJson)
        .dead_letter_topic("cdc-dlq")
        .session_timeout_ms(session_ms(KafkaFlavor::Noida));
    let source = KafkaSource::new(&config).expect("source");
    let source_stats = source.stats_handle();
    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let refresher = Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::from_millis(200))
        .ack(AckPolicy::AfterRebuild)
        .build()
        .unwrap();
    let run = Running::spawn(refresher);

    until("every message consumed, rebuilt and committed", || {
        committed(&bootstrap, "g1", "cdc", 1) == [Some(produced)]
    })
    .await;
    let stats = run.handle.stats();
    assert_eq!(stats.events_received, 3, "DDL and poison carry no rows");
    assert_eq!(stats.events_skipped, 1);
    assert_eq!(
        stats.rebuilds_ok, 2,
        "dev-a twice coalesces with dev-b: two rebuilds"
    );
    assert_eq!(stats.dirty + stats.in_flight, 0);
    assert_eq!(
        rebuilt.distinct().into_iter().collect::<Vec<_>>(),
        ["dev-a", "dev-b"]
    );
    let s = source_stats.stats();
    assert_eq!((s.messages, s.skipped, s.dead_lettered), (5, 1, 1));
    run.stop().await;
    assert_eq!(rebuilt.len(), 2, "nothing more after the drain");

    // The poison message sits in the dead-letter topic, with where it came from.
    let dlq = reader_from_start(&bootstrap, "cdc-dlq", 1);
    // Detached: a message still held keeps its consumer from closing.
    let msg = tokio::time::timeout(DEADLINE, dlq.recv())
        .await
        .expect("a dead letter")
        .unwrap()
        .detach();
    close("the dead-letter reader", dlq).await;
    assert_eq!(msg.payload(), Some(&b"{not canal-json"[..]));
    assert_eq!(msg.key(), Some(&b"poison"[..]));
    let headers = msg.headers().expect("headers");
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("freshen.topic").as_deref(), Some("cdc"));
    assert_eq!(header("freshen.offset").as_deref(), Some("2"));
    assert!(header("freshen.error").unwrap().contains("invalid JSON"));
}

/// A key-only message (a large row) and a truncated partition carry no rows the view's
/// scope could read: each sweeps the view, is counted, and its offset is committed only
/// once the sweep's keys are rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_only_messages_and_truncated_partitions_sweep_the_view() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "gaps", 1).await;
    let p = producer(&bootstrap);
    let config = KafkaSourceConfig::new(&bootstrap, ["gaps"], "g", Format::CanalJson)
        .session_timeout_ms(session_ms(KafkaFlavor::Noida));
    let source = KafkaSource::new(&config).unwrap();
    let source_stats = source.stats_handle();
    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let sweeps = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = sweeps.clone();
    let refresher = Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .watches("demo", "readings", &["device"])
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::ZERO)
        .reconcile(Duration::from_secs(3600), move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(vec![Key::from("dev-a"), Key::from("dev-b")]) }
        })
        .build()
        .unwrap();
    let run = Running::spawn(refresher);
    until("the start-up sweep", || run.handle.stats().rebuilds_ok == 2).await;

    send(&p, "gaps", 0, "1", &ticdc_key_only(1)).await;
    send(&p, "gaps", 0, "demo.readings", &ticdc_truncate_partition()).await;
    until("both gaps swept, rebuilt and committed", || {
        committed(&bootstrap, "g", "gaps", 1) == [Some(2)]
    })
    .await;
    let stats = run.handle.stats();
    assert_eq!(stats.gaps, 2);
    assert_eq!(stats.events_received, 0, "neither message carried rows");
    assert!(
        sweeps.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "a sweep after the start-up one"
    );
    assert!(
        rebuilt.len() >= 4,
        "the sweep's keys were rebuilt: {:?}",
        rebuilt.all()
    );
    assert_eq!(source_stats.stats().gaps, 2);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_wait_for_rebuilds_under_after_rebuild() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "held", 1).await;
    let p = producer(&bootstrap);
    send(&p, "held", 0, "1", &ticdc_insert(1, "dev-a", 1)).await;

    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let opened = gate.clone();
    let config = KafkaSourceConfig::new(&bootstrap, ["held"], "g", Format::CanalJson)
        .session_timeout_ms(session_ms(KafkaFlavor::Noida));
    let refresher = Refresher::builder()
        .source(KafkaSource::new(&config).unwrap())
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |_k: Key| {
            let gate = opened.clone();
            async move {
                let _permit = gate.acquire().await;
                Ok::<_, std::io::Error>(())
            }
        })
        .coalesce(Duration::ZERO)
        .build()
        .unwrap();
    let run = Running::spawn(refresher);
    until("the rebuild started", || run.handle.stats().in_flight == 1).await;
    assert_eq!(
        committed(&bootstrap, "g", "held", 1),
        [None],
        "consumed but not rebuilt: nothing committed"
    );
    gate.add_permits(1);
    until("committed after the rebuild", || {
        committed(&bootstrap, "g", "held", 1) == [Some(1)]
    })
    .await;
    run.stop().await;
}
