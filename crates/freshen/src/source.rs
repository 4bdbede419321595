//! The source contract: batches of row events, each with one acknowledgement.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{Gap, Key, Retry, RowEvent, SchemaChange};

/// A boxed error that can cross threads.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A boxed, sendable future (what the object-safe traits here return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Tells a source that a batch is done with: its position may be confirmed upstream
/// (replication feedback, Kafka offset commit, Pulsar ack).
///
/// The refresher calls acks strictly in the order the batches arrived. Dropping an
/// `Ack` without calling it is "not acknowledged": after a crash the source replays.
pub struct Ack(Option<Box<dyn FnOnce() + Send>>);

impl Ack {
    /// An acknowledgement that runs `f` once when the batch is released.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Ack {
        Ack(Some(Box::new(f)))
    }

    /// An acknowledgement that does nothing (a source without positions).
    pub fn none() -> Ack {
        Ack(None)
    }

    /// Whether this acknowledgement does nothing ([`Ack::none`]).
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// Releases the batch.
    pub fn ack(mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl fmt::Debug for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Ack" } else { "Ack(none)" })
    }
}

/// What a source hands the refresher: row events, the messages it had to skip, and one
/// acknowledgement covering all of them.
///
/// A message the source cannot decode is a *skip*: it travels in the batch (so its
/// position is acknowledged with the batch and never pins the source), is counted and
/// reported, and the stream goes on.
#[derive(Debug)]
pub struct Batch {
    events: Arc<[RowEvent]>,
    skipped: Vec<BoxError>,
    marks: Vec<StreamMark>,
    gaps: Vec<Gap>,
    schema_changes: Vec<SchemaChange>,
    keys: Vec<ScopedKey>,
    committed_through: Option<u64>,
    ack: Ack,
}

/// A key someone else already scoped (a capture instance that publishes keys, not
/// rows): the refresher marks it dirty as it is, without running its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedKey {
    /// The key, in the view's own key space.
    pub key: Key,
    /// The transaction whose change dirtied it (PostgreSQL `xid8`), when known: the
    /// rebuild's snapshot must see it (see [`Due::txids`](crate::Due)).
    pub txid: Option<u64>,
}

/// A marker written into the source's change stream by someone other than a row change
/// (PostgreSQL's logical decoding messages, `pg_logical_emit_message`), delivered in
/// stream order: it sits before the batch's event at index [`StreamMark::at`].
///
/// Consumers that order their own work against the stream use them (the changefeed's
/// snapshot watermarks); others ignore them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMark {
    /// Index in the batch's events of the first event after the mark (`events().len()`
    /// when the mark comes after every event).
    pub at: usize,
    /// The writer's prefix (a namespace: marks with prefixes a consumer does not know
    /// are not for it).
    pub prefix: Box<str>,
    /// The payload.
    pub content: Box<[u8]>,
    /// The mark's position in the source (a PostgreSQL LSN).
    pub position: u64,
}

impl Batch {
    /// A batch of events with its acknowledgement.
    pub fn new(events: Vec<RowEvent>, ack: Ack) -> Batch {
        Batch {
            events: events.into(),
            skipped: Vec::new(),
            marks: Vec::new(),
            gaps: Vec::new(),
            schema_changes: Vec::new(),
            keys: Vec::new(),
            committed_through: None,
            ack,
        }
    }

    /// A batch sharing already-shared events (see [`fanout`](crate::fanout)).
    pub fn shared(events: Arc<[RowEvent]>, ack: Ack) -> Batch {
        Batch {
            events,
            skipped: Vec::new(),
            marks: Vec::new(),
            gaps: Vec::new(),
            schema_changes: Vec::new(),
            keys: Vec::new(),
            committed_through: None,
            ack,
        }
    }

    /// Adds a message the source could not decode.
    pub fn with_skipped(mut self, error: impl Into<BoxError>) -> Batch {
        self.skipped.push(error.into());
        self
    }

    /// Adds marks found in the stream among these events (see [`StreamMark`]).
    pub fn with_marks(mut self, marks: Vec<StreamMark>) -> Batch {
        self.marks = marks;
        self
    }

    /// Adds tables whose rows changed in ways the stream does not carry (see [`Gap`]):
    /// each view over them sweeps.
    pub fn with_gaps(mut self, gaps: Vec<Gap>) -> Batch {
        self.gaps = gaps;
        self
    }

    /// Tables whose rows changed in ways the stream does not carry.
    pub fn gaps(&self) -> &[Gap] {
        &self.gaps
    }

    /// Adds schema changes seen among these events (see [`SchemaChange`]): a view whose
    /// key they break pauses until a later change undoes it.
    pub fn with_schema_changes(mut self, changes: Vec<SchemaChange>) -> Batch {
        self.schema_changes = changes;
        self
    }

    /// Adds keys already scoped (see [`ScopedKey`]): each is marked dirty as the keys
    /// of an event are, holding the batch's acknowledgement until it is rebuilt.
    pub fn with_keys(mut self, keys: Vec<ScopedKey>) -> Batch {
        self.keys = keys;
        self
    }

