//! A durable, sequenced change log served over HTTP.
//!
//! Capture appends row events to an embedded log (a [redb](https://www.redb.org) file)
//! with group commit; each event gets a monotonic `sequence`. Applications read the log
//! over HTTP in ThemisDB's changefeed format, so its clients work unchanged:
//! long-polling (`GET /changefeed`), Server-Sent Events (`GET /changefeed/stream`),
//! WebSocket (`GET /v2/cdc/stream`), consumer groups with leases and dead letters.
//!
//! # Concepts
//!
//! - [`Changefeed`]: the log. [`Changefeed::append`] returns once the events are
//!   durable; [`Changefeed::capture`] runs a [`freshen::Source`] into the log and
//!   acknowledges each batch once it is durable. Events carrying a source position
//!   ([`freshen::Tx`]: commit LSN, index in the transaction) are appended at most once,
//!   so a source replaying after a crash duplicates nothing.
//! - Readers see only durable events, in sequence order, at their own pace: every reader
//!   reads the log itself, so a slow reader never loses events and never makes the
//!   server buffer for it. A reader may follow several tables in one stream, each from
//!   its own cursor (`?cursors=orders:120,items:95` on the long poll and Server-Sent
//!   Events, `"cursors"` in a WebSocket subscription; each page or event says every
//!   table's next cursor), and ask for a `TRANSACTION_COMMIT` marker after each source
//!   transaction (`tx`); a consumer group keeps one committed sequence (one group per
//!   table for tables consumed at different paces) and carries no markers.
//! - [`app`] builds the HTTP API (an axum `Router`, testable in-process); [`serve`] runs
//!   it on a bound listener until a shutdown future completes, through `freshen-http`
//!   (the binary's metrics listener uses the same): on loopback only `localhost`, IP
//!   addresses and `allowed_hosts` are served (DNS rebinding); WebSocket upgrades and
//!   non-`GET` requests from a browser must come from the API's own origin or one of
//!   `cors_allow_origins`; connections have `header_timeout` to send each request's
//!   headers (and to stay idle between requests), handlers `request_timeout` (long
//!   polls and group receives their wait on top; streams are not cut); at most
//!   `max_connections` are served at once. See [`HttpConfig`]. Long-poll pages, group
//!   receives and the snapshot progress are gzip- or zstd-compressed when the request's
//!   `Accept-Encoding` asks; Server-Sent Events never are (compressors hold frames,
//!   proxies buffer encoded streams), and WebSocket has no permessage-deflate here.
//! - Consumer groups: competing consumers lease events for a visibility timeout,
//!   acknowledge or reject them; unacknowledged events are delivered again, then
//!   dead-lettered. All of it survives a restart.
//! - Retention: by age, count or size in the background ([`RetentionConfig`]), or
//!   `POST /changefeed/retention`. Events some consumer group has not acknowledged are
//!   kept unless the policy says `unacknowledged = "drop"`; a reader that missed
//!   deleted events is told so (a gap, below), never left to guess.
//! - Compaction: `keep = "latest-per-key"` keeps the last event of each row (a DELETE
//!   stays as a tombstone for `tombstone_secs`), so a new consumer builds a table's
//!   state from the log alone.
//! - Snapshots: the rows that already exist, read into the log as `read` events while
//!   changes keep streaming ([`Changefeed::run_snapshots`] next to
//!   [`Changefeed::capture`] on a source whose plug reads chunks, PostgreSQL's;
//!   `snapshot = "initial"`, or
//!   `POST /changefeed/snapshot`). See "Snapshots" below.
//!
//! # What a change means, replayed by key
//!
//! A consumer that applies the log by key (a PUT sets the key's row to `value`, a
//! DELETE removes it, a TRUNCATE removes the table's keys) ends with the source table:
//!
//! - **Primary-key changes** (an UPDATE that moves a row to another key) are a DELETE of
//!   the old key (with `"new_key"`) followed by a PUT of the new one (`op` `insert`,
//!   with `"old_key"`), at consecutive sequences, both carrying the UPDATE's `lsn` and
//!   `xid`. They count as one source event for idempotent capture: a replaying source
//!   appends neither twice. (The Kafka sink does the same in Debezium's way: delete,
//!   tombstone, create.)
//! - **Unchanged values** (PostgreSQL's TOASTed columns under the default replica
//!   identity, which an UPDATE that leaves them alone does not send) are filled in
//!   from the row's latest event in the log, found through the latest-per-key index
//!   (the `latest` table: `schema\0table\0pk` → sequence, updated with every append in
//!   the same commit). Where the log holds no earlier image (the row was not changed
//!   since the changefeed started, it was deleted, or retention removed its last
//!   event), the event keeps `"unchanged_columns"` and says `"partial":true`: `value`
//!   is then not the whole row. Never a `null` for an unknown value.
//!   `freshen check` tells which tables need
//!   `REPLICA IDENTITY FULL` to avoid partial events altogether.
//! - **Gaps**: when events after a reader's position were deleted before it read them
//!   (retention with `unacknowledged = "drop"`, or an explicit delete), the reader is
//!   told: `"gap":{"after":a,"before":b}` in a long-poll page or a consumer group's
//!   receive (and `dropped_sequences`, `last_gap` in the group's info), an
//!   `event: gap` on Server-Sent Events, an `{"action":"gap"}` frame on WebSocket.
//!   Compaction's holes are not gaps: each row's latest event is still there.
//!
//! # Snapshots
//!
//! DBLog's algorithm, without table locks, driven by the source's chunk reader
//! ([`freshen::plug::ChunkReader`], from its plug: the changefeed knows no source
//! kind). PostgreSQL's, for each chunk of a table, in primary-key order: a *low watermark* is written into the WAL (`pg_logical_emit_message`, not
//! transactional: its position is known at once); the chunk is read
//! (`WHERE (pk) > $last ORDER BY pk LIMIT snapshot_chunk_rows`, the last key bound as
//! parameters) in a REPEATABLE READ transaction whose snapshot (`xmin`, `xmax`, running
//! xids) is kept with the rows; then a *high watermark* is written (transactional: it is
//! streamed in commit order with every other transaction). The PostgreSQL source hands
//! logical decoding messages over in stream order ([`freshen::StreamMark`]).
//!
//! When the capture loop meets the high watermark, the events before it are already
//! queued for the writer, and the chunk goes right behind them. The writer checks each
//! row against the row's latest event in the log (the latest-per-key index, so a
//! snapshot needs `key_index = true`): if that event committed after the low watermark
//! (DBLog's window), or in a transaction the chunk's snapshot did not see — WAL order is
//! not visibility order, so a transaction can be in the WAL before the low watermark and
//! still be invisible to the SELECT — the row is dropped: the live event is already in
//! the log, and what follows it streams after. The other rows are appended as events
//! with `"op":"read"` (`type` `PUT`, no `lsn`/`xid`), and the table's progress (the
//! chunk's last key, counts) is written in the same commit. Hence:
//!
//! - a `read` event never shows a row older than a change already in the log, and a
//!   consumer applying the log by key ends with the table;
//! - a crash resumes after the last committed chunk; the chunk in flight is read again
//!   (at-least-once: a row may appear twice, never stale);
//! - memory holds one chunk; `snapshot_pause_ms` spaces chunks out to bound the load on
//!   the source;
//! - a TRUNCATE while a chunk is in flight ends that table's snapshot (whatever exists
//!   after it streams live).
//!
//! Progress is in [`Changefeed::snapshot_status`], `GET /changefeed/snapshot`,
//! `/changefeed/stats` and the metrics (`snapshot_rows_total`,
//! `snapshot_dropped_rows_total`, `snapshot_errors_total`). Failures reading the source
//! are retried with backoff and shown as the table's `last_error`. Filters by operation
//! count a `read` as an `insert`.
//!
//! # Event JSON
//!
//! ThemisDB's fields — `sequence`, `type` (`PUT`, `DELETE`), `key` (`table:pk`, the
//! primary-key values joined by `:`), `value` (the new row as JSON text; `null` for a
//! DELETE), `timestamp_ms` (commit time when the source gives it, else append time),
//! `metadata` (`table`, `pk`), `before_snapshot` / `after_snapshot` (row JSON text, when
//! known) — plus ours: `op` (`insert`, `update`, `delete`, `truncate`, and `read` for a
//! row read by a snapshot, a `PUT`), `schema`,
//! `table`, `lsn` (`X/X`) and `xid` when the source gives them, and `unchanged_columns`
//! (columns the source did not send because they did not change and the log had no
//! earlier image of; they are left out of the row JSON rather than shown as `null`)
//! with `partial` (`true`), and `old_key` / `new_key` on the halves of a primary-key
//! change. A TRUNCATE is a `DELETE` of key `table:`. Clients that ignore fields they do
//! not know (ThemisDB's do) are unaffected by ours.
//!
//! A long-poll reader that asks `tx=1` also gets a `TRANSACTION_COMMIT` entry after each
//! source transaction's last event (`sequence` of that event, `xid`, `lsn`,
//! `event_count`, `first_sequence`); they are made while reading, not stored. See
//! `txmark.rs` for when a transaction is known to have ended.
//!
//! # Store
//!
//! The log is one [redb](https://www.redb.org) file: a copy-on-write B-tree with ACID
//! transactions over several tables, so that events, the dedupe high-water mark,
//! consumer-group cursors, leases and dead letters change atomically. It was chosen over
//! fjall (an LSM tree) by measuring both in one run
//! (`cargo run -p freshen-changefeed --release --features compare-stores --example
//! store_compare`, 2 cores, ~300-byte events, fsync per commit):
//!
//! | events, per commit | redb append | fjall append | redb scan | fjall scan | on disk (redb, fjall) |
//! |---|---|---|---|---|---|
//! | 200k, 1000 | 370k/s | 546k/s | 12.2M/s | 5.0M/s | 68, 118 MiB |
//! | 200k, 100 | 136k/s | 223k/s | 8.9M/s | 4.0M/s | 68, 118 MiB |
//! | 1M, 1000 | 226k/s | 340k/s | 8.0M/s | 2.1M/s | 305, 349 MiB |
//!
//! fjall appends about 1.5× faster; redb reads 2.5–4× faster, stays smaller, and builds
//! in half the time (debug build: redb 6.6 s, no dependencies but libc; fjall about 12 s
//! with lsm-tree and some 30 more crates). A changefeed is read far more than it is
//! written — every event goes to every reader — and group commit already puts appends
//! above the goal, so redb.
//! After a crash, redb checks the file on open: about 1 s per million events.
//!
//! # Example
//!
//! ```
//! use freshen::{Op, Row, RowEvent, Value};
//! use freshen_changefeed::{Changefeed, ChangefeedConfig, Filter};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let cf = Changefeed::open(&ChangefeedConfig::new(dir.path().join("feed.redb"))).await.unwrap();
//! let insert = RowEvent::new("public", "orders", Op::Insert)
//!     .with_pk(["id"])
//!     .with_new(Row::from_pairs([("id", Value::Int(7)), ("total", Value::text("9.50"))]));
//! cf.append(&[insert]).await.unwrap();
//! let events = cf.read(0, 10, &Filter::default()).unwrap();
//! assert_eq!(events[0].sequence, 1);
//! assert!(events[0].json.contains(r#""key":"orders:7""#));
//! cf.close().await;
//! # });
//! ```

mod capture;
mod config;
mod cursors;
mod error;
mod filter;
mod groups;
mod http;
mod log;
mod metrics;
mod record;
mod reference;
mod retention;
mod shared;
mod snapshot;
mod store;
mod txmark;
mod writer;

pub use capture::{CaptureError, CaptureReport};
pub use config::{
    ChangefeedConfig, Durability, GroupDefaults, HttpConfig, Keep, RetentionConfig, Scope,
    SnapshotMode, TokenConfig, Unacknowledged,
};
pub use error::Error;
pub use filter::Filter;
pub use groups::{Gap, GroupInfo, GroupSpec, Start};
pub use http::{AppState, ServeError, app, serve};
pub use log::{Changefeed, Event};
pub use shared::Stats;
pub use snapshot::{DISCOVER_EVERY, SnapshotProgress, SnapshotSource, SnapshotState};
pub use writer::AppendOutcome;
