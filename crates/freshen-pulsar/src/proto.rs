//! The subset of Pulsar's `PulsarApi.proto` this crate speaks, derived with prost (no
//! protoc at build time). Field numbers and types follow the upstream definitions; a
//! decoder skips the fields left out here. Enums travel as their varint values.

#![allow(missing_docs, unreachable_pub)]

/// `BaseCommand.Type` values used here.
pub(crate) mod kind {
    pub const CONNECT: i32 = 2;
    pub const CONNECTED: i32 = 3;
    pub const SUBSCRIBE: i32 = 4;
    pub const PRODUCER: i32 = 5;
    pub const SEND: i32 = 6;
    pub const SEND_RECEIPT: i32 = 7;
    pub const SEND_ERROR: i32 = 8;
    pub const MESSAGE: i32 = 9;
    pub const ACK: i32 = 10;
    pub const FLOW: i32 = 11;
    pub const SUCCESS: i32 = 13;
    pub const ERROR: i32 = 14;
    pub const CLOSE_PRODUCER: i32 = 15;
    pub const CLOSE_CONSUMER: i32 = 16;
    pub const PRODUCER_SUCCESS: i32 = 17;
    pub const PING: i32 = 18;
    pub const PONG: i32 = 19;
    pub const LOOKUP: i32 = 23;
    pub const LOOKUP_RESPONSE: i32 = 24;
    pub const ACTIVE_CONSUMER_CHANGE: i32 = 31;
}

/// `CommandSubscribe.SubType.Failover`.
pub(crate) const SUB_FAILOVER: i32 = 2;
/// `CommandSubscribe.InitialPosition.Earliest`.
pub(crate) const INITIAL_EARLIEST: i32 = 1;
/// `CommandAck.AckType.Cumulative`.
pub(crate) const ACK_CUMULATIVE: i32 = 1;
/// `CommandLookupTopicResponse.LookupType`.
pub(crate) const LOOKUP_REDIRECT: i32 = 0;
pub(crate) const LOOKUP_CONNECT: i32 = 1;
/// The protocol version announced (v12: what current clients speak; no optional features
/// needed here).
pub(crate) const PROTOCOL_VERSION: i32 = 12;

