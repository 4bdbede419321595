//! `PulsarSource`: a failover subscription whose acknowledgements follow the refresher's.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::{
    Ack, Backoff, Batch, BoxError, BoxFuture, Capabilities, RowEvent, Source, SourceError,
};
use freshen_codec::Decoder;

use crate::Error;
use crate::config::PulsarSourceConfig;
use crate::connection::{Connection, Inbound, Sender};
use crate::frame::{self, Frame};
use crate::lookup::connect_for;
use crate::proto::{
    self, BaseCommand, CommandAck, CommandCloseConsumer, CommandFlow, CommandSubscribe,
    MessageIdData, kind,
};
use crate::stats::{Counters, SourceStats, add};

/// Where a message sits in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    /// The ledger.
    pub ledger: u64,
    /// The entry in the ledger.
    pub entry: u64,
    /// The partition (-1: a non-partitioned topic).
    pub partition: i32,
    /// The message's place in a batched entry.
    pub batch_index: Option<i32>,
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.ledger, self.entry, self.partition)?;
        if let Some(i) = self.batch_index {
            write!(f, ":{i}")?;
        }
        Ok(())
    }
}

/// A message that could not be decoded: where it was and why. Travels in its batch's
/// skipped list ([`Batch::skipped`]); downcast to read the position.
#[derive(Debug)]
pub struct Undecodable {
    /// Its topic.
    pub topic: String,
    /// Its position.
    pub id: MessageId,
    /// Why.
    pub error: String,
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}: {}", self.topic, self.id, self.error)
    }
}

impl std::error::Error for Undecodable {}

/// What acknowledgements need: where to send them, and the last one (re-sent after a
/// reconnect, in case it was lost with the old connection).
#[derive(Debug, Default)]
struct AckState {
    target: Option<(Sender, u64)>,
    last: Option<MessageIdData>,
}

#[derive(Debug, Default)]
struct Shared {
    ack: Mutex<AckState>,
    counters: Counters,
    active: Mutex<Option<bool>>,
    last_error: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn snapshot(&self) -> SourceStats {
        let mut s = self.counters.snapshot();
        s.active = *lock(&self.active);
        s.last_error = lock(&self.last_error).clone();
        s
    }
}

/// A cloneable view of a [`PulsarSource`]'s counters, usable after the source has moved
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
        "pulsar"
    }

    /// A failover standby (the broker made another consumer active) is healthy but not
    /// streaming.
    fn health(&self) -> freshen::SourceHealth {
        let s = self.stats();
        let mut h = freshen::SourceHealth::default();
        h.standby = s.active == Some(false);
        h.streaming = !h.standby;
        h.last_error = s.last_error;
        h.reconnects = s.reconnects;
        h.events = s.events;
        h.skipped = s.skipped;
        h
    }
}

struct Live {
    conn: Connection,
    consumer_id: u64,
    /// Messages received since flow permits were last topped up.
    used: u32,
}

/// One entry read, before the batch is handed out.
struct Taken {
    id: MessageIdData,
    events: Vec<RowEvent>,
    skipped: Vec<Undecodable>,
    gaps: Vec<freshen::Gap>,
}

/// Change events from a Pulsar topic (TiCDC's canal-json by default), read through a
/// failover subscription.
///
/// - Every instance subscribing with the same subscription name shares it: the broker
///   makes one active and holds the others as standbys, which wait (their
///   `next_batch` does not return) until the active one goes.
/// - A new subscription starts at the earliest message; an existing one resumes after
///   its last acknowledgement.
/// - Acknowledgement is cumulative and follows the refresher: a batch's last entry is
///   acknowledged when the refresher releases the batch (batches are released in
///   order), so under `AckPolicy::AfterRebuild` nothing is acknowledged before its
///   keys are rebuilt, and a crash replays from there.
/// - A message that cannot be decoded (bad JSON, an unknown type, a compressed or
///   chunked entry, which are not supported) travels in its batch as an
///   [`Undecodable`]: skipped, counted, acknowledged with the rest.
/// - A message that changed rows without carrying them (a TiCDC key-only message, a
///   dropped partition: a [`Decoded::Gap`](freshen_codec::Decoded)) travels in its batch
///   as a [`Gap`](freshen::Gap): each view over the table sweeps, and reports it.
///   Counted in [`SourceStats::gaps`](crate::SourceStats).
/// - A lost connection is re-established with backoff (lookup, subscribe again, the
///   last acknowledgement re-sent); what was not acknowledged is delivered again.
pub struct PulsarSource {
    config: PulsarSourceConfig,
    topic: String,
    consumer_name: String,
    decoder: Decoder,
    live: Option<Live>,
    shared: Arc<Shared>,
    backoff: Backoff,
    failures: u32,
    closed: bool,
}

impl fmt::Debug for PulsarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulsarSource")
            .field("topic", &self.topic)
            .field("subscription", &self.config.subscription)
            .field("consumer_name", &self.consumer_name)
            .field("connected", &self.live.is_some())
            .finish_non_exhaustive()
    }
}

