//! The key stream on a real Kafka-protocol broker: a capture end publishes keys and
//! acknowledges after delivery; workers in one group split them, and through joins and
//! leaves under load no key is ever rebuilt by two workers at overlapping times. The
//! fence is proven with a rebuild held open across a revocation, and offsets are
//! committed only once the views rebuilt the keys they carry.

use crate::support;

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
    hold: Option<Hold>,
    failing: Option<Failing>,
}

/// Rebuilds that carry one of these keys fail, every time.
#[derive(Clone)]
struct Failing(BTreeSet<String>);

/// Holds every rebuild that carries one of `keys` open until `released` says so,
/// counting those held in `running`.
#[derive(Clone)]
struct Hold {
    keys: BTreeSet<String>,
    released: tokio::sync::watch::Receiver<bool>,
    running: Arc<std::sync::atomic::AtomicUsize>,
}

impl Hold {
    fn new(keys: impl IntoIterator<Item = String>) -> (Hold, tokio::sync::watch::Sender<bool>) {
        let (release, released) = tokio::sync::watch::channel(false);
        let hold = Hold {
            keys: keys.into_iter().collect(),
            released,
            running: Arc::default(),
        };
        (hold, release)
    }

    fn running(&self) -> usize {
        self.running.load(std::sync::atomic::Ordering::SeqCst)
    }
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
            if let Some(f) = &self.failing
                && due.iter().any(|d| f.0.contains(&d.key.to_string()))
            {
                return Err("this key's rebuild fails here".into());
            }
            if let Some(h) = &self.hold
                && due.iter().any(|d| h.keys.contains(&d.key.to_string()))
            {
                use std::sync::atomic::Ordering::SeqCst;
                h.running.fetch_add(1, SeqCst);
                let _ = h.released.clone().wait_for(|r| *r).await;
                h.running.fetch_sub(1, SeqCst);
            }
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
        Worker::start_holding(bootstrap, id, spans, None).await
    }

    /// A worker whose `totals` rebuilds of `hold`'s keys wait for its release.
    async fn start_holding(
        bootstrap: &str,
        id: usize,
        spans: &Spans,
        hold: Option<Hold>,
    ) -> Worker {
        Worker::start_with(bootstrap, id, spans, hold, None).await
    }

    /// A worker whose `totals` rebuilds of `hold`'s keys wait for its release, and whose
    /// rebuilds (both views) of `failing`'s keys fail.
    async fn start_with(
        bootstrap: &str,
        id: usize,
        spans: &Spans,
        hold: Option<Hold>,
        failing: Option<Failing>,
    ) -> Worker {
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
                        hold: hold.clone().filter(|_| *v == VIEWS[0]),
                        failing: failing.clone(),
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
                        .workers(2 * PARTITIONS as usize)
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

/// The capture end on a task, fed by [`Capture::feed`].
struct Capture {
    feed: freshen::Feed,
    task: tokio::task::JoinHandle<()>,
}

impl Capture {
    /// Ends its stream and waits until the publisher has stopped and its producer is
    /// gone, failing (rather than hanging the run) past 60 s. Every test stops it (and
    /// its workers) before it ends: the broker is stopped when the test's locals drop,
    /// and a client still talking to it then — a producer's or a consumer's blocking
    /// close — would hold the runtime's shutdown, which was how these tests hung.
    async fn stop(self) {
        drop(self.feed);
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the capture stops within 60 s")
            .expect("the capture ended without a panic");
    }
}

async fn capture(bootstrap: &str) -> Capture {
    let publisher = KeyPublisher::connect(&config(bootstrap)).await.unwrap();
    assert_eq!(publisher.partitions(), PARTITIONS);
    let (feed, source) = channel(4);
    let task = tokio::spawn(async move {
        let views: Vec<String> = VIEWS.iter().map(|v| v.to_string()).collect();
        publisher
            .run(source, &views, &*keyer(), std::future::pending())
            .await
            .unwrap();
        // Dropping the producer closes it in librdkafka, which blocks its thread: off
        // the runtime's, and before the task (and so the test) ends.
        tokio::task::spawn_blocking(move || drop(publisher))
            .await
            .unwrap();
    });
    Capture { feed, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capture_acknowledges_a_batch_only_once_its_keys_are_in_kafka() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let cap = capture(&bootstrap).await;
    let acked = Arc::new(Mutex::new(false));
    let a = acked.clone();
    let events = (0..10)
        .map(|i| reading(&format!("dev-{i}"), 7))
        .chain([reading("dev-0", 7)]) // the same key in the same transaction: once
        .collect();
    cap.feed
        .send(Batch::new(
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
    cap.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_truncate_at_the_capture_sweeps_the_views_on_every_worker() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let cap = capture(&bootstrap).await;
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
                hold: None,
                failing: None,
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
    cap.feed
        .send(Batch::new(
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
    cap.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_joining_and_leaving_under_load_never_rebuild_a_key_at_once() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let cap = capture(&bootstrap).await;
    let spans = Spans::default();

    // Load: every device changes again and again, each batch its own transaction.
    let changed: Arc<Mutex<BTreeMap<String, (Instant, u64)>>> = Arc::default();
    let stop_load = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (changed, stop, feed) = (changed.clone(), stop_load.clone(), cap.feed.clone());
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
    cap.stop().await;
}

/// Stops `w`, failing (rather than hanging the run) if it takes over 60 s.
async fn stopped(w: Worker, what: &str) {
    tokio::time::timeout(Duration::from_secs(60), w.stop())
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within 60 s"));
}

/// For each partition, a device whose `totals` key it owns.
fn one_key_per_partition(prefix: &str) -> Vec<String> {
    (0..PARTITIONS)
        .map(|p| {
            (0..)
                .map(|i| format!("{prefix}-{i}"))
                .find(|d| {
                    freshen_kafka::partition_of(VIEWS[0], &Key::from(d.as_str()), PARTITIONS) == p
                })
                .expect("a key for every partition")
        })
        .collect()
}

/// Fails if any two rebuilds of one key overlapped in time, whoever ran them.
fn assert_no_overlap(spans: &[Span]) {
    let mut by_key: BTreeMap<(&str, Key), Vec<&Span>> = BTreeMap::new();
    for r in spans {
        by_key.entry((r.view, r.key.clone())).or_default().push(r);
    }
    for ((v, k), mut spans) in by_key {
        spans.sort_by_key(|r| r.start);
        for pair in spans.windows(2) {
            assert!(
                pair[1].start >= pair[0].end,
                "{v}/{k}: worker {} started while worker {} still ran it",
                pair[1].worker,
                pair[0].worker
            );
        }
    }
}

/// The fence, forced: a rebuild of a key of every partition is held open on worker 0
/// when worker 1 joins. Whatever the rebalance moves, its revocation finds a rebuild
/// running and waits (counted), the next owner gets nothing until the rebuilds end, and
/// no key is rebuilt by both at once. Without the fence the revocation would not wait:
/// worker 1 would own partitions while their keys still rebuild on worker 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_held_open_across_a_revocation_keeps_the_next_owner_waiting() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let cap = capture(&bootstrap).await;
    let spans = Spans::default();
    let held = one_key_per_partition("held");
    let (hold, release) = Hold::new(held.clone());
    let w0 = Worker::start_holding(&bootstrap, 0, &spans, Some(hold.clone())).await;
    until("worker 0 owns every partition", || {
        w0.probe.owned().len() == PARTITIONS as usize
    })
    .await;
    let events = held.iter().map(|d| reading(d, 5000)).collect();
    cap.feed
        .send(Batch::new(events, Ack::none()))
        .await
        .unwrap();
    until("a rebuild of every partition's key runs, held open", || {
        hold.running() == PARTITIONS as usize
    })
    .await;

    let w1 = Worker::start(&bootstrap, 1, &spans).await;
    until("worker 0's revocation waits for the held rebuilds", || {
        w0.probe.stats().revoke_waits >= 1
    })
    .await;
    // While the revocation waits, the partitions it gives up are nobody's: the new owner
    // has none for as long as the rebuilds are held (a window for a wrong fence to show,
    // not a synchronization).
    let window = Instant::now() + Duration::from_secs(2);
    while Instant::now() < window {
        let s = w0.probe.stats();
        assert_eq!(
            s.revoke_timeouts, 0,
            "worker 0 gave its partitions up while their rebuilds still ran: {s:?}"
        );
        assert!(
            w1.probe.owned().is_empty(),
            "worker 1 owns {:?} while worker 0 still rebuilds their keys",
            w1.probe.owned()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release.send(true).unwrap();
    until("worker 1 owns partitions once the rebuilds ended", || {
        !w1.probe.owned().is_empty()
    })
    .await;
    let s = w0.probe.stats();
    assert_eq!(
        s.revoke_timeouts, 0,
        "the revocation waited them out: {s:?}"
    );
    // The held rebuilds ended (a span is recorded when its rebuild ends).
    until("every held rebuild ended", || {
        let s = spans.0.lock().unwrap();
        held.iter().all(|d| {
            s.iter()
                .any(|r| r.view == VIEWS[0] && r.key.as_str() == Some(d.as_str()) && r.worker == 0)
        })
    })
    .await;
    assert_no_overlap(&spans.0.lock().unwrap());
    w1.stop().await;
    w0.stop().await;
    cap.stop().await;
}

/// Offsets follow the rebuilds: a worker whose rebuild of a key keeps failing stops
/// without committing that key's record, so the next worker reads it again and rebuilds
/// it. A worker that committed on reading would have lost the key for good: nothing
/// would change it again (a witness), and no sweep runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_commits_a_record_only_after_its_views_rebuilt_its_keys() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "keys", PARTITIONS).await;
    let cap = capture(&bootstrap).await;
    let spans = Spans::default();
    let witness = "witness-0".to_string();
    let failing = Some(Failing([witness.clone()].into()));
    let w0 = Worker::start_with(&bootstrap, 0, &spans, None, failing).await;
    until("worker 0 owns every partition", || {
        w0.probe.owned().len() == PARTITIONS as usize
    })
    .await;
    let events = (0..5)
        .map(|i| reading(&format!("dev-{i:02}"), 7000))
        .chain([reading(&witness, 7000)])
        .collect();
    cap.feed
        .send(Batch::new(events, Ack::none()))
        .await
        .unwrap();
    until("worker 0 rebuilt the others and failed the witness", || {
        let failed: u64 = w0
            .views
            .iter()
            .map(|v| v.handle.stats().rebuilds_failed)
            .sum();
        let s = spans.0.lock().unwrap();
        failed >= 2 && (0..5).all(|i| s.iter().any(|r| r.key.to_string() == format!("dev-{i:02}")))
    })
    .await;
    stopped(w0, "worker 0, its witness failing").await;
    assert!(
        !spans
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.key.to_string() == witness),
        "worker 0 never rebuilt the witness"
    );

    let w1 = Worker::start(&bootstrap, 1, &spans).await;
    until(
        "worker 1 reads the witness again and rebuilds it, in both views",
        || {
            let s = spans.0.lock().unwrap();
            VIEWS.iter().all(|v| {
                s.iter()
                    .any(|r| r.worker == 1 && r.view == *v && r.key.to_string() == witness)
            })
        },
    )
    .await;
    stopped(w1, "worker 1").await;
    cap.stop().await;
}
