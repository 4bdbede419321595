//! The broker dies and comes back: the source reconnects, subscribes again and goes on;
//! nothing is lost (what was not acknowledged in time may come twice).

use crate::support;

use std::time::Duration;

use freshen::{Key, Refresher, RowEvent};
use freshen_pulsar::{PulsarSource, PulsarSourceConfig};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_broker_restart() {
    let mut pulsar = broker();
    let mut p = producer(&pulsar, "rc").await;
    p.send(Some("1"), &ticdc_insert(1, "dev-1", 1))
        .await
        .unwrap();
    let source = PulsarSource::new(PulsarSourceConfig::new(pulsar.url(), "rc", "s")).unwrap();
    let stats = source.stats_handle();
    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let refresher = Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::ZERO)
        .build()
        .unwrap();
    let run = Running::spawn(refresher);
    until("the first change rebuilt", || rebuilt.len() == 1).await;

    pulsar.restart().expect("restart pulsar-lite");
    let mut p = producer(&pulsar, "rc").await;
    p.send(Some("2"), &ticdc_insert(2, "dev-2", 1))
        .await
        .unwrap();
    until("the change made after the restart rebuilt", || {
        rebuilt.distinct().contains("dev-2")
    })
    .await;
    let s = stats.stats();
    assert!(s.reconnects >= 1, "{s:?}");
    assert!(s.subscribes >= 2, "{s:?}");
    run.stop().await;
}
