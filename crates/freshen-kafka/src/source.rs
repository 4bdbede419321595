//! `KafkaSource`: a consumer group whose offsets follow the refresher's acknowledgements.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use freshen::{Ack, Batch, BoxError, BoxFuture, Capabilities, RowEvent, Source, SourceError};
use freshen_codec::{DecodeError, Decoded, Decoder, Format};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};

use crate::Error;
use crate::config::{KafkaSourceConfig, StartFrom};
use crate::context::{Context, Shared, to_tpl};
use crate::dead_letter::DeadLetter;
use crate::error::needs_a_person;
use crate::offsets::{Mark, Tp};
use crate::stats::{SourceStats, add};

/// Pause after a consumer error before polling again (errors come from librdkafka's
/// own retries; this only keeps a flapping broker from spinning the loop).
const ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A message that could not be decoded: where it was and why. Travels in the batch's
/// skipped list (see [`Batch::skipped`]); downcast to read the position.
#[derive(Debug)]
pub struct Undecodable {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Why it could not be decoded.
    pub error: DecodeError,
    /// Why it could not be copied to the dead-letter topic, when that failed too.
    pub dead_letter_error: Option<String>,
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}[{}]@{}: {}",
            self.topic, self.partition, self.offset, self.error
        )?;
        if let Some(e) = &self.dead_letter_error {
            write!(
                f,
                " (and it could not be copied to the dead-letter topic: {e})"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Undecodable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A cloneable view of a [`KafkaSource`]'s counters, usable after the source has moved
/// into a refresher.
#[derive(Debug, Clone)]
pub struct SourceStatsHandle(Arc<Shared>);

impl SourceStatsHandle {
    /// A snapshot of the counters.
    pub fn stats(&self) -> SourceStats {
        self.0.snapshot()
    }
}

impl freshen::SourceProbe for SourceStatsHandle {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    /// A consumer group member is streaming while it runs: librdkafka reconnects to
    /// brokers by itself and reports what it recovered from as `last_error`.
    fn health(&self) -> freshen::SourceHealth {
        let s = self.stats();
        let mut h = freshen::SourceHealth::default();
        h.streaming = true;
        h.last_error = s.last_error;
        h.reconnects = s.rebalances;
        h.events = s.events;
        h.skipped = s.skipped;
        h
    }
}

/// One message read, before the batch is handed out.
struct Taken {
    tp: Tp,
    epoch: u64,
    offset: i64,
    events: Vec<RowEvent>,
    skipped: Option<Undecodable>,
    gap: Option<freshen::Gap>,
}

/// Change events from Kafka topics, read as a consumer group.
///
/// - Each batch holds up to `max_batch` messages (waiting `batch_linger_ms` after the
///   first for more); a message may carry several row events (canal-json) or none
///   (DDL, watermarks, tombstones).
/// - Offsets are committed per partition, and only up to what the refresher
///   acknowledged: batches are acknowledged in order, so the commit is the highest
///   acknowledged offset + 1. Under [`AckPolicy::AfterRebuild`](freshen::AckPolicy)
///   that means after the rebuilds; a consumer that stops (or crashes) before then
///   leaves the messages to be read again.
/// - When partitions are revoked (a rebalance), what was acknowledged for them is
///   committed at once, messages of theirs not yet handed out are dropped, and later
///   acknowledgements for them are ignored: the new owner reads on from the commit.
/// - A message that cannot be decoded is skipped — it travels in its batch as a
///   [`Undecodable`] so its offset is acknowledged with the rest — counted, and,
///   when a dead-letter topic is configured, copied there first (with headers
///   `freshen.error`, `freshen.topic`, `freshen.partition`, `freshen.offset`).
/// - A message that changed rows without carrying them ([`Decoded::Gap`]: a TiCDC
///   key-only message, a Canal partial image or statement, a dropped partition) travels
///   in its batch as a [`Gap`](freshen::Gap) ([`Batch::gaps`]): each view over the
///   table sweeps, and reports it. Counted in [`SourceStats::gaps`](crate::SourceStats).
/// - A `next_batch` future dropped half-way loses what it had gathered until the next
///   restart (nothing of it is committed, so a new consumer reads it again): poll it to
///   completion, as the refresher, `fanout` and [`KafkaSink::run`](crate::KafkaSink::run)
///   do.
///
/// ```no_run
/// # async fn demo() -> Result<(), freshen_kafka::Error> {
/// use freshen_codec::Format;
/// use freshen_kafka::{KafkaSource, KafkaSourceConfig};
/// let config = KafkaSourceConfig::new("127.0.0.1:9092", ["tidb-changes"], "freshen", Format::CanalJson);
/// let source = KafkaSource::new(&config)?;
/// // Refresher::builder().source(source) …
/// # Ok(()) }
/// ```
pub struct KafkaSource {
    consumer: Arc<StreamConsumer<Context>>,
    shared: Arc<Shared>,
    decoder: Decoder,
    format: Format,
    dead_letter: Option<DeadLetter>,
    max_batch: usize,
    linger: Duration,
    closed: bool,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("format", &self.format)
            .field("dead_letter", &self.dead_letter.is_some())
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Creates the consumer and subscribes to the topics. Fails on an invalid
    /// configuration; brokers that cannot be reached yet are retried in the background.
    pub fn new(config: &KafkaSourceConfig) -> Result<KafkaSource, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let session = config.session_timeout_ms;
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group)
            .set("client.id", "freshen")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set(
                "auto.offset.reset",
                match config.start {
                    StartFrom::Earliest => "earliest",
                    StartFrom::Latest => "latest",
                },
            )
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 3).min(3000).to_string());
        for (k, v) in &config.properties {
            cc.set(k, v);
        }
        let shared = Arc::new(Shared::default());
        let consumer: StreamConsumer<Context> = cc.create_with_context(Context {
            shared: shared.clone(),
            fencing: None,
        })?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let dead_letter = match &config.dead_letter_topic {
            Some(topic) => Some(DeadLetter::new(&config.brokers, topic, &config.properties)?),
            None => None,
        };
        Ok(KafkaSource {
            consumer: Arc::new(consumer),
            shared,
            decoder: Decoder::new(config.format),
            format: config.format,
            dead_letter,
            max_batch: config.max_batch,
            linger: Duration::from_millis(config.batch_linger_ms),
            closed: false,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SourceStats {
        self.shared.snapshot()
    }

    /// A handle on the counters that outlives moving the source into a refresher.
    pub fn stats_handle(&self) -> SourceStatsHandle {
        SourceStatsHandle(self.shared.clone())
    }

    /// Decodes one message into `out`; drops it when its partition is not assigned here.
    fn take(&mut self, msg: &BorrowedMessage<'_>, out: &mut Vec<Taken>) {
        let c = &self.shared.counters;
        add(&c.messages, 1);
        let tp: Tp = (Arc::from(msg.topic()), msg.partition());
        let Some(epoch) = self.shared.offsets().epoch(&tp) else {
            add(&c.dropped_revoked, 1);
            return;
        };
        let (events, skipped, gap) = match self.decoder.decode(msg.key(), msg.payload()) {
            Ok(Decoded::Gap(gap)) => (Vec::new(), None, Some(gap)),
            Ok(decoded) => (decoded.into_events(), None, None),
            Err(error) => (
                Vec::new(),
                Some(Undecodable {
                    topic: msg.topic().to_owned(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    error,
                    dead_letter_error: None,
                }),
                None,
            ),
        };
        if let (Some(skipped), Some(dl)) = (&skipped, &mut self.dead_letter) {
            dl.send(msg, &skipped.error);
        }
        out.push(Taken {
            tp,
            epoch,
            offset: msg.offset(),
            events,
            skipped,
            gap,
        });
    }

    /// A consumer error: one that needs a person (bad configuration, credentials) ends
    /// the source; the others are counted, remembered and waited out.
    async fn on_error(&self, e: KafkaError) -> Result<(), SourceError> {
        if needs_a_person(&e) {
            return Err(SourceError::new(Error::Client(e)));
        }
        add(&self.shared.counters.consumer_errors, 1);
        *self.shared.last_error() = Some(e.to_string());
        tokio::time::sleep(ERROR_PAUSE).await;
        Ok(())
    }

    async fn next(&mut self) -> Option<Result<Batch, SourceError>> {
        if self.closed {
            return None;
        }
        let consumer = self.consumer.clone();
        let revocations = self.shared.offsets().revocations();
        let mut taken = Vec::new();
        // The first message: as long as it takes.
        while taken.is_empty() {
            match consumer.recv().await {
                Ok(msg) => self.take(&msg, &mut taken),
                Err(e) => {
                    if let Err(fatal) = self.on_error(e).await {
                        return Some(Err(fatal));
                    }
                }
            }
        }
        // More, for a little while.
        let deadline = tokio::time::Instant::now() + self.linger;
        while taken.len() < self.max_batch {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Err(_) => break,
                Ok(Ok(msg)) => self.take(&msg, &mut taken),
                Ok(Err(e)) => {
                    if let Err(fatal) = self.on_error(e).await {
                        return Some(Err(fatal));
                    }
                }
            }
        }
        // A rebalance while gathering: hand out nothing of a partition that left.
        {
            let offsets = self.shared.offsets();
            if offsets.revocations() != revocations {
                let before = taken.len();
                taken.retain(|t| offsets.epoch(&t.tp) == Some(t.epoch));
                add(
                    &self.shared.counters.dropped_revoked,
                    (before - taken.len()) as u64,
                );
            }
        }
        if let Some(dl) = &mut self.dead_letter {
            // Copied before the batch leaves: once acknowledged, the original is gone.
            let (sent, failures) = dl.flush().await;
            for t in &mut taken {
                if let Some(s) = &mut t.skipped {
                    s.dead_letter_error = failures.get(&(t.tp.clone(), t.offset)).cloned();
                }
            }
            let c = &self.shared.counters;
            add(&c.dead_letter_failures, failures.len() as u64);
            add(&c.dead_lettered, sent.saturating_sub(failures.len()) as u64);
        }
        Some(Ok(self.batch(taken)))
    }

    fn batch(&self, taken: Vec<Taken>) -> Batch {
        let mut next: HashMap<Tp, (u64, i64)> = HashMap::new();
        let mut events = Vec::new();
        let mut skipped: Vec<BoxError> = Vec::new();
        let mut gaps = Vec::new();
        for t in taken {
            let e = next.entry(t.tp).or_insert((t.epoch, t.offset + 1));
            e.1 = e.1.max(t.offset + 1);
            events.extend(t.events);
            gaps.extend(t.gap);
            if let Some(s) = t.skipped {
                skipped.push(Box::new(s));
            }
        }
        let c = &self.shared.counters;
        add(&c.events, events.len() as u64);
        add(&c.skipped, skipped.len() as u64);
        add(&c.gaps, gaps.len() as u64);
        let marks: Vec<Mark> = next
            .into_iter()
            .map(|(tp, (epoch, next))| Mark { tp, epoch, next })
            .collect();
        let ack = acknowledge(Arc::downgrade(&self.consumer), self.shared.clone(), marks);
        skipped
            .into_iter()
            .fold(Batch::new(events, ack).with_gaps(gaps), Batch::with_skipped)
    }
}

/// The acknowledgement of one batch: record its offsets, commit what moved.
pub(crate) fn acknowledge(
    consumer: Weak<StreamConsumer<Context>>,
    shared: Arc<Shared>,
    marks: Vec<Mark>,
) -> Ack {
    Ack::new(move || {
        let commits = {
            let mut o = shared.offsets();
            o.ack(&marks);
            o.take_commits()
        };
        if commits.is_empty() {
            return;
        }
        // Gone consumer: the group has been left, the partitions are someone else's.
        let Some(consumer) = consumer.upgrade() else {
            return;
        };
        add(&shared.counters.commits, 1);
        if consumer
            .commit(&to_tpl(&commits), CommitMode::Async)
            .is_err()
        {
            add(&shared.counters.commit_failures, 1);
            let mut o = shared.offsets();
            for (tp, next) in &commits {
                o.failed(tp, *next);
            }
        }
    })
}

impl Source for KafkaSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.next())
    }

    fn capabilities(&self) -> Capabilities {
        self.format.capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.closed {
                return;
            }
            self.closed = true;
            let commits = self.shared.offsets().take_commits();
            let consumer = self.consumer.clone();
            let shared = self.shared.clone();
            // librdkafka's synchronous commit blocks its thread: keep it off the runtime's.
            let _ = tokio::task::spawn_blocking(move || {
                if !commits.is_empty() {
                    add(&shared.counters.commits, 1);
                    if consumer
                        .commit(&to_tpl(&commits), CommitMode::Sync)
                        .is_err()
                    {
                        add(&shared.counters.commit_failures, 1);
                    }
                }
                consumer.unsubscribe();
            })
            .await;
        })
    }
}
