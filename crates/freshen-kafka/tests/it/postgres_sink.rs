//! PostgreSQL → Kafka: a workload's changes all arrive once in Debezium form, in commit
//! order per key; a sink killed mid-workload and restarted on the same slot loses none
//! (the replayed tail may arrive twice, in order).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use freshen_codec::{DebeziumJson, Decoded};
use freshen_kafka::{KafkaSink, KafkaSinkConfig, TopicMode};
use freshen_postgres::{
    ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SlotMode, TableName,
};
use freshen_testenv::child::ChildProcess;
use freshen_testenv::{KafkaFlavor, PgServer};
use rdkafka::consumer::StreamConsumer;
use rdkafka::message::Message;
use support::*;
use tokio_postgres::{Client, NoTls};

const TOPIC: &str = "pg.public.orders";

/// One committed change: key, operation, the row's version after it (0 for a delete:
/// under the default replica identity a delete carries only the primary key).
type Change = (i64, &'static str, i64);

/// A deterministic workload over 8 keys. Every statement stamps the row with a fresh
/// global version, so each change is identifiable and orderable.
struct Workload {
    rng: freshen::Jitter,
    version: i64,
    live: BTreeMap<i64, i64>,
    done: Vec<Change>,
}

impl Workload {
    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    async fn run(&mut self, c: &Client, txs: usize) {
        for _ in 0..txs {
            let mut sql = String::from("BEGIN;");
            let mut changes = Vec::new();
            for _ in 0..=self.below(3) {
                let id = self.below(8) as i64;
                self.version += 1;
                let v = self.version;
                match (self.live.get(&id).copied(), self.below(3)) {
                    (None, _) => {
                        sql.push_str(&format!("INSERT INTO orders VALUES ({id}, 'new', {v});"));
                        self.live.insert(id, v);
                        changes.push((id, "c", v));
                    }
                    (Some(_), 0) => {
                        sql.push_str(&format!("DELETE FROM orders WHERE id = {id};"));
                        self.live.remove(&id);
                        changes.push((id, "d", 0));
                    }
                    (Some(_), _) => {
                        sql.push_str(&format!("UPDATE orders SET version = {v} WHERE id = {id};"));
                        self.live.insert(id, v);
                        changes.push((id, "u", v));
                    }
                }
            }
            sql.push_str("COMMIT;");
            c.batch_execute(&sql).await.unwrap();
            self.done.extend(changes);
        }
    }
}

async fn sql(pg: &PgServer) -> Client {
    let (client, conn) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

async fn pg_source(url: &str) -> PgSource {
    let config = PgSourceConfig {
        connection: ConnectionConfig::from_url(url).unwrap(),
        slot: "to_kafka".into(),
        slot_mode: SlotMode::CreateIfMissing,
        publication: "to_kafka".into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: vec!["public.orders".parse::<TableName>().unwrap()],
        status_interval: Duration::from_millis(100),
        reconnect: freshen::Backoff::new(Duration::from_millis(50), Duration::from_millis(500)),
        ..PgSourceConfig::default()
    };
    PgSource::start(config)
        .await
        .expect("the PostgreSQL source")
}

/// Reads the topic from the start until `n` messages arrived; returns each as a change.
async fn read_changes(reader: &StreamConsumer, n: usize) -> Vec<Change> {
    let mut decoder = DebeziumJson::new();
    let mut out = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(DEADLINE, reader.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} changes arrived", out.len()))
            .unwrap();
        let Decoded::Rows(rows) = decoder.decode_with_key(msg.key(), msg.payload()).unwrap() else {
            panic!("a row change");
        };
        let e = &rows[0];
        let (op, image) = match e.op {
            freshen::Op::Insert => ("c", e.new.as_ref()),
            freshen::Op::Update => ("u", e.new.as_ref()),
            freshen::Op::Delete => ("d", e.old.as_ref()),
            other => panic!("unexpected {other}"),
        };
        let image = image.expect("an image");
        let int = |c: &str| match image.get(c) {
            Some(freshen::Value::Int(i)) => *i,
            None if op == "d" => 0,
            other => panic!("{c}: {other:?}"),
        };
        assert!(e.tx.is_some(), "PostgreSQL changes carry their transaction");
        assert_eq!(e.pk_names.iter().map(|c| &**c).collect::<Vec<_>>(), ["id"]);
        out.push((int("id"), op, int("version")));
    }
    out
}

/// Whether `want` is a subsequence of `got`: everything arrived, in order (a replay
/// after a crash may repeat a tail; the repeats are skipped over).
fn arrived_in_order(got: &[Change], want: &[Change]) -> bool {
    let mut got = got.iter();
    want.iter().all(|w| got.any(|g| g == w))
}

fn per_key(changes: &[Change]) -> BTreeMap<i64, Vec<Change>> {
    let mut out: BTreeMap<i64, Vec<Change>> = BTreeMap::new();
    for c in changes {
        out.entry(c.0).or_default().push(*c);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_arrive_once_in_order_and_survive_a_killed_sink() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, TOPIC, 3).await;
    let c = sql(&pg).await;
    c.batch_execute(
        // The default replica identity: the primary key is the event key. (Under FULL,
        // freshen-postgres reports every column as key, and so would the sink.)
        "CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, version int8 NOT NULL);",
    )
    .await
    .unwrap();
    let sink_config = KafkaSinkConfig::new(&bootstrap, "pg", TopicMode::PerTable);
    // In no group: its drop never waits on the broker (support::reader_from_start).
    let reader = reader_from_start(&bootstrap, TOPIC, 3);

    // Phase 1: a clean run, by a sink in a process of its own (phase 2 kills it). Every
    // change once, in commit order per key.
    let mut w = Workload {
        rng: freshen::Jitter::new(1),
        version: 0,
        live: BTreeMap::new(),
        done: Vec::new(),
    };
    let mut first = ChildProcess::spawn(
        "postgres_sink::the_sink_killed_mid_workload",
        &[(CHILD_PG, &pg.url()), (CHILD_KAFKA, &bootstrap)],
    );
    // Its slot streams before the workload starts: nothing written before the slot
    // would ever reach it.
    pg.wait_for_slot("to_kafka", Duration::from_secs(30))
        .unwrap();
    w.run(&c, 40).await;
    let phase1 = w.done.len();
    let arrived = read_changes(&reader, phase1).await;
    assert_eq!(
        per_key(&arrived),
        per_key(&w.done),
        "once each, in commit order per key"
    );
    let extra = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await;
    assert!(extra.is_err(), "no duplicates in a clean run");

    // Phase 2: the sink's process is SIGKILLed mid-workload (no final acknowledgement,
    // no producer flush), the workload goes on, a new sink resumes from the slot.
    w.run(&c, 10).await;
    first.kill();
    w.run(&c, 30).await;
    let sink = Arc::new(KafkaSink::new(&sink_config).unwrap());
    let source = pg_source(&pg.url()).await;
    let task = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.run(source, std::future::pending()).await })
    };
    let want = per_key(&w.done);
    let mut all = arrived.clone();
    loop {
        let got = per_key(&all);
        let done = want
            .iter()
            .all(|(k, w)| arrived_in_order(got.get(k).map_or(&[][..], Vec::as_slice), w));
        if done {
            let expected: BTreeSet<Change> = w.done.iter().copied().collect();
            assert!(
                all.iter().all(|c| expected.contains(c)),
                "nothing but the workload"
            );
            break;
        }
        if task.is_finished() {
            panic!("the restarted sink stopped: {:?}", task.await);
        }
        all.extend(read_changes(&reader, 1).await);
    }
    // Every Kafka client closed before the broker goes with the test's locals.
    task.abort();
    let _ = task.await;
    close("the restarted sink", sink).await;
    close("the reader", reader).await;
}

/// Where the child process of the test above finds PostgreSQL and Kafka.
const CHILD_PG: &str = "FRESHEN_TEST_PG_URL";
const CHILD_KAFKA: &str = "FRESHEN_TEST_KAFKA";

/// The first sink of the test above, in a process of its own that the test SIGKILLs:
/// the orders table to Kafka over the slot `to_kafka`, run until killed.
#[test]
#[ignore = "the child process of changes_arrive_once_in_order_and_survive_a_killed_sink, which runs and kills it"]
fn the_sink_killed_mid_workload() {
    let url = freshen_testenv::child::var(CHILD_PG);
    let bootstrap = freshen_testenv::child::var(CHILD_KAFKA);
    freshen_testenv::child::run(async move {
        let sink =
            KafkaSink::new(&KafkaSinkConfig::new(&bootstrap, "pg", TopicMode::PerTable)).unwrap();
        sink.run(pg_source(&url).await, std::future::pending())
            .await
            .unwrap();
    });
}
