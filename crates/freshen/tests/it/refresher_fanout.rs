//! Key fan-out: parent rows mapped to view keys off the receive path, with their
//! acknowledgements passed on to the keys they map to.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{
    BoxError, BoxFuture, Due, Expand, Key, KeySink, Op, Refresher, Row, RowEvent, Value, channel,
};
use support::*;
use tokio::sync::Semaphore;

/// A plan row change: `id` before and after.
fn plan(old: Option<&str>, new: &str) -> RowEvent {
    let e = RowEvent::new("public", "plans", Op::Update)
        .with_new(Row::from_pairs([("id", Value::from(new))]));
    match old {
        Some(o) => e.with_old(Row::from_pairs([("id", Value::from(o))])),
        None => e,
    }
}

fn plan_scope(e: &RowEvent) -> Vec<Key> {
    if &*e.table == "plans" {
        e.scope_keys(&["id"]).collect()
    } else {
        Vec::new()
    }
}

fn device_scope(e: &RowEvent) -> Vec<Key> {
    if &*e.table == "readings" {
        e.scope_keys(&["device"]).collect()
    } else {
        Vec::new()
    }
}

/// Maps plans to devices from a table the test owns; records each call's parents.
#[derive(Clone, Default)]
struct Children {
    map: Arc<Mutex<HashMap<String, Vec<String>>>>,
    calls: Arc<Mutex<Vec<Vec<String>>>>,
    /// Calls to fail (with a key error) before succeeding.
    fail: Arc<AtomicUsize>,
    /// When set, each call waits for a permit after sending its keys.
    gate: Option<Arc<Semaphore>>,
    batch: usize,
}

impl Children {
    fn with(pairs: &[(&str, &[&str])]) -> Children {
        let c = Children {
            batch: 16,
            ..Children::default()
        };
        for (p, kids) in pairs {
            c.map
                .lock()
                .unwrap()
                .insert(p.to_string(), kids.iter().map(|k| k.to_string()).collect());
        }
        c
    }
}

impl Expand for Children {
    fn expand<'a>(
        &'a self,
        due: &'a [Due],
        sink: &'a KeySink,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let parents: Vec<String> = due.iter().map(|d| d.key.to_string()).collect();
            self.calls.lock().unwrap().push(parents.clone());
            let kids: Vec<String> = {
                let map = self.map.lock().unwrap();
                parents
                    .iter()
                    .flat_map(|p| map.get(p).cloned().unwrap_or_default())
                    .collect()
            };
            for k in kids {
                sink.send(Key::from(k)).await?;
            }
            if let Some(g) = &self.gate {
                g.acquire().await.unwrap().forget();
            }
            if self
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err("the keys query failed".into());
            }
            Ok(())
        })
    }

    fn max_batch(&self) -> usize {
        self.batch
    }
}

fn recorder(log: &Log) -> impl Fn(Key) -> BoxFut + Send + Sync + 'static {
    let log = log.clone();
    move |key: Key| {
        let log = log.clone();
        Box::pin(async move {
            log.push(key.to_string());
            Ok(())
        })
    }
}

type BoxFut =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), std::io::Error>> + Send>>;

