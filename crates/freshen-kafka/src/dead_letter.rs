//! `DeadLetter`: copies undecodable messages to a topic before they are skipped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use freshen_codec::DecodeError;
use rdkafka::ClientConfig;
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use crate::Error;
use crate::offsets::Tp;

/// A producer for the dead-letter topic and the copies in flight for the current batch.
pub(crate) struct DeadLetter {
    producer: FutureProducer,
    topic: String,
    in_flight: Vec<(Tp, i64, Result<DeliveryFuture, String>)>,
}

impl DeadLetter {
    pub(crate) fn new(
        brokers: &str,
        topic: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<DeadLetter, Error> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", brokers)
            .set("client.id", "freshen-dead-letter")
            .set("enable.idempotence", "true")
            .set("acks", "all");
        for (k, v) in properties {
            cc.set(k, v);
        }
        Ok(DeadLetter {
            producer: cc.create()?,
            topic: topic.to_owned(),
            in_flight: Vec::new(),
        })
    }

    /// Starts copying `msg` (same key and value) with headers naming the error and the
    /// original position.
    pub(crate) fn send(&mut self, msg: &BorrowedMessage<'_>, error: &DecodeError) {
        let error = error.to_string();
        let partition = msg.partition().to_string();
        let offset = msg.offset().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "freshen.error",
                value: Some(error.as_bytes()),
            })
            .insert(Header {
                key: "freshen.topic",
                value: Some(msg.topic().as_bytes()),
            })
            .insert(Header {
                key: "freshen.partition",
                value: Some(partition.as_bytes()),
            })
            .insert(Header {
                key: "freshen.offset",
                value: Some(offset.as_bytes()),
            });
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = msg.key() {
            record = record.key(k);
        }
        if let Some(v) = msg.payload() {
            record = record.payload(v);
        }
        let sent = self
            .producer
            .send_result(record)
            .map_err(|(e, _)| e.to_string());
        self.in_flight.push((
            (Arc::from(msg.topic()), msg.partition()),
            msg.offset(),
            sent,
        ));
    }

    /// Waits for every copy in flight: how many were sent, and why each failed one failed.
    pub(crate) async fn flush(&mut self) -> (usize, HashMap<(Tp, i64), String>) {
        let mut failures = HashMap::new();
        let sent = self.in_flight.len();
        for (tp, offset, sent) in self.in_flight.drain(..) {
            let outcome = match sent {
                Err(e) => Err(e),
                Ok(fut) => match fut.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer shut down".to_owned()),
                },
            };
            if let Err(e) = outcome {
                failures.insert((tp, offset), e);
            }
        }
        (sent, failures)
    }
}
