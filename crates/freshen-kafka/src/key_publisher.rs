//! `KeyPublisher`: the capture end of the key stream — every view's dirtied scope keys,
//! published to the partition that owns them, a batch acknowledged upstream only once
//! every key record of it is delivered.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use freshen::{Gap, Key, Op, RowEvent, Source};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::Error;
use crate::key_config::KeyStreamConfig;
use crate::keys::{KeyRecord, StreamRecord, partition_of};
use crate::sink::{InFlight, QUEUE_FULL_PAUSE, deliver};
use crate::stats::{SinkCounters, SinkStats, add};

/// How long asking the brokers for the topic's partition count may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes dirtied scope keys to the key stream.
///
/// - A TRUNCATE, or a gap the source reports ([`Batch::gaps`](freshen::Batch::gaps)),
///   gives no key: it is published as a gap record for every view to every partition, so
///   that each worker's views sweep (rebuilding the keys they own), as a single instance
///   would after a TRUNCATE.
/// - One record per (view, key, transaction) of a batch: a key dirtied twice by one
///   transaction is published once. The value is a [`KeyRecord`] (the view, the key, the
///   transaction id and commit position that the worker's visibility guard checks).
/// - The partition is [`partition_of`] the view and key, chosen here rather than by the
///   producer's partitioner (see [`partition_of`](crate::partition_of)): a key always lands in one partition,
///   so it has one owner among the workers.
/// - The producer is idempotent with `acks=all`. [`run`](Self::run) acknowledges a batch
///   (confirming its transactions to the source) only once every record of it is
///   delivered; a delivery that fails ends the run with the batch unacknowledged, so the
///   source replays it after a restart: at least once, never lost.
pub struct KeyPublisher {
    producer: FutureProducer,
    topic: String,
    partitions: i32,
    counters: Arc<SinkCounters>,
}

impl fmt::Debug for KeyPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPublisher")
            .field("topic", &self.topic)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

/// What the capture end asks of each row change: the views' keys it dirties, as
/// (index into the view names given to [`KeyPublisher::run`], key).
pub type Keyer = dyn Fn(&RowEvent, &mut Vec<(usize, Key)>) + Send + Sync;