#[tokio::test(start_paused = true)]
async fn old_and_new_parents_are_mapped_and_their_keys_rebuilt_once_each() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let log = Log::default();
    let children = Children::with(&[("p0", &["a", "b"]), ("p1", &["b", "c"])]);
    let r = Refresher::builder()
        .source(source)
        .scope(device_scope)
        .fan_out(plan_scope, children.clone())
        .rebuild(recorder(&log))
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    // A plan moved from p0 to p1, and a direct change to device d.
    feed.send(acks.batch(1, vec![plan(Some("p0"), "p1"), reading("d", 1)]))
        .await
        .unwrap();
    drop(feed);
    within(
        "drain",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(log.sorted(), ["a", "b", "c", "d"]);
    let calls = children.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "both parents go in one call: {calls:?}");
    let mut parents = calls[0].clone();
    parents.sort();
    assert_eq!(parents, ["p0", "p1"]);
    assert_eq!(acks.list(), [1]);
    let st = h.stats();
    assert_eq!(st.fanout_calls, 1);
    assert_eq!(st.fanout_keys, 4);
    assert_eq!(
        st.rebuilds_ok, 4,
        "fan-out calls are not counted as rebuilds"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_acknowledged_only_after_its_fanned_keys_are_rebuilt() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let log = Log::default();
    let gate = Arc::new(Semaphore::new(0));
    let rebuild_gate = gate.clone();
    let children = Children::with(&[("p", &["a", "b"])]);
    let r = Refresher::builder()
        .source(source)
        .scope(device_scope)
        .fan_out(plan_scope, children.clone())
        .rebuild({
            let log = log.clone();
            move |key: Key| {
                let log = log.clone();
                let gate = rebuild_gate.clone();
                async move {
                    gate.acquire().await.unwrap().forget();
                    log.push(key.to_string());
                    Ok::<_, std::io::Error>(())
                }
            }
        })
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![plan(None, "p")]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![])).await.unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "fan-out done", Duration::from_secs(1), || {
        h.stats().fanout_calls == 1 && h.stats().in_flight == 2
    })
    .await;
    assert!(
        acks.list().is_empty(),
        "the fanned keys hold batch 1 (and 2 behind it)"
    );
    gate.add_permits(1);
    waiting(&mut run, "one rebuilt", Duration::from_secs(1), || {
        log.list().len() == 1
    })
    .await;
    assert!(acks.list().is_empty(), "one fanned key is still rebuilding");
    gate.add_permits(1);
    waiting(&mut run, "acked", Duration::from_secs(1), || {
        acks.list().len() == 2
    })
    .await;
    assert_eq!(acks.list(), [1, 2]);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crash_during_a_fan_out_or_its_rebuilds_acknowledges_nothing() {
    for crash_after_fanout in [false, true] {
        let (feed, source) = channel(8);
        let acks = Acks::default();
        let log = Log::default();
        let mut children = Children::with(&[("p", &["a"])]);
        let gate = Arc::new(Semaphore::new(0));
        children.gate = Some(gate.clone());
        let blocked = Arc::new(Semaphore::new(0));
        let hold = blocked.clone();
        let r = Refresher::builder()
            .source(source)
            .scope(device_scope)
            .fan_out(plan_scope, children.clone())
            .rebuild({
                let log = log.clone();
                move |key: Key| {
                    let log = log.clone();
                    let hold = hold.clone();
                    async move {
                        log.push(key.to_string());
                        hold.acquire().await.unwrap().forget();
                        Ok::<_, std::io::Error>(())
                    }
                }
            })
            .coalesce(10 * MS)
            .build()
            .unwrap();
        feed.send(acks.batch(1, vec![plan(None, "p")]))
            .await
            .unwrap();
        // Boxed so that dropping it really ends the run (a pinned local would live on).
        let mut run = Box::pin(r.run(std::future::pending()));
        if crash_after_fanout {
            gate.add_permits(1);
            waiting(
                &mut run,
                "fanned key rebuilding",
                Duration::from_secs(1),
                || log.list() == ["a"],
            )
            .await;
        } else {
            waiting(&mut run, "fan-out running", Duration::from_secs(1), || {
                children.calls.lock().unwrap().len() == 1
            })
            .await;
        }
        // The process dies: the run future is dropped mid-flight, its tasks aborted.
        drop(run);
        assert!(
            acks.list().is_empty(),
            "crash {}: the transaction must be replayed",
            if crash_after_fanout {
                "during the rebuild"
            } else {
                "during the fan-out"
            }
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_fan_out_is_retried_and_still_holds_its_batch() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let log = Log::default();
    let children = Children::with(&[("p", &["a"])]);
    children.fail.store(2, Ordering::SeqCst);
    let r = Refresher::builder()
        .source(source)
        .scope(device_scope)
        .fan_out(plan_scope, children.clone())
        .rebuild(recorder(&log))
        .coalesce(10 * MS)
        .backoff(50 * MS, 200 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![plan(None, "p")]))
        .await
        .unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "retried twice", Duration::from_secs(5), || {
        h.stats().fanout_calls == 1
    })
    .await;
    waiting(&mut run, "acked", Duration::from_secs(5), || {
        acks.list() == [1]
    })
    .await;
    assert_eq!(children.calls.lock().unwrap().len(), 3);
    assert!(log.count("a") >= 1);
    assert_eq!(h.stats().rebuilds_failed, 2);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_large_fan_out_streams_through_a_bounded_buffer() {
    const N: usize = 50_000;
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let rebuilt = Arc::new(AtomicUsize::new(0));
    let kids: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
    let children = Children::default();
    let children = Children {
        batch: 8,
        ..children
    };
    children.map.lock().unwrap().insert("big".into(), kids);
    let count = rebuilt.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(device_scope)
        .fan_out(plan_scope, children.clone())
        .rebuild_batch(1000, move |keys: Vec<Key>| {
            let count = count.clone();
            async move {
                count.fetch_add(keys.len(), Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            }
        })
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![plan(None, "big")]))
        .await
        .unwrap();
    drop(feed);
    within(
        "drain",
        Duration::from_secs(60),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(rebuilt.load(Ordering::SeqCst), N);
    assert_eq!(h.stats().fanout_keys, N as u64);
    assert_eq!(acks.list(), [1]);
}

#[tokio::test(start_paused = true)]
async fn a_fan_out_larger_than_the_queue_limit_waits_for_rebuilds_to_drain() {
    // Above 65 536 dirty keys the refresher stops taking fanned keys until rebuilds
    // drain some: the dirty set never holds the whole fan-out.
    const N: usize = 200_000;
    const LIMIT: u64 = 65_536;
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let rebuilt = Arc::new(AtomicUsize::new(0));
    let children = Children {
        batch: 8,
        ..Children::default()
    };
    children
        .map
        .lock()
        .unwrap()
        .insert("huge".into(), (0..N).map(|i| format!("k{i}")).collect());
    let count = rebuilt.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(device_scope)
        .fan_out(plan_scope, children.clone())
        .rebuild_batch(500, move |keys: Vec<Key>| {
            let count = count.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                count.fetch_add(keys.len(), Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            }
        })
        .workers(2)
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![plan(None, "huge")]))
        .await
        .unwrap();
    drop(feed);
    let mut run = Box::pin(r.run(std::future::pending()));
    let mut peak = 0;
    loop {
        tokio::select! {
            done = &mut run => {
                done.unwrap();
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(1)) => {
                peak = peak.max(h.stats().dirty);
            }
        }
    }
    assert_eq!(rebuilt.load(Ordering::SeqCst), N);
    assert_eq!(acks.list(), [1]);
    assert!(peak > LIMIT / 2, "the test reached the limit: peak {peak}");
    assert!(
        peak <= LIMIT + 2 * 4096,
        "the dirty set stayed near the limit: peak {peak}"
    );
}
