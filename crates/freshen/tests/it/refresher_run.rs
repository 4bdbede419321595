//! Run-level behaviour of `Refresher` with an in-memory source.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{
    Ack, AckPolicy, Batch, Due, Key, Rebuild, Refresher, Report, RowEvent, RunError, SourceError,
    channel, fanout,
};
use support::*;

fn recording(
    log: &Log,
) -> impl Fn(Key) -> std::future::Ready<Result<(), std::io::Error>> + Send + Sync + 'static {
    let log = log.clone();
    move |key: Key| {
        log.push(key.to_string());
        std::future::ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn three_events_on_two_keys_make_two_rebuilds_all_acked() {
    let (feed, source) = channel(8);
    let log = Log::default();
    let acks = Acks::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&log))
        .coalesce(50 * MS)
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("a", 1), reading("b", 2)]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("a", 3)]))
        .await
        .unwrap();
    drop(feed);
    let h = r.handle();
    within(
        "run drains",
        Duration::from_secs(10),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(log.sorted(), ["a", "b"]);
    assert_eq!(acks.list(), [1, 2]);
    let s = h.stats();
    assert_eq!(s.events_received, 3);
    assert_eq!(s.keys_marked, 3);
    assert_eq!(s.rebuilds_ok, 2);
    assert_eq!(s.sweep_rebuilds, 0);
    assert_eq!(s.batches_received, 2);
    assert_eq!(s.batches_acked, 2);
    assert_eq!(s.freshness.count(), 2);
    assert!(s.last_rebuild.is_some() && s.last_event.is_some());
    assert_eq!((s.dirty, s.in_flight, s.unacked_batches), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_failing_key_is_poisoned_without_blocking_a_healthy_one() {
    let (feed, source) = channel(8);
    let log = Log::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let rep = reports.clone();
    let acks = Acks::default();
    let l = log.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |key: Key| {
            let l = l.clone();
            async move {
                if key.as_str() == Some("bad") {
                    return Err("constraint violation".to_string());
                }
                l.push(key.to_string());
                Ok(())
            }
        })
        .coalesce(10 * MS)
        .backoff(100 * MS, 400 * MS)
        .poison_after(3)
        .on_error(move |r: &Report<'_>| rep.lock().unwrap().push(r.to_string()))
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("bad", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("good", 1)]))
        .await
        .unwrap();
    let handle = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // The healthy key is rebuilt while the bad one is still backing off.
    waiting(&mut run, "good rebuilt", Duration::from_secs(1), || {
        log.count("good") == 1
    })
    .await;
    assert_eq!(handle.stats().keys_poisoned, 0, "bad key is still retrying");
    drop(feed);
    within("run drains", Duration::from_secs(10), &mut run)
        .await
        .unwrap();
    let s = handle.stats();
    assert_eq!(s.rebuilds_failed, 3);
    assert_eq!(s.keys_poisoned, 1);
    assert_eq!(s.poisoned, 1);
    // No reconcile sweep would heal it: its batch stays unacknowledged (and the later
    // one with it, acks leave in order) instead of being confirmed unrebuilt.
    assert_eq!(acks.list(), Vec::<u32>::new());
    assert_eq!(s.poisoned_holding, 1);
    assert_eq!(s.quarantine_releases, 0);
    let q = handle.quarantined();
    assert!(
        q[0].holding && q[0].error.contains("constraint violation"),
        "{q:?}"
    );
    let reports = reports.lock().unwrap();
    let poisoned: Vec<_> = reports
        .iter()
        .filter(|r| r.contains("quarantined"))
        .collect();
    assert_eq!(poisoned.len(), 1, "{reports:?}");
    assert_eq!(reports.iter().filter(|r| r.contains("retrying")).count(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_change_to_a_poisoned_key_retries_it_and_a_sweep_revives_it() {
    let (feed, source) = channel(8);
    let fail = Arc::new(AtomicUsize::new(1));
    let calls = Arc::new(AtomicUsize::new(0));
    let (f, c) = (fail.clone(), calls.clone());
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |_key: Key| {
            c.fetch_add(1, Ordering::SeqCst);
            let failing = f.load(Ordering::SeqCst) == 1;
            async move { if failing { Err("bad row") } else { Ok(()) } }
        })
        .coalesce(MS)
        .poison_after(1)
        .reconcile(Duration::from_secs(3600), || async {
            Ok::<_, std::io::Error>(vec![Key::from("k")])
        })
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // The start-up sweep lists k; its rebuild fails once and poisons it.
    waiting(&mut run, "poisoned", Duration::from_secs(1), || {
        h.stats().poisoned == 1
    })
    .await;
    let q = h.quarantined();
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].key, Key::from("k"));
    assert!(q[0].error.contains("bad row"), "{q:?}");
    assert!(!q[0].holding, "a view with a sweep releases its holds");
    // A change is not ignored: it gives the key a fresh attempt (still failing).
    feed.send(Batch::new(vec![reading("k", 1)], Ack::none()))
        .await
        .unwrap();
    waiting(&mut run, "retried", Duration::from_secs(5), || {
        calls.load(Ordering::SeqCst) == 2 && h.stats().poisoned == 1
    })
    .await;
    assert_eq!(h.stats().keys_poisoned, 1, "reported once per quarantine");
    fail.store(0, Ordering::SeqCst);
    assert!(h.reconcile_now());
    waiting(
        &mut run,
        "revived and rebuilt",
        Duration::from_secs(1),
        || h.stats().rebuilds_ok == 1,
    )
    .await;
    assert_eq!(h.stats().poisoned, 0);
    assert!(h.quarantined().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_key_asked_for_by_hand_is_rebuilt_and_a_quarantined_one_readmitted() {
    let (feed, source) = channel(8);
    let log = Log::default();
    let fail = Arc::new(AtomicUsize::new(1));
    let (l, f) = (log.clone(), fail.clone());
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |key: Key| {
            l.push(key.to_string());
            let failing = key == Key::from("bad") && f.load(Ordering::SeqCst) == 1;
            async move { if failing { Err("bad row") } else { Ok(()) } }
        })
        .coalesce(MS)
        .poison_after(1)
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // No change ever named "x": the request alone rebuilds it.
    h.rebuild(&Key::from("x"));
    waiting(&mut run, "x rebuilt", Duration::from_secs(1), || {
        log.count("x") == 1
    })
    .await;
    feed.send(Batch::new(vec![reading("bad", 1)], Ack::none()))
        .await
        .unwrap();
    waiting(&mut run, "bad quarantined", Duration::from_secs(1), || {
        h.stats().poisoned == 1
    })
    .await;
    fail.store(0, Ordering::SeqCst);
    h.rebuild(&Key::from("bad"));
    waiting(&mut run, "bad readmitted", Duration::from_secs(1), || {
        h.stats().poisoned == 0 && log.count("bad") == 2
    })
    .await;
    assert!(h.quarantined().is_empty());
    assert_eq!(h.stats().rebuilds_ok, 2);
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_running_rebuild_and_a_listing_sweep_are_visible_while_they_last() {
    let (feed, source) = channel(8);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let listing = Arc::new(tokio::sync::Semaphore::new(0));
    let (g, l) = (gate.clone(), listing.clone());
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |_key: Key| {
            let g = g.clone();
            async move {
                let _ = g.acquire().await.unwrap();
                Ok::<_, std::io::Error>(())
            }
        })
        .coalesce(MS)
        .reconcile(Duration::from_secs(3600), move || {
            let l = l.clone();
            async move {
                let _ = l.acquire().await.unwrap();
                Ok::<_, std::io::Error>(vec![Key::from("s")])
            }
        })
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "the start-up sweep lists",
        Duration::from_secs(1),
        || h.stats().sweep_since.is_some(),
    )
    .await;
    assert_eq!(h.stats().oldest_in_flight, None);
    listing.add_permits(1);
    waiting(
        &mut run,
        "the swept key runs",
        Duration::from_secs(1),
        || {
            let s = h.stats();
            s.sweep_since.is_none() && s.oldest_in_flight.is_some()
        },
    )
    .await;
    gate.add_permits(1);
    waiting(&mut run, "nothing runs", Duration::from_secs(1), || {
        let s = h.stats();
        s.oldest_in_flight.is_none() && s.rebuilds_ok == 1
    })
    .await;
    assert_eq!(h.stats().sweep_rebuilds, 1);
    drop(feed);
}

