//! PostgreSQL for freshen: a logical replication source and SQL helpers.
//!
//! # Concepts
//!
//! - [`PgSource`]: streams row changes from a replication slot through the `pgoutput`
//!   plugin and implements [`freshen::Source`]. Rows are handed over as they arrive, in
//!   batches of at most `batch_size` events; a huge transaction is many batches and only
//!   the one holding its commit carries the acknowledgement, so memory stays bounded.
//!   Feedback never confirms past what was acknowledged, and confirms the server's WAL
//!   end when nothing is pending, so a quiet or filtered database retains no WAL.
//!   Reconnects with backoff and resumes from the slot (at-least-once).
//! - [`PgHandle`]: [`Health`] and slot lag of a running source.
//! - [`PgAdmin`]: slot and publication administration and the inspections
//!   `freshen check` runs (`wal_level`, replication privilege, slot lag, publication
//!   coverage, replica identity against scope columns).
//! - [`SqlRebuild`]: a [`freshen::Rebuild`] that runs your statements in one
//!   REPEATABLE READ transaction per key (or batch of keys), with key parts bound as
//!   typed parameters, after checking the snapshot sees every transaction that dirtied
//!   the key.
//! - [`QueryRebuild`]: a [`freshen::Rebuild`] from a declared query: the rows it
//!   returns for a batch of keys are written into a table by one set-based statement
//!   that inserts, updates only what differs (`IS DISTINCT FROM`) and deletes what the
//!   query no longer returns — run as a [`SqlRebuild`], with the same visibility guard.
//! - [`SqlEnumerate`]: a [`freshen::Enumerate`] that streams keys from a query.
//! - [`TableReader`], [`write_watermark`]: a table's rows in primary-key chunks with
//!   the snapshot each was read under, and watermarks written into the WAL, for
//!   snapshots interleaved with the stream (the changefeed's DBLog snapshots). The
//!   source hands logical decoding messages over as [`freshen::StreamMark`]s.
//!   [`ChunkCheck`] and [`StreamedKeys`] decide which of a chunk's rows are stale.
//!   One chunk loop (watermarks, SELECT, waiting for the high watermark) serves the
//!   sinks and [`PgChunkReader`], the [`freshen::plug::ChunkReader`] the source hands
//!   the changefeed.
//! - [`SinkSnapshots`]: the same snapshots for a sink (Kafka): chunks spliced into the
//!   sink's own stream at their high watermarks ([`SinkSnapshots::splice`]), checked
//!   against the keys the stream carried meanwhile, progress stored in the source
//!   database once the sink has delivered a chunk.
//! - [`SqlFanOut`]: a [`freshen::Expand`] that maps changed parent rows to view keys
//!   with a query, in a snapshot that sees the change, page by page.
//! - [`PgIncrementalSource`] ([`incremental`]): a cursor-polling source for databases
//!   without replication grants (SELECT only): keyset pages past a cursor column, late
//!   commits found through the `xmin` horizon, cursors stored after the rebuilds.
//!
//! # Layout
//!
//! The source files are grouped by part: `capture/` (the replication stream and
//! [`PgSource`]), `target/` (rebuilds, fan-outs, enumeration, [`PgTarget`]), `check/`
//! (what `freshen check` asks of PostgreSQL), `snapshot/` (DBLog chunks and
//! watermarks, for the changefeed and for sinks) and `polling/` (the cursor source).
//! Helpers they share sit beside them, named for what they are (`admin/`, `catalog`,
//! `publication`, `table`, `lsn`, `config`, `pool`, `tls`, `quote`, `error`,
//! `spelling`). Their public items are re-exported here, flat, besides the public
//! modules [`check`], [`depends`] and [`polling`] (also [`incremental`]).
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use freshen::{Refresher, RowEvent};
//! use freshen_postgres::{connect_pool, ConnectionConfig, PgSource, PublicationMode, SlotMode, SqlRebuild};
//!
//! let url = "postgres://freshen:secret@localhost/app";
//! let source = PgSource::builder()
//!     .url(url)
//!     .slot("freshen_rollup", SlotMode::CreateIfMissing)
//!     .publication("freshen_rollup", PublicationMode::CreateIfMissing)
//!     .table("public.readings")
//!     .start()
//!     .await?;
//! let pool = connect_pool(&ConnectionConfig::from_url(url)?, 4)?;
//! let rebuild = SqlRebuild::builder(pool)
//!     .statement("DELETE FROM rollup WHERE device = $1")
//!     .statement("INSERT INTO rollup SELECT device, count(*), sum(value) FROM readings WHERE device = $1 GROUP BY device")
//!     .build()
//!     .await?;
//! let refresher = Refresher::builder()
//!     .source(source)
//!     .scope(|e: &RowEvent| e.scope_keys(&["device"]))
//!     .rebuild_with(rebuild)
//!     .coalesce(Duration::from_millis(50))
//!     .build()?;
//! refresher.run(std::future::pending()).await?; // or a shutdown signal
//! # Ok(()) }
//! ```
//!
//! # Key text forms
//!
//! Keys from the stream and keys from [`SqlEnumerate`] are the same [`freshen::Key`]
//! for the same scope: integers print as decimal, booleans as `true`/`false`, text,
//! uuid, numeric, dates and timestamps as PostgreSQL prints them (both sides use the
//! server's `DateStyle`/`TimeZone`). Floats in exponent form (`1e+20`) are the
//! exception; avoid floating-point scope columns.
//!
//! # TLS
//!
//! rustls with the ring provider, for SQL and replication connections alike;
//! `sslmode` `disable`, `prefer`, `require`, `verify-full` (with `sslrootcert`).

