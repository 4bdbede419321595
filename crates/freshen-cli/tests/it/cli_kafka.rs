//! The binary with Kafka: TiCDC canal-json in, a view kept fresh; PostgreSQL changes out
//! to a Kafka sink in Debezium's envelope. Real brokers (noida-db), started by the tests.

use crate::support;

use std::time::{Duration, Instant};

use freshen_testenv::KafkaServer;
use rdkafka::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use support::*;

const DEADLINE: Duration = Duration::from_secs(30);

fn broker() -> KafkaServer {
    KafkaServer::start().expect("a Kafka-protocol broker (run scripts/test-deps-brokers)")
}

async fn create_topic(bootstrap: &str, topic: &str) {
    create_topics(bootstrap, &[topic], 2).await;
}

async fn send(p: &FutureProducer, topic: &str, key: &str, value: &[u8]) {
    p.send(FutureRecord::to(topic).key(key).payload(value), DEADLINE)
        .await
        .unwrap_or_else(|(e, _)| panic!("producing: {e}"));
}

/// Reads `n` messages of `topic` from the start as group `group` (key and value as
/// JSON), or fails naming what arrived and the run's log.
fn consume(
    bootstrap: &str,
    topic: &str,
    group: &str,
    n: usize,
    log: &std::path::Path,
) -> Vec<(Value, Value)> {
    let consumer = reader(bootstrap, group, &[topic]);
    let mut got: Vec<(Value, Value)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} messages: {}",
            got.len(),
            log_of(log, 1)
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let key: Value = serde_json::from_slice(m.key().unwrap()).unwrap();
            let value: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
            got.push((key, value));
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canal_json_from_kafka_keeps_a_view_fresh_and_skips_poison() {
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    // The target holds the source tables (as TiDB would) and the derived table.
    c.batch_execute(DEMO_SCHEMA).await.unwrap();
    create_topic(&kafka.bootstrap(), "ticdc").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "kafka"
brokers = "{}"
topics = ["ticdc"]
group = "freshen-cli-test"
format = "canal-json"
session_timeout_ms = 6000

[target]
url = "{}"

[http]
listen = "127.0.0.1:{port}"

{DEMO_VIEW}
"#,
            kafka.bootstrap(),
            pg.url()
        ),
    );
    let mut child = spawn_run(dir.path(), &cfg, 1);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap())
        .create()
        .unwrap();
    // Each change is applied upstream, then announced on the topic, as TiCDC would.
    for id in 0..40i64 {
        let device = format!("d{}", id % 4);
        c.execute(
            "INSERT INTO demo.readings VALUES ($1, $2, $3)",
            &[&id, &device, &id],
        )
        .await
        .unwrap();
        send(
            &producer,
            "ticdc",
            &device,
            &canal("INSERT", id, &device, id),
        )
        .await;
        if id == 20 {
            send(&producer, "ticdc", "poison", b"{not json").await;
        }
    }
    c.execute("DELETE FROM demo.readings WHERE id = 3", &[])
        .await
        .unwrap();
    send(&producer, "ticdc", "d3", &canal("DELETE", 3, "d3", 3)).await;

    assert!(
        wait_demo_equal(&c, 4, Duration::from_secs(60)).await,
        "the view never matched: {}",
        log_of(dir.path(), 1)
    );
    let metrics = wait_http(&base, "/metrics", 200, DEADLINE).await;
    assert!(
        metrics.contains("freshen_events_skipped_total{view=\"device_totals\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("freshen_source_streaming{kind=\"kafka\"} 1"),
        "{metrics}"
    );
    stop_run(&mut child, dir.path(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_changes_reach_a_kafka_sink_in_debezium_form() {
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL)")
        .await
        .unwrap();
    create_topic(&kafka.bootstrap(), "changes").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "postgres"
url = "{}"
slot = "freshen_sink"
publication = "freshen_sink"
tables = ["public.orders"]

[http]
listen = "127.0.0.1:{port}"

[[sinks]]
kind = "kafka"
brokers = "{}"
topic = "changes"
topic_mode = "single"
"#,
            pg.url(),
            kafka.bootstrap()
        ),
    );
    let mut child = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{port}"),
        "/healthz",
        200,
        DEADLINE,
    )
    .await;
    for id in 0..25i64 {
        c.execute("INSERT INTO orders VALUES ($1, 1)", &[&id])
            .await
            .unwrap();
    }
    c.execute("UPDATE orders SET amount = 2 WHERE id = 7", &[])
        .await
        .unwrap();

    let got = consume(&kafka.bootstrap(), "changes", "reader", 26, dir.path());
    let creates = got.iter().filter(|(_, v)| v["op"] == "c").count();
    assert_eq!(creates, 25, "{got:?}");
    let update = got
        .iter()
        .find(|(_, v)| v["op"] == "u")
        .expect("the update");
    assert_eq!(update.0, json!({"id": 7}), "key is the primary key as JSON");
    assert_eq!(update.1["after"]["amount"], json!(2));
    assert_eq!(update.1["source"]["table"], json!("orders"));
    stop_run(&mut child, dir.path(), 1);
}