/// A refresher of `source` rebuilding into `log`, and the lines it reports.
fn reporting(source: freshen::ChannelSource, log: &Log) -> (Refresher, Arc<Mutex<Vec<String>>>) {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let rep = reports.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(log))
        .on_error(move |r: &Report<'_>| rep.lock().unwrap().push(r.to_string()))
        .build()
        .unwrap();
    (r, reports)
}

#[tokio::test(start_paused = true)]
async fn skipped_messages_are_counted_reported_and_acked() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let log = Log::default();
    let (r, reports) = reporting(source, &log);
    feed.send(acks.batch(1, vec![]).with_skipped("bad json at offset 7"))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("a", 1)]))
        .await
        .unwrap();
    drop(feed);
    let h = r.handle();
    r.run(std::future::pending()).await.unwrap();
    assert_eq!(h.stats().events_skipped, 1);
    assert_eq!(acks.list(), [1, 2]);
    assert_eq!(log.list(), ["a"]);
    assert!(reports.lock().unwrap()[0].contains("bad json at offset 7"));
}

/// An outage the source retries by itself (`Retry::Path`) is reported and the run reads
/// on: the changes after it are rebuilt and acknowledged as if nothing had happened.
#[tokio::test(start_paused = true)]
async fn a_source_outage_is_reported_and_the_run_reads_on() {
    let (feed, source) = channel(8);
    let log = Log::default();
    let acks = Acks::default();
    let (r, reports) = reporting(source, &log);
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    feed.fail(SourceError::msg("connection reset by peer").with_retry(freshen::Retry::Path))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("b", 2)]))
        .await
        .unwrap();
    drop(feed);
    within(
        "run ends",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .expect("an outage does not end the run");
    assert_eq!(acks.list(), [1, 2]);
    let mut rebuilt = log.list();
    rebuilt.sort();
    assert_eq!(rebuilt, ["a", "b"]);
    let said = reports.lock().unwrap().clone();
    assert!(
        said.iter()
            .any(|r| r.contains("keeps retrying") && r.contains("connection reset by peer")),
        "{said:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fatal_source_error_ends_run_with_that_error() {
    let (feed, source) = channel(8);
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&Log::default()))
        .build()
        .unwrap();
    feed.fail(SourceError::msg("replication slot \"s\" was invalidated"))
        .await
        .unwrap();
    let err = within(
        "run fails",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Source(_)));
    // The chain reaches the source's own error.
    let chain: Vec<String> =
        std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect();
    assert_eq!(chain.len(), 2, "{chain:?}");
    assert!(chain[1].contains("invalidated"), "{chain:?}");
}

