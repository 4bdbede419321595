//! The cursor-incremental source (`kind = "mysql-incremental"`): for MySQL and MariaDB
//! where freshen may not read the binlog (no REPLICATION grants, a managed read
//! replica, a vendor's database). It needs only SELECT on the polled tables, and
//! somewhere to keep its cursors (a table, by default in the polled database).
//!
//! The contract is `postgres-incremental`'s, and so is the cursor logic
//! ([`freshen::cursor`], shared): each table has a cursor column every insert and
//! update moves forward (`updated_at`, an AUTO_INCREMENT id for insert-only tables); a
//! poll reads, in one `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`, pages of
//! rows past the last read position ordered by `(cursor, primary key)` with the keyset
//! predicate `(cursor, pk) > (?, ?)`, so rows that share a cursor value across a page
//! boundary are neither skipped nor read twice, and memory holds one page. Every row is
//! an [`Op::Update`](freshen::Op) carrying the row as it is now (no former row).
//!
//! # Late commits: a lookback window only
//!
//! MySQL has no `xmin` horizon: a session cannot see which transactions were running
//! when its snapshot was taken, nor which transaction wrote a row. So a row committed
//! late with an earlier cursor value — an AUTO_INCREMENT id allocated, or
//! `updated_at = NOW()` evaluated, early in a transaction that commits after a poll read
//! past that value — is covered by `lookback` alone ([`freshen::cursor::Horizon::NONE`]):
//! the range read since the durable cursor stays pending and is read again at every poll
//! for `lookback` (default 30s) after it was first read; rows found there that no earlier
//! poll handed over are handed over ([`freshen::cursor::Handed`] remembers what was),
//! and only then may the position become durable. A transaction that commits within
//! `lookback` of the poll that read past its cursor value is found; one that commits
//! later is **missed** until its row changes again or a reconcile sweep covers it. The
//! capabilities say so (`lookback_only`), and `freshen check` reports it for every view
//! and for the source. Set `lookback` above the longest write transaction on the polled
//! tables. The cost: each poll re-reads the rows of the last `lookback` (an index range
//! scan with an index on the cursor), and the source remembers their positions to hand
//! each over once — memory in proportion to the rows read within one `lookback`, which
//! while catching up on a big table (polls back to back) is every row read in that time;
//! the pending range is then read again at most once a poll interval.
//!
//! # What it cannot do
//!
//! As `postgres-incremental`: no deletes, no former row, no TRUNCATE, no transaction
//! boundaries; a row whose cursor value moves back past the durable cursor is not seen,
//! nor are rows whose cursor is NULL. Position columns (the cursor and the primary key)
//! must have a type that orders as it compares: integers, DECIMAL, temporal types,
//! strings (by their collation) and binary strings; FLOAT, DOUBLE, ENUM, SET, JSON and
//! BIT are refused.
//!
//! # Durability
//!
//! The durable cursor of each table is stored (table `freshen_cursors`, one row per
//! source name and table) only after the refresher acknowledged the batches up to it —
//! after the rebuilds their rows dirtied are done — so a restart or SIGKILL resumes from
//! it and re-reads at most the pending range and what was not yet acknowledged.
//!
//! One process is active per source `name`: it holds the binlog source's named lock
//! ([`Leadership`](crate::Leadership), `GET_LOCK`), keyed `mysql-incremental:NAME`, on
//! the cursor store's server; a second process waits as a standby and takes over when
//! the holder's session ends.

mod settings;
mod source;
mod store;
mod table;

pub use settings::{MySqlIncrementalSettings, TableSettings};
pub use source::{
    IncrementalConfig, IncrementalHandle, IncrementalStats, MySqlDialect, MySqlIncrementalSource,
    PolledTable, TableReader,
};
pub use table::TableName;
pub(crate) use table::url_naming;
