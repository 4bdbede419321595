//! Keep derived tables fresh from change-data-capture.
//!
//! A change event is a doorbell, never the data: freshen maps each row change to the
//! *scope keys* of the derived tables it dirties, waits for each key to go quiet
//! (debounce, capped by a maximum wait), and calls your rebuild to recompute that scope
//! from the source tables. Rebuilds are idempotent, so at-least-once delivery is enough
//! and the derived table cannot drift; a reconcile sweep is the safety net.
//!
//! # Concepts
//!
//! - [`Source`]: batches of [`RowEvent`]s, each batch with one [`Ack`]. Sources live in
//!   adapter crates (`freshen-postgres`, `freshen-kafka`, …); [`channel`] is an in-memory one.
//! - *Scope*: `Fn(&RowEvent) -> keys`. A row that moves between scopes dirties both
//!   ([`RowEvent::scope_keys`]).
//! - [`DirtySet`]: the scheduler. Per-key debounce (`coalesce`) with a cap (`max_wait`),
//!   single flight, exponential backoff with jitter, quarantine after `poison_after`
//!   failures that blame the key. O(log n) per operation.
//! - [`Retry`]: whose fault a failure is. An outage (the *path*) delays rebuilds and
//!   never quarantines a key; only the key's own data (its SQL raised) counts.
//! - *Rebuild*: recompute one key, or up to N keys per call ([`Rebuild`]).
//! - *Fan-out* ([`Expand`]): a table that does not carry the view's key (a plan, a
//!   product) maps its changed rows to view keys through a query, off the receive path;
//!   the parent rows are debounced like keys and their acknowledgements pass to the
//!   keys they map to ([`Builder::fan_out`]).
//! - *Reconcile*: list the live key universe ([`Enumerate`]) once at start, then on an
//!   interval and right after a TRUNCATE; every key flows through the normal pipeline.
//! - What a source says besides rows: a [`Gap`] (rows of a table changed that the stream
//!   did not carry: the views over it sweep) and a [`SchemaChange`] (a view whose declared
//!   key it breaks pauses, holding its keys and acks, until a later change undoes it).
//!   [`Builder::watches`] declares a view's tables and key columns.
//! - [`AckPolicy`]: acknowledge on enqueue (stateless; the sweep heals a crash) or after
//!   rebuild (the default; a crash loses nothing, the source replays).
//! - [`Stats`]: counters, gauges and a freshness-lag histogram, from a [`Handle`].
//! - [`redact_url`]: a connection string with its secrets hidden, the one routine every
//!   adapter uses for logs, errors and `check` output.
//!
//! # Example
//!
//! Three row changes on two devices collapse into two rebuilds:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use freshen::{channel, Ack, Batch, Key, Op, Refresher, Row, RowEvent, Value};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let reading = |device: &str, value: i64| {
//!     RowEvent::new("public", "readings", Op::Insert)
//!         .with_new(Row::from_pairs([("device", Value::from(device)), ("value", Value::Int(value))]))
//! };
//! let (feed, source) = channel(16);
//! let rebuilt = Arc::new(Mutex::new(Vec::new()));
//! let log = rebuilt.clone();
//! let refresher = Refresher::builder()
//!     .source(source)
//!     .scope(|e: &RowEvent| e.scope_keys(&["device"]))
//!     .rebuild(move |key: Key| {
//!         let log = log.clone();
//!         async move {
//!             // Here: DELETE + INSERT … SELECT … WHERE device = $1, in one transaction.
//!             log.lock().unwrap().push(key.to_string());
//!             Ok::<_, std::io::Error>(())
//!         }
//!     })
//!     .coalesce(Duration::from_millis(20))
//!     .build()
//!     .expect("valid configuration");
//!
//! let events = vec![reading("dev-1", 10), reading("dev-2", 5), reading("dev-1", 12)];
//! feed.send(Batch::new(events, Ack::none())).await.unwrap();
//! drop(feed); // end of stream: run drains the dirty keys, then returns
//! let handle = refresher.handle();
//! refresher.run(std::future::pending()).await.unwrap();
//!
//! let mut keys = rebuilt.lock().unwrap().clone();
//! keys.sort();
//! assert_eq!(keys, ["dev-1", "dev-2"]);
//! assert_eq!(handle.stats().rebuilds_ok, 2);
//! # });
//! ```
//!
//! # The shape of a source
//!
//! Every source crate (`freshen-postgres`, `freshen-kafka`, `freshen-pulsar`, and the
//! ones to come) has the same parts, so that a reader of one can read them all and a
//! program plugs any of them in the same way:
//!
//! - **A config type owned by the crate**: serde, unknown keys rejected, every field
//!   documented, and a `problems()` that lists every mistake at once. Secrets are never
//!   printed: `Debug` and errors show them through [`redact_url`].
//! - **A constructor** that validates the config, sets up what the source needs
//!   upstream (a slot, a subscription), and returns the [`Source`]: batches of
//!   [`RowEvent`]s, each batch with one [`Ack`], never a whole transaction buffered.
//!   [`Source::capabilities`] says honestly what it guarantees.
//! - **A handle implementing [`SourceProbe`]**: [`SourceHealth`] (streaming, positions,
//!   lag, last error, setup problems) without I/O, and a periodic `sample` for what must
//!   be asked of the server.
//! - **One error type** whose `retry()` gives a [`Retry`] read from codes (SQLSTATE,
//!   error numbers, broker codes), never from message text; a rebuild helper overrides
//!   [`Rebuild::classify`] with it, so an outage is never blamed on a key.
//! - **[`plug::SourcePlug`] on the config type**: the one trait through which a program
//!   that reads configuration files validates, checks ([`plug::Finding`]s, each with its
//!   fix) and starts the source against a [`plug::Plan`] (which tables each view watches
//!   by which key columns). The `freshen` binary registers each kind with one line.
//! - **Test support** in `freshen-testenv` (a throwaway real server, the refresher
//!   running on a task, polling with deadlines), never a mock.
//!
//! # Dependencies
//!
//! This crate depends on tokio only; it never learns about a database. No features.