impl KeyPublisher {
    /// Creates the producer and reads the topic's partition count. Fails on an invalid
    /// configuration, or when the topic does not exist (create it first: its partition
    /// count is how far the workers scale).
    pub async fn connect(config: &KeyStreamConfig) -> Result<KeyPublisher, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.brokers)
            .set("client.id", "freshen-capture")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        for (k, v) in &config.properties {
            cc.set(k, v);
        }
        let producer: FutureProducer = cc.create()?;
        let p = producer.clone();
        let topic = config.topic.clone();
        let partitions = tokio::task::spawn_blocking(move || partition_count(p.client(), &topic))
            .await
            .map_err(|_| Error::Client(KafkaError::Canceled))??;
        Ok(KeyPublisher {
            producer,
            topic: config.topic.clone(),
            partitions,
            counters: Arc::new(SinkCounters::default()),
        })
    }

    /// The topic's partition count, as read at connect.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// A snapshot of the counters (records delivered, batches acknowledged).
    pub fn stats(&self) -> SinkStats {
        self.counters.snapshot()
    }

    /// The records of `events`: each view's keys, once per (view, key, transaction).
    pub fn records(&self, events: &[RowEvent], views: &[String], keyer: &Keyer) -> Vec<KeyRecord> {
        let mut seen: HashSet<(usize, Key, Option<u64>)> = HashSet::new();
        let mut keys = Vec::new();
        let mut out = Vec::new();
        for e in events {
            keys.clear();
            keyer(e, &mut keys);
            let txid = e.tx.map(|t| t.id);
            for (view, key) in keys.drain(..) {
                let Some(name) = views.get(view) else {
                    continue;
                };
                if seen.insert((view, key.clone(), txid)) {
                    out.push(KeyRecord {
                        view: name.clone(),
                        key,
                        txid,
                        position: e.tx.map(|t| t.commit),
                    });
                }
            }
        }
        out
    }

    /// The gaps of a batch: its TRUNCATEs and the gaps its source reported, each once.
    pub fn gaps(events: &[RowEvent], reported: &[Gap]) -> Vec<Gap> {
        let mut out: Vec<Gap> = Vec::new();
        let truncates = events
            .iter()
            .filter(|e| e.op == Op::Truncate)
            .map(|e| Gap::new(&*e.schema, &*e.table, "TRUNCATE (at the capture instance)"));
        for g in reported.iter().cloned().chain(truncates) {
            if !out
                .iter()
                .any(|o| o.schema == g.schema && o.table == g.table)
            {
                out.push(g);
            }
        }
        out
    }

    /// Hands every record to the producer (a gap record to every partition, for each
    /// view); the deliveries are awaited by the result.
    async fn enqueue(
        &self,
        records: &[KeyRecord],
        gaps: &[Gap],
        views: &[String],
    ) -> Result<InFlight, Error> {
        let mut deliveries = Vec::with_capacity(records.len());
        let mut value = Vec::with_capacity(64);
        for r in records {
            value.clear();
            if let Err(e) = r.encode_into(&mut value) {
                // A key the format cannot hold (over 4 GiB a part): nothing to deliver.
                return Err(Error::Config(vec![e.to_string()]));
            }
            let key = r.kafka_key();
            let partition = partition_of(&r.view, &r.key, self.partitions);
            deliveries.push(self.send(partition, &key, &value).await?);
        }
        for gap in gaps {
            for view in views {
                value.clear();
                StreamRecord::encode_gap(view, gap, &mut value);
                for partition in 0..self.partitions {
                    deliveries.push(self.send(partition, view.as_bytes(), &value).await?);
                }
            }
        }
        Ok(InFlight {
            deliveries,
            counters: self.counters.clone(),
        })
    }

    /// Hands one record to the producer, waiting while its queue is full.
    async fn send(
        &self,
        partition: i32,
        key: &[u8],
        value: &[u8],
    ) -> Result<(String, DeliveryFuture), Error> {
        loop {
            let record = FutureRecord::to(&self.topic)
                .partition(partition)
                .key(key)
                .payload(value);
            match self.producer.send_result(record) {
                Ok(fut) => return Ok((self.topic.clone(), fut)),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((error, _)) => {
                    add(&self.counters.failed, 1);
                    return Err(Error::Delivery {
                        topic: self.topic.clone(),
                        error,
                    });
                }
            }
        }
    }

    /// Publishes the keys of every batch of `source` (`keyer` maps a row change to the
    /// keys of `views` it dirties) and acknowledges each batch once delivered, until the
    /// source ends, `shutdown` completes, the source fails ([`Error::Source`]) or a
    /// delivery fails (its batch and every later one stay unacknowledged). Up to 64
    /// batches are in flight; acknowledgements leave in batch order. Closes the source
    /// at the end.
    pub async fn run<S, F>(
        &self,
        source: S,
        views: &[String],
        keyer: &Keyer,
        shutdown: F,
    ) -> Result<(), Error>
    where
        S: Source,
        F: Future<Output = ()> + Send,
    {
        deliver(source, shutdown, &self.counters, move |batch| {
            let reported = batch.gaps().to_vec();
            let (events, _skipped, ack) = batch.into_parts();
            let records = self.records(&events, views, keyer);
            let gaps = Self::gaps(&events, &reported);
            async move {
                let pending = self.enqueue(&records, &gaps, views).await?;
                Ok((tokio::spawn(pending.settle()), ack))
            }
        })
        .await
    }
}

/// The partition count of `topic`, from the brokers (blocking).
pub(crate) fn partition_count<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<i32, Error> {
    let md = client.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
    let t = md.topics().iter().find(|t| t.name() == topic);
    match t {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
            i32::try_from(t.partitions().len()).map_err(|_| {
                Error::Config(vec![format!("topic {topic:?} has too many partitions")])
            })
        }
        _ => Err(Error::Config(vec![format!(
            "the key stream topic {topic:?} does not exist: create it with as many partitions as workers may run"
        )])),
    }
}
