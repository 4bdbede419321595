//! `PulsarSourceConfig`: the source's settings, as the `freshen` binary reads them.

use std::fmt;

use freshen_codec::Format;
use serde::Deserialize;

use crate::connection::addresses;

/// The most messages in one batch: a batch is held in memory.
const MAX_BATCH: usize = 1_000_000;
/// The longest a batch waits for more messages: past a minute it only delays.
const MAX_LINGER_MS: u64 = 60_000;
/// The most messages the broker may push ahead: each is held in memory.
const MAX_RECEIVER_QUEUE: u32 = 1_000_000;

/// The Pulsar source: a failover subscription on one topic.
///
/// ```toml
/// [source]
/// kind = "pulsar"
/// url = "pulsar://127.0.0.1:6650"
/// topic = "persistent://public/default/tidb-changes"
/// subscription = "freshen-readings"
/// format = "canal-json"
/// ```
///
/// `Debug` never shows the token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PulsarSourceConfig {
    /// Service URL: `pulsar://host:port` (several hosts: `pulsar://a:6650,b:6650`).
    pub url: String,
    /// The topic: `persistent://tenant/namespace/name`, or a short name meaning
    /// `persistent://public/default/<name>`. One partition of a partitioned topic is
    /// `…/<name>-partition-<n>`: run one source per partition.
    pub topic: String,
    /// Subscription name. Every instance with the same name shares one failover
    /// subscription: one is active, the others wait and take over when it goes.
    pub subscription: String,
    /// This consumer's name (default: `freshen-<random>`); the broker picks the active
    /// consumer of a failover subscription by name order.
    #[serde(default)]
    pub consumer_name: Option<String>,
    /// Wire format of the messages (default `"canal-json"`, what TiCDC writes).
    #[serde(default = "default_format")]
    pub format: Format,
    /// Most messages in one batch (default 1000).
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// How long a batch waits for more messages after its first, in ms (default 10).
    #[serde(default = "default_linger_ms")]
    pub batch_linger_ms: u64,
    /// Messages the broker may push ahead of processing (flow permits; default 1000).
    #[serde(default = "default_receiver_queue")]
    pub receiver_queue: u32,
    /// Authentication token (JWT), sent as Pulsar's `token` method. Never logged.
    #[serde(default)]
    pub token: Option<String>,
}

/// A topic's full name: a short name means `persistent://public/default/<name>`.
pub fn full_topic(topic: &str) -> String {
    if topic.contains("://") {
        topic.to_owned()
    } else {
        format!("persistent://public/default/{topic}")
    }
}

fn default_format() -> Format {
    Format::CanalJson
}

fn default_max_batch() -> usize {
    1000
}

fn default_linger_ms() -> u64 {
    10
}

fn default_receiver_queue() -> u32 {
    1000
}

impl PulsarSourceConfig {
    /// A configuration with the defaults for everything optional.
    pub fn new(
        url: impl Into<String>,
        topic: impl Into<String>,
        subscription: impl Into<String>,
    ) -> PulsarSourceConfig {
        PulsarSourceConfig {
            url: url.into(),
            topic: topic.into(),
            subscription: subscription.into(),
            consumer_name: None,
            format: default_format(),
            max_batch: default_max_batch(),
            batch_linger_ms: default_linger_ms(),
            receiver_queue: default_receiver_queue(),
            token: None,
        }
    }

    /// Sets the consumer name.
    pub fn consumer_name(mut self, name: impl Into<String>) -> PulsarSourceConfig {
        self.consumer_name = Some(name.into());
        self
    }

    /// Sets the wire format.
    pub fn format(mut self, format: Format) -> PulsarSourceConfig {
        self.format = format;
        self
    }

    /// Sets the most messages per batch.
    pub fn max_batch(mut self, n: usize) -> PulsarSourceConfig {
        self.max_batch = n;
        self
    }

    /// The topic's full name.
    pub fn full_topic(&self) -> String {
        full_topic(&self.topic)
    }

    /// Every problem with this configuration, one sentence each (empty: valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if let Err(e) = addresses(&self.url) {
            p.push(format!("url {e}"));
        }
        let topic = self.full_topic();
        let valid = topic
            .strip_prefix("persistent://")
            .or_else(|| topic.strip_prefix("non-persistent://"))
            .is_some_and(|rest| {
                rest.split('/').count() == 3 && rest.split('/').all(|s| !s.is_empty())
            });
        if !valid {
            p.push(format!(
                "topic {:?} is not `name` or `persistent://tenant/namespace/name`",
                self.topic
            ));
        }
        if self.subscription.trim().is_empty() {
            p.push("subscription must not be empty".into());
        }
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            p.push(format!("max_batch must be between 1 and {MAX_BATCH}"));
        }
        if self.batch_linger_ms > MAX_LINGER_MS {
            p.push(format!(
                "batch_linger_ms must be at most {MAX_LINGER_MS} (a minute)"
            ));
        }
        if !(2..=MAX_RECEIVER_QUEUE).contains(&self.receiver_queue) {
            p.push(format!(
                "receiver_queue must be between 2 and {MAX_RECEIVER_QUEUE}"
            ));
        }
        p
    }
}

impl fmt::Debug for PulsarSourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulsarSourceConfig")
            .field("url", &self.url)
            .field("topic", &self.topic)
            .field("subscription", &self.subscription)
            .field("consumer_name", &self.consumer_name)
            .field("format", &self.format)
            .field("max_batch", &self.max_batch)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .field("receiver_queue", &self.receiver_queue)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_and_names() {
        let ok = PulsarSourceConfig::new("pulsar://h:6650", "cdc", "s");
        assert!(ok.problems().is_empty());
        assert_eq!(ok.full_topic(), "persistent://public/default/cdc");
        let mut bad = PulsarSourceConfig::new("http://h", "persistent://x/y", " ");
        bad.max_batch = 0;
        bad.receiver_queue = 1;
        assert_eq!(bad.problems().len(), 5, "{:?}", bad.problems());
    }

    #[test]
    fn debug_hides_the_token() {
        let mut c = PulsarSourceConfig::new("pulsar://h:6650", "cdc", "s");
        c.token = Some("eyJsecret".into());
        assert!(!format!("{c:?}").contains("eyJsecret"));
    }
}

#[cfg(test)]
mod embedding {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    enum SourceKind {
        Pulsar(PulsarSourceConfig),
    }

    #[test]
    fn embeds_with_a_kind_tag_and_rejects_unknown_fields() {
        let SourceKind::Pulsar(c) = serde_json::from_str(
            r#"{"kind":"pulsar","url":"pulsar://h:6650","topic":"cdc","subscription":"s"}"#,
        )
        .unwrap();
        assert_eq!(c.format, Format::CanalJson);
        assert!(c.problems().is_empty());
        let typo = serde_json::from_str::<SourceKind>(
            r#"{"kind":"pulsar","url":"pulsar://h:6650","topic":"cdc","subscripton":"s"}"#,
        );
        assert!(typo.is_err());
    }
}
