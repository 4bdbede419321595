//! `KafkaSink`: captured changes published in Debezium's envelope.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::{Ack, Batch, RowEvent, Source, SourceError};
use freshen_codec::{DebeziumEncoder, changes_key};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::Error;
use crate::config::{KafkaSinkConfig, TopicMode, valid_topic_char};
use crate::stats::{CountingContext, SinkCounters, SinkStats, add};

/// Publishes row events to Kafka as Debezium change events.
///
/// - Value: Debezium's envelope `{before, after, source, op, ts_ms}` (see
///   [`DebeziumEncoder`]); key: the primary key as a JSON object (`{"id":7}`), so all
///   changes of one row land in one partition, in order. Events without a primary key
///   (a truncate, a table without one) get no key.
/// - A primary-key change (an UPDATE that moves a row to another key) is three records,
///   as Debezium publishes it: a DELETE keyed by the old key (header
///   `__debezium.newkey`), a tombstone for the old key, and a CREATE keyed by the new
///   key (header `__debezium.oldkey`): a consumer or a compacted topic that keeps state
///   by key forgets the old key.
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
    producer: FutureProducer<CountingContext>,
    encoder: DebeziumEncoder,
    topic: String,
    mode: TopicMode,
    counters: Arc<SinkCounters>,
    /// Column redaction, applied to every event and snapshot row before it is encoded.
    redact: Option<Arc<dyn freshen::plug::Redact>>,
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
        let counters = Arc::new(SinkCounters::default());
        Ok(KafkaSink {
            producer: cc.create_with_context(CountingContext {
                counters: counters.clone(),
            })?,
            encoder,
            topic: config.topic.clone(),
            mode: config.topic_mode,
            counters,
            redact: None,
        })
    }

    /// This sink with `redact` applied to every event and snapshot row it publishes
    /// (keys, values, before and after images), so no record holds a redacted
    /// column's clear value.
    pub fn with_redactor(mut self, redact: Arc<dyn freshen::plug::Redact>) -> KafkaSink {
        self.redact = Some(redact);
        self
    }

    /// `event` as it may leave: redacted when a rule concerns it.
    fn redacted<'a>(&self, event: &'a RowEvent) -> std::borrow::Cow<'a, RowEvent> {
        match self.redact.as_ref().and_then(|r| r.apply(event)) {
            Some(e) => std::borrow::Cow::Owned(e),
            None => std::borrow::Cow::Borrowed(event),
        }
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

    /// Reads this sink's deliveries while it runs (for the binary's `/metrics`).
    pub fn probe(&self) -> std::sync::Arc<dyn freshen::plug::SinkProbe> {
        Arc::new(SinkCountersProbe(self.counters.clone()))
    }

    /// Publishes `events` in order and waits until every one is delivered.
    pub async fn publish(&self, events: &[RowEvent]) -> Result<(), Error> {
        self.enqueue(events, &[]).await?.settle().await
    }

    /// Hands every record of `events` to the producer, in order, with each of `reads`
    /// (rows read by a snapshot, published as READ events) before the event at its
    /// index; the deliveries are awaited by [`InFlight::settle`].
    async fn enqueue(
        &self,
        events: &[RowEvent],
        reads: &[(usize, Vec<RowEvent>)],
    ) -> Result<InFlight, Error> {
        let ts_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut deliveries = Vec::with_capacity(events.len());
        let mut value = Vec::with_capacity(512);
        let mut pending_reads = reads.iter().peekable();
        for (i, event) in events.iter().enumerate() {
            while let Some((_, rows)) = pending_reads.next_if(|(at, _)| *at <= i) {
                self.enqueue_reads(rows, ts_ms, &mut value, &mut deliveries)
                    .await?;
            }
            let event = &*self.redacted(event);
            let topic = self.topic_for(event);
            if changes_key(event) {
                // A primary-key change: delete, tombstone, create (Debezium's records).
                for r in self.encoder.records(event, ts_ms) {
                    let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
                        h.insert(Header {
                            key: k,
                            value: Some(v),
                        })
                    });
                    let fut = self
                        .send(&topic, r.key.as_deref(), r.value.as_deref(), Some(headers))
                        .await?;
                    deliveries.push((topic.clone(), fut));
                }
                continue;
            }
            let key = self.encoder.encode_key(event);
            value.clear();
            self.encoder.encode_value_into(event, ts_ms, &mut value);
            let fut = self
                .send(&topic, key.as_deref(), Some(&value), None)
                .await?;
            deliveries.push((topic, fut));
        }
        for (_, rows) in pending_reads {
            self.enqueue_reads(rows, ts_ms, &mut value, &mut deliveries)
                .await?;
        }
        Ok(InFlight {
            deliveries,
            counters: self.counters.clone(),
        })
    }

    /// Hands rows read by a snapshot to the producer as READ events (`op` `r`).
    async fn enqueue_reads(
        &self,
        rows: &[RowEvent],
        ts_ms: u64,
        value: &mut Vec<u8>,
        deliveries: &mut Vec<(String, DeliveryFuture)>,
    ) -> Result<(), Error> {
        for row in rows {
            let row = &*self.redacted(row);
            let topic = self.topic_for(row);
            let key = self.encoder.encode_key(row);
            value.clear();
            self.encoder.encode_read_into(row, ts_ms, value);
            let fut = self.send(&topic, key.as_deref(), Some(value), None).await?;
            deliveries.push((topic, fut));
        }
        Ok(())
    }

    /// Hands one record to the producer, waiting while its queue is full.
    async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) -> Result<DeliveryFuture, Error> {
        send_record(&self.producer, &self.counters, topic, key, value, headers).await
    }

    /// Publishes every batch of `source` and acknowledges it once delivered, until the
    /// source ends, `shutdown` completes, the source fails ([`Error::Source`]) or a
    /// delivery fails (its batch and every later one stay unacknowledged). Up to
    /// 64 batches are in flight at once; acknowledgements leave in batch order. On
    /// shutdown or the end of the source, batches in flight are settled first. Closes
    /// the source at the end.
    pub async fn run<S, F>(&self, source: S, shutdown: F) -> Result<(), Error>
    where
        S: Source,
        F: Future<Output = ()> + Send,
    {
        self.run_interleaved(source, |_: &Batch| Vec::new(), shutdown)
            .await
    }

    /// [`run`](Self::run), publishing rows a snapshot read among the stream's changes:
    /// `interleave` is called on every batch, in order, before it is published, and
    /// answers `(index, rows, delivered)` for each run of rows to publish as READ events
    /// (`op` `r`) before the batch's event at `index`; `delivered` is acknowledged with
    /// the batch, once every record up to and including it is delivered (a failed
    /// delivery drops it unacknowledged). `freshen_postgres::SinkSnapshots::splice`
    /// answers this for DBLog snapshots.
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
}

