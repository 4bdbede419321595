//! Kafka for freshen.
//!
//! - [`KafkaSource`]: change events (canal-json from TiCDC or Canal, Debezium JSON) read
//!   as a consumer group. Offsets are committed per partition only up to what the
//!   refresher acknowledged, so with `AckPolicy::AfterRebuild` a crash loses nothing.
//!   Undecodable messages are skipped, counted and optionally copied to a dead-letter
//!   topic.
//! - [`KafkaSink`]: freshen's captured changes published in Debezium's envelope (key =
//!   the primary key as JSON) by an idempotent producer with `acks=all`; a batch is
//!   acknowledged upstream only once every record of it is delivered.
//!   [`KafkaSink::run_interleaved`] also publishes a snapshot's rows as READ events
//!   (`op` `r`) at their place in the stream (`freshen_postgres::SinkSnapshots`).
//! - [`KafkaOutbox`]: a transactional outbox table relayed as Debezium's outbox event
//!   router does (topic by `aggregatetype`, key `aggregateid`, headers `id` and `type`,
//!   value `payload`); malformed rows go to a dead-letter topic with the reason; a batch
//!   is acknowledged upstream only once the broker acknowledged all of it.
//! - The key stream, for rebuild work spread over many instances: a capture instance's
//!   [`KeyPublisher`] publishes each view's dirtied scope keys ([`KeyRecord`]) to the
//!   partition that owns them ([`partition_of`]); workers read them as a consumer group
//!   ([`KeySource`]), fence their rebuilds by partition ownership and commit offsets
//!   after the rebuilds, so single flight per key holds across instances.
//!
//! Both are configured by serde structs ([`KafkaSourceConfig`], [`KafkaSinkConfig`])
//! that the `freshen` binary embeds in its TOML.
//!
//! # Features
//!
//! librdkafka is built from source (bundled) with gzip (libz), lz4 and snappy.
//! - `ssl`: TLS to the brokers (librdkafka uses OpenSSL, not the project's rustls).
//! - `zstd`: zstd-compressed topics.

mod config;
mod context;
mod dead_letter;
mod error;
mod fence;
mod key_config;
mod key_publisher;
mod key_source;
mod keys;
mod offsets;
mod outbox;
mod plug;
mod reference;
mod sink;
mod source;
mod stats;

pub use config::{KafkaSinkConfig, KafkaSourceConfig, StartFrom, TopicMode};
pub use error::Error;
pub use key_config::KeyStreamConfig;
pub use key_publisher::{KeyPublisher, Keyer};
pub use key_source::{KeySource, KeyStreamProbe, ViewKeys};
pub use keys::{KeyDecodeError, KeyRecord, StreamRecord, partition_of};
pub use outbox::{KafkaOutbox, KafkaOutboxConfig, OutboxStats, PayloadEncoding, ROUTED_BY};
pub use sink::KafkaSink;
pub use source::{KafkaSource, SourceStatsHandle, Undecodable};
pub use stats::{SinkStats, SourceStats};
