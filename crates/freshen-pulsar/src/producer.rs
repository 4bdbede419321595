//! `PulsarProducer`: publishes messages to a topic (for tests, tools and demos; freshen
//! itself only consumes from Pulsar).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;
use crate::connection::{Connection, Inbound, REQUEST_TIMEOUT};
use crate::frame;
use crate::lookup::connect_for;
use crate::proto::{
    BaseCommand, CommandCloseProducer, CommandProducer, CommandSend, MessageMetadata, kind,
};
use crate::source::MessageId;

/// A producer on one topic that sends one entry at a time and waits for its receipt.
pub struct PulsarProducer {
    conn: Connection,
    topic: String,
    producer_id: u64,
    name: String,
    sequence: u64,
}

impl fmt::Debug for PulsarProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulsarProducer")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PulsarProducer {
    /// Connects to the broker serving `topic` (a full `persistent://…` name, or a short
    /// name as in [`PulsarSourceConfig`](crate::PulsarSourceConfig)) and registers a producer.
    pub async fn connect(url: &str, topic: &str) -> Result<PulsarProducer, Error> {
        let topic = &crate::config::full_topic(topic);
        let conn = connect_for(url, topic, None).await?;
        let producer_id = 1;
        let answer = conn
            .request(|request_id| BaseCommand {
                producer: Some(CommandProducer {
                    topic: topic.to_owned(),
                    producer_id,
                    request_id,
                }),
                ..BaseCommand::of(kind::PRODUCER)
            })
            .await?;
        let name = answer
            .producer_success
            .map(|p| p.producer_name)
            .ok_or_else(|| Error::Protocol("PRODUCER answered without a name".into()))?;
        Ok(PulsarProducer {
            conn,
            topic: topic.to_owned(),
            producer_id,
            name,
            sequence: 0,
        })
    }

    /// Sends one message (keyed by `key`, if any) and waits until it is stored.
    pub async fn send(&mut self, key: Option<&str>, payload: &[u8]) -> Result<MessageId, Error> {
        let mut metadata = self.metadata();
        metadata.partition_key = key.map(str::to_owned);
        self.send_entry(metadata, payload, 1).await
    }

    /// Sends `messages` as one batched entry (as TiCDC's Go client does by default).
    pub async fn send_batch(&mut self, messages: &[&[u8]]) -> Result<MessageId, Error> {
        let mut metadata = self.metadata();
        metadata.num_messages_in_batch = Some(messages.len() as i32);
        let payload = frame::encode_batch(messages);
        self.send_entry(metadata, &payload, messages.len() as i32)
            .await
    }

    fn metadata(&self) -> MessageMetadata {
        MessageMetadata {
            producer_name: self.name.clone(),
            sequence_id: self.sequence,
            publish_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ..MessageMetadata::default()
        }
    }

    async fn send_entry(
        &mut self,
        metadata: MessageMetadata,
        payload: &[u8],
        n: i32,
    ) -> Result<MessageId, Error> {
        let sequence_id = self.sequence;
        self.sequence += 1;
        let cmd = BaseCommand {
            send: Some(CommandSend {
                producer_id: self.producer_id,
                sequence_id,
                num_messages: Some(n),
            }),
            ..BaseCommand::of(kind::SEND)
        };
        if !self
            .conn
            .sender()
            .send_frame(frame::encode_payload(&cmd, &metadata, payload))
        {
            return Err(Error::Protocol("the connection is closed".into()));
        }
        loop {
            let inbound = tokio::time::timeout(REQUEST_TIMEOUT, self.conn.next())
                .await
                .map_err(|_| Error::Timeout("a send"))?;
            match inbound {
                Inbound::Send(cmd) => {
                    if let Some(r) = cmd.send_receipt.filter(|r| r.sequence_id == sequence_id) {
                        let id = r.message_id.unwrap_or_default();
                        return Ok(MessageId {
                            ledger: id.ledger_id,
                            entry: id.entry_id,
                            partition: id.partition.unwrap_or(-1),
                            batch_index: None,
                        });
                    }
                    if let Some(e) = cmd.send_error.filter(|e| e.sequence_id == sequence_id) {
                        return Err(Error::Server {
                            code: e.error,
                            message: e.message,
                        });
                    }
                }
                Inbound::Closed(why) => return Err(Error::Protocol(why)),
                _ => {}
            }
        }
    }

    /// Closes the producer.
    pub async fn close(self) -> Result<(), Error> {
        let producer_id = self.producer_id;
        self.conn
            .request(|request_id| BaseCommand {
                close_producer: Some(CommandCloseProducer {
                    producer_id,
                    request_id,
                }),
                ..BaseCommand::of(kind::CLOSE_PRODUCER)
            })
            .await
            .map(|_| ())
    }
}
