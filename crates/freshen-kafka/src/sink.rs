//! `KafkaSink`: captured changes published in Debezium's envelope.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use freshen::{RowEvent, Source};
use freshen_codec::DebeziumEncoder;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use crate::Error;
use crate::config::{KafkaSinkConfig, TopicMode, valid_topic_char};
use crate::stats::{SinkCounters, SinkStats, add};

/// Publishes row events to Kafka as Debezium change events.
///
/// - Value: Debezium's envelope `{before, after, source, op, ts_ms}` (see
///   [`DebeziumEncoder`]); key: the primary key as a JSON object (`{"id":7}`), so all
///   changes of one row land in one partition, in order. Events without a primary key
///   (a truncate, a table without one) get no key.
/// - Topic: `<topic>.<schema>.<table>` (per table; characters Kafka does not allow in a
///   topic name become `_`) or `<topic>` (single).
/// - The producer is idempotent with `acks=all`: a retried record is written once,
///   and records of one partition stay in order.
///
/// [`run`](Self::run) is the usual way in: a loop over a [`Source`] (typically one
/// branch of [`freshen::fanout`]) that publishes each batch and acknowledges it only
/// once every record is delivered. A delivery that fails (after the producer's retries,
/// within `delivery_timeout_ms`) ends the loop with the batch unacknowledged, so the
/// upstream replays it on restart: at least once, never lost.
///
/// ```no_run
/// # async fn demo(source: impl freshen::Source) -> Result<(), freshen_kafka::Error> {
/// use freshen_kafka::{KafkaSink, KafkaSinkConfig, TopicMode};
/// let sink = KafkaSink::new(&KafkaSinkConfig::new("127.0.0.1:9092", "shop", TopicMode::PerTable))?;
/// sink.run(source, std::future::pending()).await
/// # }
/// ```
pub struct KafkaSink {
    producer: FutureProducer,
    encoder: DebeziumEncoder,
    topic: String,
    mode: TopicMode,
    counters: Arc<SinkCounters>,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Creates the producer. Fails on an invalid configuration; brokers that cannot be
    /// reached yet are retried in the background.
    pub fn new(config: &KafkaSinkConfig) -> Result<KafkaSink, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.brokers)
            .set("client.id", "freshen-sink")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Java's partitioner, so that keys land where Kafka Connect would put them.
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        for (k, v) in &config.properties {
            cc.set(k, v);
        }
        let name = config
            .server_name
            .clone()
            .unwrap_or_else(|| config.topic.clone());
        let mut encoder = DebeziumEncoder::new(name);
        if let Some(db) = &config.database {
            encoder = encoder.database(db.clone());
        }
        Ok(KafkaSink {
            producer: cc.create()?,
            encoder,
            topic: config.topic.clone(),
            mode: config.topic_mode,
            counters: Arc::new(SinkCounters::default()),
        })
    }

    /// The topic an event is published to.
    pub fn topic_for(&self, event: &RowEvent) -> String {
        match self.mode {
            TopicMode::Single => self.topic.clone(),
            TopicMode::PerTable => {
                let sanitize = |s: &str| -> String {
                    s.chars()
                        .map(|c| if valid_topic_char(c) { c } else { '_' })
                        .collect()
                };
                format!(
                    "{}.{}.{}",
                    self.topic,
                    sanitize(&event.schema),
                    sanitize(&event.table)
                )
            }
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SinkStats {
        self.counters.snapshot()
    }

    /// Publishes `events` in order and waits until every one is delivered.
    pub async fn publish(&self, events: &[RowEvent]) -> Result<(), Error> {
        let ts_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut in_flight: VecDeque<(String, DeliveryFuture)> = VecDeque::new();
        let mut first_error = None;
        let mut value = Vec::with_capacity(512);
        for event in events {
            let topic = self.topic_for(event);
            let key = self.encoder.encode_key(event);
            value.clear();
            self.encoder.encode_value_into(event, ts_ms, &mut value);
            loop {
                let mut record: FutureRecord<'_, [u8], [u8]> =
                    FutureRecord::to(&topic).payload(&value[..]);
                if let Some(k) = &key {
                    record = record.key(&k[..]);
                }
                match self.producer.send_result(record) {
                    Ok(fut) => {
                        in_flight.push_back((topic.clone(), fut));
                        break;
                    }
                    // The local queue is full: wait for the oldest delivery, then retry.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                        if !in_flight.is_empty() =>
                    {
                        let (t, fut) = in_flight.pop_front().expect("not empty");
                        self.settle(t, fut, &mut first_error).await;
                    }
                    Err((error, _)) => {
                        add(&self.counters.failed, 1);
                        first_error.get_or_insert(Error::Delivery {
                            topic: topic.clone(),
                            error,
                        });
                        break;
                    }
                }
            }
        }
        for (t, fut) in in_flight {
            self.settle(t, fut, &mut first_error).await;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn settle(&self, topic: String, fut: DeliveryFuture, first_error: &mut Option<Error>) {
        let error = match fut.await {
            Ok(Ok(_)) => {
                add(&self.counters.delivered, 1);
                return;
            }
            Ok(Err((e, _))) => e,
            Err(_) => KafkaError::Canceled,
        };
        add(&self.counters.failed, 1);
        first_error.get_or_insert(Error::Delivery { topic, error });
    }

    /// Publishes every batch of `source` and acknowledges it once delivered, until the
    /// source ends, `shutdown` completes, the source fails ([`Error::Source`]) or a
    /// delivery fails (its batch stays unacknowledged). Closes the source at the end.
    pub async fn run<S, F>(&self, mut source: S, shutdown: F) -> Result<(), Error>
    where
        S: Source,
        F: Future<Output = ()> + Send,
    {
        tokio::pin!(shutdown);
        let result = loop {
            let item = tokio::select! {
                biased;
                _ = &mut shutdown => break Ok(()),
                item = source.next_batch() => item,
            };
            let batch = match item {
                None => break Ok(()),
                Some(Err(e)) => break Err(Error::Source(e)),
                Some(Ok(batch)) => batch,
            };
            let (events, _skipped, ack) = batch.into_parts();
            if let Err(e) = self.publish(&events).await {
                break Err(e);
            }
            ack.ack();
            add(&self.counters.batches, 1);
        };
        source.close().await;
        result
    }
}