/// The loop every publisher here runs: reads `source` on its own task (a `next_batch`
/// is never dropped half-way: a Kafka source would lose what it had gathered), hands
/// each batch to `enqueue` — which queues its records with the producer and returns the
/// task settling their deliveries with the batch's acknowledgement — and acknowledges
/// batches in order once delivered, up to [`MAX_IN_FLIGHT`] at a time. Ends when the
/// source ends, `shutdown` completes, the source fails ([`Error::Source`]) or a delivery
/// fails (its batch and every later one stay unacknowledged); closes the source.
pub(crate) async fn deliver<S, F, E, Q>(
    source: S,
    shutdown: F,
    counters: &SinkCounters,
    mut enqueue: E,
) -> Result<(), Error>
where
    S: Source,
    F: Future<Output = ()> + Send,
    E: FnMut(Batch) -> Q,
    Q: Future<Output = Result<(JoinHandle<Result<(), Error>>, Ack), Error>>,
{
    let (tx, mut rx) = mpsc::channel(2);
    let (stop_tx, stop_rx) = oneshot::channel();
    let pump = tokio::spawn(pump(source, tx, stop_rx));
    tokio::pin!(shutdown);
    let mut in_flight: VecDeque<(JoinHandle<Result<(), Error>>, Ack)> = VecDeque::new();
    // When each batch in flight was handed over, for the waiting gauges.
    let mut handed: VecDeque<SystemTime> = VecDeque::new();
    let mut source_done = false;
    let mut result = loop {
        counters.set_waiting(handed.iter().copied());
        if source_done && in_flight.is_empty() {
            break Ok(());
        }
        tokio::select! {
            biased;
            _ = &mut shutdown => break Ok(()),
            done = async { (&mut in_flight.front_mut().expect("not empty").0).await }, if !in_flight.is_empty() => {
                let (_, ack) = in_flight.pop_front().expect("not empty");
                handed.pop_front();
                match flatten(done) {
                    Ok(()) => {
                        ack.ack();
                        add(&counters.batches, 1);
                    }
                    Err(e) => break Err(e),
                }
            }
            item = rx.recv(), if !source_done && in_flight.len() < MAX_IN_FLIGHT => match item.flatten() {
                None => source_done = true,
                // An outage the source retries by itself (its health and logs say
                // so): read on.
                Some(Err(e)) if !e.is_final() => {}
                Some(Err(e)) => break Err(Error::Source(e)),
                Some(Ok(batch)) => match enqueue(batch).await {
                    Ok(queued) => {
                        in_flight.push_back(queued);
                        handed.push_back(SystemTime::now());
                    }
                    Err(e) => break Err(e),
                },
            },
        }
    };
    // Batches already handed to the producer: settle and acknowledge them in order
    // (on a failure, nothing after it is acknowledged).
    while let Some((task, ack)) = in_flight.pop_front() {
        counters.set_waiting(handed.iter().copied());
        handed.pop_front();
        if result.is_err() {
            task.abort();
            continue;
        }
        match flatten(task.await) {
            Ok(()) => {
                ack.ack();
                add(&counters.batches, 1);
            }
            Err(e) => result = Err(e),
        }
    }
    counters.set_waiting(std::iter::empty());
    let _ = stop_tx.send(());
    if let Ok(mut source) = pump.await {
        source.close().await;
    }
    result
}

