//! Shared helpers for the Kafka integration tests: brokers, topics, TiCDC-shaped
//! messages, a recording rebuild, polling with deadlines.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use freshen::Key;
use freshen_testenv::{KafkaFlavor, KafkaServer};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

pub use freshen_testenv::refresher::{DEADLINE, Running, until};

/// Starts a broker; fails with the install hint when it is missing.
pub fn broker(flavor: KafkaFlavor) -> KafkaServer {
    KafkaServer::start_flavor(flavor).unwrap_or_else(|e| panic!("{flavor} broker: {e}"))
}

/// A session timeout each broker accepts and joins quickly with: noida enforces Kafka's
/// 6 s minimum; tansu holds a join for half the session timeout.
pub fn session_ms(flavor: KafkaFlavor) -> u32 {
    match flavor {
        KafkaFlavor::Tansu => 2000,
        _ => 6000,
    }
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(DEADLINE)),
        )
        .await
        .expect("create_topics");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
}

/// A producer for test messages.
pub fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()
        .expect("producer")
}

/// Produces `value` (with `key`) to `topic`'s `partition` and waits for delivery.
pub async fn send(p: &FutureProducer, topic: &str, partition: i32, key: &str, value: &[u8]) {
    p.send(
        FutureRecord::to(topic)
            .partition(partition)
            .key(key)
            .payload(value),
        DEADLINE,
    )
    .await
    .unwrap_or_else(|(e, _)| panic!("producing to {topic}[{partition}]: {e}"));
}

/// A TiCDC canal-json INSERT of one `demo.readings` row.
pub fn ticdc_insert(id: i64, device: &str, value: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"INSERT","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4}},"mysqlType":{{"id":"int","device":"varchar","value":"int"}},"old":null,"data":[{{"id":"{id}","device":"{device}","value":"{value}"}}]}}"#
    )
    .into_bytes()
}

/// A TiCDC canal-json UPDATE of a row too large for the topic, sent with its handle key
/// only (`large-message-handle-option=handle-key-only`).
pub fn ticdc_key_only(id: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"UPDATE","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4}},"mysqlType":{{"id":"int"}},"old":[{{"id":"{id}"}}],"data":[{{"id":"{id}"}}],"_tidb":{{"commitTs":434919270523076621,"onlyHandleKey":true}}}}"#
    )
    .into_bytes()
}

/// TiCDC's canal-json for `ALTER TABLE … TRUNCATE PARTITION` (a DDL of type ALTER).
pub fn ticdc_truncate_partition() -> Vec<u8> {
    br#"{"id":0,"database":"demo","table":"readings","pkNames":null,"isDdl":true,"type":"ALTER","es":1786358942713,"ts":1786358944991,"sql":"ALTER TABLE `demo`.`readings` TRUNCATE PARTITION `p0`","sqlType":null,"mysqlType":null,"data":null,"old":null}"#.to_vec()
}

/// A TiCDC canal-json UPDATE moving row `id` from `from` to `to`.
pub fn ticdc_update(id: i64, from: &str, to: &str, value: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"UPDATE","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4}},"mysqlType":{{"id":"int","device":"varchar","value":"int"}},"old":[{{"id":"{id}","device":"{from}","value":"{value}"}}],"data":[{{"id":"{id}","device":"{to}","value":"{value}"}}]}}"#
    )
    .into_bytes()
}

/// A TiCDC DDL message (no rows).
pub fn ticdc_ddl() -> Vec<u8> {
    br#"{"id":0,"database":"demo","table":"readings","pkNames":null,"isDdl":true,"type":"CREATE","es":1786358942713,"ts":1786358943021,"sql":"CREATE TABLE readings (id INT PRIMARY KEY, device VARCHAR(64), value INT)","sqlType":null,"mysqlType":null,"data":null,"old":null}"#.to_vec()
}

/// Keys rebuilt so far, in order.
#[derive(Clone, Default)]
pub struct Rebuilt(Arc<Mutex<Vec<Key>>>);

impl Rebuilt {
    pub fn push(&self, k: Key) {
        self.0.lock().unwrap().push(k);
    }

    pub fn all(&self) -> Vec<Key> {
        self.0.lock().unwrap().clone()
    }

    pub fn distinct(&self) -> BTreeSet<String> {
        self.all().iter().map(|k| k.to_string()).collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The group's committed offset for each partition of `topic` (`None`: nothing
/// committed).
pub fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer for offsets");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, DEADLINE)
        .expect("committed offsets");
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect()
}

/// The end offset (high watermark) of each partition of `topic`. The consumer is in no
/// group (see [`reader_from_start`]).
pub fn high_watermarks(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer for watermarks");
    (0..partitions)
        .map(|p| {
            c.fetch_watermarks(topic, p, DEADLINE)
                .expect("watermarks")
                .1
        })
        .collect()
}

/// A consumer of `topic`'s `partitions` partitions from their first record, assigned
/// by hand: it never joins its group (librdkafka needs a `group.id` to assign, not to
/// join one) and commits nothing. A subscribed member's drop waits — without a bound,
/// on the thread that drops it — until the broker has let it leave the group (rdkafka's
/// `BaseConsumer` drop polls until closed): a test that only reads a topic has no group
/// to leave.
pub fn reader_from_start(bootstrap: &str, topic: &str, partitions: i32) -> StreamConsumer {
    let r: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "freshen-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("a partition to read");
    }
    r.assign(&tpl).expect("the partitions assigned");
    r
}

/// Drops a Kafka client on a blocking thread and waits for it, failing past 60 s:
/// librdkafka's close blocks the thread it runs on, and a close still talking to the
/// broker when the test ends (the broker stopped as its locals drop) would hold the
/// runtime's shutdown without a word. Every test closes its clients before it ends,
/// after dropping (or detaching) the messages it read: librdkafka destroys a consumer
/// only once none of its messages is held, so a close with one still held waits out
/// the 60 s.
pub async fn close<T: Send + 'static>(what: &str, client: T) {
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::task::spawn_blocking(move || drop(client)),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} not closed within 60 s"))
    .unwrap_or_else(|e| panic!("closing {what}: {e}"));
}
