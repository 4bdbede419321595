//! A source's existing rows read in chunks interleaved with its stream (DBLog's
//! watermarks), for a consumer that keeps its own log of the stream — the changefeed —
//! so that it snapshots tables without knowing the source's kind.
//!
//! ```text
//!   SourcePlug::chunk_reader() ──► dyn ChunkReader
//!                                    │ read_table(holder, progress)
//!                                    │     per chunk: low mark, SELECT, holder.hold(chunk),
//!                                    │     high mark … holder answers the progress
//!                                    │ seal_stored()      stored progress made fit to keep
//!                                    │ readable(table)    can it be read at all
//!                                    └ selected(patterns) the tables patterns select now
//!
//!   the stream ──► consumer: a mark whose content is a held chunk's `high` ends it;
//!                  each row is checked with `chunk.check` against its latest change
//! ```
//!
//! The reader owns everything about the source (its SQL, its marks, what a chunk's
//! snapshot saw); the holder owns where chunks go (a log, a sink) and the progress it
//! stores. [`TableSnapshot`] is what passes between them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Redact, TableSnapshot};
use crate::RowEvent;
use crate::source::{BoxError, BoxFuture};

/// The prefix of the stream marks ([`crate::StreamMark::prefix`]) freshen writes as
/// snapshot watermarks, whatever the source: a consumer tells them from other marks by it.
pub const WATERMARK_PREFIX: &str = "freshen.watermark";

/// What decides which of a chunk's rows may be stale: the change a row's latest event
/// carries may be missing from the chunk's SELECT (it committed after the chunk's low
/// watermark, or in a transaction the chunk's snapshot did not see). Such a row is
/// dropped: the live change is in the stream before the chunk's high watermark.
pub trait ChunkView: fmt::Debug + Send + Sync {
    /// Whether a change committed by transaction `xid` ([`crate::Tx::id`]) at stream
    /// position `commit` ([`crate::Tx::commit`]) may be missing from the chunk's rows.
    fn misses(&self, xid: u64, commit: u64) -> bool;
}

/// A chunk read between its watermarks, for the holder to keep until the stream mark
/// whose content is `high` comes by.
#[derive(Debug)]
#[non_exhaustive]
pub struct Chunk {
    /// The content of the high watermark (a mark with [`WATERMARK_PREFIX`]) that ends
    /// the chunk: the stream carries every change the chunk may miss before it.
    pub high: Box<[u8]>,
    /// The chunk's rows, as inserts.
    pub rows: Vec<RowEvent>,
    /// Which rows are stale, asked of each row's latest change.
    pub check: Arc<dyn ChunkView>,
    /// The table's progress once the chunk is in; the holder adds the counts.
    pub next: TableSnapshot,
}

impl Chunk {
    /// A chunk ending at the mark `high`.
    pub fn new(
        high: impl Into<Box<[u8]>>,
        rows: Vec<RowEvent>,
        check: Arc<dyn ChunkView>,
        next: TableSnapshot,
    ) -> Chunk {
        Chunk {
            high: high.into(),
            rows,
            check,
            next,
        }
    }
}