#[tokio::test(start_paused = true)]
async fn reconcile_sweeps_at_start_and_on_the_interval() {
    let (feed, source) = channel(1);
    let sweeps = Arc::new(AtomicUsize::new(0));
    let s2 = sweeps.clone();
    let log = Log::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&log))
        .reconcile(Duration::from_secs(60), move || {
            s2.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(vec![Key::from("x"), Key::from("y")]) }
        })
        .build()
        .unwrap();
    let h = r.handle();
    let start = tokio::time::Instant::now();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "first sweep rebuilt",
        Duration::from_secs(1),
        || h.stats().rebuilds_ok == 2,
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the first sweep runs at start"
    );
    waiting(&mut run, "second sweep", Duration::from_secs(120), || {
        h.stats().rebuilds_ok == 4
    })
    .await;
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(60) && elapsed < Duration::from_secs(62),
        "second sweep after the interval, at {elapsed:?}"
    );
    assert_eq!(h.stats().reconciles, 2);
    assert_eq!(h.stats().reconcile_keys, 4);
    // No change made these due: they are sweep rebuilds, outside freshness.
    assert_eq!(h.stats().sweep_rebuilds, 4);
    assert_eq!(h.stats().freshness.count(), 0);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
    assert_eq!(sweeps.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn without_a_sweep_at_start_the_first_comes_one_interval_later() {
    let (feed, source) = channel(1);
    let log = Log::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&log))
        .sweep_at_start(false)
        .reconcile(Duration::from_secs(60), || async {
            Ok::<_, std::io::Error>(vec![Key::from("x")])
        })
        .build()
        .unwrap();
    let h = r.handle();
    let start = tokio::time::Instant::now();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "the first sweep",
        Duration::from_secs(120),
        || h.stats().rebuilds_ok == 1,
    )
    .await;
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(60) && elapsed < Duration::from_secs(62),
        "first sweep after one interval, at {elapsed:?}"
    );
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_failed_sweep_is_retried_with_backoff() {
    let (feed, source) = channel(1);
    let tries = Arc::new(AtomicUsize::new(0));
    let t = tries.clone();
    let reports = Arc::new(AtomicUsize::new(0));
    let rep = reports.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&Log::default()))
        .backoff(100 * MS, Duration::from_secs(1))
        .reconcile(Duration::from_secs(3600), move || {
            let n = t.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err("database is starting up".to_string())
                } else {
                    Ok(vec![Key::from("x")])
                }
            }
        })
        .on_error(move |r: &Report<'_>| {
            if matches!(r, Report::ReconcileFailed { .. }) {
                rep.fetch_add(1, Ordering::SeqCst);
            }
        })
        .build()
        .unwrap();
    let h = r.handle();
    let start = tokio::time::Instant::now();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "retried sweep", Duration::from_secs(5), || {
        h.stats().reconciles == 1
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "retried long before the hourly sweep"
    );
    assert_eq!(h.stats().reconcile_failures, 1);
    assert_eq!(reports.load(Ordering::SeqCst), 1);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn batched_rebuild_takes_many_keys_per_call_and_isolates_failures_by_halving() {
    let (feed, source) = channel(8);
    let calls: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let c = calls.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_batch(10, move |keys: Vec<Key>| {
            let names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let fail = names.len() > 1 && names.iter().any(|n| n == "bad");
            let fail_alone = names == ["bad"];
            c.lock().unwrap().push(names);
            async move {
                if fail || fail_alone {
                    Err("bad row")
                } else {
                    Ok(())
                }
            }
        })
        .coalesce(10 * MS)
        .poison_after(2)
        .build()
        .unwrap();
    let events = ["a", "b", "bad", "c"]
        .iter()
        .map(|d| reading(d, 1))
        .collect();
    feed.send(Batch::new(events, Ack::none())).await.unwrap();
    drop(feed);
    let h = r.handle();
    r.run(std::future::pending()).await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls[0].len(),
        4,
        "one call for all four ready keys: {calls:?}"
    );
    // After the batch failed it runs again in halves, the failing half in halves
    // again, until "bad" fails alone (twice: quarantined); the good keys succeed.
    assert_eq!(
        (calls[1].len(), calls[2].len()),
        (2, 2),
        "the failed call's two halves: {calls:?}"
    );
    let with_bad: Vec<usize> = calls
        .iter()
        .filter(|c| c.iter().any(|k| k == "bad"))
        .map(Vec::len)
        .collect();
    assert_eq!(with_bad, [4, 2, 1, 1], "{calls:?}");
    assert_eq!(
        calls.len(),
        6,
        "4 keys, 2 halves, 2 quarters, bad again: {calls:?}"
    );
    let s = h.stats();
    assert_eq!(s.rebuilds_ok, 3);
    assert_eq!(s.keys_poisoned, 1);
}

