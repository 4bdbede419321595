//! Configuration of the key stream, shared by its two ends: the capture instance that
//! publishes dirtied keys and the workers that consume them as a group.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::config::{Redacted, bad_topic, brokers, reserved};

/// Properties freshen sets itself on either end (see the source's and the sink's).
const RESERVED: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "partition.assignment.strategy",
];

/// The key stream: a topic of dirtied scope keys between one capture instance and a
/// group of workers (see docs/scaling.md).
///
/// ```toml
/// [key_stream]
/// brokers = "127.0.0.1:9092"
/// topic = "freshen-keys"        # create it with as many partitions as workers may run
/// group = "freshen-workers"
/// ```
///
/// `Debug` shows property names but never their values.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyStreamConfig {
    /// Bootstrap brokers: `"host:port,host:port"` or a list of `"host:port"`.
    #[serde(deserialize_with = "brokers")]
    pub brokers: String,
    /// The topic. It must exist; its partition count caps how many workers share the
    /// work, and must not change while instances run (keys would change owners).
    pub topic: String,
    /// The workers' consumer group.
    pub group: String,
    /// Group session timeout in ms (default 10000): how long a worker that died keeps its
    /// partitions. Keep it above the views' `statement_timeout` (see docs/scaling.md).
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u32,
    /// How long a worker losing partitions in a rebalance waits for its running rebuilds
    /// of their keys, in ms (default 30000). The rebalance completes only then; a
    /// rebuild still running after it is reported (its statement ends at the view's
    /// `statement_timeout`).
    #[serde(default = "default_revoke_timeout_ms")]
    pub revoke_timeout_ms: u32,
    /// Most records in one worker batch (default 1000).
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// How long a worker batch waits for more records after its first, in ms (default 10).
    #[serde(default = "default_linger_ms")]
    pub batch_linger_ms: u64,
    /// How long the capture instance lets the producer retry a record before giving up,
    /// in ms (default 30000); then its transaction stays unconfirmed and is replayed.
    #[serde(default = "default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u32,
    /// More librdkafka properties (`security.protocol`, `sasl.username`, …) for both
    /// ends, applied last; the ones freshen's promises rest on cannot be set.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_session_timeout_ms() -> u32 {
    10_000
}

fn default_revoke_timeout_ms() -> u32 {
    30_000
}

fn default_max_batch() -> usize {
    1000
}

fn default_linger_ms() -> u64 {
    10
}

fn default_delivery_timeout_ms() -> u32 {
    30_000
}

impl KeyStreamConfig {
    /// A configuration with the defaults for everything optional.
    pub fn new(
        brokers: impl Into<String>,
        topic: impl Into<String>,
        group: impl Into<String>,
    ) -> KeyStreamConfig {
        KeyStreamConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            group: group.into(),
            session_timeout_ms: default_session_timeout_ms(),
            revoke_timeout_ms: default_revoke_timeout_ms(),
            max_batch: default_max_batch(),
            batch_linger_ms: default_linger_ms(),
            delivery_timeout_ms: default_delivery_timeout_ms(),
            properties: BTreeMap::new(),
        }
    }

    /// Sets the group session timeout (ms).
    pub fn session_timeout_ms(mut self, ms: u32) -> KeyStreamConfig {
        self.session_timeout_ms = ms;
        self
    }

    /// Adds a librdkafka property.
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
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
        if self.group.trim().is_empty() {
            p.push("group must not be empty".into());
        }
        if !(1000..=3_600_000).contains(&self.session_timeout_ms) {
            p.push(
                "session_timeout_ms must be between 1000 and 3600000 (librdkafka's range)".into(),
            );
        }
        if self.revoke_timeout_ms > 3_600_000 {
            p.push("revoke_timeout_ms must be at most 3600000 (an hour)".into());
        }
        if !(1..=1_000_000).contains(&self.max_batch) {
            p.push("max_batch must be between 1 and 1000000".into());
        }
        if self.batch_linger_ms > 60_000 {
            p.push("batch_linger_ms must be at most 60000 (a minute)".into());
        }
        if self.delivery_timeout_ms == 0 || self.delivery_timeout_ms > i32::MAX as u32 {
            p.push(format!(
                "delivery_timeout_ms must be between 1 and {}",
                i32::MAX
            ));
        }
        reserved(&self.properties, RESERVED, &mut p);
        p
    }
}

impl fmt::Debug for KeyStreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStreamConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("revoke_timeout_ms", &self.revoke_timeout_ms)
            .field("max_batch", &self.max_batch)
            .field("batch_linger_ms", &self.batch_linger_ms)
            .field("delivery_timeout_ms", &self.delivery_timeout_ms)
            .field("properties", &Redacted(&self.properties))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_at_once_and_no_secret_shown() {
        let mut c = KeyStreamConfig::new(" ", "bad topic", "")
            .property("partition.assignment.strategy", "range")
            .property("sasl.password", "hunter2");
        c.max_batch = 0;
        c.session_timeout_ms = 5;
        let p = c.problems();
        assert_eq!(p.len(), 6, "{p:#?}");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(
            KeyStreamConfig::new("b:9092", "keys", "workers")
                .problems()
                .is_empty()
        );
    }
}
