//! The key stream on a real Kafka-protocol broker: a capture end publishes keys and
//! acknowledges after delivery; workers in one group split them, and through joins and
//! leaves under load no key is ever rebuilt by two workers at overlapping times.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freshen::{Ack, Batch, Due, Key, Op, Rebuild, Refresher, Row, RowEvent, Tx, Value, channel};
use freshen_kafka::{KeyPublisher, KeySource, KeyStreamConfig, KeyStreamProbe, Keyer};
use freshen_testenv::KafkaFlavor;
use support::*;

const PARTITIONS: i32 = 6;
const VIEWS: [&str; 2] = ["totals", "latest"];
const DEVICES: usize = 40;

fn reading(device: &str, txid: u64) -> RowEvent {
    let mut e = RowEvent::new("public", "readings", Op::Insert).with_new(Row::from_pairs([
        ("device", Value::from(device)),
        ("value", Value::Int(1)),
    ]));
    e.tx = Some(Tx {
        id: txid,
        commit: txid * 100,
        index: 0,
    });
    e
}

/// Both views are keyed by the device.
fn keyer() -> Box<Keyer> {
    Box::new(|e: &RowEvent, out: &mut Vec<(usize, Key)>| {
        for k in e.scope_keys(&["device"]) {
            out.push((0, k.clone()));
            out.push((1, k));
        }
    })
}

fn config(bootstrap: &str) -> KeyStreamConfig {
    KeyStreamConfig::new(bootstrap, "keys", "workers")
        .session_timeout_ms(session_ms(KafkaFlavor::Noida))
}

/// One rebuild: which worker, which view and key, when it ran, which txids it saw.
#[derive(Clone)]
struct Span {
    worker: usize,
    view: &'static str,
    key: Key,
    start: Instant,
    end: Instant,
    txids: Vec<u64>,
}

/// Every rebuild.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Span>>>);

struct Recording {
    worker: usize,
    view: &'static str,
    spans: Spans,
}

impl Rebuild for Recording {
    fn rebuild<'a>(
        &'a self,
        due: &'a [Due],
    ) -> freshen::BoxFuture<'a, Result<(), freshen::BoxError>> {
        Box::pin(async move {
            let start = Instant::now();
            // The rebuild's own work: long enough that rebalances catch some running.
            tokio::time::sleep(Duration::from_millis(15)).await;
            let end = Instant::now();
            let mut s = self.spans.0.lock().unwrap();
            for d in due {
                s.push(Span {
                    worker: self.worker,
                    view: self.view,
                    key: d.key.clone(),
                    start,
                    end,
                    txids: d.txids.clone(),
                });
            }
            Ok(())
        })
    }
}

struct Worker {
    views: Vec<Running>,
    probe: KeyStreamProbe,
}

impl Worker {
    async fn start(bootstrap: &str, id: usize, spans: &Spans) -> Worker {
        let source = KeySource::connect(&config(bootstrap)).await.unwrap();
        assert_eq!(source.partitions(), PARTITIONS);
        let probe = source.probe();
        let rebuilds: Vec<Box<dyn Rebuild>> = VIEWS
            .iter()
            .map(|v| {
                source.fence(
                    v,
                    Box::new(Recording {
                        worker: id,
                        view: v,
                        spans: spans.clone(),
                    }),
                )
            })
            .collect();
        let sources = source.split(VIEWS.iter().map(|v| v.to_string()).collect());
        let views = sources
            .into_iter()
            .zip(rebuilds)
            .map(|(s, r)| {
                Running::spawn(
                    Refresher::builder()
                        .source(s)
                        .scope(|_: &RowEvent| Vec::<Key>::new())
                        .rebuild_with(r)
                        .coalesce(Duration::from_millis(5))
                        .workers(4)
                        .build()
                        .unwrap(),
                )
            })
            .collect();
        Worker { views, probe }
    }

    async fn stop(self) {
        for v in self.views {
            v.stop().await;
        }
    }

    fn rebuilt(&self) -> u64 {
        self.views
            .iter()
            .map(|v| v.handle.stats().rebuilds_ok)
            .sum()
    }
}

