//! Two consumers in one group split the partitions, and a rebalance in the middle of
//! unacknowledged work loses no key — on both Kafka-protocol brokers.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use freshen::{Key, Refresher, RowEvent};
use freshen_codec::Format;
use freshen_kafka::{KafkaSource, KafkaSourceConfig, SourceStatsHandle};
use freshen_testenv::KafkaFlavor;
use support::*;
use tokio::sync::Semaphore;

const PARTITIONS: i32 = 4;
const WAVE: usize = 16;

/// A consumer of the group whose rebuilds wait for `gate` to have permits.
fn consumer(
    bootstrap: &str,
    flavor: KafkaFlavor,
    rebuilt: &Rebuilt,
    gate: Arc<Semaphore>,
) -> (Running, SourceStatsHandle) {
    let config = KafkaSourceConfig::new(bootstrap, ["grp"], "split", Format::CanalJson)
        .session_timeout_ms(session_ms(flavor));
    let source = KafkaSource::new(&config).unwrap();
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
        .coalesce(Duration::from_millis(10))
        .build()
        .unwrap();
    (Running::spawn(refresher), stats)
}

async fn wave(bootstrap: &str, from: usize) {
    let p = producer(bootstrap);
    for i in from..from + WAVE {
        let device = format!("dev-{i:02}");
        let partition = (i % PARTITIONS as usize) as i32;
        send(
            &p,
            "grp",
            partition,
            &device,
            &ticdc_insert(i as i64, &device, 1),
        )
        .await;
    }
}

fn keys(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("dev-{i:02}")).collect()
}

async fn split_and_rebalance(flavor: KafkaFlavor) {
    let kafka = broker(flavor);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "grp", PARTITIONS).await;
    wave(&bootstrap, 0).await;

    // A alone, its rebuilds held: it reads the whole first wave and acknowledges none.
    let (ra, rb) = (Rebuilt::default(), Rebuilt::default());
    let held = Arc::new(Semaphore::new(0));
    let (a, a_stats) = consumer(&bootstrap, flavor, &ra, held.clone());
    until("A read the first wave", || {
        a.handle.stats().events_received as usize >= WAVE
    })
    .await;

    // B joins: the partitions are split while A holds every batch unacknowledged.
    let open = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let (b, b_stats) = consumer(&bootstrap, flavor, &rb, open);
    until("B was assigned partitions", || {
        b_stats.stats().rebalances >= 1
    })
    .await;
    until("B re-read what A had not acknowledged", || {
        b.handle.stats().events_received > 0
    })
    .await;
    assert!(a_stats.stats().rebalances >= 2, "A saw the rebalance");
    assert_eq!(ra.len(), 0, "A has acknowledged nothing so far");
    held.add_permits(Semaphore::MAX_PERMITS);
    wave(&bootstrap, WAVE).await;

    let all = keys(0..2 * WAVE);
    until("every key of both waves rebuilt", || {
        let mut done = ra.distinct();
        done.extend(rb.distinct());
        done.is_superset(&all)
    })
    .await;
    let per_partition = Some((2 * WAVE / PARTITIONS as usize) as i64);
    until("every partition committed to its end", || {
        committed(&bootstrap, "split", "grp", PARTITIONS)
            == vec![per_partition; PARTITIONS as usize]
    })
    .await;
    let second = keys(WAVE..2 * WAVE);
    let by_a: BTreeSet<_> = ra.distinct().intersection(&second).cloned().collect();
    let by_b: BTreeSet<_> = rb.distinct().intersection(&second).cloned().collect();
    assert!(
        !by_a.is_empty() && !by_b.is_empty(),
        "both consumers own partitions: A {by_a:?}, B {by_b:?}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_split_and_rebalance_on_noida() {
    split_and_rebalance(KafkaFlavor::Noida).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_split_and_rebalance_on_tansu() {
    split_and_rebalance(KafkaFlavor::Tansu).await;
}
