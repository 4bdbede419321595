//! `KeySource`: the worker end of the key stream — a consumer group member whose keys
//! go straight into the views' dirty sets, whose rebuilds are fenced by partition
//! ownership, and whose offsets follow the rebuilds.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{
    Ack, Batch, BoxError, BoxFuture, Capabilities, Due, Gap, Rebuild, Retry, ScopedKey, Source,
    SourceError,
};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use tokio::sync::{Notify, mpsc};

use crate::Error;
use crate::context::{Context, Fencing, Shared, to_tpl};
use crate::error::needs_a_person;
use crate::fence::Fences;
use crate::key_config::KeyStreamConfig;
use crate::key_publisher::partition_count;
use crate::keys::{StreamRecord, partition_of};
use crate::offsets::{Mark, Tp};
use crate::source::acknowledge;
use crate::stats::{SourceStats, add};

/// Pause after a consumer error before polling again.
const ERROR_PAUSE: Duration = Duration::from_millis(50);

/// One read of the key stream: its records, what could not be decoded, its offsets.
struct Read {
    records: Vec<StreamRecord>,
    skipped: Vec<String>,
    marks: Vec<Mark>,
}

/// Dirtied scope keys read from the key stream as a consumer group member.
///
/// - The group's assignment is `cooperative-sticky`: a rebalance moves only the
///   partitions that must move, and the others keep being rebuilt meanwhile.
/// - Keys go to the views by name ([`split`](Self::split)), each marked dirty with the
///   transaction id its record carries, so the rebuild's visibility guard still holds.
///   A gap record (a TRUNCATE at the capture instance) reaches its view as a
///   [`Gap`]: the view sweeps, if it has a reconcile.
/// - Offsets are committed per partition only up to what every view acknowledged:
///   under `after-rebuild`, after the rebuilds of the keys read.
/// - Single flight across instances: wrap each view's rebuild with
///   [`fence`](Self::fence). When partitions are revoked, no rebuild of their keys
///   starts here any more, and the revocation (so the rebalance, so the next owner's
///   start) waits for the ones running, up to `revoke_timeout_ms`. Keys of partitions
///   that left and are still dirty here are skipped when their turn comes (counted as
///   `fenced`): their records are not committed, so the new owner reads them again.
pub struct KeySource {
    consumer: Arc<StreamConsumer<Context>>,
    shared: Arc<Shared>,
    fencing: Arc<Fencing>,
    partitions: i32,
    max_batch: usize,
    linger: Duration,
    closed: bool,
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySource")
            .field("topic", &self.fencing.topic)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl KeySource {
    /// Reads the topic's partition count, creates the consumer and subscribes. Fails on
    /// an invalid configuration or a missing topic.
    pub async fn connect(config: &KeyStreamConfig) -> Result<KeySource, Error> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Config(problems));
        }
        let session = config.session_timeout_ms;
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group)
            .set("client.id", "freshen-worker")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 3).min(3000).to_string());
        for (k, v) in &config.properties {
            cc.set(k, v);
        }
        let shared = Arc::new(Shared::default());
        let fencing = Arc::new(Fencing {
            fences: Fences::default(),
            topic: config.topic.clone(),
            revoke_timeout: Duration::from_millis(config.revoke_timeout_ms.into()),
        });
        let consumer: StreamConsumer<Context> = cc.create_with_context(Context {
            shared: shared.clone(),
            fencing: Some(fencing.clone()),
        })?;
        let consumer = Arc::new(consumer);
        let c = consumer.clone();
        let topic = config.topic.clone();
        let partitions = tokio::task::spawn_blocking(move || partition_count(c.client(), &topic))
            .await
            .map_err(|_| Error::Client(rdkafka::error::KafkaError::Canceled))??;
        fencing.fences.lock().set_partitions(partitions);
        consumer.subscribe(&[&config.topic])?;
        Ok(KeySource {
            consumer,
            shared,
            fencing,
            partitions,
            max_batch: config.max_batch,
            linger: Duration::from_millis(config.batch_linger_ms),
            closed: false,
        })
    }

    /// The topic's partition count.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// The health and counters handle (kind `kafka-keys`), usable after the source has
    /// been split.
    pub fn probe(&self) -> KeyStreamProbe {
        KeyStreamProbe {
            shared: self.shared.clone(),
            fencing: self.fencing.clone(),
        }
    }

    /// `rebuild` of `view`, fenced: a key is rebuilt only while its partition is owned
    /// here, and a revocation waits for its running rebuilds.
    pub fn fence(&self, view: &str, rebuild: Box<dyn Rebuild>) -> Box<dyn Rebuild> {
        Box::new(Fenced {
            view: view.into(),
            inner: rebuild,
            fencing: self.fencing.clone(),
            shared: self.shared.clone(),
        })
    }

    /// One source per view (in `views` order), each carrying its view's keys. A batch
    /// of records is acknowledged (its offsets committed) once every view has
    /// acknowledged its share. A record for a view not in `views` is skipped and
    /// reported (on the first view's source): every worker must run the same views.
    /// Call within a tokio runtime; the consumer closes once every view's source has.
    pub fn split(self, views: Vec<String>) -> Vec<ViewKeys> {
        let n = views.len();
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(4)).unzip();
        let (finished_tx, finished) = tokio::sync::watch::channel(false);
        let split = Arc::new(Split {
            open: AtomicUsize::new(n),
            all_closed: Notify::new(),
            finished,
        });
        let index: HashMap<String, usize> =
            views.into_iter().enumerate().map(|(i, v)| (v, i)).collect();
        tokio::spawn(pump(self, index, senders, split.clone(), finished_tx));
        receivers
            .into_iter()
            .map(|rx| ViewKeys {
                rx,
                split: split.clone(),
                closed: false,
            })
            .collect()
    }

    /// Decodes one message into `out`; drops it when its partition is not assigned here.
    fn take(
        &self,
        msg: &BorrowedMessage<'_>,
        out: &mut Vec<(Tp, u64, i64, Result<StreamRecord, String>)>,
    ) {
        add(&self.shared.counters.messages, 1);
        let tp: Tp = (Arc::from(msg.topic()), msg.partition());
        let Some(epoch) = self.shared.offsets().epoch(&tp) else {
            add(&self.shared.counters.dropped_revoked, 1);
            return;
        };
        let record = StreamRecord::decode(msg.payload().unwrap_or_default())
            .map_err(|e| format!("{}[{}]@{}: {e}", msg.topic(), msg.partition(), msg.offset()));
        out.push((tp, epoch, msg.offset(), record));
    }

    async fn on_error(&self, e: rdkafka::error::KafkaError) -> Result<(), SourceError> {
        if needs_a_person(&e) {
            return Err(SourceError::new(Error::Client(e)));
        }
        add(&self.shared.counters.consumer_errors, 1);
        *self.shared.last_error() = Some(e.to_string());
        tokio::time::sleep(ERROR_PAUSE).await;
        Ok(())
    }

    async fn next(&mut self) -> Result<Read, SourceError> {
        let consumer = self.consumer.clone();
        let revocations = self.shared.offsets().revocations();
        let mut taken = Vec::new();
        while taken.is_empty() {
            match consumer.recv().await {
                Ok(msg) => self.take(&msg, &mut taken),
                Err(e) => self.on_error(e).await?,
            }
        }
        let deadline = tokio::time::Instant::now() + self.linger;
        while taken.len() < self.max_batch {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Err(_) => break,
                Ok(Ok(msg)) => self.take(&msg, &mut taken),
                Ok(Err(e)) => self.on_error(e).await?,
            }
        }
        {
            let offsets = self.shared.offsets();
            if offsets.revocations() != revocations {
                let before = taken.len();
                taken.retain(|t| offsets.epoch(&t.0) == Some(t.1));
                add(
                    &self.shared.counters.dropped_revoked,
                    (before - taken.len()) as u64,
                );
            }
        }
        let mut next: HashMap<Tp, (u64, i64)> = HashMap::new();
        let mut read = Read {
            records: Vec::with_capacity(taken.len()),
            skipped: Vec::new(),
            marks: Vec::new(),
        };
        for (tp, epoch, offset, record) in taken {
            let e = next.entry(tp).or_insert((epoch, offset + 1));
            e.1 = e.1.max(offset + 1);
            match record {
                Ok(r) => read.records.push(r),
                Err(why) => read.skipped.push(why),
            }
        }
        let c = &self.shared.counters;
        add(&c.events, read.records.len() as u64);
        add(&c.skipped, read.skipped.len() as u64);
        read.marks = next
            .into_iter()
            .map(|(tp, (epoch, next))| Mark { tp, epoch, next })
            .collect();
        Ok(read)
    }

    fn ack(&self, marks: Vec<Mark>) -> Ack {
        acknowledge(Arc::downgrade(&self.consumer), self.shared.clone(), marks)
    }

    async fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // Stopping: nothing more starts here, whoever gets the partitions next.
        self.fencing.fences.lock().revoke_all();
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
    }
}