    /// Keys already scoped that the batch carries besides its events.
    pub fn keys(&self) -> &[ScopedKey] {
        &self.keys
    }

    /// Takes the batch's already-scoped keys out of it.
    pub fn take_keys(&mut self) -> Vec<ScopedKey> {
        std::mem::take(&mut self.keys)
    }

    /// Schema changes seen among the events.
    pub fn schema_changes(&self) -> &[SchemaChange] {
        &self.schema_changes
    }

    /// Says that every transaction whose commit position ([`Tx::commit`](crate::Tx)) is
    /// at or below `commit` is complete: no later batch holds an event of it. Sources
    /// that hand transactions over in commit order and know where each ends set it (the
    /// changefeed's transaction markers use it to close the last transaction at once).
    pub fn with_committed_through(mut self, commit: Option<u64>) -> Batch {
        self.committed_through = commit;
        self
    }

    /// The commit position through which every transaction is complete, when the
    /// source knows it (see [`Batch::with_committed_through`]).
    pub fn committed_through(&self) -> Option<u64> {
        self.committed_through
    }

    /// Marks found in the stream among the events, in stream order.
    pub fn marks(&self) -> &[StreamMark] {
        &self.marks
    }

    /// The row events, in source order.
    pub fn events(&self) -> &[RowEvent] {
        &self.events
    }

    /// The events as a shared slice.
    pub fn shared_events(&self) -> &Arc<[RowEvent]> {
        &self.events
    }

    /// Messages skipped because they could not be decoded.
    pub fn skipped(&self) -> &[BoxError] {
        &self.skipped
    }

    /// Splits the batch into its parts.
    pub fn into_parts(self) -> (Arc<[RowEvent]>, Vec<BoxError>, Ack) {
        (self.events, self.skipped, self.ack)
    }
}

/// A source error, with what it says about retrying ([`SourceError::retry`]).
///
/// Sources retry what can be retried (reconnects) themselves. An error whose directive
/// is [`Retry::Path`] says the way to the data is down and the source goes on retrying:
/// the refresher reports it ([`Report::SourceFailed`](crate::Report)) and reads on. Any
/// other ends [`Refresher::run`](crate::Refresher::run) — the default, for what a
/// source cannot mend by itself. Cloneable so that [`fanout`](crate::fanout) can hand it
/// to every branch.
#[derive(Clone)]
pub struct SourceError {
    error: Arc<dyn StdError + Send + Sync + 'static>,
    retry: Retry,
}

impl SourceError {
    /// Wraps any error; it ends the run ([`Retry::Fix`]) unless
    /// [`SourceError::with_retry`] says otherwise.
    pub fn new(error: impl Into<BoxError>) -> SourceError {
        SourceError {
            error: Arc::from(error.into()),
            retry: Retry::Fix,
        }
    }

    /// A plain-message error.
    pub fn msg(message: impl fmt::Display) -> SourceError {
        SourceError::new(message.to_string())
    }

    /// The same error with another directive: [`Retry::Path`] when the source goes on
    /// retrying by itself.
    pub fn with_retry(mut self, retry: Retry) -> SourceError {
        self.retry = retry;
        self
    }

    /// What the error says about retrying.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// Whether the error ends the source's stream: anything but [`Retry::Path`].
    pub fn is_final(&self) -> bool {
        self.retry != Retry::Path
    }

    /// The wrapped error.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.error
    }
}

impl fmt::Debug for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.error, f)
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl StdError for SourceError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.error.source()
    }
}

/// How much of a changed row's former image a source delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeImage {
    /// The whole former row (PostgreSQL REPLICA IDENTITY FULL, MySQL full row image).
    Full,
    /// Only the key columns, and only when they change (PostgreSQL's default identity).
    KeyOnly,
    /// No former row.
    None,
}

/// What a source kind guarantees — static data per kind (adjusted by its configuration
/// where that changes a promise) — so that `freshen check` can say what a view relies on
/// that its source cannot give, and what covers the gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// How much of the former row updates and deletes carry (what lets a row that moves
    /// to another key dirty the key it left).
    pub before_image: BeforeImage,
    /// Whether the former image can vary per table (PostgreSQL's replica identity):
    /// then `before_image` is the best case and the source's own check names the tables.
    pub before_image_per_table: bool,
    /// Whether deleted rows arrive as events.
    pub deletes: bool,
    /// Whether a TRUNCATE of a table arrives (as an [`Op::Truncate`](crate::Op) event).
    pub truncates: bool,
    /// Whether unacknowledged batches are replayed after a restart (a replication slot,
    /// a committed consumer offset, a stored binlog position). Without it only the
    /// reconcile sweep heals a crash.
    pub recoverable: bool,
    /// Whether changes arrive with their transaction's boundaries (one acknowledgement
    /// per transaction, commit order).
    pub transactions: bool,
    /// Whether schema changes of watched tables are reported.
    pub schema_changes: bool,
    /// Whether the source can deliver the current contents as events (a snapshot):
    /// the one thing the changefeed's and the sinks' snapshots ask of a source.
    pub snapshot: bool,
    /// Whether the source polls a cursor column instead of reading a change log.
    pub cursor: bool,
    /// Whether a polled cursor finds rows committed late with an earlier cursor value by
    /// a time window alone (`lookback`: MySQL, MariaDB), not by the transactions the
    /// server reports running (PostgreSQL's `xmin` horizon): a transaction that commits
    /// more than `lookback` after a poll read past its cursor value is missed.
    pub lookback_only: bool,
    /// Whether some changes may arrive without their rows, as a [`Gap`](crate::Gap) (a
    /// key-only message, a statement, a partition dropped): then the views over the
    /// table sweep, so a view without a reconcile sweep misses them.
    pub row_gaps: bool,
}

