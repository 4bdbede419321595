//! Configuration of the source and the sink, as the `freshen` binary reads it from TOML.

use std::collections::BTreeMap;
use std::fmt;

use freshen_codec::Format;
use serde::{Deserialize, Deserializer};

/// librdkafka properties freshen sets itself: overriding them would break its promises
/// (offsets committed only after acknowledgement, idempotent all-replica delivery).
const RESERVED_CONSUMER: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
];
pub(crate) const RESERVED_PRODUCER: &[&str] = &[
    "bootstrap.servers",
    "enable.idempotence",
    "acks",
    "request.required.acks",
];

/// The most messages in one batch: a batch is held in memory.
const MAX_BATCH: usize = 1_000_000;
/// The longest a batch waits for more messages: past a minute it only delays.
const MAX_LINGER_MS: u64 = 60_000;
/// librdkafka's upper bound for `session.timeout.ms` (an hour).
const MAX_SESSION_TIMEOUT_MS: u32 = 3_600_000;
/// librdkafka's upper bound for `message.timeout.ms`.
const MAX_DELIVERY_TIMEOUT_MS: u32 = i32::MAX as u32;

/// Where a consumer group without a committed offset starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartFrom {
    /// The oldest retained message (the default: nothing is missed).
    #[default]
    Earliest,
    /// Only messages produced from now on.
    Latest,
}

/// The Kafka source: a consumer group reading change events.
///
/// ```toml
/// [source]
/// kind = "kafka"
/// brokers = "127.0.0.1:9092"          # or a list
/// topics = ["tidb-changes"]
/// group = "freshen-readings"
/// format = "canal-json"               # or "debezium"
/// dead_letter_topic = "freshen-dlq"   # optional
/// ```
///
/// `Debug` shows property names but never their values (they may hold credentials).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap brokers: `"host:port,host:port"` or a list of `"host:port"`.
    #[serde(deserialize_with = "brokers")]
    pub brokers: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Consumer group id. Consumers sharing it split the partitions between them.
    pub group: String,
    /// Wire format of the messages: `"canal-json"` or `"debezium"`.
    pub format: Format,
    /// Topic that receives a copy of every message that cannot be decoded (with headers
    /// naming the error and the original topic, partition and offset) before it is
    /// skipped. Without it such messages are only skipped, counted and reported.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Where a group without a committed offset starts: `"earliest"` (default) or
    /// `"latest"`.
    #[serde(default)]
    pub start: StartFrom,
    /// Most messages in one batch (default 1000).
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// How long a batch waits for more messages after its first one, in ms (default 10).
    #[serde(default = "default_linger_ms")]
    pub batch_linger_ms: u64,
    /// Group session timeout in ms (default 10000): how long a dead consumer keeps its
    /// partitions.
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u32,
    /// More librdkafka properties (`security.protocol`, `sasl.username`, …), applied
    /// last. `bootstrap.servers`, `group.id`, `enable.auto.commit` and
    /// `enable.auto.offset.store` are freshen's and cannot be set here.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_max_batch() -> usize {
    1000
}

fn default_linger_ms() -> u64 {
    10
}

fn default_session_timeout_ms() -> u32 {
    10_000
}

impl KafkaSourceConfig {
    /// A configuration with the defaults for everything optional.
    pub fn new(
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
        group: impl Into<String>,
        format: Format,
    ) -> KafkaSourceConfig {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            group: group.into(),
            format,
            dead_letter_topic: None,
            start: StartFrom::default(),
            max_batch: default_max_batch(),
            batch_linger_ms: default_linger_ms(),
            session_timeout_ms: default_session_timeout_ms(),
            properties: BTreeMap::new(),
        }
    }

    /// Sets the dead-letter topic.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> KafkaSourceConfig {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// Sets where a new group starts.
    pub fn start(mut self, start: StartFrom) -> KafkaSourceConfig {
        self.start = start;
        self
    }

    /// Sets the most messages per batch.
    pub fn max_batch(mut self, n: usize) -> KafkaSourceConfig {
        self.max_batch = n;
        self
    }

    /// Sets the group session timeout (ms).
    pub fn session_timeout_ms(mut self, ms: u32) -> KafkaSourceConfig {
        self.session_timeout_ms = ms;
        self
    }

    /// Adds a librdkafka property.
    pub fn property(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> KafkaSourceConfig {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// Every problem with this configuration, one sentence each (empty: valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.brokers.trim().is_empty() {
            p.push("brokers must name at least one broker".into());
        }
        if self.topics.is_empty() {
            p.push("topics must name at least one topic".into());
        }
        for t in &self.topics {
            if let Some(why) = bad_topic(t) {
                p.push(format!("topic {t:?} {why}"));
            }
        }
        if self.group.trim().is_empty() {
            p.push("group must not be empty".into());
        }
        if let Some(t) = &self.dead_letter_topic {
            if let Some(why) = bad_topic(t) {
                p.push(format!("dead_letter_topic {t:?} {why}"));
            }
            if self.topics.contains(t) {
                p.push(format!(
                    "dead_letter_topic {t:?} is also a source topic: bad messages would loop"
                ));
            }
        }
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            p.push(format!("max_batch must be between 1 and {MAX_BATCH}"));
        }
        if self.batch_linger_ms > MAX_LINGER_MS {
            p.push(format!(
                "batch_linger_ms must be at most {MAX_LINGER_MS} (a minute)"
            ));
        }
        if !(1000..=MAX_SESSION_TIMEOUT_MS).contains(&self.session_timeout_ms) {
            p.push(format!(
                "session_timeout_ms must be between 1000 and {MAX_SESSION_TIMEOUT_MS} (librdkafka's range)"
            ));
        }
        reserved(&self.properties, RESERVED_CONSUMER, &mut p);
        p
    }
}

