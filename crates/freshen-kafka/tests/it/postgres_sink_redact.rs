//! Column redaction in the Kafka sink against a real PostgreSQL and a real Kafka-protocol
//! broker: a redacted column's clear value is in no record (key, value, headers) —
//! neither the snapshot's READ records nor the live changes' before and after images —
//! and hashed columns carry the keyed HMAC of the value.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use freshen_codec::{HashKey, Mask, RedactAction, RedactRule, Redactor, hmac_hex};
use freshen_kafka::{KafkaSink, KafkaSinkConfig, TopicMode};
use freshen_postgres::{
    ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SinkSnapshotConfig, SinkSnapshots,
    SnapshotState, TableName,
};
use freshen_testenv::refresher::eventually;
use freshen_testenv::{KafkaFlavor, PgServer};
use rdkafka::message::{Headers, Message};
use serde_json::Value;
use support::*;
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

const TOPIC: &str = "pii.public.users";
const KEY: &[u8] = b"sink-test-key";

/// Each row's clear values: none may leave freshen.
const SECRETS: [(i32, &str, &str, &str); 3] = [
    (
        1,
        "ann.secret@example.com",
        "4111222233331111",
        "987-65-4301",
    ),
    (
        2,
        "bob.secret@example.com",
        "4111222233332222",
        "987-65-4302",
    ),
    (
        3,
        "cyd.secret@example.com",
        "4111222233333333",
        "987-65-4303",
    ),
];
/// Written live after the snapshot into row 1 (its before image holds the old ones).
const LIVE: (&str, &str) = ("ann.changed@example.com", "987-65-4399");

fn hashed(value: &str) -> String {
    hmac_hex(&HashKey::new(KEY.to_vec()), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_columns_are_in_no_kafka_record() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, TOPIC, 1).await;
    let (c, conn) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    c.batch_execute(
        "CREATE TABLE users (id int PRIMARY KEY, email text, card text, ssn text, city text);
         ALTER TABLE users REPLICA IDENTITY FULL;",
    )
    .await
    .unwrap();
    for (id, email, card, ssn) in SECRETS {
        c.execute(
            "INSERT INTO users VALUES ($1, $2, $3, $4, 'Oslo')",
            &[&id, &email, &card, &ssn],
        )
        .await
        .unwrap();
    }

    let users = TableName::new("public", "users");
    let source = PgSource::start(PgSourceConfig {
        connection: ConnectionConfig::from_url(&pg.url()).unwrap(),
        slot: "pii".into(),
        slot_mode: freshen_postgres::SlotMode::CreateIfMissing,
        publication: "pii".into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: vec![users.clone()],
        status_interval: Duration::from_millis(100),
        ..PgSourceConfig::default()
    })
    .await
    .expect("the PostgreSQL source");
    let pool =
        freshen_postgres::connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 2).unwrap();
    let snapshots = SinkSnapshots::new(SinkSnapshotConfig::new("kafka:pii", true).chunk_rows(2));
    let redactor = Redactor::new(vec![
        RedactRule::new(
            "public.users",
            "email",
            RedactAction::Hash(HashKey::new(KEY.to_vec())),
        ),
        RedactRule::new("users", "card", RedactAction::Mask(Mask::Fixed(6))),
        RedactRule::new("users", "ssn", RedactAction::Drop),
    ]);
    let sink = KafkaSink::new(&KafkaSinkConfig::new(
        &bootstrap,
        "pii",
        TopicMode::PerTable,
    ))
    .unwrap()
    .with_redactor(Arc::new(redactor));
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
        s.run(pool, vec![users], async {
            let _ = driver_stopped.await;
        })
        .await
        .expect("the snapshots run");
    });
    eventually(60, "the sink snapshot done", || async {
        snapshots
            .status()
            .into_iter()
            .any(|p| p.table == "users" && p.state == SnapshotState::Done)
            .then_some(())
    })
    .await;
    c.execute(
        "UPDATE users SET email = $1, ssn = $2 WHERE id = 1",
        &[&LIVE.0, &LIVE.1],
    )
    .await
    .unwrap();
    c.execute("DELETE FROM users WHERE id = 2", &[])
        .await
        .unwrap();

    // Every record up to the delete, as raw bytes and as JSON.
    let r = reader_from_start(&bootstrap, TOPIC, 1);
    let mut raw: Vec<u8> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !values.iter().any(|v| v["op"] == "d") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delete never reached the topic: {values:?}"
        );
        let Ok(msg) = tokio::time::timeout(Duration::from_secs(2), r.recv()).await else {
            continue;
        };
        let msg = msg.expect("a record");
        raw.extend_from_slice(msg.key().unwrap_or_default());
        if let Some(h) = msg.headers() {
            for h in h.iter() {
                raw.extend_from_slice(h.value.unwrap_or_default());
            }
        }
        if let Some(p) = msg.payload() {
            raw.extend_from_slice(p);
            values.push(serde_json::from_slice(p).unwrap());
        }
    }
    close("the topic's reader", r).await;
    let _ = stop_driver.send(());
    let _ = stop_sink.send(());
    driver.await.unwrap();
    sink.await.unwrap();

    let mut clear: Vec<&str> = SECRETS
        .iter()
        .flat_map(|(_, e, c, s)| [*e, *c, *s])
        .collect();
    clear.extend([LIVE.0, LIVE.1, "secret@example", "987-65", "41112222"]);
    let text = String::from_utf8_lossy(&raw);
    for leaked in clear {
        assert!(!text.contains(leaked), "{leaked:?} in a record: {text}");
    }
    let reads: Vec<&Value> = values.iter().filter(|v| v["op"] == "r").collect();
    assert_eq!(reads.len(), SECRETS.len(), "{values:?}");
    let read1 = reads
        .iter()
        .find(|v| v["after"]["id"] == 1)
        .expect("row 1 read");
    assert_eq!(read1["after"]["email"], hashed(SECRETS[0].1));
    assert_ne!(
        read1["after"]["email"],
        hmac_hex(&HashKey::new(b"another key".to_vec()), SECRETS[0].1),
        "the hash depends on the key"
    );
    assert_eq!(read1["after"]["card"], "******");
    assert_eq!(read1["after"]["city"], "Oslo");
    assert!(read1["after"].get("ssn").is_none(), "{read1}");
    let update = values.iter().find(|v| v["op"] == "u").expect("the update");
    assert_eq!(update["before"]["email"], hashed(SECRETS[0].1), "{update}");
    assert_eq!(update["after"]["email"], hashed(LIVE.0), "{update}");
    assert!(update["before"].get("ssn").is_none() && update["after"].get("ssn").is_none());
    let delete = values.iter().find(|v| v["op"] == "d").unwrap();
    assert_eq!(delete["before"]["email"], hashed(SECRETS[1].1), "{delete}");
}
