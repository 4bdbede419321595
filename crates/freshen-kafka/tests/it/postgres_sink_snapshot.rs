//! A Kafka sink's snapshot (DBLog, `freshen_postgres::SinkSnapshots`) against a real
//! PostgreSQL and a real Kafka-protocol broker while writers change the table (updates,
//! deletes, primary-key changes, inserts): a consumer that applies the topic by key ends
//! equal to the table, no READ record shows a row older than a change already published
//! for its key, and a snapshot killed mid-way resumes after its last delivered chunk.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use freshen_kafka::{KafkaSink, KafkaSinkConfig, TopicMode};
use freshen_postgres::{
    ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SinkSnapshotConfig, SinkSnapshots,
    SnapshotProgress, SnapshotState, TableName,
};
use freshen_testenv::refresher::{eventually, within};
use freshen_testenv::{KafkaFlavor, PgServer};
use rdkafka::consumer::StreamConsumer;
use rdkafka::message::Message;
use serde_json::{Value, json};
use support::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

const ROWS: i32 = 3000;
const TOPIC: &str = "pg.public.items";
const PARTITIONS: i32 = 3;
const SINK: &str = "kafka:pg";

async fn sql(pg: &PgServer) -> Client {
    let (client, conn) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Rows no writer touches (see [`writers`]), present before the snapshot starts.
const WITNESSES: &str =
    "INSERT INTO items SELECT g, 0, 'witness' FROM generate_series(500000, 500004) g";
/// Each witness changed once; one more inserted and one deleted.
const WITNESSES_CHANGED: &str = "BEGIN; UPDATE items SET v = 'witness-changed', grp = 1 WHERE id BETWEEN 500000 AND 500002;
     INSERT INTO items VALUES (500005, 2, 'witness-new'); DELETE FROM items WHERE id = 500004; COMMIT;";

async fn setup(pg: &PgServer) -> Client {
    let c = sql(pg).await;
    c.batch_execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, v text NOT NULL);
         CREATE SEQUENCE new_ids START 1000000;
         INSERT INTO items SELECT g, g % 7, 'v' || g FROM generate_series(1, {ROWS}) g;"
    ))
    .await
    .unwrap();
    c
}

fn items() -> TableName {
    TableName::new("public", "items")
}

async fn pg_source(pg: &PgServer) -> PgSource {
    PgSource::start(PgSourceConfig {
        connection: ConnectionConfig::from_url(&pg.url()).unwrap(),
        slot: "sink_snap".into(),
        slot_mode: freshen_postgres::SlotMode::CreateIfMissing,
        publication: "sink_snap".into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: vec![items()],
        status_interval: Duration::from_millis(100),
        reconnect: freshen::Backoff::new(Duration::from_millis(50), Duration::from_millis(500)),
        ..PgSourceConfig::default()
    })
    .await
    .expect("the PostgreSQL source")
}

/// The sink and its snapshot driver, running.
struct Run {
    snapshots: SinkSnapshots,
    sink: JoinHandle<()>,
    driver: JoinHandle<()>,
    stop: Vec<oneshot::Sender<()>>,
}

async fn run(pg: &PgServer, bootstrap: &str, initial: bool, pause_ms: u64) -> Run {
    let source = pg_source(pg).await;
    let pool =
        freshen_postgres::connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 2).unwrap();
    let snapshots = SinkSnapshots::new(
        SinkSnapshotConfig::new(SINK, initial)
            .chunk_rows(100)
            .pause(Duration::from_millis(pause_ms)),
    );
    let sink = KafkaSink::new(&KafkaSinkConfig::new(bootstrap, "pg", TopicMode::PerTable)).unwrap();
    let (stop_sink, sink_stopped) = oneshot::channel::<()>();
    let (stop_driver, driver_stopped) = oneshot::channel::<()>();
    let s = snapshots.clone();
    let sink = tokio::spawn(async move {
        let splice = move |b: &freshen::Batch| {
            s.splice(b)
                .into_iter()
                .map(|x| (x.at, x.rows, x.delivered))
                .collect()
        };
        sink.run_interleaved(source, splice, async {
            let _ = sink_stopped.await;
        })
        .await
        .expect("the sink runs");
    });
    let s = snapshots.clone();
    let driver = tokio::spawn(async move {
        s.run(pool, vec![items()], async {
            let _ = driver_stopped.await;
        })
        .await
        .expect("the snapshots run");
    });
    Run {
        snapshots,
        sink,
        driver,
        stop: vec![stop_driver, stop_sink],
    }
}

impl Run {
    fn progress(&self) -> Option<SnapshotProgress> {
        self.snapshots
            .status()
            .into_iter()
            .find(|p| p.table == "items")
    }