impl fmt::Debug for KafkaSourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSourceConfig")
            .field("brokers", &self.brokers)
            .field("topics", &self.topics)
            .field("group", &self.group)
            .field("format", &self.format)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("start", &self.start)
            .field("max_batch", &self.max_batch)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("properties", &Redacted(&self.properties))
            .finish()
    }
}

/// How the sink names topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicMode {
    /// One topic per table, `<topic>.<schema>.<table>` (Debezium's naming, with `topic`
    /// as its `topic.prefix`). The default.
    #[default]
    PerTable,
    /// Every change to the one topic `topic`.
    Single,
}

/// The Kafka sink: every captured change published in Debezium's envelope.
///
/// ```toml
/// [[sinks]]
/// kind = "kafka"
/// brokers = "127.0.0.1:9092"
/// topic = "shop"            # prefix: shop.public.orders, …
/// topic_mode = "per-table"  # or "single": everything to topic "shop"
/// ```
///
/// `Debug` shows property names but never their values.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap brokers: `"host:port,host:port"` or a list of `"host:port"`.
    #[serde(deserialize_with = "brokers")]
    pub brokers: String,
    /// The topic prefix (`per-table`) or the topic (`single`).
    pub topic: String,
    /// `"per-table"` (default) or `"single"`.
    #[serde(default)]
    pub topic_mode: TopicMode,
    /// The logical server name written in each event's `source.name` (default: `topic`).
    #[serde(default)]
    pub server_name: Option<String>,
    /// The database name written in each event's `source.db` (default: empty).
    #[serde(default)]
    pub database: Option<String>,
    /// How long a record may take to be acknowledged by every in-sync replica, retries
    /// included, in ms (default 30000). Past it the sink fails and its batch is not
    /// acknowledged.
    #[serde(default = "default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u32,
    /// More librdkafka properties (`compression.type`, `security.protocol`, …), applied
    /// last. `bootstrap.servers`, `enable.idempotence` and `acks` are freshen's.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_delivery_timeout_ms() -> u32 {
    30_000
}

impl KafkaSinkConfig {
    /// A configuration with the defaults for everything optional.
    pub fn new(
        brokers: impl Into<String>,
        topic: impl Into<String>,
        mode: TopicMode,
    ) -> KafkaSinkConfig {
        KafkaSinkConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            topic_mode: mode,
            server_name: None,
            database: None,
            delivery_timeout_ms: default_delivery_timeout_ms(),
            properties: BTreeMap::new(),
        }
    }

    /// Adds a librdkafka property.
    pub fn property(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> KafkaSinkConfig {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// Every problem with this configuration, one sentence each (empty: valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.brokers.trim().is_empty() {
            p.push("brokers must name at least one broker".into());
        }
        if let Some(why) = bad_topic(&self.topic) {
            p.push(format!("topic {:?} {why}", self.topic));
        }
        if !(1..=MAX_DELIVERY_TIMEOUT_MS).contains(&self.delivery_timeout_ms) {
            p.push(format!(
                "delivery_timeout_ms must be between 1 and {MAX_DELIVERY_TIMEOUT_MS} (librdkafka's range)"
            ));
        }
        reserved(&self.properties, RESERVED_PRODUCER, &mut p);
        p
    }
}