/// The capture end on a task, fed by the returned channel.
async fn capture(bootstrap: &str) -> (freshen::Feed, tokio::task::JoinHandle<()>) {
    let publisher = KeyPublisher::connect(&config(bootstrap)).await.unwrap();
    assert_eq!(publisher.partitions(), PARTITIONS);
    let (feed, source) = channel(4);
    let task = tokio::spawn(async move {
        let views: Vec<String> = VIEWS.iter().map(|v| v.to_string()).collect();
        publisher
            .run(source, &views, &*keyer(), std::future::pending())
            .await
            .unwrap();
    });
    (feed, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capture_acknowledges_a_batch_only_once_its_keys_are_in_kafka() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let (feed, _task) = capture(&bootstrap).await;
    let acked = Arc::new(Mutex::new(false));
    let a = acked.clone();
    let events = (0..10)
        .map(|i| reading(&format!("dev-{i}"), 7))
        .chain([reading("dev-0", 7)]) // the same key in the same transaction: once
        .collect();
    feed.send(Batch::new(
        events,
        Ack::new(move || *a.lock().unwrap() = true),
    ))
    .await
    .unwrap();
    until("the batch is acknowledged", || *acked.lock().unwrap()).await;
    // Acknowledged: every record is already readable, in the partition that owns it.
    let ends = high_watermarks(&bootstrap, "keys", PARTITIONS);
    assert_eq!(ends.iter().sum::<i64>(), 20, "10 keys × 2 views: {ends:?}");
    let mut expected = vec![0i64; PARTITIONS as usize];
    for i in 0..10 {
        for v in VIEWS {
            let p = freshen_kafka::partition_of(v, &Key::from(format!("dev-{i}")), PARTITIONS);
            expected[p as usize] += 1;
        }
    }
    assert_eq!(ends, expected, "each key in its own partition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_truncate_at_the_capture_sweeps_the_views_on_every_worker() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let (feed, _task) = capture(&bootstrap).await;
    // Two workers, each view sweeping its listed keys: each key rebuilt by its owner only.
    let spans = Spans::default();
    let mut workers = Vec::new();
    for id in 0..2 {
        let source = KeySource::connect(&config(&bootstrap)).await.unwrap();
        let probe = source.probe();
        let rebuild = source.fence(
            VIEWS[0],
            Box::new(Recording {
                worker: id,
                view: VIEWS[0],
                spans: spans.clone(),
            }),
        );
        let mut sources = source.split(vec![VIEWS[0].to_string(), VIEWS[1].to_string()]);
        let other = sources.pop().unwrap();
        let running = Running::spawn(
            Refresher::builder()
                .source(sources.pop().unwrap())
                .scope(|_: &RowEvent| Vec::<Key>::new())
                .rebuild_with(rebuild)
                .watches("public", "readings", &["device"])
                .reconcile(Duration::from_secs(3600), || async {
                    Ok::<_, std::io::Error>(
                        (0..DEVICES)
                            .map(|i| Key::from(format!("dev-{i:02}")))
                            .collect(),
                    )
                })
                .sweep_at_start(false)
                .build()
                .unwrap(),
        );
        let other = Running::spawn(
            Refresher::builder()
                .source(other)
                .scope(|_: &RowEvent| Vec::<Key>::new())
                .rebuild(|_: Key| async { Ok::<_, std::io::Error>(()) })
                .build()
                .unwrap(),
        );
        workers.push((running, other, probe));
    }
    until("both workers own partitions, all of them", || {
        let owned: Vec<Vec<i32>> = workers.iter().map(|(.., p)| p.owned()).collect();
        owned.iter().all(|o| !o.is_empty())
            && owned.iter().map(Vec::len).sum::<usize>() == PARTITIONS as usize
    })
    .await;
    let acked = Arc::new(Mutex::new(false));
    let a = acked.clone();
    let truncate = RowEvent::new("public", "readings", Op::Truncate);
    let other = RowEvent::new("public", "unwatched", Op::Truncate);
    feed.send(Batch::new(
        vec![truncate.clone(), truncate, other],
        Ack::new(move || *a.lock().unwrap() = true),
    ))
    .await
    .unwrap();
    until("the truncate is published", || *acked.lock().unwrap()).await;
    // Each table once, for each view, to every partition.
    let ends = high_watermarks(&bootstrap, "keys", PARTITIONS);
    assert_eq!(ends, vec![4; PARTITIONS as usize]);

    until("every key swept and rebuilt by its owner", || {
        let s = spans.0.lock().unwrap();
        let keys: BTreeSet<String> = s.iter().map(|r| r.key.to_string()).collect();
        keys.len() == DEVICES
    })
    .await;
    until("both workers saw the gap", || {
        workers.iter().all(|(r, ..)| r.handle.stats().gaps >= 1)
    })
    .await;
    let s = spans.0.lock().unwrap().clone();
    for r in &s {
        let p = freshen_kafka::partition_of(VIEWS[0], &r.key, PARTITIONS);
        let owner = workers
            .iter()
            .position(|(.., probe)| probe.owned().contains(&p));
        assert_eq!(owner, Some(r.worker), "{} rebuilt by its owner", r.key);
    }
    for (r, o, _) in workers {
        r.stop().await;
        o.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_joining_and_leaving_under_load_never_rebuild_a_key_at_once() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let (feed, _capture) = capture(&bootstrap).await;
    let spans = Spans::default();

    // Load: every device changes again and again, each batch its own transaction.
    let changed: Arc<Mutex<BTreeMap<String, (Instant, u64)>>> = Arc::default();
    let stop_load = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (changed, stop) = (changed.clone(), stop_load.clone());
        tokio::spawn(async move {
            let mut txid = 1000u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                txid += 1;
                let devices: Vec<String> = (0..8)
                    .map(|j| format!("dev-{:02}", (txid as usize * 7 + j * 5) % DEVICES))
                    .collect();
                let now = Instant::now();
                for d in &devices {
                    changed.lock().unwrap().insert(d.clone(), (now, txid));
                }
                let events = devices.iter().map(|d| reading(d, txid)).collect();
                feed.send(Batch::new(events, Ack::none())).await.unwrap();
                // The pace of the writes (load, not synchronisation).
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };

    let w0 = Worker::start(&bootstrap, 0, &spans).await;
    until("worker 0 rebuilds", || w0.rebuilt() > 50).await;
    let w1 = Worker::start(&bootstrap, 1, &spans).await;
    until("worker 1 took partitions and rebuilds", || {
        !w1.probe.owned().is_empty() && w1.rebuilt() > 20
    })
    .await;
    let w2 = Worker::start(&bootstrap, 2, &spans).await;
    until("worker 2 took partitions and rebuilds", || {
        !w2.probe.owned().is_empty() && w2.rebuilt() > 20
    })
    .await;
    // A leave under load: worker 0's partitions move to the others.
    w0.stop().await;
    until("workers 1 and 2 own every partition", || {
        let mut all: BTreeSet<i32> = w1.probe.owned().into_iter().collect();
        all.extend(w2.probe.owned());
        all.len() == PARTITIONS as usize
    })
    .await;
    let mark = w1.rebuilt() + w2.rebuilt();
    until("rebuilds go on after the leave", || {
        w1.rebuilt() + w2.rebuilt() > mark + 20
    })
    .await;
    stop_load.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::timeout(DEADLINE, load)
        .await
        .expect("the load stops")
        .unwrap();

    // Every view's key was rebuilt by a rebuild that started after its last change.
    let last: BTreeMap<String, (Instant, u64)> = changed.lock().unwrap().clone();
    until(
        "every key rebuilt after its last change, in both views",
        || {
            let s = spans.0.lock().unwrap();
            last.iter().all(|(device, (at, _))| {
                VIEWS.iter().all(|v| {
                    s.iter().any(|r| {
                        r.view == *v && r.key.as_str() == Some(device.as_str()) && r.start >= *at
                    })
                })
            })
        },
    )
    .await;

    let s = spans.0.lock().unwrap().clone();
    // The transaction ids travelled with the keys (the worker's visibility guard).
    assert!(s.iter().all(|r| r.txids.iter().all(|t| *t > 1000)));
    assert!(s.iter().any(|r| !r.txids.is_empty()));
    // No two rebuilds of one key overlapped, whoever ran them.
    let mut by_key: BTreeMap<(&str, Key), Vec<&Span>> = BTreeMap::new();
    for r in &s {
        by_key.entry((r.view, r.key.clone())).or_default().push(r);
    }
    let mut moved = 0;
    for ((v, k), mut spans) in by_key {
        spans.sort_by_key(|r| r.start);
        for pair in spans.windows(2) {
            assert!(
                pair[1].start >= pair[0].end,
                "{v}/{k}: worker {} started at {:?} while worker {} ran until {:?}",
                pair[1].worker,
                pair[1].start,
                pair[0].worker,
                pair[0].end
            );
            if pair[0].worker != pair[1].worker {
                moved += 1;
            }
        }
    }
    assert!(moved > 0, "some keys changed owners under load");
    let fenced: u64 = [&w1, &w2].iter().map(|w| w.probe.stats().fenced).sum();
    let waits: u64 = [&w1, &w2]
        .iter()
        .map(|w| w.probe.stats().revoke_waits)
        .sum();
    eprintln!("fenced {fenced}, revoke waits {waits}, owner changes {moved}");
    w1.stop().await;
    w2.stop().await;
}
