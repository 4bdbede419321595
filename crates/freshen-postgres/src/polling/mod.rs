//! The cursor-incremental source (`kind = "postgres-incremental"`): for databases where
//! freshen may not replicate (no REPLICATION grant, a managed read replica, a vendor's
//! database). It needs only SELECT on the polled tables, and somewhere to keep its
//! cursors (a table, by default in the same database).
//!
//! # How it reads
//!
//! Each table has a *cursor* column that every insert and update moves forward
//! (`updated_at`, an increasing id). A poll reads, in one REPEATABLE READ READ ONLY
//! snapshot, pages of rows past the last read position ordered by `(cursor, primary
//! key)` with the keyset predicate `(cursor, pk) > ($c, $pk)`: rows that share a cursor
//! value across a page boundary are neither skipped nor read twice, and memory holds one
//! page (never the whole table). Every row becomes an [`Op::Update`](freshen::Op) event
//! carrying the row as it is now — the source cannot tell an insert from an update, and
//! has no former row.
//!
//! # Late commits: the `xmin` horizon and the lookback
//!
//! A transaction that set `updated_at = now()` and committed after a poll moved past
//! that value is the classic loss of cursor polling. Each poll records
//! `pg_current_snapshot()`'s `xmin` (oldest running transaction) and `xmax` (next id).
//! The range read since the durable cursor stays *pending* and is read again at every
//! poll, returning only rows whose writer (the row's `xmin`, made 64-bit) is at least the
//! previous poll's `xmin` — exactly the rows that poll may not have seen. A read position
//! becomes durable only when every transaction that had an id `lookback` after it was
//! read has ended (see [`cursor`]). So:
//!
//! - a transaction that had written before a poll and commits any time later is found
//!   (its id holds the position back until it ends, and the re-read finds its rows);
//! - a transaction whose cursor value was fixed before its first write (`now()` is the
//!   transaction's start), and writers whose clocks lag, are found if their first write
//!   comes within `lookback` (default 5s) of the value;
//! - the cost: a filtered index range scan of the pending range per poll — the rows
//!   written in the last `lookback` plus those since the oldest open write transaction
//!   began, visited once per poll (so about `lookback / poll_interval` visits per row);
//!   while catching up (polls back to back) the range is re-read at most once a poll
//!   interval (BENCHMARKS.md, `incremental`). Rows of transactions that ended between a
//!   poll's `xmin` and `xmax` are handed over twice (a subtransaction's id is not in
//!   `pg_current_snapshot()`, so the exact set is not knowable from SQL); a doorbell
//!   rung twice rebuilds a key twice, never wrongly.
//!
//! Why the `xmin` horizon and not a time lookback alone: a lookback finds a late
//! transaction only if it is longer than that transaction (unknowable; a forgotten
//! `BEGIN` in a console runs for hours), and without the writer filter it would hand
//! every row of the window over again at every poll. The horizon holds the cursor back
//! exactly as long as a transaction that wrote runs, and the filter hands over only rows
//! the previous poll may not have seen; the lookback stays, short, for what ids cannot
//! see.
//!
//! # What it cannot do
//!
//! No deletes (a deleted row is simply gone), no former row (a row whose key columns
//! change leaves its old key stale), no TRUNCATE, no transaction boundaries: the
//! capabilities say so, and `freshen check` reports per view that only a reconcile
//! sweep covers them (an error without one). A row whose cursor value moves backwards
//! past the durable cursor (set by hand, or by a clock that lags more than `lookback`)
//! is not seen. Rows whose cursor is NULL are never read.
//!
//! # Durability
//!
//! The durable cursor of each table is stored (table `freshen_cursors`, one row per
//! source name and table) only after the refresher acknowledged the batches up to it —
//! after the rebuilds their rows dirtied are done — so a restart or SIGKILL resumes
//! from it and re-reads at most the pending range and what was not yet acknowledged.
//! The first run reads every table from its start.

pub mod cursor;
mod settings;
mod source;
mod store;
mod table;

pub use settings::{PgIncrementalSettings, TableSettings};
pub use source::{
    IncrementalConfig, IncrementalHandle, IncrementalStats, PgDialect, PgIncrementalSource,
    PolledTable, TableReader,
};