    async fn stop(self) {
        for s in self.stop {
            let _ = s.send(());
        }
        self.driver.await.unwrap();
        self.sink.await.unwrap();
    }

    /// A crash: both tasks die where they are; nothing more is acknowledged or stored.
    async fn kill(self) {
        self.driver.abort();
        self.sink.abort();
        let _ = self.driver.await;
        let _ = self.sink.await;
    }
}

/// Writers changing the table until stopped: updates, deletes, primary-key changes
/// (`id` to `-id`: never a collision), inserts. One statement per transaction.
struct Writers {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

fn writers(pg: &PgServer, n: u64) -> Writers {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks = (0..n)
        .map(|w| {
            let url = pg.url();
            let (stop, done) = (stop.clone(), done.clone());
            tokio::spawn(async move {
                let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                let mut rng = freshen::Jitter::new(w + 1);
                let mut next = || rng.next_u64();
                while !stop.load(Ordering::Relaxed) {
                    let id = (next() % ROWS as u64) as i32 + 1;
                    let id = if next() % 4 == 0 { -id } else { id };
                    let statement = match next() % 8 {
                        0..=3 => "UPDATE items SET v = v || '+', grp = grp + 1 WHERE id = $1",
                        4 => "UPDATE items SET id = -id WHERE id = $1",
                        5 => "DELETE FROM items WHERE id = $1",
                        _ => "INSERT INTO items SELECT nextval('new_ids'), 1, 'new' WHERE $1::int IS NOT NULL",
                    };
                    c.execute(statement, &[&id])
                        .await
                        .expect("a writer's statement");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    Writers { stop, done, tasks }
}

impl Writers {
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.done.load(Ordering::Relaxed)
    }
}

async fn table(c: &Client) -> BTreeMap<i64, Value> {
    c.query("SELECT id, grp, v FROM items", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let (id, grp, v): (i32, i32, String) = (r.get(0), r.get(1), r.get(2));
            (i64::from(id), json!({"id": id, "grp": grp, "v": v}))
        })
        .collect()
}

/// One record of the topic as a consumer sees it.
#[derive(Debug)]
struct Record {
    partition: i32,
    offset: i64,
    id: i64,
    /// `c`, `u`, `d`, `r`, or `tombstone`.
    op: String,
    after: Value,
}

/// A consumer reading the topic from its start, in no group: its drop never waits on
/// the broker ([`reader_from_start`]).
fn reader(bootstrap: &str) -> StreamConsumer {
    reader_from_start(bootstrap, TOPIC, PARTITIONS)
}

async fn next_record(r: &StreamConsumer) -> Option<Record> {
    let msg = tokio::time::timeout(Duration::from_secs(2), r.recv())
        .await
        .ok()?
        .expect("a record");
    let key: Value = serde_json::from_slice(msg.key().expect("a key")).unwrap();
    let id = key["id"].as_i64().unwrap();
    let (op, after) = match msg.payload() {
        None => ("tombstone".to_owned(), Value::Null),
        Some(p) => {
            let v: Value = serde_json::from_slice(p).unwrap();
            if v["op"] == "r" {
                assert_eq!(v["source"]["snapshot"], "incremental", "{v}");
            }
            (v["op"].as_str().unwrap().to_owned(), v["after"].clone())
        }
    };
    Some(Record {
        partition: msg.partition(),
        offset: msg.offset(),
        id,
        op,
        after,
    })
}

/// Applies records by key, as a consumer keeping state does; checks that no READ
/// shows a row older than a change already published for its key: the key's previous
/// record, if any, is a create, update or read of the same row (never a delete).
#[derive(Default)]
struct Replay {
    state: BTreeMap<i64, Value>,
    last: BTreeMap<i64, (String, Value)>,
    records: Vec<Record>,
}

impl Replay {
    fn apply(&mut self, r: Record) {
        if r.op == "r"
            && let Some((op, prev)) = self.last.get(&r.id)
        {
            assert!(
                op != "d" && op != "tombstone",
                "a READ of key {} after its delete: {r:?}",
                r.id
            );
            assert_eq!(
                prev, &r.after,
                "a READ of key {} shows another row than the change before it",
                r.id
            );
        }
        match r.op.as_str() {
            "d" | "tombstone" => {
                self.state.remove(&r.id);
            }
            _ => {
                self.state.insert(r.id, r.after.clone());
            }
        }
        self.last.insert(r.id, (r.op.clone(), r.after.clone()));
        self.records.push(r);
    }

    /// Reads until the state equals `want` (within a deadline).
    async fn until_equal(&mut self, r: &StreamConsumer, want: &BTreeMap<i64, Value>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while &self.state != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the topic applied by key never equalled the table ({} keys vs {})",
                self.state.len(),
                want.len()
            );
            if let Some(rec) = next_record(r).await {
                self.apply(rec);
            }
        }
    }

    fn reads(&self) -> usize {
        self.records.iter().filter(|r| r.op == "r").count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_snapshot_taken_while_writers_run_replays_to_the_table() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, TOPIC, PARTITIONS).await;
    let c = setup(&pg).await;
    let w = writers(&pg, 2);
    let run = run(&pg, &bootstrap, true, 0).await;
    let done = eventually(120, "the sink snapshot done", || async {
        run.progress().filter(|p| p.state == SnapshotState::Done)
    })
    .await;
    let writes = w.stop().await;
    assert!(
        writes > 100,
        "the writers ran during the snapshot ({writes})"
    );
    let want = table(&c).await;
    let r = reader(&bootstrap);
    let mut replay = Replay::default();
    replay.until_equal(&r, &want).await;
    let reads = replay.reads();
    assert!(reads as u64 <= done.rows, "{reads} reads, {done:?}");
    assert!(
        reads > ROWS as usize / 2,
        "most rows were read ({reads}, dropped {})",
        done.dropped
    );
    assert!(done.chunks >= u64::from(ROWS as u32 / 100), "{done:?}");
    let live = replay.records.iter().filter(|r| r.op != "r").count();
    assert!(live > 0, "live changes published along with the reads");
    // Stored in the source database, for a restart.
    let stored: String = c
        .query_one(
            "SELECT progress::text FROM freshen_sink_snapshots WHERE sink = $1 AND source_table = 'public.items'",
            &[&SINK],
        )
        .await
        .unwrap()
        .get(0);
    let stored: SnapshotProgress = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        (stored.state, stored.rows),
        (SnapshotState::Done, done.rows)
    );
    eprintln!(
        "sink snapshot: {done:?}; {reads} reads so far, {live} live records, {writes} writes"
    );
    run.stop().await;
    close("the replay reader", r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sink_snapshot_resumes_after_its_last_delivered_chunk() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    within(
        60,
        "the topic created",
        create_topic(&bootstrap, TOPIC, PARTITIONS),
    )
    .await;
    let c = within(60, "the table set up", setup(&pg)).await;
    within(60, "the witnesses written", c.batch_execute(WITNESSES))
        .await
        .unwrap();
    let w = writers(&pg, 2);

    let first = within(60, "the first run started", run(&pg, &bootstrap, true, 20)).await;
    eventually(60, "a few chunks delivered", || async {
        first.progress().filter(|p| p.chunks >= 5)
    })
    .await;
    // Witness rows changed live just before the crash and never again (the writers keep
    // to ids up to ROWS, their negations and the sequence's): a change lost at the
    // crash leaves the replay unequal to the table.
    within(
        60,
        "the witnesses changed",
        c.batch_execute(WITNESSES_CHANGED),
    )
    .await
    .unwrap();
    within(60, "the first run killed", first.kill()).await;
    let stored: String = within(
        60,
        "the stored progress read",
        c.query_one(
            "SELECT progress::text FROM freshen_sink_snapshots WHERE sink = $1",
            &[&SINK],
        ),
    )
    .await
    .unwrap()
    .get(0);
    let stored: SnapshotProgress = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored.state, SnapshotState::Running, "{stored:?}");
    assert!(stored.chunks >= 5, "{stored:?}");
    let resume_after: i64 = stored.after.as_ref().unwrap()[0].parse().unwrap();
    // Where the topic ended when the sink died: later records are the second run's.
    let ends: BTreeMap<i32, i64> = (0..PARTITIONS)
        .zip(high_watermarks(&bootstrap, TOPIC, PARTITIONS))
        .collect();

    let second = within(60, "the second run started", run(&pg, &bootstrap, true, 0)).await;
    let done = eventually(120, "the resumed snapshot done", || async {
        second.progress().filter(|p| p.state == SnapshotState::Done)
    })
    .await;
    within(60, "the writers stopped", w.stop()).await;
    assert!(done.chunks > stored.chunks, "{done:?} {stored:?}");
    let want = within(60, "the table read", table(&c)).await;
    let r = reader(&bootstrap);
    let mut replay = Replay::default();
    replay.until_equal(&r, &want).await;
    // Resumed, not restarted: the second run read only keys after the stored one.
    let reread: Vec<i64> = replay
        .records
        .iter()
        .filter(|r| r.op == "r" && r.offset >= ends[&r.partition])
        .map(|r| r.id)
        .collect();
    assert!(!reread.is_empty(), "the second run read rows");
    assert!(
        reread.iter().all(|&id| id > resume_after),
        "the second run started after key {resume_after}: {:?}",
        &reread[..reread.len().min(10)]
    );
    within(60, "the second run stopped", second.stop()).await;
    // Before the broker goes with the test's locals.
    close("the replay reader", r).await;
}
