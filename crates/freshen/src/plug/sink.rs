//! How a sink kind — somewhere every captured change is published besides the views —
//! plugs into a program that picks it from configuration (the `freshen` binary), beside
//! [`SourcePlug`]:
//!
//! ```text
//!   [[sinks]] kind = "…" ──deserialize──► XSinkConfig: SinkPlug
//!                                             │ problems()   offline validation
//!                                             │ identity()   who keeps snapshot progress
//!                                             └ open() ──► RunSink(branch, splice, stop)
//!                                               open_redacted(redact): the same, with
//!                                               column redaction on what it publishes
//! ```
//!
//! A sink is one more consumer of the source's [`fanout`](crate::fanout()): it takes
//! batches from its [`Branch`] and acknowledges each once it is durable elsewhere. With
//! a snapshot, the program hands it a [`Splice`] that answers, for each batch, the rows
//! a snapshot read to publish among the batch's changes.
//!
//! [`SourcePlug`]: super::SourcePlug

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::fanout::Branch;
use crate::source::{BoxError, BoxFuture};
use crate::{Ack, Batch, RowEvent};

/// Called on every batch, in order, before it is published: `(index, rows, delivered)`
/// for each run of rows (a snapshot's, published as reads) to publish before the
/// batch's event at `index`; `delivered` is acknowledged with the batch once every
/// record up to and including those rows is delivered.
pub type Splice = Box<dyn FnMut(&Batch) -> Vec<(usize, Vec<RowEvent>, Ack)> + Send>;

/// A sink set up by [`SinkPlug::open`], run once on its branch of the source, with an
/// optional [`Splice`], until the stop future completes, the branch ends or delivery
/// fails.
pub type RunSink = Box<
    dyn FnOnce(
            Branch,
            Option<Splice>,
            BoxFuture<'static, ()>,
        ) -> BoxFuture<'static, Result<(), BoxError>>
        + Send,
>;

/// Rewrites the row images of the events a sink publishes (column redaction, e.g.
/// `freshen_codec::Redactor`): `None` leaves an event as it is. Applied to the
/// branch's events and to a snapshot's rows alike, never to rebuilds.
///
/// A position freshen keeps outside the process (a snapshot's resume key, a polling
/// cursor) holds values of the table's columns too: where a rule hides one of them, the
/// position is kept *sealed* ([`seal_position`](Self::seal_position)), never in clear.
pub trait Redact: fmt::Debug + Send + Sync + 'static {
    /// `event` redacted, or `None` when no rule concerns it.
    fn apply(&self, event: &RowEvent) -> Option<RowEvent>;

    /// `position` — the values of `columns` of `schema.table`, as text — sealed into an
    /// opaque token that only [`open_position`](Self::open_position) reads back, when a
    /// rule hides any of those columns; `None` when none does (the position may be kept
    /// as it is).
    fn seal_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        position: &[String],
    ) -> Option<String>;

    /// The position `token` holds, sealed by [`seal_position`](Self::seal_position) for
    /// the same table and columns; `None` when it cannot be opened (sealed under another
    /// key: a changed rule or hash key, or a key that lived only in an earlier process).
    fn open_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        token: &str,
    ) -> Option<Vec<String>>;
}

/// What a running sink says about its deliveries, for `/metrics`: counters only grow
/// (from the sink's start), gauges are now. Read through a [`SinkProbe`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkReport {
    /// Records the destination acknowledged (events, snapshot rows and dead letters).
    pub delivered: u64,
    /// Records whose delivery failed for good (after the client's own retries): the
    /// batch stays unacknowledged and is replayed.
    pub failed: u64,
    /// Errors the client reported and retried by itself (a broker down, a connection
    /// refused): a sink waiting out an outage counts up here before anything fails.
    pub client_errors: u64,
    /// Rows sent to the dead-letter path, by reason: each reason a short fixed word of
    /// the sink's (`missing_id`), never an error's text, so the label set stays small.
    pub dead_lettered: Vec<(&'static str, u64)>,
    /// Batches handed to the destination and not yet acknowledged by it.
    pub batches_waiting: u64,
    /// When the oldest of those batches was handed over (`None`: none waits).
    pub oldest_waiting: Option<SystemTime>,
    /// When the destination last acknowledged a record (`None`: never yet).
    pub last_delivery: Option<SystemTime>,
}

/// Reads a running sink's [`SinkReport`]; from [`SinkPlug::open_probed`].
pub trait SinkProbe: Send + Sync + 'static {
    /// The report now.
    fn report(&self) -> SinkReport;
}

/// A sink kind's configuration, as a program that reads configuration files uses it.
///
/// Implemented by each sink crate's configuration type (which also derives serde's
/// `Deserialize` and rejects unknown fields), so that what a sink knows about itself —
/// its defaults, validation, how it publishes — lives in its crate.
pub trait SinkPlug: fmt::Debug + Send + Sync + 'static {
    /// The kind, as `[[sinks]] kind` names it.
    fn kind(&self) -> &'static str;

    /// The kind as messages name it (`"Kafka"`).
    fn name(&self) -> &'static str;

    /// What is wrong with the values themselves, each problem a sentence starting with
    /// the field's name; checked without any I/O.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }

    /// Who this sink is where its progress is kept (a snapshot's, per table): the same
    /// while it publishes to the same place, so that a sink pointed elsewhere starts
    /// afresh (`kafka:<topic>`).
    fn identity(&self) -> String;

    /// Tables this sink needs captured (`(schema, table)`), besides the views' and the
    /// source's own: a transactional outbox names its table here, so that the file need
    /// not list it twice.
    fn tables(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Sets the sink up (a producer; nothing is sent yet) and returns how to run it.
    fn open(&self) -> Result<RunSink, BoxError>;

    /// Like [`open`](Self::open), with `redact` applied to every event and snapshot row
    /// before the sink encodes it. A kind that cannot redact refuses (the default), so
    /// configured redaction is never skipped silently.
    fn open_redacted(&self, redact: Arc<dyn Redact>) -> Result<RunSink, BoxError> {
        let _ = redact;
        Err(format!("the {} sink cannot redact columns", self.name()).into())
    }

    /// [`open`](Self::open) (or [`open_redacted`](Self::open_redacted) with `redact`),
    /// with a [`SinkProbe`] reading the running sink's deliveries. The default has no
    /// probe: the sink exports nothing.
    fn open_probed(
        &self,
        redact: Option<Arc<dyn Redact>>,
    ) -> Result<(RunSink, Option<Arc<dyn SinkProbe>>), BoxError> {
        let run = match redact {
            Some(r) => self.open_redacted(r)?,
            None => self.open()?,
        };
        Ok((run, None))
    }
}
