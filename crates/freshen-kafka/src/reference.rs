//! The keys of Kafka's kinds: `[source] kind = "kafka"`
//! (`freshen_kafka::KafkaSourceConfig`), `[[sinks]] kind = "kafka"`
//! (`freshen_kafka::KafkaSinkConfig`), `[[sinks]] kind = "kafka-outbox"`
//! (`freshen_kafka::KafkaOutboxConfig`) and `[key_stream]`
//! (`freshen_kafka::KeyStreamConfig`).

use freshen::reference::{Documented, Omitted::*, Range::*, Table, key};

const SOURCE: Table = Table {
    header: "[source] kind = \"kafka\"",
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

const SINK: Table = Table {
    header: "[[sinks]] kind = \"kafka\"",
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

const OUTBOX: Table = Table {
    header: "[[sinks]] kind = \"kafka-outbox\"",
    about: "Relays a transactional outbox table as Debezium's outbox event router does: each inserted row becomes one record on its `aggregatetype`'s topic, keyed by `aggregateid`, with headers `id` and `type` and the `payload` as value; updates and deletes are ignored and the rows are never deleted by freshen; a batch is acknowledged (the slot advances) once the broker acknowledged every record of it.",
    keys: &[
        key(
            "brokers",
            "string or array of strings",
            Required("\"k1:9092\""),
            Any,
            "Bootstrap brokers: `\"host:port,host:port\"` or a list of `\"host:port\"`.",
        ),
        key(
            "table",
            "string",
            Required("\"public.outbox\""),
            Any,
            "The outbox table as `schema.table`; the source captures it (it need not be in `[source] tables`).",
        ),
        key(
            "topic",
            "string",
            Is("\"outbox.event.{routedByValue}\""),
            Any,
            "The topic pattern: `{routedByValue}` becomes the row's aggregate type (characters a topic name may not hold become `_`); Debezium's `${routedByValue}` without the `$`, since `${…}` reads the environment.",
        ),
        key(
            "dead_letter_topic",
            "string",
            Required("\"outbox.dead-letter\""),
            Any,
            "Where a malformed row goes (no id, aggregate type or aggregate id, or a payload the encoding refuses), with header `freshen.error` giving the reason.",
        ),
        key(
            "id_column",
            "string",
            Is("\"id\""),
            Any,
            "The column of the event's unique id, sent as header `id` for consumer-side deduplication.",
        ),
        key(
            "aggregate_type_column",
            "string",
            Is("\"aggregatetype\""),
            Any,
            "The column whose value routes the row to a topic.",
        ),
        key(
            "aggregate_id_column",
            "string",
            Is("\"aggregateid\""),
            Any,
            "The column that keys the record: one aggregate's events share a partition, in order.",
        ),
        key(
            "type_column",
            "string",
            Is("\"type\""),
            Any,
            "The column of the event type, sent as header `type` (NULL: no header).",
        ),
        key(
            "payload_column",
            "string",
            Is("\"payload\""),
            Any,
            "The column whose value is the record's value (NULL: a record without a value).",
        ),
        key(
            "payload_encoding",
            "string",
            Is("\"json\""),
            OneOf(&["json", "text", "bytes"]),
            "What the payload must be: a JSON document, UTF-8 text, or any bytes.",
        ),
        key(
            "delivery_timeout_ms",
            "integer",
            Is("30000"),
            Int(1, 2_147_483_647),
            "How long a record may take to be acknowledged by every in-sync replica, retries included, in ms; past it the relay fails and its batch is not acknowledged.",
        ),
        key(
            "properties",
            "table of strings",
            Is("{}"),
            Any,
            "More librdkafka properties, applied last; `bootstrap.servers`, `enable.idempotence` and `acks` are freshen's.",
        ),
    ],
};

const KEY_STREAM: Table = Table {
    header: "[key_stream]",
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

impl Documented for crate::KafkaSourceConfig {
    const REFERENCE: &'static [Table] = &[SOURCE];
}

impl Documented for crate::KafkaSinkConfig {
    const REFERENCE: &'static [Table] = &[SINK];
}

impl Documented for crate::KafkaOutboxConfig {
    const REFERENCE: &'static [Table] = &[OUTBOX];
}

impl Documented for crate::KeyStreamConfig {
    const REFERENCE: &'static [Table] = &[KEY_STREAM];
}

#[cfg(test)]
mod tests {
    use freshen_testenv::reference::{fields, same_keys};

    use super::*;

    #[test]
    fn every_key_the_parser_accepts_is_documented_and_no_other() {
        same_keys(&SOURCE, fields::<crate::KafkaSourceConfig>());
        same_keys(&SINK, fields::<crate::KafkaSinkConfig>());
        same_keys(&OUTBOX, fields::<crate::KafkaOutboxConfig>());
        same_keys(&KEY_STREAM, fields::<crate::KeyStreamConfig>());
    }
}