mod ack;
mod backoff;
mod builder;
mod channel;
pub mod cursor;
mod deadlines;
mod dirty;
mod event;
mod fanout;
mod hash;
mod heap;
mod histogram;
mod index;
mod key;
mod parts;
pub mod plug;
pub mod poller;
mod pump;
mod rebuild;
mod redact;
pub mod reference;
mod refresher;
mod report;
mod retry;
mod runner;
mod schema;
mod shared;
mod source;
mod stats;
mod sweep;

pub use ack::AckPolicy;
pub use backoff::{Backoff, Jitter};
pub use builder::Builder;
pub use channel::{ChannelSource, Feed, FeedClosed, channel};
/// How many keys a sweep lists between two [`Report::SweepProgress`] lines.
pub const SWEEP_PROGRESS_EVERY: u64 = 100_000;

pub use dirty::{Completion, DirtyConfig, DirtySet, Mark, Outcome, Ready, Ticket};
pub use event::{Columns, Op, Row, RowEvent, Tx, Value};
pub use fanout::{Branch, fanout};
pub use histogram::HistogramSnapshot;
pub use key::{Key, Parts, Quoted};
pub use rebuild::{
    Due, Enumerate, Expand, KeySink, Rebuild, RebuildBy, SinkClosed, Whole, WholeDone, WholeWay,
};
pub use redact::{
    MASK, SAFE_PARAMETERS, SecretUrl, clip, is_safe_parameter, parameter_name, redact_text,
    redact_url,
};
pub use refresher::{Handle, Refresher};
pub use report::{BuildError, Report, RunError};
pub use retry::Retry;
pub use schema::{Difference, Gap, SchemaChange};
pub use shared::Quarantined;
pub use source::{
    Ack, Batch, BeforeImage, BoxError, BoxFuture, Capabilities, ScopedKey, Source, SourceError,
    SourceHealth, SourceProbe, SourceProblem, StreamMark,
};
pub use stats::{Stats, WholeRunning};

/// The library guide's Rust examples (docs/library.md) compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct ReadmeDoctests;
