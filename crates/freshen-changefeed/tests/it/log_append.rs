//! The log: append, read, dedupe of replays across reopen, retention, stats, capture.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use freshen::{Ack, Batch, Op, channel};
use freshen_changefeed::{Durability, Filter, RetentionConfig};
use support::*;

#[tokio::test]
async fn appends_are_sequenced_and_read_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    assert_eq!(cf.latest_sequence(), 0);
    let out = cf.append(&orders(1, 3)).await.unwrap();
    assert_eq!(
        (
            out.appended,
            out.duplicates,
            out.first_sequence,
            out.last_sequence
        ),
        (3, 0, Some(1), 3)
    );
    let out = cf.append(&[plain("items", 9, Op::Delete)]).await.unwrap();
    assert_eq!(out.first_sequence, Some(4));
    let all = cf.read(0, 100, &Filter::default()).unwrap();
    assert_eq!(
        all.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let j: serde_json::Value = serde_json::from_str(&all[1].json).unwrap();
    assert_eq!(
        (j["sequence"].as_u64(), j["key"].as_str()),
        (Some(2), Some("orders:2"))
    );
    assert_eq!(
        cf.read(2, 1, &Filter::default()).unwrap()[0].sequence,
        3,
        "after is exclusive"
    );
    let deletes = cf
        .read(0, 100, &Filter::default().ops([Op::Delete]))
        .unwrap();
    assert_eq!(deletes.iter().map(|e| e.sequence).collect::<Vec<_>>(), [4]);
    let s = cf.stats();
    assert_eq!(
        (s.total_events, s.latest_sequence, s.oldest_sequence),
        (4, 4, 1)
    );
    assert!(s.total_size_bytes > 4 * 100);
    cf.close().await;
}

#[tokio::test]
async fn a_replay_after_reopen_appends_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cf = open(&cfg).await;
    // Two transactions, the second with two rows.
    let first = vec![order(1, 10, 0), order(2, 20, 0), order(3, 20, 1)];
    assert_eq!(cf.append(&first).await.unwrap().appended, 3);
    cf.close().await;
    drop(cf);

    let cf = open(&cfg).await;
    assert_eq!(cf.latest_sequence(), 3, "the sequence survives a reopen");
    // The source replays from the start of the second transaction, then goes on.
    let replay = vec![order(2, 20, 0), order(3, 20, 1), order(4, 30, 0)];
    let out = cf.append(&replay).await.unwrap();
    assert_eq!(
        (out.appended, out.duplicates, out.first_sequence),
        (1, 2, Some(4))
    );
    // Events without a position are always appended.
    assert_eq!(
        cf.append(&[plain("t", 1, Op::Insert)])
            .await
            .unwrap()
            .appended,
        1
    );
    let keys: Vec<String> = cf
        .read(0, 100, &Filter::default())
        .unwrap()
        .iter()
        .map(|e| {
            serde_json::from_str::<serde_json::Value>(&e.json).unwrap()["key"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        keys,
        ["orders:1", "orders:2", "orders:3", "orders:4", "t:1"]
    );
    cf.close().await;
}

#[tokio::test]
async fn concurrent_appends_get_distinct_contiguous_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let cf = cf.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                cf.append(&[plain("t", t * 100 + i, Op::Insert)])
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(cf.latest_sequence(), 160);
    let seqs: Vec<u64> = cf
        .read(0, 1000, &Filter::default())
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(seqs, (1..=160).collect::<Vec<_>>());
    let text = cf.metrics_text();
    assert_eq!(
        metric(&text, "freshen_changefeed_appended_events_total"),
        160
    );
    assert!(metric(&text, "freshen_changefeed_commits_total") >= 1);
    cf.close().await;
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

#[tokio::test]
async fn retention_by_sequence_count_bytes_and_age() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.durability = Durability::None;
    let cf = open(&cfg).await;
    cf.append(&orders(1, 100)).await.unwrap();

    assert_eq!(cf.delete_before(11).await.unwrap(), 10);
    assert_eq!(cf.stats().oldest_sequence, 11);
    assert_eq!(cf.delete_before(5).await.unwrap(), 0, "already gone");

    let count = RetentionConfig {
        max_events: Some(50),
        ..RetentionConfig::default()
    };
    assert_eq!(cf.enforce_retention(&count).await.unwrap(), 40);
    let s = cf.stats();
    assert_eq!(
        (s.total_events, s.oldest_sequence, s.latest_sequence),
        (50, 51, 100)
    );

    let per_event = s.total_size_bytes / 50;
    let bytes = RetentionConfig {
        max_bytes: Some(per_event * 20),
        ..RetentionConfig::default()
    };
    let deleted = cf.enforce_retention(&bytes).await.unwrap();
    let s = cf.stats();
    assert!(s.total_size_bytes <= per_event * 20 + per_event, "{s:?}");
    assert_eq!(s.total_events, 50 - deleted);
    assert!((29..=31).contains(&deleted), "deleted {deleted}");

    // Every event is younger than an hour; all are older than "0 seconds" once a
    // millisecond has passed.
    let hour = RetentionConfig {
        max_age_secs: Some(3600),
        ..RetentionConfig::default()
    };
    assert_eq!(cf.enforce_retention(&hour).await.unwrap(), 0);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let zero = RetentionConfig {
        max_age_secs: Some(0),
        ..RetentionConfig::default()
    };
    cf.enforce_retention(&zero).await.unwrap();
    let s = cf.stats();
    assert_eq!(
        (
            s.total_events,
            s.oldest_sequence,
            s.latest_sequence,
            s.total_size_bytes
        ),
        (0, 101, 100, 0)
    );
    // The sequence keeps counting after the log emptied, and across a reopen.
    cf.close().await;
    drop(cf);
    let cf = open(&cfg).await;
    assert_eq!(
        cf.append(&orders(500, 1)).await.unwrap().first_sequence,
        Some(101)
    );
    cf.close().await;
}