/// The key stream worker's health: partitions owned, records read, rebalances.
#[derive(Debug, Clone)]
pub struct KeyStreamProbe {
    shared: Arc<Shared>,
    fencing: Arc<Fencing>,
}

impl KeyStreamProbe {
    /// A snapshot of the counters.
    pub fn stats(&self) -> SourceStats {
        self.shared.snapshot()
    }

    /// The partitions of the key stream this instance owns now.
    pub fn owned(&self) -> Vec<i32> {
        self.fencing.fences.lock().owned()
    }
}

impl freshen::SourceProbe for KeyStreamProbe {
    fn kind(&self) -> &'static str {
        "kafka-keys"
    }

    fn health(&self) -> freshen::SourceHealth {
        let s = self.stats();
        let mut h = freshen::SourceHealth::default();
        h.streaming = true;
        h.last_error = s.last_error;
        h.reconnects = s.rebalances;
        h.events = s.events;
        h.skipped = s.skipped;
        h.partitions = Some(self.owned());
        h
    }
}

/// A view's rebuild, fenced by partition ownership.
struct Fenced {
    view: Arc<str>,
    inner: Box<dyn Rebuild>,
    fencing: Arc<Fencing>,
    shared: Arc<Shared>,
}

/// Leaves the fence when the rebuild ends, however it ends (a cancelled rebuild too).
struct Entered<'a>(&'a Fences, Vec<i32>);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if !self.1.is_empty() {
            self.0.leave(&self.1);
        }
    }
}