/// Each rebuild call: when it started (since the test began) and the keys it carried.
type Calls = Arc<Mutex<Vec<(Duration, Vec<String>)>>>;

#[tokio::test(start_paused = true)]
async fn a_batch_takes_along_keys_due_within_a_tenth_of_coalesce() {
    let (feed, source) = channel(8);
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let t0 = tokio::time::Instant::now();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_batch(64, move |keys: Vec<Key>| {
            let names = keys.iter().map(|k| k.to_string()).collect();
            c.lock().unwrap().push((t0.elapsed(), names));
            async { Ok::<_, &str>(()) }
        })
        .coalesce(100 * MS)
        .build()
        .unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // a at 0 ms (due at 100), b at 5 ms (due at 105: within the window of the batch
    // that starts at 100), c at 20 ms (due at 120: outside it).
    for (at, key) in [(0, "a"), (5, "b"), (20, "c")] {
        meanwhile(&mut run, tokio::time::sleep_until(t0 + at * MS)).await;
        let events = vec![reading(key, 1)];
        meanwhile(&mut run, feed.send(Batch::new(events, Ack::none())))
            .await
            .unwrap();
    }
    waiting(&mut run, "c rebuilt", Duration::from_secs(1), || {
        calls.lock().unwrap().len() == 2
    })
    .await;
    let calls = calls.lock().unwrap().clone();
    let (first_at, first) = &calls[0];
    assert_eq!(first, &["a", "b"], "{calls:?}");
    assert!(
        *first_at >= 100 * MS && *first_at < 105 * MS,
        "the batch starts when a falls due, not earlier: {calls:?}"
    );
    let (second_at, second) = &calls[1];
    assert_eq!(second, &["c"], "{calls:?}");
    assert!(
        *second_at >= 120 * MS,
        "c waits for its own deadline: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn on_enqueue_acks_before_rebuilding() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |_k: Key| {
            let g = g.clone();
            async move {
                let _permit = g.acquire().await.unwrap();
                Ok::<_, std::io::Error>(())
            }
        })
        .ack(AckPolicy::OnEnqueue)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "acked while the rebuild is blocked",
        Duration::from_secs(1),
        || acks.list() == [1],
    )
    .await;
    assert_eq!(h.stats().rebuilds_ok, 0);
    gate.add_permits(1);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
    assert_eq!(h.stats().rebuilds_ok, 1);
}