impl Capabilities {
    /// A log of row changes that gives nothing more than the rows themselves; sources
    /// start from it and say what they add.
    pub const NONE: Capabilities = Capabilities {
        before_image: BeforeImage::None,
        before_image_per_table: false,
        deletes: false,
        truncates: false,
        recoverable: false,
        transactions: false,
        schema_changes: false,
        snapshot: false,
        cursor: false,
        lookback_only: false,
        row_gaps: false,
    };
}

impl Default for Capabilities {
    fn default() -> Capabilities {
        Capabilities::NONE
    }
}

/// What a running source says about itself — one shape for every kind, so that a
/// program reports any source's health without knowing which it is.
///
/// Positions are the source's own, as numbers (a PostgreSQL LSN, a Kafka offset sum…);
/// `None` where the source has no such notion.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SourceHealth {
    /// Changes are flowing now (connected, subscribed, streaming).
    pub streaming: bool,
    /// A healthy standby: connected, waiting for another instance to fail (a Pulsar
    /// failover subscription, a slot held elsewhere).
    pub standby: bool,
    /// The last error (a broken connection, a failed reconnect), if any.
    pub last_error: Option<String>,
    /// What is wrong with the source's setup now (a table dropped from a publication);
    /// each entry makes the pipeline unhealthy until it is gone.
    pub problems: Vec<SourceProblem>,
    /// Reconnects (or rebalances) so far.
    pub reconnects: u64,
    /// Row events handed over.
    pub events: u64,
    /// Messages skipped because they could not be decoded.
    pub skipped: u64,
    /// Furthest position received.
    pub received: Option<u64>,
    /// Position confirmed upstream (everything before it is safe to forget).
    pub confirmed: Option<u64>,
    /// The upstream's own newest position (server WAL end, high watermark).
    pub head: Option<u64>,
    /// How far behind the confirmed position is, in bytes (what the server retains).
    pub lag_bytes: Option<u64>,
    /// How far behind in time: the age of the oldest change handed over and not yet
    /// confirmed (its commit time). `None` when nothing is waiting or not known.
    pub lag_seconds: Option<f64>,
    /// The upstream's state of the retained position (a slot's `wal_status`).
    pub retention: Option<String>,
    /// How long the source has taken nothing from its upstream while the upstream's
    /// own position, read independently, was ahead of it: zero while it reads (or has
    /// nothing to read); `None` for a source that does not watch itself this way. A
    /// stall is also one of [`problems`](Self::problems).
    pub stalled_for: Option<std::time::Duration>,
    /// The partitions of a shared stream this instance owns now (a member of a consumer
    /// group that splits the work, such as a key stream worker); `None` when the source
    /// is not split between instances.
    pub partitions: Option<Vec<i32>>,
    /// Tables the source found while running, captured through a pattern of its
    /// configuration (`schema.*`, `"all"`), as `(schema, table)` in the order found.
    pub discovered: Vec<(String, String)>,
}

/// Something wrong with a running source's setup, and the table it concerns (so that a
/// program can name the views that watch it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceProblem {
    /// `schema.table`, when the problem concerns one table.
    pub table: Option<(String, String)>,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The uniform handle of a running source: its health now, and a periodic sample of
/// what must be asked of the server (lag, setup drift), off the receive path.
pub trait SourceProbe: Send + Sync + 'static {
    /// The source's kind, as configuration names it (`postgres`, `kafka`, …).
    fn kind(&self) -> &'static str;

    /// A snapshot of the source's health (cheap: no I/O).
    fn health(&self) -> SourceHealth;

    /// Refreshes what [`health`](Self::health) cannot know without asking the server;
    /// called every few seconds. The default does nothing.
    fn sample(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A stream of row-event batches: PostgreSQL logical replication, a MySQL binlog, a
/// Kafka topic, an in-memory channel.
///
/// Usable as a trait object (`Box<dyn Source>`) so that a program can pick its source
/// at run time.
pub trait Source: Send + 'static {
    /// The next batch; `None` when the stream has ended for good; `Err` for a failure
    /// the source could not recover from (it retries reconnects itself).
    ///
    /// The refresher may drop the returned future when it shuts down; nothing the source
    /// has not yet handed over is acknowledged, so a replay covers it.
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>>;

    /// What this source can guarantee.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Called once when the refresher stops, after the last acknowledgement: a chance to
    /// send final feedback upstream.
    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

impl<S: Source + ?Sized> Source for Box<S> {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        (**self).next_batch()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        (**self).close()
    }
}
