//! The binary relaying a transactional outbox (`[[sinks]] kind = "kafka-outbox"`) from
//! PostgreSQL to a real Kafka-protocol broker: a SIGKILL mid-relay loses no row, each
//! aggregate's events stay in order (repeats allowed, told apart by the `id` header), and
//! a malformed row reaches the dead-letter topic with its reason.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen_testenv::refresher::{eventually, until_within, within};
use freshen_testenv::{KafkaServer, PgServer};
use rdkafka::message::{Headers, Message};
use support::*;

const DEADLINE: Duration = Duration::from_secs(60);
const TOPICS: [&str; 3] = ["outbox.event.order", "outbox.event.customer", "outbox.dlq"];
/// Aggregates written to: `a0`, `a1`, …; even ones are orders, odd ones customers.
const AGGREGATES: u64 = 12;
/// The most transactions the application commits around the kill (it stops at the kill).
const WITNESS_TXS: usize = 5000;

const OUTBOX: &str = "CREATE TABLE outbox (
    id text PRIMARY KEY,
    aggregatetype text,
    aggregateid text,
    type text,
    payload text
);
CREATE TABLE orders (id bigint PRIMARY KEY, seq int NOT NULL);";

fn broker() -> KafkaServer {
    KafkaServer::start().expect("a Kafka-protocol broker (run scripts/test-deps-brokers)")
}

/// The file; `extra` adds keys to the outbox sink.
fn config(pg: &str, brokers: &str, listen: &str, extra: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{pg}"
slot = "freshen_outbox"
publication = "freshen_outbox"
# The outbox table is captured because the sink names it.
tables = ["public.orders"]
# Confirm eagerly: an acknowledgement given too early would show as a loss.
status_interval = "10ms"

[http]
listen = "{listen}"

[[sinks]]
kind = "kafka-outbox"
brokers = "{brokers}"
table = "public.outbox"
dead_letter_topic = "outbox.dlq"
{extra}
"#
    )
}

/// What every test here starts from: a broker with the topics and a reader of them, a
/// PostgreSQL with the outbox table, and the file (`extra` adds keys to the outbox sink,
/// or tables after it) in `dir`, served on `base` once run.
struct Setup {
    kafka: KafkaServer,
    pg: PgServer,
    c: tokio_postgres::Client,
    reader: Reader,
    dir: tempfile::TempDir,
    base: String,
    cfg: std::path::PathBuf,
}

async fn setup(extra: &str) -> Setup {
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(OUTBOX).await.unwrap();
    create_topics(&kafka.bootstrap(), &TOPICS, 3).await;
    let reader = Reader::start(&kafka.bootstrap());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config(
            &pg.url(),
            &kafka.bootstrap(),
            &format!("127.0.0.1:{port}"),
            extra,
        ),
    );
    Setup {
        kafka,
        pg,
        c,
        reader,
        dir,
        base: format!("http://127.0.0.1:{port}"),
        cfg,
    }
}

/// One record read back: its topic, key, headers `id`, `type` and `freshen.error`, and
/// its value.
#[derive(Debug, Clone)]
struct Got {
    topic: String,
    key: Option<String>,
    id: Option<String>,
    kind: Option<String>,
    error: Option<String>,
    value: Option<String>,
    /// Where it was read, for failure messages.
    partition: i32,
    offset: i64,
}

/// Reads every topic from the start on a thread of its own until dropped.
struct Reader {
    got: Arc<Mutex<Vec<Got>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(bootstrap: &str) -> Reader {
        Reader::start_as(bootstrap, "outbox-reader")
    }