/// A sink's snapshots through the binary: with `snapshot = "initial"` the rows that
/// existed before it started arrive as READ events (`op` `r`) before and among the live
/// changes; a second sink (`"never"`) publishes none until `freshen snapshot --sink 1`
/// asks, and `/status` shows both sinks' progress. Wrong requests are refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_sink_snapshots_existing_rows_initially_and_on_demand() {
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL);
         INSERT INTO orders SELECT g, 1 FROM generate_series(1, 250) g;",
    )
    .await
    .unwrap();
    create_topic(&kafka.bootstrap(), "first").await;
    create_topic(&kafka.bootstrap(), "later").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_sink_snap"
publication = "freshen_sink_snap"
tables = ["public.orders"]

[http]
listen = "127.0.0.1:{port}"

[[sinks]]
kind = "kafka"
brokers = "{brokers}"
topic = "first"
topic_mode = "single"
snapshot = "initial"
snapshot_chunk_rows = 100

[[sinks]]
kind = "kafka"
brokers = "{brokers}"
topic = "later"
topic_mode = "single"
"#,
            url = pg.url(),
            brokers = kafka.bootstrap()
        ),
    );
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, DEADLINE).await;
    // Sink 0's initial snapshot, done (the library tests cover writers during one).
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let body = wait_http(&base, "/status", 200, DEADLINE).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["sink_snapshots"][0]["tables"][0]["state"] == "done" {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "sink 0's snapshot not done: {v}\n{}",
            log_of(dir.path(), 1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let s0 = &status["sink_snapshots"][0];
    assert_eq!(
        (
            s0["sink"].as_u64(),
            s0["id"].as_str(),
            s0["tables"][0]["rows"].as_u64()
        ),
        (Some(0), Some("kafka:first"), Some(250)),
        "{status}"
    );
    c.execute("UPDATE orders SET amount = 2 WHERE id = 7", &[])
        .await
        .unwrap();
    c.execute("INSERT INTO orders VALUES (1000, 3)", &[])
        .await
        .unwrap();

    // Sink 0: every existing row once as a READ, then the two live changes.
    let got = consume(&kafka.bootstrap(), "first", "reader", 252, dir.path());
    let reads: std::collections::BTreeSet<i64> = got
        .iter()
        .filter(|(_, v)| v["op"] == "r")
        .map(|(k, _)| k["id"].as_i64().unwrap())
        .collect();
    assert_eq!(reads, (1..=250).collect(), "every existing row read once");
    assert!(
        got.iter()
            .filter(|(_, v)| v["op"] == "r")
            .all(|(_, v)| v["source"]["snapshot"] == "incremental" && v["before"].is_null())
    );
    assert!(got.iter().any(|(k, v)| v["op"] == "c" && k["id"] == 1000));
    let last7 = got.iter().rev().find(|(k, _)| k["id"] == 7).unwrap();
    assert_eq!(last7.1["after"]["amount"], json!(2), "{got:?}");

    // Sink 1 took no snapshot; asked for, it publishes the rows as they are now.
    let ask = |args: &[&str]| {
        freshen()
            .args(["snapshot", "-c"])
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap()
    };
    let out = ask(&["--sink", "1", "public.nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("public.nope") && err.contains("400"), "{err}");
    let out = ask(&["--sink", "7", "orders"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sink 7"));
    let out = ask(&["--sink", "1", "orders"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["snapshots"][0]["table"], "orders", "{answer}");
    // Its two live changes, then every row as it is now.
    let got = consume(&kafka.bootstrap(), "later", "reader", 253, dir.path());
    let reads: Vec<&(Value, Value)> = got.iter().filter(|(_, v)| v["op"] == "r").collect();
    let ids: std::collections::BTreeSet<i64> = reads
        .iter()
        .map(|(k, _)| k["id"].as_i64().unwrap())
        .collect();
    assert_eq!(reads.len(), 251, "each row once");
    assert_eq!(ids, (1..=250).chain([1000]).collect());
    let seven = reads.iter().find(|(k, _)| k["id"] == 7).unwrap();
    assert_eq!(seven.1["after"]["amount"], json!(2), "the row as it is now");
    let progress = freshen_testenv::refresher::eventually(30, "sink 1's snapshot done", || {
        let out = ask(&["--sink", "1"]);
        async move {
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            (v[0]["tables"][0]["state"] == "done").then_some(v)
        }
    })
    .await;
    assert_eq!(progress[0]["tables"][0]["rows"], json!(251), "{progress}");
    stop_run(&mut child, dir.path(), 1);
}

/// A sink's snapshot survives a SIGKILL of the binary: the restarted process resumes
/// after the last chunk it delivered (stored in the source), and every row reaches the
/// topic as a READ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_snapshot_resumes_after_a_sigkill() {
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL);
         INSERT INTO orders SELECT g, 1 FROM generate_series(1, 3000) g;",
    )
    .await
    .unwrap();
    create_topic(&kafka.bootstrap(), "killed").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_sink_kill"
publication = "freshen_sink_kill"
tables = ["public.orders"]

[http]
listen = "127.0.0.1:{port}"

[[sinks]]
kind = "kafka"
brokers = "{brokers}"
topic = "killed"
topic_mode = "single"
snapshot = "initial"
snapshot_chunk_rows = 100
snapshot_pause_ms = 50
"#,
            url = pg.url(),
            brokers = kafka.bootstrap()
        ),
    );
    let base = format!("http://127.0.0.1:{port}");
    let progress = |body: &str| -> (String, u64) {
        let v: Value = serde_json::from_str(body).unwrap();
        let t = &v["sink_snapshots"][0]["tables"][0];
        (
            t["state"].as_str().unwrap_or("").to_owned(),
            t["chunks"].as_u64().unwrap_or(0),
        )
    };
    let mut first = spawn_run(dir.path(), &cfg, 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (state, chunks) = progress(&wait_http(&base, "/status", 200, DEADLINE).await);
        if chunks >= 5 {
            assert_eq!(state, "running", "killed mid-snapshot");
            break;
        }
        assert!(Instant::now() < deadline, "{}", log_of(dir.path(), 1));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let stored: String = c
        .query_one("SELECT progress::text FROM freshen_sink_snapshots", &[])
        .await
        .unwrap()
        .get(0);
    let stored: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored["state"], "running", "{stored}");
    let resume_after: i64 = stored["after"][0].as_str().unwrap().parse().unwrap();
    assert!((500..3000).contains(&resume_after), "{stored}");

    let mut second = spawn_run(dir.path(), &cfg, 2);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, body)) = freshen_cli::status::get(&base, "/status").await
            && progress(&body).0 == "done"
        {
            break;
        }
        assert!(Instant::now() < deadline, "{}", log_of(dir.path(), 2));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        log_of(dir.path(), 2).contains("resuming after its last delivered chunk"),
        "{}",
        log_of(dir.path(), 2)
    );
    // Every row at least once (the chunk in flight at the kill may come twice).
    let want: std::collections::BTreeSet<i64> = (1..=3000).collect();
    let mut seen = std::collections::BTreeSet::new();
    let consumer = reader(&kafka.bootstrap(), "reader", &["killed"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen != want {
        assert!(
            Instant::now() < deadline,
            "{} of 3000 rows arrived",
            seen.len()
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let key: Value = serde_json::from_slice(m.key().unwrap()).unwrap();
            let value: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
            assert_eq!(value["op"], "r");
            seen.insert(key["id"].as_i64().unwrap());
        }
    }
    std::process::Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(
        second.wait().unwrap().success(),
        "{}",
        log_of(dir.path(), 2)
    );
}

/// The same sink from a MySQL (MariaDB) binlog source: the envelope names the database
/// and table, and the key is the primary key.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_changes_reach_a_kafka_sink_in_debezium_form() {
    use mysql_async::prelude::Queryable;
    let kafka = broker();
    let db = freshen_testenv::MariaDbServer::start()
        .unwrap_or_else(|e| panic!("MariaDB for this test (apt-get install mariadb-server): {e}"));
    db.sql("CREATE DATABASE app").unwrap();
    let mut c = mysql_async::Conn::from_url(db.url("app")).await.unwrap();
    c.query_drop("CREATE TABLE app.orders (id BIGINT PRIMARY KEY, amount INT NOT NULL)")
        .await
        .unwrap();
    create_topic(&kafka.bootstrap(), "mysql-changes").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "mysql"
url = "{}"
name = "sink"
tables = ["app.orders"]

[http]
listen = "127.0.0.1:{port}"

[[sinks]]
kind = "kafka"
brokers = "{}"
topic = "mysql-changes"
topic_mode = "single"
"#,
            db.url("app"),
            kafka.bootstrap()
        ),
    );
    let mut child = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{port}"),
        "/healthz",
        200,
        DEADLINE,
    )
    .await;
    for id in 0..10i64 {
        c.exec_drop("INSERT INTO app.orders VALUES (?, 1)", (id,))
            .await
            .unwrap();
    }
    c.query_drop("UPDATE app.orders SET amount = 2 WHERE id = 7")
        .await
        .unwrap();

    let got = consume(
        &kafka.bootstrap(),
        "mysql-changes",
        "mysql-reader",
        11,
        dir.path(),
    );
    assert_eq!(
        got.iter().filter(|(_, v)| v["op"] == "c").count(),
        10,
        "{got:?}"
    );
    let update = got
        .iter()
        .find(|(_, v)| v["op"] == "u")
        .expect("the update");
    assert_eq!(update.0, json!({"id": 7}), "key is the primary key as JSON");
    assert_eq!(update.1["before"]["amount"], json!(1));
    assert_eq!(update.1["after"]["amount"], json!(2));
    assert_eq!(update.1["source"]["table"], json!("orders"));
    stop_run(&mut child, dir.path(), 1);
}