struct SeeTxids(Arc<Mutex<Vec<Due>>>);

impl Rebuild for SeeTxids {
    fn rebuild<'a>(
        &'a self,
        due: &'a [Due],
    ) -> freshen::BoxFuture<'a, Result<(), freshen::BoxError>> {
        self.0.lock().unwrap().extend(due.iter().cloned());
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_rebuild_sees_every_transaction_that_dirtied_its_key() {
    let (feed, source) = channel(8);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_with(SeeTxids(seen.clone()))
        .build()
        .unwrap();
    let events = vec![
        reading_in_tx("a", 1, 7),
        reading_in_tx("a", 2, 7),
        reading_in_tx("b", 1, 8),
        reading_in_tx("a", 3, 9),
    ];
    feed.send(Batch::new(events, Ack::none())).await.unwrap();
    drop(feed);
    r.run(std::future::pending()).await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].txids, [7, 9]);
    assert_eq!(seen[1].txids, [8]);
}

#[tokio::test(start_paused = true)]
async fn keys_scoped_elsewhere_are_rebuilt_with_their_txids_and_hold_the_ack() {
    let (feed, source) = channel(8);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let acks = Acks::default();
    let r = Refresher::builder()
        .source(source)
        // The scope would give nothing: only the batch's own keys are rebuilt.
        .scope(|_: &RowEvent| Vec::<Key>::new())
        .rebuild_with(SeeTxids(seen.clone()))
        .build()
        .unwrap();
    let h = r.handle();
    let keys = vec![
        freshen::ScopedKey {
            key: Key::from("a"),
            txid: Some(7),
        },
        freshen::ScopedKey {
            key: Key::from_parts([Some("eu"), None]),
            txid: None,
        },
        freshen::ScopedKey {
            key: Key::from("a"),
            txid: Some(9),
        },
    ];
    feed.send(acks.batch(1, Vec::new()).with_keys(keys))
        .await
        .unwrap();
    drop(feed);
    r.run(std::future::pending()).await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].key, Key::from("a"));
    assert_eq!(seen[1].txids, [7, 9]);
    assert_eq!(seen[0].key, Key::from_parts([Some("eu"), None]));
    assert!(seen[0].txids.is_empty());
    assert_eq!(acks.list(), [1], "acknowledged once both were rebuilt");
    assert_eq!(h.stats().keys_marked, 3);
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_running_rebuilds_finish_and_acks_them() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |_k: Key| {
            s.notify_one();
            async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, std::io::Error>(())
            }
        })
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    let stop = started.notified();
    let h = r.handle();
    within("stops", Duration::from_secs(5), r.run(stop))
        .await
        .unwrap();
    assert_eq!(
        acks.list(),
        [1],
        "the in-flight rebuild finished and its batch was acked"
    );
    assert_eq!(h.stats().rebuilds_ok, 1);
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn fanout_acks_upstream_only_when_every_branch_has() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let mut branches = fanout(source, 2).into_iter();
    let fast_log = Log::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let fast = Refresher::builder()
        .source(branches.next().unwrap())
        .scope(scope)
        .rebuild(recording(&fast_log))
        .build()
        .unwrap();
    let slow = Refresher::builder()
        .source(branches.next().unwrap())
        .scope(scope)
        .rebuild(move |_k: Key| {
            let g = g.clone();
            async move {
                let _p = g.acquire().await.unwrap();
                Ok::<_, std::io::Error>(())
            }
        })
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    drop(feed);
    let slow_h = slow.handle();
    let both = async {
        tokio::join!(
            fast.run(std::future::pending()),
            slow.run(std::future::pending())
        )
    };
    tokio::pin!(both);
    tokio::select! {
        _ = &mut both => panic!("ended while the slow view is blocked"),
        _ = eventually("fast view done", Duration::from_secs(1), || fast_log.list() == ["a"]) => {}
    }
    assert_eq!(slow_h.stats().in_flight, 1);
    assert!(acks.list().is_empty(), "the slow view has not rebuilt yet");
    gate.add_permits(1);
    let (a, b) = within("both drain", Duration::from_secs(5), both).await;
    a.unwrap();
    b.unwrap();
    assert_eq!(acks.list(), [1]);
}

