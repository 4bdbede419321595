//! The keys of Kafka's kinds: `[source] kind = "kafka"`
//! (`freshen_kafka::KafkaSourceConfig`), `[[sinks]] kind = "kafka"`
//! (`freshen_kafka::KafkaSinkConfig`) and `[key_stream]`
//! (`freshen_kafka::KeyStreamConfig`).

use super::{Omitted::*, Range::*, Table, key};

pub(super) const SOURCE: Table = Table {
    header: "[source] kind = \"kafka\"",
    feature: Some("kafka"),
    about: "Change messages (canal-json or Debezium JSON) from Kafka topics; offsets are the positions. Needs a `[target]`.",
    keys: &[
        key(
            "brokers",
            "string or array of strings",
            Required("\"k1:9092,k2:9092\""),
            Any,
            "Bootstrap brokers: `\"host:port,host:port\"` or a list of `\"host:port\"`.",
        ),
        key(
            "topics",
            "array of strings",
            Required("[\"cdc\"]"),
            Any,
            "Topics to consume.",
        ),
        key(
            "group",
            "string",
            Required("\"freshen\""),
            Any,
            "Consumer group id; consumers sharing it split the partitions.",
        ),
        key(
            "format",
            "string",
            Required("\"canal-json\""),
            OneOf(&["canal-json", "debezium"]),
            "Wire format of the messages.",
        ),
        key(
            "dead_letter_topic",
            "string",
            Unset("\"cdc-dead\""),
            Any,
            "Receives a copy of every message that cannot be decoded (headers name the error and the original topic, partition, offset) before it is skipped.",
        ),
        key(
            "start",
            "string",
            Is("\"earliest\""),
            OneOf(&["earliest", "latest"]),
            "Where a group without a committed offset starts.",
        ),
        key(
            "max_batch",
            "integer",
            Is("1000"),
            Int(1, 1_000_000),
            "Most messages in one batch.",
        ),
        key(
            "batch_linger_ms",
            "integer",
            Is("10"),
            Int(0, 60_000),
            "How long a batch waits for more messages after its first, in ms.",
        ),
        key(
            "session_timeout_ms",
            "integer",
            Is("10000"),
            Int(1000, 3_600_000),
            "Group session timeout in ms: how long a dead consumer keeps its partitions.",
        ),
        key(
            "properties",
            "table of strings",
            Is("{}"),
            Any,
            "More librdkafka properties (`security.protocol`, `sasl.username`, …), applied last; those freshen's promises rest on cannot be set.",
        ),
    ],
};

pub(super) const SINK: Table = Table {
    header: "[[sinks]] kind = \"kafka\"",
    feature: Some("kafka"),
    about: "Publishes every captured change as Debezium JSON, keyed by primary key, with an idempotent producer; a batch is acknowledged once every record is.",
    keys: &[
        key(
            "brokers",
            "string or array of strings",
            Required("\"k1:9092\""),
            Any,
            "Bootstrap brokers: `\"host:port,host:port\"` or a list of `\"host:port\"`.",
        ),
        key(
            "topic",
            "string",
            Required("\"app\""),
            Any,
            "The topic prefix (`per-table`: `<topic>.<schema>.<table>`) or the topic (`single`).",
        ),
        key(
            "topic_mode",
            "string",
            Is("\"per-table\""),
            OneOf(&["per-table", "single"]),
            "One topic per table, or one for all.",
        ),
        key(
            "server_name",
            "string",
            Derived("`topic`", "\"pg-main\""),
            Any,
            "The logical server name in each event's `source.name`.",
        ),
        key(
            "database",
            "string",
            Derived("empty", "\"app\""),
            Any,
            "The database name in each event's `source.db`.",
        ),
        key(
            "delivery_timeout_ms",
            "integer",
            Is("30000"),
            Int(1, 2_147_483_647),
            "How long a record may take to be acknowledged by every in-sync replica, retries included, in ms; past it the sink fails and its batch is not acknowledged.",
        ),
        key(
            "properties",
            "table of strings",
            Is("{}"),
            Any,
            "More librdkafka properties (`compression.type`, `security.protocol`, …), applied last; `bootstrap.servers`, `enable.idempotence` and `acks` are freshen's.",
        ),
    ],
};

pub(super) const KEY_STREAM: Table = Table {
    header: "[key_stream]",
    feature: Some("kafka"),
    about: "Rebuilds spread over several instances: `freshen run --role capture` publishes the views' dirty keys to a Kafka topic, `--role worker` instances share its partitions and rebuild.",
    keys: &[
        key(
            "brokers",
            "string or array of strings",
            Required("\"k1:9092\""),
            Any,
            "Bootstrap brokers: `\"host:port,host:port\"` or a list of `\"host:port\"`.",
        ),
        key(
            "topic",
            "string",
            Required("\"freshen-keys\""),
            Any,
            "The topic; it must exist, and its partition count (which caps the workers) must not change while instances run.",
        ),
        key(
            "group",
            "string",
            Required("\"freshen-workers\""),
            Any,
            "The workers' consumer group.",
        ),
        key(
            "session_timeout_ms",
            "integer",
            Is("10000"),
            Int(1000, 3_600_000),
            "How long a worker that died keeps its partitions, in ms; keep it above the views' `statement_timeout`.",
        ),
        key(
            "revoke_timeout_ms",
            "integer",
            Is("30000"),
            Int(0, 3_600_000),
            "How long a worker losing partitions in a rebalance waits for its running rebuilds of their keys, in ms.",
        ),
        key(
            "max_batch",
            "integer",
            Is("1000"),
            Int(1, 1_000_000),
            "Most records in one worker batch.",
        ),
        key(
            "batch_linger_ms",
            "integer",
            Is("10"),
            Int(0, 60_000),
            "How long a worker batch waits for more records after its first, in ms.",
        ),
        key(
            "delivery_timeout_ms",
            "integer",
            Is("30000"),
            Int(1, 2_147_483_647),
            "How long the capture instance lets the producer retry a record, in ms; then its transaction stays unconfirmed and is replayed.",
        ),
        key(
            "properties",
            "table of strings",
            Is("{}"),
            Any,
            "More librdkafka properties for both ends, applied last; those freshen's promises rest on cannot be set.",
        ),
    ],
};
