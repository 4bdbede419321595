//! `KafkaOutboxConfig`: the `[[sinks]] kind = "kafka-outbox"` table.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::config::{RESERVED_PRODUCER, Redacted, bad_topic, brokers, reserved};

/// The placeholder of [`KafkaOutboxConfig::topic`] that becomes the row's
/// `aggregatetype`: Debezium's `${routedByValue}` without the `$`, because `${…}` in
/// freshen's file is an environment variable.
pub const ROUTED_BY: &str = "{routedByValue}";

/// How the payload column becomes the record's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PayloadEncoding {
    /// The payload must be a JSON document (a `json`/`jsonb` column, or text holding
    /// JSON); its text is the value. The default.
    #[default]
    Json,
    /// Any text, as UTF-8 (a `bytea` payload must be valid UTF-8).
    Text,
    /// The raw bytes (`bytea`), or text as UTF-8.
    Bytes,
}

/// A transactional outbox relayed to Kafka, following Debezium's outbox event router:
/// each row inserted into `table` becomes one record on the topic its `aggregatetype`
/// names, keyed by its `aggregateid`, with its `id` and `type` as headers and its
/// `payload` as the value.
///
/// ```toml
/// [[sinks]]
/// kind = "kafka-outbox"
/// brokers = "127.0.0.1:9092"
/// table = "public.outbox"                  # captured by the source
/// topic = "outbox.event.{routedByValue}"  # the default
/// dead_letter_topic = "outbox.dead-letter"
/// ```
///
/// `Debug` shows property names but never their values.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaOutboxConfig {
    /// Bootstrap brokers: `"host:port,host:port"` or a list of `"host:port"`.
    #[serde(deserialize_with = "brokers")]
    pub brokers: String,
    /// The outbox table, `schema.table` as the source names it.
    pub table: String,
    /// The topic pattern: [`ROUTED_BY`] becomes the row's aggregate type (characters a
    /// topic name may not hold become `_`). Default `outbox.event.{routedByValue}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Where a malformed row goes (no `id`, `aggregatetype` or `aggregateid`, or a
    /// payload the encoding refuses), with header `freshen.error` saying why.
    pub dead_letter_topic: String,
    /// The column of the event's unique id, sent as header `id` (default `id`).
    #[serde(default = "default_id_column")]
    pub id_column: String,
    /// The column routing to a topic (default `aggregatetype`).
    #[serde(default = "default_aggregate_type_column")]
    pub aggregate_type_column: String,
    /// The column that keys the record (default `aggregateid`): one aggregate's events
    /// share a partition, in order.
    #[serde(default = "default_aggregate_id_column")]
    pub aggregate_id_column: String,
    /// The column of the event type, sent as header `type` (default `type`; a NULL
    /// sends no header).
    #[serde(default = "default_type_column")]
    pub type_column: String,
    /// The column whose value is the record's value (default `payload`; NULL sends a
    /// record without a value, a tombstone).
    #[serde(default = "default_payload_column")]
    pub payload_column: String,
    /// `"json"` (default), `"text"` or `"bytes"`: what the payload must be.
    #[serde(default)]
    pub payload_encoding: PayloadEncoding,
    /// How long a record may take to be acknowledged by every in-sync replica, retries
    /// included, in ms (default 30000). Past it the relay fails and its batch is not
    /// acknowledged (the rows are read again after a restart).
    #[serde(default = "default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u32,
    /// More librdkafka properties, applied last. `bootstrap.servers`,
    /// `enable.idempotence` and `acks` are freshen's.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_topic() -> String {
    format!("outbox.event.{ROUTED_BY}")
}
fn default_id_column() -> String {
    "id".into()
}
fn default_aggregate_type_column() -> String {
    "aggregatetype".into()
}
fn default_aggregate_id_column() -> String {
    "aggregateid".into()
}
fn default_type_column() -> String {
    "type".into()
}
fn default_payload_column() -> String {
    "payload".into()
}
fn default_delivery_timeout_ms() -> u32 {
    30_000
}

impl KafkaOutboxConfig {
    /// A configuration with Debezium's column names and the defaults for everything
    /// optional.
    pub fn new(
        brokers: impl Into<String>,
        table: impl Into<String>,
        dead_letter_topic: impl Into<String>,
    ) -> KafkaOutboxConfig {
        KafkaOutboxConfig {
            brokers: brokers.into(),
            table: table.into(),
            topic: default_topic(),
            dead_letter_topic: dead_letter_topic.into(),
            id_column: default_id_column(),
            aggregate_type_column: default_aggregate_type_column(),
            aggregate_id_column: default_aggregate_id_column(),
            type_column: default_type_column(),
            payload_column: default_payload_column(),
            payload_encoding: PayloadEncoding::default(),
            delivery_timeout_ms: default_delivery_timeout_ms(),
            properties: BTreeMap::new(),
        }
    }