#[test]
fn build_lists_every_problem_at_once() {
    let err = Refresher::builder()
        .coalesce(Duration::from_secs(10))
        .max_wait(Duration::from_secs(1))
        .workers(0)
        .poison_after(0)
        .backoff(Duration::ZERO, Duration::from_secs(1))
        .build()
        .unwrap_err();
    let p = err.problems();
    for needle in [
        "source",
        "scope",
        "rebuild",
        "coalesce",
        "workers",
        "poison_after",
        "backoff",
    ] {
        assert!(
            p.iter().any(|x| x.contains(needle)),
            "missing {needle}: {p:?}"
        );
    }
    assert_eq!(p.len(), 7, "{p:?}");
    assert!(err.to_string().contains("\n  - "), "one problem per line");
}

/// A source that counts `close` calls, around a channel source.
struct Closing {
    inner: freshen::ChannelSource,
    closed: Arc<AtomicUsize>,
}

impl freshen::Source for Closing {
    fn next_batch(&mut self) -> freshen::BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        self.inner.next_batch()
    }

    fn close(&mut self) -> freshen::BoxFuture<'_, ()> {
        self.closed.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {})
    }
}

#[tokio::test(start_paused = true)]
async fn the_source_is_closed_once_on_shutdown_and_at_the_end_of_the_stream() {
    for end_of_stream in [false, true] {
        let (feed, inner) = channel(8);
        let closed = Arc::new(AtomicUsize::new(0));
        let acks = Acks::default();
        let r = Refresher::builder()
            .source(Closing {
                inner,
                closed: closed.clone(),
            })
            .scope(scope)
            .rebuild(recording(&Log::default()))
            .build()
            .unwrap();
        feed.send(acks.batch(1, vec![reading("a", 1)]))
            .await
            .unwrap();
        let h = r.handle();
        if end_of_stream {
            drop(feed);
            within(
                "drain",
                Duration::from_secs(5),
                r.run(std::future::pending()),
            )
            .await
            .unwrap();
        } else {
            let stop = async {
                eventually("acked", Duration::from_secs(5), || {
                    h.stats().batches_acked == 1
                })
                .await
            };
            within("stop", Duration::from_secs(5), r.run(stop))
                .await
                .unwrap();
            drop(feed);
        }
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1,
            "end_of_stream = {end_of_stream}"
        );
        assert_eq!(acks.list(), [1]);
    }
}

/// Real time on purpose: a loop that spins never lets a paused clock advance.
#[tokio::test]
async fn a_saturated_refresher_waits_for_a_worker_instead_of_spinning() {
    let (feed, source) = channel(8);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |_k: Key| {
            let g = g.clone();
            async move {
                let _p = g.acquire().await.unwrap();
                Ok::<_, std::io::Error>(())
            }
        })
        .workers(1)
        .coalesce(Duration::ZERO)
        .build()
        .unwrap();
    let h = r.handle();
    let events = (0..50).map(|i| reading(&format!("k{i}"), 1)).collect();
    feed.send(Batch::new(events, Ack::none())).await.unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "one rebuild running, 49 keys due",
        Duration::from_secs(5),
        || {
            let s = h.stats();
            s.in_flight == 1 && s.dirty == 49
        },
    )
    .await;
    let before = h.stats().wakeups;
    meanwhile(&mut run, tokio::time::sleep(Duration::from_millis(300))).await;
    let spent = h.stats().wakeups - before;
    assert!(
        spent < 20,
        "the loop woke {spent} times with nothing it could do"
    );
    gate.add_permits(50);
    drop(feed);
    within("drain", Duration::from_secs(10), run).await.unwrap();
    assert_eq!(h.stats().rebuilds_ok, 50);
}

