//! TiCDC-shaped canal-json on Pulsar drives a refresher: three changes on two keys make
//! two rebuilds; a poison message is skipped and counted while the rest flows (batched
//! entries included); what was acknowledged is not delivered again.

use crate::support;

use std::time::Duration;

use freshen::{AckPolicy, Key, Refresher, RowEvent};
use freshen_pulsar::{PulsarSource, PulsarSourceConfig, Undecodable};
use support::*;

fn refresher(source: PulsarSource, rebuilt: &Rebuilt) -> Refresher {
    let log = rebuilt.clone();
    Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::from_millis(200))
        .ack(AckPolicy::AfterRebuild)
        .on_error(|r| {
            if let freshen::Report::Skipped { error } = r {
                assert!(error.downcast_ref::<Undecodable>().is_some(), "{error}");
            }
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_changes_on_two_keys_make_two_rebuilds_and_poison_is_skipped() {
    let pulsar = broker();
    let mut p = producer(&pulsar, "cdc").await;
    p.send(None, &ticdc_ddl()).await.unwrap();
    p.send(Some("1"), &ticdc_insert(1, "dev-a", 10))
        .await
        .unwrap();
    p.send(Some("x"), b"{not canal-json").await.unwrap();
    // TiCDC's Go client batches: one entry holding a change, a watermark and a change.
    p.send_batch(&[
        &ticdc_insert(2, "dev-b", 5),
        &ticdc_watermark(),
        &ticdc_update(1, "dev-a", 12),
    ])
    .await
    .unwrap();

    let config = PulsarSourceConfig::new(pulsar.url(), "cdc", "freshen");
    let source = PulsarSource::new(config.clone()).unwrap();
    let stats = source.stats_handle();
    let rebuilt = Rebuilt::default();
    let run = Running::spawn(refresher(source, &rebuilt));
    until("all rebuilt and acknowledged", || {
        let s = run.handle.stats();
        s.rebuilds_ok == 2 && s.unacked_batches == 0 && s.events_received == 3
    })
    .await;
    let s = run.handle.stats();
    assert_eq!(s.events_skipped, 1, "the poison message");
    assert_eq!(
        rebuilt.distinct().into_iter().collect::<Vec<_>>(),
        ["dev-a", "dev-b"]
    );
    let ps = stats.stats();
    assert_eq!((ps.messages, ps.events, ps.skipped), (6, 3, 1));
    assert!(ps.acks >= 1);
    run.stop().await;
    assert_eq!(rebuilt.len(), 2);

    // A new consumer on the subscription sees only what came after the acknowledgement.
    p.send(Some("3"), &ticdc_insert(3, "dev-c", 1))
        .await
        .unwrap();
    let again = Rebuilt::default();
    let run = Running::spawn(refresher(PulsarSource::new(config).unwrap(), &again));
    until("the new message rebuilt", || again.len() == 1).await;
    assert_eq!(
        run.handle.stats().events_received,
        1,
        "nothing acknowledged came back"
    );
    assert_eq!(again.distinct().into_iter().collect::<Vec<_>>(), ["dev-c"]);
    run.stop().await;
}

/// A key-only message (a row too large for the topic) sweeps the view over its table,
/// is counted by the source, and is acknowledged once the sweep's keys are rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_only_message_sweeps_the_view() {
    let pulsar = broker();
    let mut p = producer(&pulsar, "gaps").await;
    let config = PulsarSourceConfig::new(pulsar.url(), "gaps", "freshen");
    let source = PulsarSource::new(config).unwrap();
    let stats = source.stats_handle();
    let rebuilt = Rebuilt::default();
    let log = rebuilt.clone();
    let refresher = Refresher::builder()
        .source(source)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .watches("demo", "readings", &["device"])
        .rebuild(move |k: Key| {
            log.push(k);
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(Duration::ZERO)
        .reconcile(Duration::from_secs(3600), || async {
            Ok::<_, std::io::Error>(vec![Key::from("dev-a")])
        })
        .build()
        .unwrap();
    let run = Running::spawn(refresher);
    until("the start-up sweep", || run.handle.stats().rebuilds_ok == 1).await;
    p.send(Some("1"), &ticdc_key_only(1)).await.unwrap();
    until("swept, rebuilt and acknowledged", || {
        let s = run.handle.stats();
        s.gaps == 1 && s.reconciles == 2 && s.rebuilds_ok == 2 && s.unacked_batches == 0
    })
    .await;
    assert_eq!(run.handle.stats().events_received, 0, "no rows in it");
    assert_eq!(stats.stats().gaps, 1);
    run.stop().await;
}