/// `[[redact]]` through the binary: the file's rules reach both outputs. A hashed
/// column's clear value is in no Kafka record (snapshot READ, create, update), no
/// changefeed page and not in the changefeed's store file; the hash is the HMAC under
/// the key from the environment, which the log never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_columns_leave_neither_the_sink_nor_the_changefeed_in_clear() {
    const KEY: &str = "cli-test-key-0123456789abcdef";
    let kafka = broker();
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, ssn text);
         ALTER TABLE users REPLICA IDENTITY FULL;
         INSERT INTO users VALUES (1, 'ann.secret@example.com', '987-65-4301');",
    )
    .await
    .unwrap();
    create_topic(&kafka.bootstrap(), "pii").await;
    let dir = tempfile::tempdir().unwrap();
    let (port, feed) = (free_port(), free_port());
    let store = dir.path().join("feed.redb");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "postgres"
url = "{}"
slot = "freshen_pii"
publication = "freshen_pii"
tables = ["public.users"]

[http]
listen = "127.0.0.1:{port}"

[[sinks]]
kind = "kafka"
brokers = "{}"
topic = "pii"
topic_mode = "single"
snapshot = "initial"

[changefeed]
path = "{}"
snapshot = "initial"

[changefeed.http]
listen = "127.0.0.1:{feed}"

