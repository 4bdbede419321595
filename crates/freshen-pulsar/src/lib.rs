//! Pulsar for freshen: [`PulsarSource`], change events (TiCDC's canal-json by default)
//! read through a failover subscription and acknowledged as the refresher releases
//! batches.
//!
//! # Why this crate speaks the protocol itself
//!
//! The `pulsar` crate (6.9) cannot consume from brokers that send messages without the
//! optional checksum section: its frame decoder reads a magic number and a checksum
//! without checking that the magic number is there, so every such MESSAGE frame fails
//! to decode ("Error decoding payload frame: Incomplete(Size(…))"), the crate drops the
//! connection, reconnects and subscribes again — in a loop. The protocol makes that
//! section optional (the official clients check for the magic number `0x0e01` first),
//! pulsar-lite never sends it, and Apache Pulsar forwards whatever the producer wrote.
//! The part of the protocol a consumer needs is small, so this crate speaks it: connect,
//! lookup, subscribe, flow, message (plain and batched, checksum verified when present),
//! cumulative ack, ping; protobuf messages derived with prost, so no `protoc` at build.
//!
//! A second, broker-side bug shaped one detail: pulsar-lite 0.2 refuses a subscription
//! whose consumer id another connection already holds ("Consumer 0 already exists"),
//! though ids are per connection in the protocol; every process's first consumer
//! is id 0 in most clients. [`PulsarSource`] picks random ids.
//!
//! # Not supported
//!
//! TLS (`pulsar+ssl://`), compressed and chunked entries (skipped and reported),
//! partitioned topics as one source (run one source per `-partition-N` topic).
//!
//! [`PulsarProducer`] publishes messages (tests, tools); freshen itself only consumes.

mod config;
mod connection;
mod error;
mod frame;
mod lookup;
mod plug;
mod producer;
mod proto;
mod reference;
mod source;
mod stats;

pub use config::{PulsarSourceConfig, full_topic};
pub use error::Error;
pub use producer::PulsarProducer;
pub use source::{MessageId, PulsarSource, SourceStatsHandle, Undecodable};
pub use stats::SourceStats;