#[derive(Clone, PartialEq, prost::Message)]
pub struct MessageIdData {
    #[prost(uint64, required, tag = "1")]
    pub ledger_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub entry_id: u64,
    #[prost(int32, optional, tag = "3")]
    pub partition: Option<i32>,
    #[prost(int32, optional, tag = "4")]
    pub batch_index: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, required, tag = "1")]
    pub key: String,
    #[prost(string, required, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandConnect {
    #[prost(string, required, tag = "1")]
    pub client_version: String,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub auth_data: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "4")]
    pub protocol_version: Option<i32>,
    #[prost(string, optional, tag = "5")]
    pub auth_method_name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandConnected {
    #[prost(string, required, tag = "1")]
    pub server_version: String,
    #[prost(int32, optional, tag = "2")]
    pub protocol_version: Option<i32>,
    #[prost(int32, optional, tag = "3")]
    pub max_message_size: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandSubscribe {
    #[prost(string, required, tag = "1")]
    pub topic: String,
    #[prost(string, required, tag = "2")]
    pub subscription: String,
    #[prost(int32, required, tag = "3")]
    pub sub_type: i32,
    #[prost(uint64, required, tag = "4")]
    pub consumer_id: u64,
    #[prost(uint64, required, tag = "5")]
    pub request_id: u64,
    #[prost(string, optional, tag = "6")]
    pub consumer_name: Option<String>,
    #[prost(bool, optional, tag = "8")]
    pub durable: Option<bool>,
    #[prost(int32, optional, tag = "13")]
    pub initial_position: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandLookupTopic {
    #[prost(string, required, tag = "1")]
    pub topic: String,
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
    #[prost(bool, optional, tag = "3")]
    pub authoritative: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandLookupTopicResponse {
    #[prost(string, optional, tag = "1")]
    pub broker_service_url: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub response: Option<i32>,
    #[prost(uint64, required, tag = "4")]
    pub request_id: u64,
    #[prost(bool, optional, tag = "5")]
    pub authoritative: Option<bool>,
    #[prost(int32, optional, tag = "6")]
    pub error: Option<i32>,
    #[prost(string, optional, tag = "7")]
    pub message: Option<String>,
    #[prost(bool, optional, tag = "8")]
    pub proxy_through_service_url: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandFlow {
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    #[prost(uint32, required, tag = "2")]
    pub message_permits: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandMessage {
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    #[prost(message, required, tag = "2")]
    pub message_id: MessageIdData,
    #[prost(uint32, optional, tag = "3")]
    pub redelivery_count: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandAck {
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    #[prost(int32, required, tag = "2")]
    pub ack_type: i32,
    #[prost(message, repeated, tag = "3")]
    pub message_id: Vec<MessageIdData>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandSuccess {
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandError {
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    #[prost(int32, required, tag = "2")]
    pub error: i32,
    #[prost(string, required, tag = "3")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandCloseConsumer {
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandCloseProducer {
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub request_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandProducer {
    #[prost(string, required, tag = "1")]
    pub topic: String,
    #[prost(uint64, required, tag = "2")]
    pub producer_id: u64,
    #[prost(uint64, required, tag = "3")]
    pub request_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandProducerSuccess {
    #[prost(uint64, required, tag = "1")]
    pub request_id: u64,
    #[prost(string, required, tag = "2")]
    pub producer_name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandSend {
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    #[prost(int32, optional, tag = "3")]
    pub num_messages: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandSendReceipt {
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    #[prost(message, optional, tag = "3")]
    pub message_id: Option<MessageIdData>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandSendError {
    #[prost(uint64, required, tag = "1")]
    pub producer_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    #[prost(int32, required, tag = "3")]
    pub error: i32,
    #[prost(string, required, tag = "4")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandPing {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandPong {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommandActiveConsumerChange {
    #[prost(uint64, required, tag = "1")]
    pub consumer_id: u64,
    #[prost(bool, optional, tag = "2")]
    pub is_active: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BaseCommand {
    #[prost(int32, required, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub connect: Option<CommandConnect>,
    #[prost(message, optional, tag = "3")]
    pub connected: Option<CommandConnected>,
    #[prost(message, optional, tag = "4")]
    pub subscribe: Option<CommandSubscribe>,
    #[prost(message, optional, tag = "5")]
    pub producer: Option<CommandProducer>,
    #[prost(message, optional, tag = "6")]
    pub send: Option<CommandSend>,
    #[prost(message, optional, tag = "7")]
    pub send_receipt: Option<CommandSendReceipt>,
    #[prost(message, optional, tag = "8")]
    pub send_error: Option<CommandSendError>,
    #[prost(message, optional, tag = "9")]
    pub message: Option<CommandMessage>,
    #[prost(message, optional, tag = "10")]
    pub ack: Option<CommandAck>,
    #[prost(message, optional, tag = "11")]
    pub flow: Option<CommandFlow>,
    #[prost(message, optional, tag = "13")]
    pub success: Option<CommandSuccess>,
    #[prost(message, optional, tag = "14")]
    pub error: Option<CommandError>,
    #[prost(message, optional, tag = "15")]
    pub close_producer: Option<CommandCloseProducer>,
    #[prost(message, optional, tag = "16")]
    pub close_consumer: Option<CommandCloseConsumer>,
    #[prost(message, optional, tag = "17")]
    pub producer_success: Option<CommandProducerSuccess>,
    #[prost(message, optional, tag = "18")]
    pub ping: Option<CommandPing>,
    #[prost(message, optional, tag = "19")]
    pub pong: Option<CommandPong>,
    #[prost(message, optional, tag = "23")]
    pub lookup_topic: Option<CommandLookupTopic>,
    #[prost(message, optional, tag = "24")]
    pub lookup_topic_response: Option<CommandLookupTopicResponse>,
    #[prost(message, optional, tag = "31")]
    pub active_consumer_change: Option<CommandActiveConsumerChange>,
}

impl BaseCommand {
    /// A command of `kind` with no body set yet.
    pub(crate) fn of(kind: i32) -> BaseCommand {
        BaseCommand {
            r#type: kind,
            ..BaseCommand::default()
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MessageMetadata {
    #[prost(string, required, tag = "1")]
    pub producer_name: String,
    #[prost(uint64, required, tag = "2")]
    pub sequence_id: u64,
    #[prost(uint64, required, tag = "3")]
    pub publish_time: u64,
    #[prost(message, repeated, tag = "4")]
    pub properties: Vec<KeyValue>,
    #[prost(string, optional, tag = "6")]
    pub partition_key: Option<String>,
    #[prost(int32, optional, tag = "8")]
    pub compression: Option<i32>,
    #[prost(uint32, optional, tag = "9")]
    pub uncompressed_size: Option<u32>,
    #[prost(int32, optional, tag = "11")]
    pub num_messages_in_batch: Option<i32>,
    #[prost(bool, optional, tag = "25")]
    pub null_value: Option<bool>,
    #[prost(int32, optional, tag = "27")]
    pub num_chunks_from_msg: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SingleMessageMetadata {
    #[prost(message, repeated, tag = "1")]
    pub properties: Vec<KeyValue>,
    #[prost(string, optional, tag = "2")]
    pub partition_key: Option<String>,
    #[prost(int32, required, tag = "3")]
    pub payload_size: i32,
    #[prost(bool, optional, tag = "4")]
    pub compacted_out: Option<bool>,
    #[prost(bool, optional, tag = "9")]
    pub null_value: Option<bool>,
}