/// A consumer id no other connection of this process, or (very likely) any other
/// process, uses: pulsar-lite 0.2 rejects an id that another connection holds on the
/// same subscription, though the protocol scopes ids to their connection.
fn fresh_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 of time, process and counter.
    let mut z =
        nanos ^ (u64::from(std::process::id()) << 32) ^ NEXT.fetch_add(1, Ordering::Relaxed);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & 0x001f_ffff_ffff_ffff
}

fn ack_command(consumer_id: u64, id: &MessageIdData) -> BaseCommand {
    BaseCommand {
        ack: Some(CommandAck {
            consumer_id,
            ack_type: proto::ACK_CUMULATIVE,
            message_id: vec![id.clone()],
        }),
        ..BaseCommand::of(kind::ACK)
    }
}

fn flow(consumer_id: u64, permits: u32) -> BaseCommand {
    BaseCommand {
        flow: Some(CommandFlow {
            consumer_id,
            message_permits: permits,
        }),
        ..BaseCommand::of(kind::FLOW)
    }
}

impl PulsarSource {
    /// Checks the configuration. Connecting and subscribing happen on the first
    /// `next_batch` (and again after a lost connection).
    pub fn new(config: PulsarSourceConfig) -> Result<PulsarSource, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let consumer_name = config
            .consumer_name
            .clone()
            .unwrap_or_else(|| format!("freshen-{:x}", fresh_id()));
        Ok(PulsarSource {
            topic: config.full_topic(),
            decoder: Decoder::new(config.format),
            consumer_name,
            config,
            live: None,
            shared: Arc::default(),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
            failures: 0,
            closed: false,
        })
    }

    /// Connects and subscribes now (otherwise the first `next_batch` does), so that a
    /// wrong URL or a refused subscription shows at start.
    pub async fn connect(&mut self) -> Result<(), Error> {
        if self.live.is_none() {
            self.live = Some(self.subscribe().await?);
        }
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SourceStats {
        self.shared.snapshot()
    }

    /// A handle on the counters that outlives moving the source into a refresher.
    pub fn stats_handle(&self) -> SourceStatsHandle {
        SourceStatsHandle(self.shared.clone())
    }

    async fn subscribe(&mut self) -> Result<Live, Error> {
        let conn = connect_for(&self.config.url, &self.topic, self.config.token.as_deref()).await?;
        let consumer_id = fresh_id();
        conn.request(|request_id| BaseCommand {
            subscribe: Some(CommandSubscribe {
                topic: self.topic.clone(),
                subscription: self.config.subscription.clone(),
                sub_type: proto::SUB_FAILOVER,
                consumer_id,
                request_id,
                consumer_name: Some(self.consumer_name.clone()),
                durable: Some(true),
                initial_position: Some(proto::INITIAL_EARLIEST),
            }),
            ..BaseCommand::of(kind::SUBSCRIBE)
        })
        .await?;
        let sender = conn.sender();
        {
            let mut a = lock(&self.shared.ack);
            if let Some(last) = &a.last {
                sender.send(&ack_command(consumer_id, last));
            }
            a.target = Some((sender.clone(), consumer_id));
        }
        sender.send(&flow(consumer_id, self.config.receiver_queue));
        add(&self.shared.counters.subscribes, 1);
        Ok(Live {
            conn,
            consumer_id,
            used: 0,
        })
    }

    /// Forgets the connection after `why`; the next read reconnects.
    fn lost(&mut self, why: String) {
        self.live = None;
        lock(&self.shared.ack).target = None;
        *lock(&self.shared.last_error) = Some(why);
    }

    /// Decodes one entry into `out`; returns how many messages it held.
    fn take(&mut self, frame: Frame, consumer_id: u64, out: &mut Vec<Taken>) -> u32 {
        let Some(msg) = frame.command.message else {
            return 0;
        };
        if msg.consumer_id != consumer_id {
            return 0;
        }
        let id = msg.message_id;
        let position = |batch_index| MessageId {
            ledger: id.ledger_id,
            entry: id.entry_id,
            partition: id.partition.unwrap_or(-1),
            batch_index,
        };
        let mut taken = Taken {
            id: MessageIdData {
                batch_index: None,
                ..id.clone()
            },
            events: Vec::new(),
            skipped: Vec::new(),
            gaps: Vec::new(),
        };
        let skip = |taken: &mut Taken, batch_index, error: String| {
            taken.skipped.push(Undecodable {
                topic: self.topic.clone(),
                id: position(batch_index),
                error,
            });
        };
        let mut count = 1;
        match frame.payload {
            None => skip(&mut taken, None, "a message without payload".into()),
            Some(p) if p.metadata.compression.unwrap_or(0) != 0 => skip(
                &mut taken,
                None,
                format!(
                    "compressed entry (compression type {}): not supported; have the producer send uncompressed",
                    p.metadata.compression.unwrap_or(0)
                ),
            ),
            Some(p) if p.metadata.num_chunks_from_msg.unwrap_or(1) > 1 => {
                skip(&mut taken, None, "chunked message: not supported".into())
            }
            Some(p) => match frame::messages(&p) {
                Err(e) => skip(&mut taken, None, e.to_string()),
                Ok(singles) => {
                    count = singles.len().max(1) as u32;
                    for s in singles {
                        match self
                            .decoder
                            .decode(s.key.as_deref().map(str::as_bytes), s.data.as_deref())
                        {
                            Ok(freshen_codec::Decoded::Gap(g)) => taken.gaps.push(g),
                            Ok(d) => taken.events.extend(d.into_events()),
                            Err(e) => skip(&mut taken, s.batch_index, e.to_string()),
                        }
                    }
                }
            },
        }
        out.push(taken);
        count
    }

    async fn next(&mut self) -> Option<Result<Batch, SourceError>> {
        loop {
            if self.closed {
                return None;
            }
            if self.live.is_none() {
                match self.subscribe().await {
                    Ok(live) => {
                        self.live = Some(live);
                        self.failures = 0;
                    }
                    Err(e) if e.retry() != freshen::Retry::Path => {
                        return Some(Err(SourceError::new(e)));
                    }
                    Err(e) => {
                        add(&self.shared.counters.reconnects, 1);
                        self.failures += 1;
                        self.lost(e.to_string());
                        tokio::time::sleep(self.backoff.ceiling(self.failures)).await;
                        continue;
                    }
                }
            }
            let mut taken = Vec::new();
            let mut received = 0u32;
            let mut deadline = None;
            let lost = loop {
                let Some(live) = self.live.as_mut() else {
                    break None;
                };
                let consumer_id = live.consumer_id;
                let inbound = match deadline {
                    None => live.conn.next().await,
                    Some(d) => match tokio::time::timeout_at(d, live.conn.next()).await {
                        Ok(i) => i,
                        Err(_) => break None,
                    },
                };
                match inbound {
                    Inbound::Message(frame) => {
                        received += self.take(*frame, consumer_id, &mut taken);
                        deadline.get_or_insert_with(|| {
                            tokio::time::Instant::now()
                                + Duration::from_millis(self.config.batch_linger_ms)
                        });
                        if received as usize >= self.config.max_batch {
                            break None;
                        }
                    }
                    Inbound::ActiveChange(active) => *lock(&self.shared.active) = Some(active),
                    Inbound::Send(_) => {}
                    Inbound::Closed(why) => break Some(why),
                }
            };
            if let Some(live) = self.live.as_mut() {
                live.used += received;
                if live.used >= self.config.receiver_queue / 2 {
                    live.conn.sender().send(&flow(live.consumer_id, live.used));
                    live.used = 0;
                }
            }
            if let Some(why) = lost {
                add(&self.shared.counters.reconnects, 1);
                self.lost(why);
            }
            if !taken.is_empty() {
                return Some(Ok(self.batch(taken, received)));
            }
        }
    }

    fn batch(&self, taken: Vec<Taken>, messages: u32) -> Batch {
        let last = taken.last().map(|t| t.id.clone());
        let mut events = Vec::new();
        let mut skipped: Vec<BoxError> = Vec::new();
        let mut gaps = Vec::new();
        for t in taken {
            events.extend(t.events);
            gaps.extend(t.gaps);
            skipped.extend(t.skipped.into_iter().map(|s| Box::new(s) as BoxError));
        }
        let c = &self.shared.counters;
        add(&c.messages, u64::from(messages));
        add(&c.events, events.len() as u64);
        add(&c.skipped, skipped.len() as u64);
        add(&c.gaps, gaps.len() as u64);
        let shared = self.shared.clone();
        let ack = Ack::new(move || {
            let Some(id) = last else { return };
            let mut a = lock(&shared.ack);
            let newer = a
                .last
                .as_ref()
                .is_none_or(|l| (id.ledger_id, id.entry_id) > (l.ledger_id, l.entry_id));
            if !newer {
                return;
            }
            if let Some((sender, consumer_id)) = &a.target {
                sender.send(&ack_command(*consumer_id, &id));
            }
            a.last = Some(id);
            add(&shared.counters.acks, 1);
        });
        skipped
            .into_iter()
            .fold(Batch::new(events, ack).with_gaps(gaps), Batch::with_skipped)
    }
}

impl Source for PulsarSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.next())
    }

    fn capabilities(&self) -> Capabilities {
        self.config.format.capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.closed = true;
            lock(&self.shared.ack).target = None;
            if let Some(live) = self.live.take() {
                // Closing the consumer hands the subscription to a standby at once,
                // rather than when the broker notices the connection is gone.
                let consumer_id = live.consumer_id;
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    live.conn.request(|request_id| BaseCommand {
                        close_consumer: Some(CommandCloseConsumer {
                            consumer_id,
                            request_id,
                        }),
                        ..BaseCommand::of(kind::CLOSE_CONSUMER)
                    }),
                )
                .await;
            }
        })
    }
}
