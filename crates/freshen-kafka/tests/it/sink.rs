//! The sink publishes every change once, in Debezium's envelope, keyed by primary key,
//! in order per key; a batch is acknowledged only after delivery; what it writes reads
//! back through the source's Debezium decoder.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use freshen::{Ack, Batch, Op, Row, RowEvent, Source, Tx, Value, channel};
use freshen_codec::{DebeziumJson, Decoded, Format};
use freshen_kafka::{KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig, TopicMode};
use freshen_testenv::KafkaFlavor;
use rdkafka::message::{Headers, Message};
use support::*;

fn order(id: i64, op: Op, status: &str, xid: u64) -> RowEvent {
    let row = Row::from_pairs([("id", Value::Int(id)), ("status", Value::text(status))]);
    let e = RowEvent::new("public", "orders", op)
        .with_pk(["id"])
        .with_tx(Tx {
            id: xid,
            commit: xid * 100,
            index: 0,
        });
    match op {
        Op::Delete => e.with_old(row),
        _ => e.with_new(row),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_arrives_once_in_order_per_key() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "shop.public.orders", 3).await;

    // 3 batches: inserts of 1..=6, updates of each, deletes of the even ones.
    let mut batches = vec![
        (1..=6)
            .map(|i| order(i, Op::Insert, "new", 10))
            .collect::<Vec<_>>(),
        (1..=6).map(|i| order(i, Op::Update, "paid", 11)).collect(),
        (1..=6)
            .filter(|i| i % 2 == 0)
            .map(|i| order(i, Op::Delete, "paid", 12))
            .collect(),
    ];
    let total: usize = batches.iter().map(Vec::len).sum();
    let acked = Arc::new(AtomicUsize::new(0));
    let (feed, source) = channel(4);
    let sink = KafkaSink::new(&KafkaSinkConfig::new(
        &bootstrap,
        "shop",
        TopicMode::PerTable,
    ))
    .unwrap();
    let sink = Arc::new(sink);
    let runner = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.run(source, std::future::pending()).await })
    };
    for events in batches.drain(..) {
        let acked = acked.clone();
        feed.send(Batch::new(
            events,
            Ack::new(move || {
                acked.fetch_add(1, Ordering::SeqCst);
            }),
        ))
        .await
        .unwrap();
    }
    drop(feed);
    tokio::time::timeout(DEADLINE, runner)
        .await
        .expect("the sink drains")
        .unwrap()
        .expect("the sink ran");
    assert_eq!(acked.load(Ordering::SeqCst), 3, "every batch acknowledged");
    let stats = sink.stats();
    assert_eq!(
        (stats.batches, stats.delivered as usize, stats.failed),
        (3, total, 0)
    );

    // Read the topic back: each change once, each key's changes in commit order.
    let reader = reader_from_start(&bootstrap, "shop.public.orders", 3);
    let mut decoder = DebeziumJson::new();
    let mut seen: Vec<(i64, Op, Option<u64>)> = Vec::new();
    while seen.len() < total {
        let msg = tokio::time::timeout(DEADLINE, reader.recv())
            .await
            .expect("all changes arrive")
            .unwrap();
        let key: serde_json::Value = serde_json::from_slice(msg.key().unwrap()).unwrap();
        let id = key["id"].as_i64().expect("key is the primary key");
        assert_eq!(key.as_object().unwrap().len(), 1);
        let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap()).unwrap();
        assert_eq!(value["source"]["table"], "orders");
        let Decoded::Rows(rows) = decoder.decode_with_key(msg.key(), msg.payload()).unwrap() else {
            panic!("a row change");
        };
        let e = &rows[0];
        assert_eq!(e.pk_names.iter().map(|c| &**c).collect::<Vec<_>>(), ["id"]);
        let image = e.new.as_ref().or(e.old.as_ref()).unwrap();
        assert_eq!(image.get("id"), Some(&Value::Int(id)));
        seen.push((id, e.op, e.tx.map(|t| t.id)));
    }
    for id in 1..=6 {
        let ops: Vec<Op> = seen.iter().filter(|s| s.0 == id).map(|s| s.1).collect();
        let want: &[Op] = if id % 2 == 0 {
            &[Op::Insert, Op::Update, Op::Delete]
        } else {
            &[Op::Insert, Op::Update]
        };
        assert_eq!(ops, want, "key {id}: once each, in order");
    }
    let extra = tokio::time::timeout(Duration::from_millis(300), reader.recv()).await;
    assert!(extra.is_err(), "nothing beyond the changes");
    close("the topic's reader", reader).await;

    // The source, in Debezium mode, reads the sink's output back as row events.
    let config =
        KafkaSourceConfig::new(&bootstrap, ["shop.public.orders"], "dbz", Format::Debezium)
            .session_timeout_ms(session_ms(KafkaFlavor::Noida));
    let mut source = KafkaSource::new(&config).unwrap();
    let mut events = 0;
    while events < total {
        let batch = tokio::time::timeout(DEADLINE, source.next_batch())
            .await
            .expect("a batch")
            .unwrap()
            .unwrap();
        assert!(batch.skipped().is_empty());
        events += batch.events().len();
    }
    assert_eq!(events, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeliverable_batch_is_not_acknowledged() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    // A topic that does not exist and may not be created on demand: undeliverable.
    let mut config = KafkaSinkConfig::new(&bootstrap, "no-such-topic", TopicMode::Single)
        .property("allow.auto.create.topics", "false");
    config.delivery_timeout_ms = 1500;
    let sink = KafkaSink::new(&config).unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let (feed, source) = channel(1);
    let a = acked.clone();
    feed.send(Batch::new(
        vec![order(1, Op::Insert, "new", 1)],
        Ack::new(move || {
            a.fetch_add(1, Ordering::SeqCst);
        }),
    ))
    .await
    .unwrap();
    let result = tokio::time::timeout(DEADLINE, sink.run(source, std::future::pending()))
        .await
        .expect("the sink gives up within its delivery timeout");
    match result {
        Err(freshen_kafka::Error::Delivery { topic, .. }) => assert_eq!(topic, "no-such-topic"),
        other => panic!("expected a delivery error, got {other:?}"),
    }
    assert_eq!(acked.load(Ordering::SeqCst), 0);
    assert_eq!(sink.stats().failed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_batches_in_flight_are_acknowledged_in_order() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap, "many", 4).await;
    let sink = Arc::new(
        KafkaSink::new(&KafkaSinkConfig::new(&bootstrap, "many", TopicMode::Single)).unwrap(),
    );
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (feed, source) = channel(8);
    let runner = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.run(source, std::future::pending()).await })
    };
    for b in 0..200 {
        let order = order.clone();
        let events = (0..3).map(|i| order_event(b * 3 + i)).collect();
        feed.send(Batch::new(
            events,
            Ack::new(move || order.lock().unwrap().push(b)),
        ))
        .await
        .unwrap();
    }
    drop(feed);
    tokio::time::timeout(DEADLINE, runner)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), (0..200).collect::<Vec<_>>());
    assert_eq!(sink.stats().delivered, 600);
}