/// Hands one record to `producer`, waiting while its queue is full; a refusal counts as
/// a failed delivery.
pub(crate) async fn send_record<C: rdkafka::ClientContext + 'static>(
    producer: &FutureProducer<C>,
    counters: &SinkCounters,
    topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: Option<OwnedHeaders>,
) -> Result<DeliveryFuture, Error> {
    loop {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
        if let Some(v) = value {
            record = record.payload(v);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(h) = &headers {
            record = record.headers(h.clone());
        }
        match producer.send_result(record) {
            Ok(fut) => return Ok(fut),
            // The producer's queue is full of earlier deliveries: let some finish.
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(QUEUE_FULL_PAUSE).await;
            }
            Err((error, _)) => {
                add(&counters.failed, 1);
                return Err(Error::Delivery {
                    topic: topic.to_owned(),
                    error,
                });
            }
        }
    }
}

/// The rows to splice into a batch, and one acknowledgement for the batch and them.
pub(crate) fn with_reads(
    spliced: Vec<(usize, Vec<RowEvent>, Ack)>,
    ack: Ack,
) -> (Vec<(usize, Vec<RowEvent>)>, Ack) {
    if spliced.is_empty() {
        return (Vec::new(), ack);
    }
    let mut reads = Vec::with_capacity(spliced.len());
    let mut acks = Vec::with_capacity(spliced.len());
    for (at, rows, delivered) in spliced {
        reads.push((at, rows));
        acks.push(delivered);
    }
    let all = Ack::new(move || {
        for a in acks {
            a.ack();
        }
        ack.ack();
    });
    (reads, all)
}

/// Batches a sink keeps in flight before it waits for the oldest.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// Pause before retrying a record the producer's full queue refused.
pub(crate) const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(1);

/// The deliveries of one batch.
pub(crate) struct InFlight {
    pub(crate) deliveries: Vec<(String, DeliveryFuture)>,
    pub(crate) counters: Arc<SinkCounters>,
}

impl InFlight {
    /// Waits for every delivery; the first failure, if any.
    pub(crate) async fn settle(self) -> Result<(), Error> {
        let mut first = None;
        for (topic, fut) in self.deliveries {
            let error = match fut.await {
                Ok(Ok(_)) => {
                    self.counters.delivered_one();
                    continue;
                }
                Ok(Err((e, _))) => e,
                Err(_) => KafkaError::Canceled,
            };
            add(&self.counters.failed, 1);
            first.get_or_insert(Error::Delivery { topic, error });
        }
        first.map_or(Ok(()), Err)
    }
}

/// A sink's counters as the binary reads them (a sink without dead letters).
struct SinkCountersProbe(Arc<SinkCounters>);

impl freshen::plug::SinkProbe for SinkCountersProbe {
    fn report(&self) -> freshen::plug::SinkReport {
        self.0.report(Vec::new())
    }
}

/// A settled batch: a settling task that panicked counts as a failed delivery.
pub(crate) fn flatten(
    done: Result<Result<(), Error>, tokio::task::JoinError>,
) -> Result<(), Error> {
    done.unwrap_or(Err(Error::Client(KafkaError::Canceled)))
}

/// Reads `source` into `tx` until told to stop, then hands the source back.
pub(crate) async fn pump<S: Source>(
    mut source: S,
    tx: mpsc::Sender<Option<Result<Batch, SourceError>>>,
    mut stop: oneshot::Receiver<()>,
) -> S {
    loop {
        let item = tokio::select! {
            biased;
            _ = &mut stop => break,
            item = source.next_batch() => item,
        };
        let end = match &item {
            Some(Ok(_)) => false,
            Some(Err(e)) => e.is_final(),
            None => true,
        };
        tokio::select! {
            biased;
            _ = &mut stop => break,
            sent = tx.send(item) => if sent.is_err() { break },
        }
        if end {
            let _ = stop.await;
            break;
        }
    }
    source
}