impl fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSinkConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("topic_mode", &self.topic_mode)
            .field("server_name", &self.server_name)
            .field("database", &self.database)
            .field("delivery_timeout_ms", &self.delivery_timeout_ms)
            .field("properties", &Redacted(&self.properties))
            .finish()
    }
}

/// Property names with their values hidden.
pub(crate) struct Redacted<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "***")))
            .finish()
    }
}

pub(crate) fn reserved(
    props: &BTreeMap<String, String>,
    reserved: &[&str],
    problems: &mut Vec<String>,
) {
    for name in props.keys() {
        if reserved.contains(&name.as_str()) {
            problems.push(format!(
                "property {name:?} is set by freshen and cannot be overridden"
            ));
        }
    }
}

/// Why `name` is not a valid Kafka topic name, if it is not.
pub(crate) fn bad_topic(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 249 {
        Some("is longer than 249 characters")
    } else if name == "." || name == ".." {
        Some("is not allowed")
    } else if !name.chars().all(valid_topic_char) {
        Some("may hold only ASCII letters, digits, '.', '_' and '-'")
    } else {
        None
    }
}

pub(crate) fn valid_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// `brokers` as a string or a list of strings.
pub(crate) fn brokers<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s,
        OneOrMany::Many(v) => v.join(","),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_all_listed() {
        let mut c = KafkaSourceConfig::new("", Vec::<String>::new(), "", Format::CanalJson)
            .dead_letter_topic("bad topic")
            .max_batch(0)
            .property("enable.auto.commit", "true");
        c.session_timeout_ms = 10;
        let p = c.problems();
        assert_eq!(p.len(), 7, "{p:#?}");
        let ok =
            KafkaSourceConfig::new("b:9092", ["t"], "g", Format::Debezium).dead_letter_topic("dlq");
        assert!(ok.problems().is_empty());
        let looped =
            KafkaSourceConfig::new("b:9092", ["t"], "g", Format::Debezium).dead_letter_topic("t");
        assert_eq!(looped.problems().len(), 1);
    }

    #[test]
    fn debug_hides_property_values() {
        let c = KafkaSinkConfig::new("b:9092", "shop", TopicMode::Single)
            .property("sasl.password", "hunter2");
        let shown = format!("{c:?}");
        assert!(shown.contains("sasl.password"));
        assert!(!shown.contains("hunter2"));
        let s = KafkaSourceConfig::new("b:9092", ["t"], "g", Format::Debezium)
            .property("sasl.password", "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(
            KafkaSinkConfig::new("b", "t", TopicMode::Single)
                .property("acks", "1")
                .problems()
                .len()
                == 1
        );
    }

    #[test]
    fn topic_names() {
        assert_eq!(bad_topic("a.b_c-1"), None);
        assert!(bad_topic("").is_some());
        assert!(bad_topic("..").is_some());
        assert!(bad_topic("a/b").is_some());
        assert!(bad_topic(&"x".repeat(250)).is_some());
    }
}

#[cfg(test)]
mod embedding {
    use super::*;

    /// How the binary embeds the configs: an internally tagged enum (`kind = "kafka"`).
    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    enum SourceKind {
        Kafka(KafkaSourceConfig),
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    enum SinkKind {
        Kafka(KafkaSinkConfig),
    }

    #[test]
    fn embeds_with_a_kind_tag_and_rejects_unknown_fields() {
        let SourceKind::Kafka(c) = serde_json::from_str(
            r#"{"kind":"kafka","brokers":["a:9092","b:9092"],"topics":["t"],"group":"g","format":"canal-json","dead_letter_topic":"dlq"}"#,
        )
        .unwrap();
        assert_eq!(c.brokers, "a:9092,b:9092");
        assert_eq!(c.format, Format::CanalJson);
        assert_eq!(c.max_batch, 1000);
        assert!(c.problems().is_empty());
        let typo = serde_json::from_str::<SourceKind>(
            r#"{"kind":"kafka","brokers":"a:9092","topics":["t"],"group":"g","format":"debezium","grup":"x"}"#,
        );
        assert!(typo.unwrap_err().to_string().contains("grup"));
        let SinkKind::Kafka(s) = serde_json::from_str(
            r#"{"kind":"kafka","brokers":"a:9092","topic":"shop","topic_mode":"single"}"#,
        )
        .unwrap();
        assert_eq!(s.topic_mode, TopicMode::Single);
        assert!(
            serde_json::from_str::<SinkKind>(
                r#"{"kind":"kafka","brokers":"a","topic":"t","topic_mode":"weird"}"#
            )
            .is_err()
        );
    }
}
