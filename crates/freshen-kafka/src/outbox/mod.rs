//! `KafkaOutbox`: a transactional outbox table relayed to Kafka, Debezium-style.

mod config;
mod route;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use freshen::{Ack, Batch, RowEvent, Source};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureProducer;

use crate::Error;
use crate::sink::{InFlight, deliver, send_record, with_reads};
use crate::stats::{CountingContext, SinkCounters, add};

pub use config::{KafkaOutboxConfig, PayloadEncoding, ROUTED_BY};
use route::{REASONS, Record, Routed, Router};

/// Relays the rows an application inserts into its outbox table — in the same
/// transaction as its data — to Kafka, as Debezium's outbox event router does:
///
/// - topic: [`KafkaOutboxConfig::topic`] with the row's `aggregatetype`;
/// - key: the row's `aggregateid`, so one aggregate's events share a partition and
///   stay in commit order (the producer is idempotent with `acks=all`);
/// - headers: `id` (for consumer-side deduplication) and `type`;
/// - value: the `payload` column, checked against the encoding.
///
/// Only inserts are relayed; updates and deletes of the table are ignored, so the
/// application may delete its rows (even in the same transaction). The relay never
/// deletes them itself: the table is the application's.
///
/// A malformed row goes to the dead-letter topic with header `freshen.error` giving
/// the reason. A batch — its events and its dead letters — is acknowledged upstream only
/// once the broker acknowledged every record of it, so the source confirms a
/// transaction (a PostgreSQL slot advances) only after its events are in Kafka: after a
/// crash they are read and published again (at least once; the `id` header tells the
/// repeats).
pub struct KafkaOutbox {
    producer: FutureProducer<CountingContext>,
    router: Router,
    dead_letter_topic: String,
    counters: Arc<SinkCounters>,
    outbox: Arc<OutboxCounters>,
    /// Column redaction, applied to every row before it is routed, so neither a
    /// relayed record nor a dead letter holds a redacted value.
    redact: Option<Arc<dyn freshen::plug::Redact>>,
}

impl fmt::Debug for KafkaOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaOutbox")
            .field("router", &self.router)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .finish_non_exhaustive()
    }
}

/// What a [`KafkaOutbox`] has done so far; from [`KafkaOutbox::stats`]. Counters only
/// grow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Outbox events handed to the producer.
    pub events: u64,
    /// Malformed rows handed to the dead-letter topic.
    pub dead_lettered: u64,
    /// Changes that were not outbox events (other tables, updates, deletes).
    pub ignored: u64,
    /// Batches whose every record was delivered, acknowledged upstream.
    pub batches: u64,
    /// Records delivered (events and dead letters).
    pub delivered: u64,
    /// Records that could not be delivered.
    pub failed: u64,
    /// Malformed rows by reason (each one of a fixed set of words, e.g.
    /// `missing_aggregate_id`), in the set's order.
    pub dead_lettered_by_reason: Vec<(&'static str, u64)>,
}

#[derive(Debug)]
struct OutboxCounters {
    events: AtomicU64,
    ignored: AtomicU64,
    /// Per reason, in the order of [`REASONS`].
    dead: Vec<AtomicU64>,
}