/// A rebuild whose failures blame the path while `down` is set, the key when the key
/// is `bad`; counts the calls running at once.
struct Flaky {
    down: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl freshen::Rebuild for Flaky {
    fn rebuild<'a>(
        &'a self,
        due: &'a [freshen::Due],
    ) -> freshen::BoxFuture<'a, Result<(), freshen::BoxError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(5 * MS).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) == 1 {
                return Err("connection refused".into());
            }
            if due.iter().any(|d| d.key.as_str() == Some("bad")) {
                return Err("division by zero".into());
            }
            Ok(())
        })
    }

    fn classify(&self, error: &freshen::BoxError) -> freshen::Retry {
        if error.to_string().contains("refused") {
            freshen::Retry::Path
        } else {
            freshen::Retry::Key
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_outage_of_any_length_delays_rebuilds_and_quarantines_nothing() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let down = Arc::new(AtomicUsize::new(1));
    let flaky = Flaky {
        down: down.clone(),
        calls: Arc::new(AtomicUsize::new(0)),
        running: Arc::new(AtomicUsize::new(0)),
        peak: Arc::new(AtomicUsize::new(0)),
    };
    let (calls, peak) = (flaky.calls.clone(), flaky.peak.clone());
    let reports = Arc::new(Mutex::new(Vec::new()));
    let rep = reports.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_with(flaky)
        .coalesce(MS)
        .workers(4)
        .backoff(10 * MS, 200 * MS)
        .poison_after(2)
        .on_error(move |r: &Report<'_>| rep.lock().unwrap().push(r.to_string()))
        .build()
        .unwrap();
    let keys: Vec<RowEvent> = (0..10).map(|i| reading(&format!("k{i}"), i)).collect();
    feed.send(acks.batch(1, keys)).await.unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // Far more failed attempts than poison_after, for a long time. The first calls ran
    // side by side before anything had failed; once stalled, one probe runs at a time.
    waiting(&mut run, "stalled", Duration::from_secs(60), || {
        calls.load(Ordering::SeqCst) >= 20
    })
    .await;
    peak.store(0, Ordering::SeqCst);
    waiting(
        &mut run,
        "many failed probes",
        Duration::from_secs(60),
        || calls.load(Ordering::SeqCst) >= 40,
    )
    .await;
    let s = h.stats();
    assert_eq!(s.poisoned, 0, "an outage never quarantines");
    assert_eq!(s.keys_poisoned, 0);
    assert!(s.stalled_since.is_some(), "the view reports itself stalled");
    assert_eq!(
        s.stall.as_ref().map(|(r, _)| *r),
        Some(freshen::Retry::Path)
    );
    assert_eq!(s.path_failures, s.rebuilds_failed);
    assert!(
        acks.list().is_empty(),
        "nothing confirmed while nothing rebuilt"
    );
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "a stalled view probes one call at a time"
    );
    down.store(0, Ordering::SeqCst);
    waiting(
        &mut run,
        "every key rebuilt",
        Duration::from_secs(5),
        || h.stats().rebuilds_ok == 10,
    )
    .await;
    assert_eq!(acks.list(), [1]);
    let s = h.stats();
    assert!(s.stalled_since.is_none() && s.stall.is_none());
    let reports = reports.lock().unwrap();
    assert_eq!(
        reports
            .iter()
            .filter(|r| r.contains("cannot reach"))
            .count(),
        1,
        "{reports:?}"
    );
    assert_eq!(
        reports.iter().filter(|r| r.contains("work again")).count(),
        1,
        "{reports:?}"
    );
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_key_failing_by_its_data_heals_with_its_next_change_without_a_sweep() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let fixed = Arc::new(AtomicUsize::new(0));
    let f = fixed.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(move |key: Key| {
            let broken = key.as_str() == Some("bad") && f.load(Ordering::SeqCst) == 0;
            async move {
                if broken {
                    Err("division by zero")
                } else {
                    Ok(())
                }
            }
        })
        .coalesce(MS)
        .backoff(10 * MS, 100 * MS)
        .poison_after(2)
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("bad", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("good", 1)]))
        .await
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "quarantined", Duration::from_secs(5), || {
        h.stats().poisoned == 1 && h.stats().rebuilds_ok == 1
    })
    .await;
    assert!(
        acks.list().is_empty(),
        "the quarantined key holds its transaction"
    );
    // The data is fixed and changes again: the change is not ignored.
    fixed.store(1, Ordering::SeqCst);
    feed.send(acks.batch(3, vec![reading("bad", 2)]))
        .await
        .unwrap();
    waiting(&mut run, "healed", Duration::from_secs(5), || {
        acks.list() == [1, 2, 3]
    })
    .await;
    let s = h.stats();
    assert_eq!(
        (s.poisoned, s.poisoned_holding, s.quarantine_releases),
        (0, 0, 0)
    );
    assert!(h.quarantined().is_empty());
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_bound_releases_a_quarantined_keys_holds_loudly() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let rep = reports.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(|_key: Key| async { Err::<(), _>("raise exception") })
        .coalesce(MS)
        .poison_after(1)
        .release_quarantined_after(Duration::from_secs(30))
        .on_error(move |r: &Report<'_>| rep.lock().unwrap().push(r.to_string()))
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![reading("bad", 1)]))
        .await
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "quarantined", Duration::from_secs(5), || {
        h.stats().poisoned_holding == 1
    })
    .await;
    assert!(acks.list().is_empty());
    waiting(&mut run, "released", Duration::from_secs(60), || {
        acks.list() == [1]
    })
    .await;
    let s = h.stats();
    assert_eq!(
        (s.poisoned, s.poisoned_holding, s.quarantine_releases),
        (1, 0, 1)
    );
    assert!(!h.quarantined()[0].holding);
    let reports = reports.lock().unwrap();
    assert!(
        reports.iter().any(|r| r.contains("released unrebuilt")),
        "{reports:?}"
    );
    drop(feed);
}