    /// Sets the topic pattern.
    pub fn topic(mut self, pattern: impl Into<String>) -> KafkaOutboxConfig {
        self.topic = pattern.into();
        self
    }

    /// The table as `(schema, table)`, when written `schema.table`.
    pub fn table_parts(&self) -> Option<(&str, &str)> {
        let (schema, table) = self.table.split_once('.')?;
        (!schema.is_empty() && !table.is_empty() && !table.contains('.')).then_some((schema, table))
    }

    /// Every problem with this configuration, one sentence each (empty: valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.brokers.trim().is_empty() {
            p.push("brokers must name at least one broker".into());
        }
        if self.table_parts().is_none() {
            p.push(format!(
                "table {:?} must be written schema.table (e.g. \"public.outbox\")",
                self.table
            ));
        }
        // The pattern with a plausible aggregate type must be a topic name.
        let sample = self.topic.replace(ROUTED_BY, "order");
        if let Some(why) = bad_topic(&sample) {
            p.push(format!("topic {:?} {why}", self.topic));
        }
        if let Some(why) = bad_topic(&self.dead_letter_topic) {
            p.push(format!(
                "dead_letter_topic {:?} {why}",
                self.dead_letter_topic
            ));
        } else if !self.topic.contains(ROUTED_BY) && self.topic == self.dead_letter_topic {
            p.push("dead_letter_topic must differ from topic".into());
        }
        let columns = [
            ("id_column", &self.id_column),
            ("aggregate_type_column", &self.aggregate_type_column),
            ("aggregate_id_column", &self.aggregate_id_column),
            ("type_column", &self.type_column),
            ("payload_column", &self.payload_column),
        ];
        for (i, (key, name)) in columns.iter().enumerate() {
            if name.is_empty() {
                p.push(format!("{key} must not be empty"));
            } else if let Some((other, _)) = columns[..i].iter().find(|(_, n)| n == name) {
                p.push(format!("{key} names column {name:?}, as {other} does"));
            }
        }
        if !(1..=i32::MAX as u32).contains(&self.delivery_timeout_ms) {
            p.push(
                "delivery_timeout_ms must be between 1 and 2147483647 (librdkafka's range)".into(),
            );
        }
        reserved(&self.properties, RESERVED_PRODUCER, &mut p);
        p
    }
}

impl fmt::Debug for KafkaOutboxConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaOutboxConfig")
            .field("brokers", &self.brokers)
            .field("table", &self.table)
            .field("topic", &self.topic)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("id_column", &self.id_column)
            .field("aggregate_type_column", &self.aggregate_type_column)
            .field("aggregate_id_column", &self.aggregate_id_column)
            .field("type_column", &self.type_column)
            .field("payload_column", &self.payload_column)
            .field("payload_encoding", &self.payload_encoding)
            .field("delivery_timeout_ms", &self.delivery_timeout_ms)
            .field("properties", &Redacted(&self.properties))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_listed() {
        let mut c = KafkaOutboxConfig::new("", "outbox", "bad topic").topic("a/{routedByValue}");
        c.type_column = "aggregateid".into();
        c.payload_column = String::new();
        c.delivery_timeout_ms = 0;
        c.properties.insert("acks".into(), "1".into());
        let p = c.problems();
        assert_eq!(p.len(), 8, "{p:#?}");
        assert!(
            p.iter()
                .any(|s| s.contains("type_column") && s.contains("aggregate_id_column"))
        );
        let ok = KafkaOutboxConfig::new("b:9092", "public.outbox", "dlq");
        assert!(ok.problems().is_empty(), "{:?}", ok.problems());
        assert_eq!(ok.table_parts(), Some(("public", "outbox")));
        let same = KafkaOutboxConfig::new("b:9092", "public.outbox", "dlq").topic("dlq");
        assert_eq!(same.problems().len(), 1);
    }

    #[test]
    fn debug_hides_property_values() {
        let mut c = KafkaOutboxConfig::new("b:9092", "public.outbox", "dlq");
        c.properties
            .insert("sasl.password".into(), "hunter2".into());
        let shown = format!("{c:?}");
        assert!(shown.contains("sasl.password") && !shown.contains("hunter2"));
    }
}