impl Rebuild for Fenced {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let fences = &self.fencing.fences;
            let mut entered = Vec::with_capacity(due.len());
            let mut owned = Vec::with_capacity(due.len());
            {
                let mut f = fences.lock();
                let n = f.partitions().unwrap_or(1);
                for d in due {
                    let p = partition_of(&self.view, &d.key, n);
                    if f.enter(p) {
                        entered.push(p);
                        owned.push(d.clone());
                    }
                }
            }
            let _entered = Entered(fences, entered);
            let fenced = due.len() - owned.len();
            if fenced > 0 {
                add(&self.shared.counters.fenced, fenced as u64);
            }
            if owned.is_empty() {
                return Ok(());
            }
            self.inner.rebuild(&owned).await
        })
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn classify(&self, error: &BoxError) -> Retry {
        self.inner.classify(error)
    }
}

struct Split {
    open: AtomicUsize,
    all_closed: Notify,
    /// True once the consumer is closed (its last offsets committed, the group left).
    finished: tokio::sync::watch::Receiver<bool>,
}

/// One view's share of a [`KeySource`]: its keys, batch by batch.
pub struct ViewKeys {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    split: Arc<Split>,
    closed: bool,
}

impl fmt::Debug for ViewKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewKeys").finish_non_exhaustive()
    }
}