#[tokio::test]
async fn capture_acknowledges_each_batch_in_order_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    let (feed, source) = channel(4);
    let acked = Arc::new(AtomicUsize::new(0));
    let order_ok = Arc::new(std::sync::Mutex::new(Vec::new()));
    let producer = {
        let acked = acked.clone();
        let order_ok = order_ok.clone();
        let cf = cf.clone();
        tokio::spawn(async move {
            for b in 0..20i64 {
                let acked = acked.clone();
                let order_ok = order_ok.clone();
                let cf = cf.clone();
                let events = orders(b * 10, 10);
                let mut batch = Batch::new(
                    events,
                    Ack::new(move || {
                        // Acknowledged only once durable: every event of the batch is
                        // already readable.
                        let visible = cf.latest_sequence();
                        order_ok.lock().unwrap().push((b, visible));
                        acked.fetch_add(1, Ordering::SeqCst);
                    }),
                );
                if b == 7 {
                    batch = batch.with_skipped("undecodable message");
                }
                feed.send(batch).await.unwrap();
            }
        })
    };
    let report = cf.capture(source, std::future::pending()).await.unwrap();
    producer.await.unwrap();
    assert_eq!(
        (
            report.batches,
            report.appended,
            report.duplicates,
            report.skipped
        ),
        (20, 200, 0, 1)
    );
    assert_eq!(report.last_skip.as_deref(), Some("undecodable message"));
    let log = order_ok.lock().unwrap().clone();
    assert_eq!(
        log.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    for (b, visible) in log {
        assert!(
            visible >= (b as u64 + 1) * 10,
            "batch {b} acked before durable ({visible})"
        );
    }
    assert_eq!(acked.load(Ordering::SeqCst), 20);
    cf.close().await;
}

#[tokio::test]
async fn capture_stops_on_shutdown_and_reports_source_failure() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    let (feed, source) = channel(4);
    feed.send(Batch::new(orders(1, 5), Ack::none()))
        .await
        .unwrap();
    feed.fail(freshen::SourceError::msg("slot invalidated"))
        .await
        .unwrap();
    let err = cf
        .capture(source, std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("slot invalidated"), "{err}");
    assert_eq!(
        cf.latest_sequence(),
        5,
        "what came before the failure is kept"
    );

    let (_feed, source) = channel(4);
    let report = cf.capture(source, async {}).await.unwrap();
    assert_eq!(report.batches, 0);
    cf.close().await;
    assert!(matches!(
        cf.append(&orders(9, 1)).await,
        Err(freshen_changefeed::Error::Closed { .. })
    ));
}

#[tokio::test]
async fn groups_declared_in_code_persist() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cf = open(&cfg).await;
    cf.append(&orders(1, 3)).await.unwrap();
    let mut spec = freshen_changefeed::GroupSpec::new(&cfg.groups);
    spec.tables = vec!["orders".into()];
    let g = cf
        .create_group(
            "search-index",
            spec.clone(),
            freshen_changefeed::Start::Latest,
        )
        .await
        .unwrap();
    assert_eq!((g.committed_offset, g.lag), (3, 0));
    // Declaring it again (a restart of the binary) changes nothing.
    cf.append(&orders(4, 1)).await.unwrap();
    let again = cf
        .create_group(
            "search-index",
            spec.clone(),
            freshen_changefeed::Start::Latest,
        )
        .await
        .unwrap();
    assert_eq!((again.committed_offset, again.lag), (3, 1));
    cf.close().await;
    drop(cf);
    let cf = open(&cfg).await;
    assert_eq!(cf.groups().len(), 1);
    assert_eq!(cf.group("search-index").unwrap().spec, spec);
    cf.delete_group("search-index").await.unwrap();
    assert!(matches!(
        cf.group("search-index"),
        Err(freshen_changefeed::Error::UnknownGroup(_))
    ));
    cf.close().await;
}

/// The store holds every captured row: a new one, and a directory made for it, are the
/// owner's alone; reopening keeps what it has.
#[tokio::test]
async fn a_new_store_and_its_directory_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.path = dir.path().join("made").join("feed.redb");
    let cf = open(&c).await;
    cf.append(&orders(1, 1)).await.unwrap();
    cf.close().await;
    drop(cf);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&c.path), 0o600);
    assert_eq!(mode(c.path.parent().unwrap()), 0o700);
    let cf = open(&c).await;
    assert_eq!(cf.latest_sequence(), 1, "an existing store opens as it was");
    cf.close().await;
}