fn order_event(id: i64) -> RowEvent {
    order(id, Op::Insert, "new", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_change_is_delete_tombstone_create() {
    let kafka = broker(KafkaFlavor::Noida);
    let bootstrap = kafka.bootstrap();
    // One partition: the three records' order across two keys is observable.
    create_topic(&bootstrap, "moves", 1).await;
    let sink = KafkaSink::new(&KafkaSinkConfig::new(
        &bootstrap,
        "moves",
        TopicMode::Single,
    ))
    .unwrap();
    let renamed = RowEvent::new("public", "users", Op::Update)
        .with_pk(["id"])
        .with_old(Row::from_pairs([("id", Value::text("alice"))]))
        .with_new(Row::from_pairs([
            ("id", Value::text("alice-renamed")),
            ("name", Value::text("Alice")),
        ]))
        .with_tx(Tx {
            id: 3,
            commit: 300,
            index: 0,
        });
    tokio::time::timeout(DEADLINE, sink.publish(&[renamed]))
        .await
        .expect("delivered in time")
        .unwrap();
    assert_eq!(sink.stats().delivered, 3);

    let reader = reader_from_start(&bootstrap, "moves", 1);
    let mut got = Vec::new();
    for _ in 0..3 {
        let msg = tokio::time::timeout(DEADLINE, reader.recv())
            .await
            .expect("all three records arrive")
            .unwrap();
        let headers: Vec<(String, Vec<u8>)> = msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        let op = msg.payload().map(|p| {
            let v: serde_json::Value = serde_json::from_slice(p).unwrap();
            v["op"].as_str().unwrap().to_owned()
        });
        got.push((
            String::from_utf8(msg.key().unwrap().to_vec()).unwrap(),
            op,
            headers,
        ));
    }
    let (old, new) = (r#"{"id":"alice"}"#, r#"{"id":"alice-renamed"}"#);
    assert_eq!(
        got,
        vec![
            (
                old.to_owned(),
                Some("d".to_owned()),
                vec![("__debezium.newkey".to_owned(), new.as_bytes().to_vec())]
            ),
            (old.to_owned(), None, vec![]),
            (
                new.to_owned(),
                Some("c".to_owned()),
                vec![("__debezium.oldkey".to_owned(), old.as_bytes().to_vec())]
            ),
        ]
    );
    close("the topic's reader", reader).await;
}
