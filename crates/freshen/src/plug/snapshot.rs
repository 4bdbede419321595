//! A sink's snapshots — the rows that already exist, published among the live changes —
//! as a source that can take them offers them ([`SourcePlug::sink_snapshots`]), so a
//! program steers them (runs them, asks for tables, shows their progress) without
//! knowing the source's kind.
//!
//! ```text
//!   SourcePlug::sink_snapshots(SinkSnapshotSpec) ──► dyn SinkSnapshots
//!                                                      │ splice()   handed to the sink
//!                                                      │ run(stop)  the driver's task
//!                                                      │ request()  tables asked for
//!                                                      └ status()   each table's progress
//! ```
//!
//! [`SourcePlug::sink_snapshots`]: super::SourcePlug::sink_snapshots

use std::sync::Arc;
use std::time::Duration;

use super::{Redact, Splice};
use crate::source::{BoxError, BoxFuture};

/// Where a table's snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    /// Asked for; not started.
    Pending,
    /// Some chunks are delivered; it resumes after the last.
    Running,
    /// Every row was read (or the table was truncated meanwhile).
    Done,
}

impl SnapshotState {
    /// `pending`, `running` or `done`.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotState::Pending => "pending",
            SnapshotState::Running => "running",
            SnapshotState::Done => "done",
        }
    }
}

/// One table's snapshot progress, as a source reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSnapshot {
    /// The table's schema.
    pub schema: String,
    /// The table.
    pub table: String,
    /// Where it stands.
    pub state: SnapshotState,
    /// The key of the last row read (as text, in key order): the next chunk starts
    /// after it.
    pub after: Option<Vec<String>>,
    /// The same position sealed, in place of `after`, where a redaction rule hides a
    /// key column: an opaque token (see [`Redact::seal_position`]).
    pub after_sealed: Option<String>,
    /// Rows published as `read` events.
    pub rows: u64,
    /// Rows dropped because their row changed while the chunk was in flight (the live
    /// change was published instead).
    pub dropped: u64,
    /// Chunks delivered.
    pub chunks: u64,
    /// When the snapshot was asked for (ms since the Unix epoch).
    pub started_ms: u64,
    /// When it ended.
    pub finished_ms: Option<u64>,
    /// The last failure reading from the source, until a chunk succeeds again.
    pub last_error: Option<String>,
}

/// How one sink's snapshots run.
#[derive(Debug, Clone)]
pub struct SinkSnapshotSpec {
    /// The sink's identity ([`SinkPlug::identity`](super::SinkPlug::identity)), under
    /// which its progress is kept: a sink with a new identity starts afresh.
    pub identity: String,
    /// On start, read every table without a completed snapshot; otherwise only the
    /// tables asked for.
    pub initial: bool,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Pause between chunks.
    pub pause: Duration,
    /// The tables it may read: those captured (`(schema, table)`), since a table the
    /// stream does not carry could not be checked against its changes.
    pub tables: Vec<(String, String)>,
    /// The `[[redact]]` rules, when there are any: the progress a snapshot keeps holds
    /// a hidden key column's position sealed ([`Redact::seal_position`]).
    pub redact: Option<Arc<dyn Redact>>,
}

/// One sink's snapshots, from [`SourcePlug::sink_snapshots`](super::SourcePlug::sink_snapshots).
pub trait SinkSnapshots: Send + Sync + 'static {
    /// The sink's identity, as the spec gave it.
    fn identity(&self) -> &str;

    /// What the sink calls on every batch before publishing it: the chunk rows to
    /// publish among the batch's changes.
    fn splice(&self) -> Splice;

    /// Runs the snapshots until `stop` completes: with `initial`, first every table
    /// without a completed one; unfinished ones resume; then those asked for. Reading
    /// failures are retried and shown in the progress; only what cannot be retried
    /// ends it.
    fn run(&self, stop: BoxFuture<'static, ()>) -> BoxFuture<'static, Result<(), BoxError>>;

    /// Asks for snapshots of `tables` (`schema.table`, or a table name the captured
    /// tables hold once): each one not under way starts over. Answers their progress;
    /// unknown tables are an error naming them all.
    fn request<'a>(
        &'a self,
        tables: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<TableSnapshot>, BoxError>>;

    /// Each table's progress, by name.
    fn status(&self) -> Vec<TableSnapshot>;
}

impl std::fmt::Debug for dyn SinkSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkSnapshots")
            .field("identity", &self.identity())
            .finish_non_exhaustive()
    }
}