    /// A reader in consumer group `group` (a new group reads every topic from the start).
    fn start_as(bootstrap: &str, group: &str) -> Reader {
        let consumer = reader(bootstrap, group, &TOPICS);
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (got, stop) = (got.clone(), stop.clone());
            std::thread::spawn(move || {
                let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
                while !stop.load(Ordering::Relaxed) {
                    let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let header = |name: &str| {
                        m.headers()
                            .and_then(|h| h.iter().find(|h| h.key == name))
                            .and_then(|h| text(h.value))
                    };
                    let g = Got {
                        topic: m.topic().to_owned(),
                        key: text(m.key()),
                        id: header("id"),
                        kind: header("type"),
                        error: header("freshen.error"),
                        value: text(m.payload()),
                        partition: m.partition(),
                        offset: m.offset(),
                    };
                    got.lock().unwrap().push(g);
                }
            })
        };
        Reader {
            got,
            stop,
            thread: Some(thread),
        }
    }

    fn all(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The application: each transaction changes its data and writes its events (one per
/// aggregate it touches, with the aggregate's next sequence number) into the outbox.
struct App {
    rng: Rng,
    seq: BTreeMap<u64, u64>,
    /// Every event committed: id → (aggregate, seq).
    committed: BTreeMap<String, (u64, u64)>,
    /// Transactions committed so far, readable while another task runs them.
    done: Arc<AtomicUsize>,
    /// Set: commit no more transactions.
    stop: Arc<AtomicBool>,
}

impl App {
    async fn transactions(&mut self, c: &tokio_postgres::Client, n: usize) {
        for _ in 0..n {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let mut sql = String::from("BEGIN;");
            let mut events = Vec::new();
            for _ in 0..=self.rng.below(3) {
                let a = self.rng.below(AGGREGATES);
                let seq = self.seq.entry(a).or_insert(0);
                *seq += 1;
                let id = format!("e-{a}-{seq}");
                let (ty, kind) = if a.is_multiple_of(2) {
                    ("order", "OrderChanged")
                } else {
                    ("customer", "CustomerChanged")
                };
                sql.push_str(&format!(
                    "INSERT INTO orders VALUES ({a}, {seq}) ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq;
                     INSERT INTO outbox VALUES ('{id}', '{ty}', 'a{a}', '{kind}', '{{\"seq\":{seq}}}');"
                ));
                events.push((id, (a, *seq)));
            }
            sql.push_str("COMMIT;");
            c.batch_execute(&sql).await.unwrap();
            self.committed.extend(events);
            self.done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What arrived, checked: each record on its aggregate type's topic, keyed by its
/// aggregate, with its `id` and `type` headers; per aggregate, the first arrival of each
/// id comes in sequence order (a repeat is a replay of an id seen before). Returns the
/// ids seen and how many records were repeats.
fn check_arrivals(got: &[Got]) -> (BTreeSet<String>, usize) {
    let mut seen = BTreeSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut repeats = 0;
    for g in got.iter().filter(|g| g.topic != "outbox.dlq") {
        let id = g.id.clone().expect("an id header");
        let key = g.key.clone().expect("a key");
        let a: u64 = key.trim_start_matches('a').parse().expect("key a<n>");
        let want_topic = if a.is_multiple_of(2) {
            "outbox.event.order"
        } else {
            "outbox.event.customer"
        };
        assert_eq!(g.topic, want_topic, "{g:?}");
        let want_kind = if a.is_multiple_of(2) {
            "OrderChanged"
        } else {
            "CustomerChanged"
        };
        assert_eq!(g.kind.as_deref(), Some(want_kind), "{g:?}");
        let value: serde_json::Value =
            serde_json::from_str(g.value.as_deref().expect("a value")).unwrap();
        let seq = value["seq"].as_u64().expect("seq");
        assert_eq!(id, format!("e-{a}-{seq}"), "the payload is the row's");
        if !seen.insert(id.clone()) {
            repeats += 1;
            continue;
        }
        let before = last.insert(key.clone(), seq).unwrap_or(0);
        assert_eq!(
            seq,
            before + 1,
            "aggregate {key}: event {seq} arrived first after {before}"
        );
    }
    (seen, repeats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_relay_killed_mid_relay_loses_nothing_and_keeps_each_aggregate_in_order() {
    // Records wait in the producer before they are sent: a relay that acknowledged on
    // handing them over (not on the broker's acknowledgement) would let the slot pass
    // them, and the kill would lose them.
    let Setup {
        kafka: _kafka,
        pg,
        c,
        reader,
        dir,
        base,
        cfg,
    } = setup(r#"properties = { "linger.ms" = "1000" }"#).await;
    let mut app = App {
        rng: Rng::new(7),
        seq: BTreeMap::new(),
        committed: BTreeMap::new(),
        done: Arc::default(),
        stop: Arc::default(),
    };

    // A clean run: every event once, in order per aggregate.
    let mut first = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    app.transactions(&c, 30).await;
    let clean: BTreeSet<String> = app.committed.keys().cloned().collect();
    until_within("the clean run's events", DEADLINE, || {
        check_arrivals(&reader.all()).0 == clean
    })
    .await;
    let (_, repeats) = check_arrivals(&reader.all());
    assert_eq!(repeats, 0, "no repeats in a clean run");

    // Witnesses: committed while the relay runs, never written again. The relay is
    // killed as soon as the first of them is in Kafka, with the rest in flight.
    let arrived_before = reader.all().len();
    let start: String = c
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let writer = {
        let url = pg.url();
        let mut app = std::mem::replace(
            &mut app,
            App {
                rng: Rng::new(0),
                seq: BTreeMap::new(),
                committed: BTreeMap::new(),
                done: Arc::default(),
                stop: Arc::default(),
            },
        );
        app.done.store(0, Ordering::Relaxed);
        let done = app.done.clone();
        let stop = app.stop.clone();
        let task = tokio::spawn(async move {
            let c = connect(&url).await;
            app.transactions(&c, WITNESS_TXS).await;
            app
        });
        (task, done, stop)
    };
    let (writer, written, stop_writing) = writer;
    // The kill comes once a witness is in Kafka and the slot has confirmed past the
    // first witnesses: a relay that confirmed ahead of the broker would lose the rest.
    eventually(60, "a witness in Kafka and the slot past it", || {
        let (reader, c, start) = (&reader, &c, &start);
        async move {
            if reader.all().len() <= arrived_before {
                return None;
            }
            let row = c
                .query_one(
                    "SELECT confirmed_flush_lsn > $1::text::pg_lsn FROM pg_replication_slots
                     WHERE slot_name = 'freshen_outbox'",
                    &[start],
                )
                .await
                .ok()?;
            row.get::<_, bool>(0).then_some(())
        }
    })
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let written_at_kill = written.load(Ordering::Relaxed);
    let arrived_at_kill = reader.all().len() - arrived_before;
    assert!(
        written_at_kill < WITNESS_TXS,
        "killed while the application was still writing ({written_at_kill} transactions)"
    );
    // Witnesses are the transactions committed up to here: the writer stops, and
    // what it committed after the kill is written while the relay is down.
    stop_writing.store(true, Ordering::Relaxed);
    app = within(60, "the witnesses committed", writer).await.unwrap();
    app.stop.store(false, Ordering::Relaxed);
    // More events while the relay is down.
    app.transactions(&c, 20).await;
    let committed: BTreeSet<String> = app.committed.keys().cloned().collect();

    let _second = spawn_run(dir.path(), &cfg, 2);
    until_within("every witness after the restart", DEADLINE, || {
        check_arrivals(&reader.all()).0 == committed
    })
    .await;
    let (seen, repeats) = check_arrivals(&reader.all());
    assert_eq!(seen, committed, "nothing but the application's events");
    eprintln!(
        "{} events; at the kill {written_at_kill} witness transactions committed and \
         {arrived_at_kill} witness events read back; {repeats} repeats",
        committed.len()
    );
    assert!(
        !reader.all().iter().any(|g| g.topic == "outbox.dlq"),
        "no dead letters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_outbox_row_reaches_the_dead_letter_topic_with_its_reason() {
    let Setup {
        kafka: _kafka,
        pg: _pg,
        c,
        reader,
        dir,
        base,
        cfg,
    } = setup("").await;
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    let insert = "INSERT INTO outbox VALUES ($1, $2, $3, $4, $5)";
    for (id, ty, agg, payload) in [
        ("e-1", Some("order"), Some("a0"), "{\"seq\":1}"),
        ("bad-key", Some("order"), None, "{\"seq\":2}"),
        ("bad-json", Some("order"), Some("a0"), "{seq: 2"),
        ("e-2", Some("order"), Some("a0"), "{\"seq\":2}"),
    ] {
        c.execute(insert, &[&id, &ty, &agg, &"OrderChanged", &payload])
            .await
            .unwrap();
    }
    // A delete of an outbox row (the application cleaning up) is no event.
    c.execute("DELETE FROM outbox WHERE id = 'e-1'", &[])
        .await
        .unwrap();
    c.execute(insert, &[&"e-3", &"order", &"a0", &"x", &"{\"seq\":3}"])
        .await
        .unwrap();
    until_within("the good events and the dead letters", DEADLINE, || {
        reader.all().len() >= 5
    })
    .await;
    let got = reader.all();
    let dead: BTreeMap<String, Got> = got
        .iter()
        .filter(|g| g.topic == "outbox.dlq")
        .map(|g| (g.id.clone().unwrap(), g.clone()))
        .collect();
    assert_eq!(dead.len(), 2, "{got:#?}\n{}", log_of(dir.path(), 1));
    assert_eq!(
        dead["bad-key"].error.as_deref(),
        Some("aggregateid is missing or NULL")
    );
    let why = dead["bad-json"].error.clone().unwrap();
    assert!(why.starts_with("payload is not valid JSON"), "{why}");
    assert_eq!(
        dead["bad-json"].value.as_deref(),
        Some("{seq: 2"),
        "the row kept as it was"
    );
    let events: Vec<(String, String)> = got
        .iter()
        .filter(|g| g.topic == "outbox.event.order")
        .map(|g| (g.id.clone().unwrap(), g.value.clone().unwrap()))
        .collect();
    assert_eq!(
        events,
        [
            ("e-1".to_owned(), "{\"seq\":1}".to_owned()),
            ("e-2".to_owned(), "{\"seq\":2}".to_owned()),
            ("e-3".to_owned(), "{\"seq\":3}".to_owned()),
        ],
        "the good rows, in order, around the bad ones; the delete is no event"
    );
    // The metrics count them by reason, never by the sentence.
    for (reason, n) in [
        ("missing_aggregate_id", 1.0),
        ("invalid_payload", 1.0),
        ("missing_id", 0.0),
    ] {
        let series =
            format!("freshen_sink_dead_letters_total{{{OUTBOX_SINK},reason=\"{reason}\"}}");
        assert_eq!(metric(&base, &series).await, Some(n), "{series}");
    }
    let series = format!("freshen_sink_records_delivered_total{{{OUTBOX_SINK}}}");
    assert_eq!(
        metric(&base, &series).await,
        Some(5.0),
        "3 events, 2 dead letters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_already_in_the_outbox_are_relayed_by_an_initial_snapshot() {
    let Setup {
        kafka: _kafka,
        pg: _pg,
        c,
        reader,
        dir,
        base,
        cfg,
    } = setup("snapshot = \"initial\"\nsnapshot_chunk_rows = 20").await;
    c.batch_execute(
        "INSERT INTO outbox SELECT 'old-' || g, 'order', 'a' || (g % 3), 'OrderCreated',
                                   '{\"seq\":' || g || '}'
         FROM generate_series(1, 50) g;",
    )
    .await
    .unwrap();
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    c.execute(
        "INSERT INTO outbox VALUES ('new-1', 'order', 'a0', 'OrderCreated', '{\"seq\":51}')",
        &[],
    )
    .await
    .unwrap();
    let want: BTreeSet<String> = (1..=50)
        .map(|g| format!("old-{g}"))
        .chain(["new-1".to_owned()])
        .collect();
    let ids = || -> BTreeSet<String> {
        reader
            .all()
            .into_iter()
            .filter(|g| g.topic == "outbox.event.order")
            .filter_map(|g| g.id)
            .collect()
    };
    until_within("the existing rows and the new one", DEADLINE, || {
        ids() == want
    })
    .await;
    let got = reader.all();
    for g in &got {
        let a: u64 = g
            .key
            .as_deref()
            .unwrap()
            .trim_start_matches('a')
            .parse()
            .unwrap();
        let id = g.id.as_deref().unwrap();
        if let Some(n) = id.strip_prefix("old-") {
            assert_eq!(
                n.parse::<u64>().unwrap() % 3,
                a,
                "keyed by aggregateid: {g:?}"
            );
        }
        assert_eq!(g.kind.as_deref(), Some("OrderCreated"));
    }
}

/// `[[redact]]` on the outbox's payload column: the clear payload reaches neither the
/// event topic nor the dead-letter topic, and routing still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacted_outbox_payload_leaves_the_relay_only_masked() {
    // A masked payload is no JSON document: relayed as text.
    let extra = "payload_encoding = \"text\"\n\n[[redact]]\ntable = \"public.outbox\"\ncolumn = \"payload\"\naction = \"mask\"";
    let Setup {
        kafka: _kafka,
        pg: _pg,
        c,
        reader,
        dir,
        base,
        cfg,
    } = setup(extra).await;
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    let insert = "INSERT INTO outbox VALUES ($1, $2, $3, $4, $5)";
    for (id, agg, payload) in [
        ("e-1", Some("a0"), "{\"card\":\"4111-secret-1\"}"),
        ("bad-key", None, "{\"card\":\"4111-secret-2\"}"),
        ("e-2", Some("a1"), "{\"card\":\"4111-secret-3\"}"),
    ] {
        c.execute(insert, &[&id, &"order", &agg, &"CardAdded", &payload])
            .await
            .unwrap();
    }
    until_within("the events and the dead letter", DEADLINE, || {
        reader.all().len() >= 3
    })
    .await;
    let got = reader.all();
    let mut seen: Vec<(String, String, Option<String>)> = got
        .iter()
        .map(|g| (g.topic.clone(), g.id.clone().unwrap(), g.value.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "outbox.dlq".to_owned(),
                "bad-key".to_owned(),
                Some("********".to_owned())
            ),
            (
                "outbox.event.order".to_owned(),
                "e-1".to_owned(),
                Some("********".to_owned())
            ),
            (
                "outbox.event.order".to_owned(),
                "e-2".to_owned(),
                Some("********".to_owned())
            ),
        ],
        "{got:#?}"
    );
    assert!(
        got.iter().all(|g| !format!("{g:?}").contains("secret")),
        "a clear payload left the relay: {got:#?}"
    );
    let series =
        "freshen_redacted_values_total{table=\"public.outbox\",column=\"payload\",action=\"mask\"}";
    assert_eq!(
        metric(&base, series).await,
        Some(3.0),
        "one per row relayed"
    );
}

/// The ids of the events read (dead letters aside).
fn ids(got: &[Got]) -> BTreeSet<String> {
    got.iter()
        .filter(|g| g.topic != "outbox.dlq")
        .filter_map(|g| g.id.clone())
        .collect()
}

/// Per aggregate, each event read as (seq, partition, offset), for failure messages.
fn by_aggregate(got: &[Got]) -> String {
    let mut per: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for g in got {
        let seq =
            g.id.as_deref()
                .and_then(|id| id.rsplit('-').next())
                .unwrap_or("?");
        per.entry(g.key.clone().unwrap_or_default())
            .or_default()
            .push(format!("{seq}@{}:{}", g.partition, g.offset));
    }
    per.iter()
        .map(|(k, v)| format!("{k}: {}", v.join(" ")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The outbox sink's series in `/metrics`: `name{sink=…,kind=…}`.
const OUTBOX_SINK: &str = "sink=\"kafka-outbox:public.outbox\",kind=\"kafka-outbox\"";

/// The value of `series` (a metric name with its labels) in the run's `/metrics`, if it
/// answers and has it.
async fn metric(base: &str, series: &str) -> Option<f64> {
    let (code, text) = freshen_cli::status::get(base, "/metrics").await.ok()?;
    if code != 200 {
        return None;
    }
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// The slot's confirmed position is at or before `lsn`.
async fn confirmed_at_most(c: &tokio_postgres::Client, lsn: &str) -> bool {
    c.query_one(
        "SELECT confirmed_flush_lsn <= $1::text::pg_lsn FROM pg_replication_slots
         WHERE slot_name = 'freshen_outbox'",
        &[&lsn],
    )
    .await
    .unwrap()
    .get(0)
}

/// The broker stops while the relay runs (witness rows delivered before, never written
/// again) and stays down while the application writes and while
/// freshen is SIGKILLed and started again; when the broker is back, every event arrives
/// (at least once), each aggregate in order. Meanwhile the metrics show the outage (client
/// errors, batches waiting, their age) and the slot is never confirmed past the rows the
/// broker has not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_delays_the_outbox_and_loses_nothing_even_across_a_kill() {
    // Deliveries wait out the outage (the default 30 s could run out on a loaded
    // machine, and a failed delivery stops the relay: another test's matter).
    let Setup {
        mut kafka,
        pg: _pg,
        c,
        reader,
        dir,
        base,
        cfg,
    } = setup("delivery_timeout_ms = 300000").await;
    let mut app = App {
        rng: Rng::new(11),
        seq: BTreeMap::new(),
        committed: BTreeMap::new(),
        done: Arc::default(),
        stop: Arc::default(),
    };
    let mut first = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    let delivered = format!(
        "{}{{{OUTBOX_SINK}}}",
        "freshen_sink_records_delivered_total"
    );
    let client_errors = format!("{}{{{OUTBOX_SINK}}}", "freshen_sink_client_errors_total");
    let waiting = format!("{}{{{OUTBOX_SINK}}}", "freshen_sink_batches_waiting");
    let oldest = format!("{}{{{OUTBOX_SINK}}}", "freshen_sink_oldest_waiting_seconds");
    let last_delivery = format!(
        "{}{{{OUTBOX_SINK}}}",
        "freshen_sink_last_delivery_timestamp_seconds"
    );

    // Witnesses: written once while the broker is up, never again, and in Kafka before
    // it stops. The relay goes on receiving rows through the outage.
    app.transactions(&c, 30).await;
    let early: BTreeSet<String> = app.committed.keys().cloned().collect();
    until_within("the witnesses in Kafka", DEADLINE, || {
        check_arrivals(&reader.all()).0 == early
    })
    .await;
    if metric(&base, &delivered).await.is_none() {
        let text = freshen_cli::status::get(&base, "/metrics").await;
        panic!("no {delivered} in /metrics: {text:?}");
    }
    // The broker stops once it has acknowledged the witnesses: a clean stop, as a
    // rolling restart or an operator stops it. Not sooner: the single test broker
    // (noida-db 0.2.3) was seen to lose records it had acknowledged just before a clean
    // stop (every offset present after the restart, the records absent), a loss no
    // client can prevent and replicas prevent in a real cluster; and a SIGKILL loses
    // everything it had not saved. Records in flight at a crash are the SIGKILL test's.
    let (delivered_ref, waiting_ref0) = (&delivered, &waiting);
    let base_ref0 = &base;
    let witnesses = early.len() as f64;
    eventually(60, "the relay idle before the outage", || async move {
        let waiting = metric(base_ref0, waiting_ref0).await?;
        let delivered = metric(base_ref0, delivered_ref).await?;
        (waiting == 0.0 && delivered >= witnesses).then_some(())
    })
    .await;
    // (A consumer may read a record before the producer hears it was acknowledged:
    // hence the wait above rather than a look.)
    assert!(metric(&base, &last_delivery).await.unwrap() > 0.0);
    let errors_before = metric(&base, &client_errors).await.unwrap();
    kafka.stop().expect("the broker stops");

    // The outage: the application goes on writing.
    let down_from: String = c
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    app.transactions(&c, 20).await;
    let base_ref = &base;
    let (client_errors_ref, waiting_ref) = (&client_errors, &waiting);
    eventually(
        60,
        "the metrics show the outage: client errors, batches waiting",
        || async move {
            let errors = metric(base_ref, client_errors_ref).await?;
            let waiting = metric(base_ref, waiting_ref).await?;
            (errors > errors_before && waiting > 0.0).then_some(())
        },
    )
    .await;
    let (oldest_ref, c_ref, down_ref) = (&oldest, &c, &down_from);
    eventually(60, "the oldest waiting batch ages", || async move {
        (metric(base_ref, oldest_ref).await? >= 1.0).then_some(())
    })
    .await;
    assert!(
        confirmed_at_most(c_ref, down_ref).await,
        "the slot was confirmed past rows the broker never acknowledged"
    );

    // SIGKILL while the broker is down: what the producer held is gone with the
    // process; the slot still has it.
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = spawn_run(dir.path(), &cfg, 2);
    eventually(
        60,
        "the restarted relay has the unacknowledged rows again, waiting for the broker",
        || async move { (metric(base_ref, waiting_ref).await? > 0.0).then_some(()) },
    )
    .await;
    app.transactions(&c, 10).await;
    assert!(
        confirmed_at_most(&c, &down_from).await,
        "the slot was confirmed past rows the broker never acknowledged (after the restart)"
    );
    assert_eq!(
        second.try_wait().unwrap(),
        None,
        "freshen runs while the broker is down:\n{}",
        log_of(dir.path(), 2)
    );

    // The broker is back: everything arrives, in order per aggregate — read by the
    // reader that followed the whole test, and afresh from the start by a new group.
    kafka.start_again().expect("the broker starts again");
    let committed: BTreeSet<String> = app.committed.keys().cloned().collect();
    let audit = Reader::start_as(&kafka.bootstrap(), "outbox-audit");
    let deadline = Duration::from_secs(120);
    for (who, r) in [("the reader", &reader), ("a new reader", &audit)] {
        let what = format!("every event, read by {who}");
        let all_read = until_within(&what, deadline * 2, || ids(&r.all()) == committed);
        if tokio::time::timeout(deadline, all_read).await.is_err() {
            let got = r.all();
            let read = ids(&got);
            let missing: Vec<&String> = committed.difference(&read).collect();
            panic!(
                "{who}: {} of {} events missing after {deadline:?}: {missing:?}\nread, per aggregate (seq@partition:offset):\n{}\nbroker log:\n{}",
                missing.len(),
                committed.len(),
                by_aggregate(&got),
                kafka.log_tail(20)
            );
        }
        let got = r.all();
        if std::panic::catch_unwind(|| check_arrivals(&got)).is_err() {
            panic!(
                "{who}: out of order; per aggregate (seq, partition, offset):\n{}",
                by_aggregate(&got)
            );
        }
    }
    let (seen, repeats) = check_arrivals(&reader.all());
    assert_eq!(seen, committed, "nothing but the application's events");
    assert!(
        !reader.all().iter().any(|g| g.topic == "outbox.dlq"),
        "no dead letters"
    );
    eventually(60, "the relay drains: nothing waits", || async move {
        let waiting = metric(base_ref, waiting_ref).await?;
        let delivered = metric(base_ref, delivered_ref).await?;
        (waiting == 0.0 && delivered > 0.0).then_some(())
    })
    .await;
    assert_eq!(metric(&base, &oldest).await, Some(0.0));
    eprintln!(
        "{} events ({} witnesses before the outage); {repeats} repeats",
        committed.len(),
        early.len()
    );
}
