//! A table's snapshot progress as freshen stores and shows it (JSON): the changefeed
//! keeps it with its log and serves it (`GET /changefeed/snapshot`), a sink's snapshots
//! keep it in the source database (`freshen_sink_snapshots`) and `/status` shows it. At
//! a plug's boundary it is the core's serde-free [`TableSnapshot`].
//!
//! The JSON is the format records were stored in since snapshots began: a store
//! written by an earlier version opens with its progress intact. Its position is sealed
//! where a redaction rule hides a key column ([`crate::Redactor::seal_position`]).

use freshen::plug::{self, TableSnapshot};
use serde::{Deserialize, Serialize};

/// Where a table's snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotState {
    /// Asked for; not started.
    Pending,
    /// Some chunks are in; resumes after `after`.
    Running,
    /// Every row was read (or the table was truncated meanwhile).
    Done,
}

/// One table's snapshot progress, as stored and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotProgress {
    /// The table's schema.
    pub schema: String,
    /// The table.
    pub table: String,
    /// Where it stands.
    pub state: SnapshotState,
    /// The primary key of the last row read (as text, in key order): the next chunk
    /// starts after it. `None` when the position is sealed (`after_sealed`) and once the
    /// snapshot is done.
    pub after: Option<Vec<String>>,
    /// The same position sealed, in place of `after`, where a redaction rule hides a
    /// primary-key column: an opaque token (see [`freshen::plug::Redact::seal_position`])
    /// that only the running process, or a restart with the same hash key, opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_sealed: Option<String>,
    /// Rows put out (appended, published) as `read` events.
    pub rows: u64,
    /// Rows dropped because their row changed while the chunk was in flight (the live
    /// event went out instead).
    pub dropped: u64,
    /// Chunks put out.
    pub chunks: u64,
    /// When the snapshot was asked for (ms since the Unix epoch).
    pub started_ms: u64,
    /// When it ended.
    pub finished_ms: Option<u64>,
    /// The last failure reading from the source, until a chunk succeeds again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl SnapshotProgress {
    /// A snapshot of `schema.table` asked for at `now` (ms since the Unix epoch), not
    /// started.
    pub fn new(schema: impl Into<String>, table: impl Into<String>, now: u64) -> SnapshotProgress {
        SnapshotProgress {
            schema: schema.into(),
            table: table.into(),
            state: SnapshotState::Pending,
            after: None,
            after_sealed: None,
            rows: 0,
            dropped: 0,
            chunks: 0,
            started_ms: now,
            finished_ms: None,
            last_error: None,
        }
    }

    /// `schema.table`, for logs.
    pub fn table_name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// Marks the snapshot done at `now` (ms since the Unix epoch). A finished snapshot
    /// never resumes, so it keeps no position: a key read last is not kept at rest.
    pub fn finish(&mut self, now: u64) {
        self.state = SnapshotState::Done;
        self.finished_ms = Some(now);
        self.after = None;
        self.after_sealed = None;
    }

    /// Drops the position of a finished snapshot stored by an earlier version (which
    /// kept the last key read); whether anything changed, for the caller to store it
    /// again.
    pub fn scrub_finished(&mut self) -> bool {
        let kept = self.after.is_some() || self.after_sealed.is_some();
        if self.state == SnapshotState::Done && kept {
            self.after = None;
            self.after_sealed = None;
            return true;
        }
        false
    }
}

impl From<plug::SnapshotState> for SnapshotState {
    fn from(s: plug::SnapshotState) -> SnapshotState {
        match s {
            plug::SnapshotState::Pending => SnapshotState::Pending,
            plug::SnapshotState::Running => SnapshotState::Running,
            plug::SnapshotState::Done => SnapshotState::Done,
        }
    }
}

impl From<SnapshotState> for plug::SnapshotState {
    fn from(s: SnapshotState) -> plug::SnapshotState {
        match s {
            SnapshotState::Pending => plug::SnapshotState::Pending,
            SnapshotState::Running => plug::SnapshotState::Running,
            SnapshotState::Done => plug::SnapshotState::Done,
        }
    }
}

// Field by field both ways: the core's `TableSnapshot` carries no serde (the core
// depends on tokio only), so this record is its stored and served form.
impl From<TableSnapshot> for SnapshotProgress {
    fn from(p: TableSnapshot) -> SnapshotProgress {
        SnapshotProgress {
            schema: p.schema,
            table: p.table,
            state: p.state.into(),
            after: p.after,
            after_sealed: p.after_sealed,
            rows: p.rows,
            dropped: p.dropped,
            chunks: p.chunks,
            started_ms: p.started_ms,
            finished_ms: p.finished_ms,
            last_error: p.last_error,
        }
    }
}

impl From<SnapshotProgress> for TableSnapshot {
    fn from(p: SnapshotProgress) -> TableSnapshot {
        TableSnapshot {
            schema: p.schema,
            table: p.table,
            state: p.state.into(),
            after: p.after,
            after_sealed: p.after_sealed,
            rows: p.rows,
            dropped: p.dropped,
            chunks: p.chunks,
            started_ms: p.started_ms,
            finished_ms: p.finished_ms,
            last_error: p.last_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as earlier versions stored it (when freshen-postgres held the type)
    /// reads back unchanged, and survives the trip through the plug's type.
    #[test]
    fn a_record_stored_by_an_earlier_version_reads_back() {
        let stored = r#"{"schema":"public","table":"items","state":"running","after":["41"],"rows":40,"dropped":1,"chunks":4,"started_ms":7,"finished_ms":null}"#;
        let p: SnapshotProgress = serde_json::from_str(stored).unwrap();
        assert_eq!(p.state, SnapshotState::Running);
        assert_eq!(p.after.as_deref(), Some(&["41".to_owned()][..]));
        assert_eq!(serde_json::to_string(&p).unwrap(), stored);
        let back = SnapshotProgress::from(TableSnapshot::from(p.clone()));
        assert_eq!(back, p);
    }
}