impl Default for OutboxCounters {
    fn default() -> OutboxCounters {
        OutboxCounters {
            events: AtomicU64::new(0),
            ignored: AtomicU64::new(0),
            dead: REASONS.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl OutboxCounters {
    fn dead_lettered(&self) -> Vec<(&'static str, u64)> {
        REASONS
            .iter()
            .zip(&self.dead)
            .map(|(r, n)| (*r, n.load(Relaxed)))
            .collect()
    }
}

/// The relay's deliveries and dead letters, as the binary reads them.
struct OutboxProbe {
    counters: Arc<SinkCounters>,
    outbox: Arc<OutboxCounters>,
}

impl freshen::plug::SinkProbe for OutboxProbe {
    fn report(&self) -> freshen::plug::SinkReport {
        self.counters.report(self.outbox.dead_lettered())
    }
}

impl KafkaOutbox {
    /// Creates the producer. Fails on an invalid configuration; brokers that cannot be
    /// reached yet are retried in the background.
    pub fn new(config: &KafkaOutboxConfig) -> Result<KafkaOutbox, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.brokers)
            .set("client.id", "freshen-outbox")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Java's partitioner: an aggregate lands where Kafka Connect would put it.
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        for (k, v) in &config.properties {
            cc.set(k, v);
        }
        let counters = Arc::new(SinkCounters::default());
        Ok(KafkaOutbox {
            producer: cc.create_with_context(CountingContext {
                counters: counters.clone(),
            })?,
            router: Router::new(config),
            dead_letter_topic: config.dead_letter_topic.clone(),
            counters,
            outbox: Arc::new(OutboxCounters::default()),
            redact: None,
        })
    }

    /// This relay with `redact` applied to every outbox row before it is routed: a rule
    /// on the payload column hides it in the record's value (and in a dead letter); a
    /// rule that drops `id`, `aggregatetype` or `aggregateid` sends the rows to the
    /// dead-letter topic, as a row without them would.
    pub fn with_redactor(mut self, redact: Arc<dyn freshen::plug::Redact>) -> KafkaOutbox {
        self.redact = Some(redact);
        self
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> OutboxStats {
        let s = self.counters.snapshot();
        let g = |a: &AtomicU64| a.load(Relaxed);
        let by_reason = self.outbox.dead_lettered();
        OutboxStats {
            events: g(&self.outbox.events),
            dead_lettered: by_reason.iter().map(|(_, n)| n).sum(),
            ignored: g(&self.outbox.ignored),
            batches: s.batches,
            delivered: s.delivered,
            failed: s.failed,
            dead_lettered_by_reason: by_reason,
        }
    }

    /// Reads this relay's deliveries and dead letters while it runs (for the binary's
    /// `/metrics`).
    pub fn probe(&self) -> Arc<dyn freshen::plug::SinkProbe> {
        Arc::new(OutboxProbe {
            counters: self.counters.clone(),
            outbox: self.outbox.clone(),
        })
    }

    /// Relays every batch of `source` and acknowledges it once delivered, until the
    /// source ends, `shutdown` completes, the source fails or a delivery fails (its
    /// batch and every later one stay unacknowledged). Closes the source at the end.
    pub async fn run<S, F>(&self, source: S, shutdown: F) -> Result<(), Error>
    where
        S: Source,
        F: Future<Output = ()> + Send,
    {
        self.run_interleaved(source, |_: &Batch| Vec::new(), shutdown)
            .await
    }

    /// [`run`](Self::run), relaying the outbox rows a snapshot read (rows that were in
    /// the table before the relay started) as if inserted; `interleave` as in
    /// [`KafkaSink::run_interleaved`](crate::KafkaSink::run_interleaved).
    pub async fn run_interleaved<S, F, I>(
        &self,
        source: S,
        mut interleave: I,
        shutdown: F,
    ) -> Result<(), Error>
    where
        S: Source,
        F: Future<Output = ()> + Send,
        I: FnMut(&Batch) -> Vec<(usize, Vec<RowEvent>, Ack)> + Send,
    {
        deliver(source, shutdown, &self.counters, move |batch| {
            let spliced = interleave(&batch);
            let (events, _skipped, ack) = batch.into_parts();
            let (reads, ack) = with_reads(spliced, ack);
            async move {
                let pending = self.enqueue(&events, &reads).await?;
                Ok((tokio::spawn(pending.settle()), ack))
            }
        })
        .await
    }

    /// Hands the records of `events` (with each run of `reads` before the event at its
    /// index) to the producer, in order.
    async fn enqueue(
        &self,
        events: &[RowEvent],
        reads: &[(usize, Vec<RowEvent>)],
    ) -> Result<InFlight, Error> {
        let mut deliveries = Vec::new();
        let mut pending_reads = reads.iter().peekable();
        for (i, event) in events.iter().enumerate() {
            while let Some((_, rows)) = pending_reads.next_if(|(at, _)| *at <= i) {
                for row in rows {
                    self.enqueue_one(row, true, &mut deliveries).await?;
                }
            }
            self.enqueue_one(event, false, &mut deliveries).await?;
        }
        for (_, rows) in pending_reads {
            for row in rows {
                self.enqueue_one(row, true, &mut deliveries).await?;
            }
        }
        Ok(InFlight {
            deliveries,
            counters: self.counters.clone(),
        })
    }

    async fn enqueue_one(
        &self,
        event: &RowEvent,
        read: bool,
        deliveries: &mut Vec<(String, rdkafka::producer::DeliveryFuture)>,
    ) -> Result<(), Error> {
        let redacted = self.redact.as_ref().and_then(|r| r.apply(event));
        let event = redacted.as_ref().unwrap_or(event);
        let record = match self.router.route(event, read, &self.dead_letter_topic) {
            Routed::Ignored => {
                add(&self.outbox.ignored, 1);
                return Ok(());
            }
            Routed::Event(r) => {
                add(&self.outbox.events, 1);
                r
            }
            Routed::Dead(r, why) => {
                if let Some(i) = REASONS.iter().position(|r| *r == why) {
                    add(&self.outbox.dead[i], 1);
                }
                r
            }
        };
        let Record {
            topic,
            key,
            value,
            headers,
        } = record;
        let headers = headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(v),
            })
        });
        let fut = send_record(
            &self.producer,
            &self.counters,
            &topic,
            key.as_deref(),
            value.as_deref(),
            Some(headers),
        )
        .await?;
        deliveries.push((topic, fut));
        Ok(())
    }
}