impl Source for ViewKeys {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.rx.recv())
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::NONE;
        // Uncommitted records are read again by whoever owns their partition next.
        c.recoverable = true;
        c
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if !self.closed {
                self.closed = true;
                // No more batches for this view: the pump never waits on it again (what
                // it held back is unacknowledged, so read again by the next owner).
                self.rx.close();
                if self.split.open.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.split.all_closed.notify_one();
                    // The last view's close returns once the consumer is closed: a
                    // process that stops right after has committed what it rebuilt, and
                    // nothing of the consumer outlives it (a close still talking to a
                    // broker held the runtime's shutdown).
                    let _ = self.split.finished.clone().wait_for(|done| *done).await;
                }
            }
        })
    }
}

/// An acknowledgement shared by `n` views: the upstream one runs when the last has.
fn shares(ack: Ack, n: usize) -> Vec<Ack> {
    let remaining = Arc::new(AtomicUsize::new(n));
    let upstream = Arc::new(Mutex::new(Some(ack)));
    (0..n)
        .map(|_| {
            let (remaining, upstream) = (remaining.clone(), upstream.clone());
            Ack::new(move || {
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let ack = upstream.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(ack) = ack {
                        ack.ack();
                    }
                }
            })
        })
        .collect()
}

async fn pump(
    mut source: KeySource,
    index: HashMap<String, usize>,
    senders: Vec<mpsc::Sender<Result<Batch, SourceError>>>,
    split: Arc<Split>,
    finished: tokio::sync::watch::Sender<bool>,
) {
    let closed = split.all_closed.notified();
    tokio::pin!(closed);
    let mut all_closed = false;
    loop {
        let read = tokio::select! {
            _ = &mut closed => {
                all_closed = true;
                break;
            }
            read = source.next() => read,
        };
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                for tx in &senders {
                    let _ = tx.send(Err(e.clone())).await;
                }
                break;
            }
        };
        let mut per_view: Vec<Vec<ScopedKey>> = vec![Vec::new(); senders.len()];
        let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); senders.len()];
        let mut skipped = read.skipped;
        for r in read.records {
            let view = match &r {
                StreamRecord::Key(k) => &k.view,
                StreamRecord::Gap { view, .. } => view,
            };
            let Some(&i) = index.get(view) else {
                skipped.push(format!(
                    "a record of view {view:?}, which this worker does not run: every worker must run the capture's views"
                ));
                continue;
            };
            match r {
                StreamRecord::Key(k) => per_view[i].push(ScopedKey {
                    key: k.key,
                    txid: k.txid,
                }),
                StreamRecord::Gap { gap, .. } => {
                    if !gaps[i].contains(&gap) {
                        gaps[i].push(gap);
                    }
                }
            }
        }
        let acks = shares(source.ack(read.marks), senders.len());
        // Every view gets every batch, empty or not: acknowledgements then leave each
        // view in order, so the shared ones do too.
        for (i, (((tx, keys), gaps), ack)) in
            senders.iter().zip(per_view).zip(gaps).zip(acks).enumerate()
        {
            let mut batch = Batch::new(Vec::new(), ack).with_keys(keys).with_gaps(gaps);
            if i == 0 {
                for s in &skipped {
                    batch = batch.with_skipped(s.clone());
                }
            }
            let _ = tx.send(Ok(batch)).await;
        }
    }
    drop(senders);
    if !all_closed {
        closed.await;
    }
    source.close().await;
    // Dropping the consumer closes it in librdkafka, which blocks its thread: off the
    // runtime's.
    let _ = tokio::task::spawn_blocking(move || drop(source)).await;
    let _ = finished.send(true);
}