mod admin;
mod capture;
mod catalog;
pub mod check;
mod config;
mod error;
mod gaps;
mod hosts;
pub mod infer;
mod leader;
mod lsn;
pub mod polling;
mod pool;
mod publication;
mod quote;
mod reference;
mod select;
mod snapshot;
mod spelling;
mod table;
mod target;
mod target_plug;
mod tls;

pub use check::depends;
/// The cursor-polling source under its earlier name: [`polling`].
pub use polling as incremental;

pub use admin::{
    CREATED_BY, Coverage, PgAdmin, PublicationDrop, PublicationInfo, ReplicaIdentity, SlotInfo,
    TableIdentity,
};
pub use capture::pgoutput::DecodeError;
pub use capture::settings::{PgSourceSettings, PublicationChoice, SlotChoice, url_problems};
pub use capture::source::{Health, PgHandle, PgSource, PgSourceBuilder};
pub use check::identity::{
    Choice, FULL_COST, IdentityFacts, Recommendation, TableAdvice, UniqueIndex, Verdict, ViewNeed,
    advise, recommend,
};
pub use check::toast::{IdentityAdvice, TOASTABLE_COLUMNS_SQL, TableStorage, needs_full_identity};
pub use config::{
    ConnectionConfig, DEFAULT_READ_GAP, DEFAULT_STALL_AFTER, DEFAULT_STREAM_MEMORY,
    MAX_CONNECT_TIMEOUT, MAX_READ_GAP, MAX_STATUS_INTERVAL, MAX_STREAM_MEMORY, PgSourceConfig,
    PublicationMode, SessionAttrs, SlotMode, SslMode, StartPosition,
};
pub use deadpool_postgres::Pool;
pub use error::{ErrorKind, PgError, retry_of};
pub use gaps::{GAP_TABLE, PgGapLedger};
pub use leader::{Attempt, Holder, Leadership};
pub use lsn::{Lsn, ParseLsnError};
pub use polling::{PgIncrementalSettings, PgIncrementalSource};
pub use pool::connect_pool;
pub use quote::quote_ident;
pub use select::{BOOKKEEPING_PREFIX, TablePattern, capturable, system_schema};
pub use snapshot::chunks::PgChunkReader;
pub use snapshot::sink::{SINK_SNAPSHOT_TABLE, SinkSnapshotConfig, SinkSnapshots, Spliced};

/// The name [`SinkSnapshotConfig`] had before the workspace settled on one meaning of
/// `…Config` (what a part is built with) and `…Settings` (a file table still to be
/// resolved into a `…Config`).
#[deprecated(since = "0.1.0", note = "renamed `SinkSnapshotConfig`")]
pub type SinkSnapshotSettings = SinkSnapshotConfig;
pub use snapshot::window::{ChunkCheck, RECENT_XIDS, StreamedKeys, row_key};
pub use snapshot::{
    Chunk, SnapshotProgress, SnapshotState, TableReader, WATERMARK_PREFIX, XidSnapshot,
    resolve_tables, write_watermark,
};
pub use table::{TableName, naming};
pub use target::enumerate::SqlEnumerate;
pub use target::fanout::{SqlFanOut, SqlFanOutBuilder};
pub use target::keyed::batch_query;
pub use target::query::{
    DEFAULT_QUERY_BATCH, DEFAULT_WHOLE_TIMEOUT, QueryRebuild, QueryRebuildBuilder,
};
pub use target::rebuild::{
    DEFAULT_BULK_BATCH, SqlRebuild, SqlRebuildBuilder, Visibility, cancels_settled,
};
pub use target_plug::{PgTarget, is_postgres_url};