/// What happened to a table's snapshot, for the holder to log.
#[derive(Debug, Clone, Copy)]
pub enum ChunkEvent<'a> {
    /// The table's reading starts (from its first row, or after its position).
    Started(&'a TableSnapshot),
    /// A chunk is in; the table's progress after it.
    Chunk(&'a TableSnapshot),
    /// The table is read to its end.
    Done(&'a TableSnapshot),
}

/// What a chunk's answer is: the table's progress once the chunk is in (the chunk's
/// `next` with the counts added, or the progress before it to read the chunk again);
/// `None` when the holder dropped it unanswered (it stops).
pub type ChunkAnswer = Option<Result<TableSnapshot, BoxError>>;

/// Where a reader's chunks go: held until their high watermark comes through the
/// holder's stream, checked and put in there.
pub trait ChunkHolder: Send + Sync {
    /// The redaction rules of what the holder publishes: where one hides a primary-key
    /// column, the progress the reader hands out holds its position sealed.
    fn redact(&self) -> Option<&dyn Redact>;

    /// Holds `chunk` until its high watermark comes by; answers once it is in.
    fn hold(&self, chunk: Chunk) -> BoxFuture<'static, ChunkAnswer>;

    /// Forgets the chunk ending at `high`, if it is still held (its watermark failed,
    /// or never came back).
    fn release(&self, high: &[u8]);

    /// Completes when the holder stops; a chunk held then is released.
    fn stopping(&self) -> BoxFuture<'static, ()>;

    /// The table's progress as the reader moved it: after each chunk, and at the start
    /// when a stored position had to be sealed.
    fn committed(&self, progress: &TableSnapshot);

    /// Says what happened to the table's snapshot (logs it).
    fn on(&self, event: ChunkEvent<'_>);
}

/// Why a table's reading stopped before its end.
#[derive(Debug)]
pub enum ReadError {
    /// The holder stopped, or dropped a chunk unanswered.
    Stopped,
    /// Reading the source failed: retried later.
    Source(BoxError),
    /// A high watermark did not come back through the stream within this long (is the
    /// capture running?): retried later.
    Unseen(Duration),
    /// The holder failed to put a chunk in.
    Holder(BoxError),
}

/// A source's reader of existing rows, from [`SourcePlug::chunk_reader`](super::SourcePlug::chunk_reader).
/// Tables are `(schema, table)` as the source names them.
pub trait ChunkReader: fmt::Debug + Send + Sync + 'static {
    /// Reads one table to its end from `progress` (its first row, or after its
    /// position), chunk by chunk of `chunk_rows`, `pause` apart, each handed to
    /// `holder`. At most one chunk is held at a time.
    fn read_table<'a>(
        &'a self,
        holder: &'a dyn ChunkHolder,
        progress: TableSnapshot,
        chunk_rows: usize,
        pause: Duration,
    ) -> BoxFuture<'a, Result<(), ReadError>>;

    /// Makes a stored progress record fit to keep: a finished snapshot's position
    /// dropped; an unfinished one's clear position sealed where `redact` hides a
    /// primary-key column. Whether it changed (the caller stores it again).
    fn seal_stored<'a>(
        &'a self,
        redact: Option<&'a dyn Redact>,
        progress: &'a mut TableSnapshot,
    ) -> BoxFuture<'a, Result<bool, BoxError>>;

    /// Whether `table` can be read in chunks (it exists and has a primary key).
    fn readable<'a>(&'a self, table: &'a (String, String)) -> BoxFuture<'a, Result<(), BoxError>>;

    /// The tables `patterns` (the source's `"all"`, `"schema.*"`, `"schema.prefix_*"`
    /// entries) select now, read from the catalog.
    fn selected<'a>(
        &'a self,
        patterns: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BoxError>>;
}

/// Resolves the tables a snapshot request names (`schema.table`, or a table name that
/// `known` holds once) against `known`; every unknown or ambiguous name, with the known
/// ones, in one message.
pub fn resolve_tables(
    known: &[(String, String)],
    names: &[String],
) -> Result<Vec<(String, String)>, String> {
    if names.is_empty() {
        return Err("tables: name at least one table to snapshot".to_owned());
    }
    let spelled = |(s, t): &(String, String)| format!("{s}.{t}");
    let mut resolved = Vec::new();
    let mut unknown = Vec::new();
    for name in names {
        let hits: Vec<&(String, String)> = known
            .iter()
            .filter(|t| spelled(t) == *name || t.1 == *name)
            .collect();
        match hits.as_slice() {
            [one] => resolved.push((*one).clone()),
            _ => unknown.push(name.as_str()),
        }
    }
    if !unknown.is_empty() {
        let known: Vec<String> = known.iter().map(spelled).collect();
        return Err(format!(
            "tables: not captured (or ambiguous): {}; captured: {}",
            unknown.join(", "),
            known.join(", ")
        ));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str, n: &str) -> (String, String) {
        (s.to_owned(), n.to_owned())
    }

    #[test]
    fn a_request_names_tables_by_full_name_or_by_a_name_held_once() {
        let known = [t("public", "a"), t("public", "b"), t("other", "b")];
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            resolve_tables(&known, &names(&["a", "other.b"])).unwrap(),
            [t("public", "a"), t("other", "b")]
        );
        let e = resolve_tables(&known, &names(&["b", "c", "public.a"])).unwrap_err();
        assert_eq!(
            e,
            "tables: not captured (or ambiguous): b, c; captured: public.a, public.b, other.b"
        );
        assert!(resolve_tables(&known, &[]).is_err());
    }
}