[[redact]]
table = "public.users"
column = "email"
action = "hash"
key_env = "FRESHEN_PII_KEY"

[[redact]]
table = "users"
column = "ssn"
action = "drop"
"#,
            pg.url(),
            kafka.bootstrap(),
            store.display()
        ),
    );
    let mut child = spawn_run_env(dir.path(), &cfg, 1, &[("FRESHEN_PII_KEY", KEY)]);
    let metrics = format!("http://127.0.0.1:{port}");
    let base = format!("http://127.0.0.1:{feed}");
    wait_http(&metrics, "/healthz", 200, DEADLINE).await;
    // Both snapshots done before the writes, so each reads row 1 as it was (the
    // library tests cover snapshots among writes).
    freshen_testenv::refresher::eventually(60, "both initial snapshots done", || async {
        let sink: Value =
            serde_json::from_str(&wait_http(&metrics, "/status", 200, DEADLINE).await).unwrap();
        let feed: Value =
            serde_json::from_str(&wait_http(&base, "/changefeed/snapshot", 200, DEADLINE).await)
                .unwrap();
        (sink["sink_snapshots"][0]["tables"][0]["state"] == "done"
            && feed["snapshots"][0]["state"] == "done")
            .then_some(())
    })
    .await;
    c.execute(
        "INSERT INTO users VALUES (2, 'bob.secret@example.com', '987-65-4302')",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "UPDATE users SET email = 'ann.changed@example.com' WHERE id = 1",
        &[],
    )
    .await
    .unwrap();

    // The snapshot's READ of row 1, the insert and the update.
    let got = consume(&kafka.bootstrap(), "pii", "reader", 3, dir.path());
    let deadline = Instant::now() + DEADLINE;
    let events = loop {
        let events = changefeed_events(&base).await;
        if events.len() >= 3 {
            break events;
        }
        assert!(Instant::now() < deadline, "changefeed events: {events:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop_run(&mut child, dir.path(), 1);

    let hash =
        |v: &str| freshen_codec::hmac_hex(&freshen_codec::HashKey::new(KEY.as_bytes().to_vec()), v);
    let text = format!("{got:?} {events:?}");
    for clear in ["secret@example", "changed@example", "987-65"] {
        assert!(!text.contains(clear), "{clear:?} left freshen: {text}");
    }
    // Two partitions: row 1's records keep their order, row 2's may come first.
    let mut ops: Vec<&str> = got.iter().map(|(_, v)| v["op"].as_str().unwrap()).collect();
    ops.sort_unstable();
    assert_eq!(ops, ["c", "r", "u"], "{got:?}");
    let row1 = json!(hash("ann.secret@example.com"));
    let read = got.iter().find(|(_, v)| v["op"] == "r").expect("a READ");
    assert_eq!(read.1["after"]["email"], row1, "{read:?}");
    assert!(read.1["after"].get("ssn").is_none(), "{read:?}");
    let update = got
        .iter()
        .find(|(_, v)| v["op"] == "u")
        .expect("the update");
    assert_eq!(
        update.1["after"]["email"],
        json!(hash("ann.changed@example.com"))
    );
    assert_eq!(
        update.1["before"]["email"],
        json!(hash("ann.secret@example.com"))
    );
    let cf_read = events
        .iter()
        .find(|e| e["op"] == "read")
        .expect("the changefeed's snapshot read");
    let row: Value = serde_json::from_str(cf_read["value"].as_str().unwrap()).unwrap();
    assert_eq!(row["email"], row1, "{row}");
    let bytes = std::fs::read(&store).unwrap();
    for clear in ["secret@example", "changed@example", "987-65"] {
        assert!(
            !bytes.windows(clear.len()).any(|w| w == clear.as_bytes()),
            "{clear:?} in the store file"
        );
    }
    let log = log_of(dir.path(), 1);
    assert!(!log.contains(KEY), "the key in the log: {log}");
}