#[test]
fn durations_beyond_a_year_are_build_problems_not_panics() {
    let (_feed, source) = channel(1);
    let err = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&Log::default()))
        .max_wait(Duration::from_secs(u64::MAX))
        .reconcile(Duration::MAX, || async { Ok::<_, std::io::Error>(vec![]) })
        .build()
        .unwrap_err();
    let problems = err.problems().join("\n");
    assert!(
        problems.contains("max_wait") && problems.contains("reconcile interval"),
        "{problems}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sweep_listing_when_the_source_ends_is_waited_for() {
    let (feed, source) = channel(8);
    let log = Log::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let (open, gate) = tokio::sync::watch::channel(false);
    let c = calls.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(recording(&log))
        .coalesce(MS)
        .reconcile(Duration::from_secs(3600), move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            let mut gate = gate.clone();
            async move {
                if n == 0 {
                    return Ok::<_, std::io::Error>(vec![Key::from("x")]);
                }
                let _ = gate.wait_for(|o| *o).await;
                Ok(vec![Key::from("late")])
            }
        })
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "start-up sweep", Duration::from_secs(1), || {
        h.stats().reconciles == 1
    })
    .await;
    assert!(h.reconcile_now());
    waiting(&mut run, "second listing", Duration::from_secs(1), || {
        calls.load(Ordering::SeqCst) == 2
    })
    .await;
    drop(feed);
    assert!(
        tokio::time::timeout(Duration::from_secs(5), &mut run)
            .await
            .is_err(),
        "the run ended while a sweep was still listing"
    );
    open.send(true).unwrap();
    within("drain", Duration::from_secs(5), run).await.unwrap();
    assert_eq!(
        log.count("late"),
        1,
        "the listed key was rebuilt before the end"
    );
}

#[tokio::test(start_paused = true)]
async fn no_periodic_sweep_starts_after_the_source_ended() {
    let (feed, source) = channel(8);
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(|key: Key| async move {
            if key.to_string() == "slow" {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Ok::<_, std::io::Error>(())
        })
        .coalesce(MS)
        .reconcile(Duration::from_secs(1), || async {
            Ok::<_, std::io::Error>(vec![Key::from("x")])
        })
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "start-up sweep", Duration::from_secs(1), || {
        h.stats().reconciles == 1
    })
    .await;
    feed.send(Batch::new(vec![reading("slow", 1)], Ack::none()))
        .await
        .unwrap();
    drop(feed);
    // The slow rebuild outlasts the sweep interval several times over.
    within("drain", Duration::from_secs(20), run).await.unwrap();
    assert_eq!(
        h.stats().reconciles,
        1,
        "the ended source's drain swept again"
    );
}
