//! MySQL and MariaDB for freshen: a row-based binlog source and SQL helpers.
//!
//! # Concepts
//!
//! - [`MySqlSource`]: reads the binlog as a replica does (a binlog dump, by GTID or by
//!   file and offset) and implements [`freshen::Source`]. Row images are decoded by this
//!   crate ([`binlog`]) straight into [`freshen::RowEvent`]s with old and new rows and
//!   typed values, handed over in batches of at most `batch_size` as they arrive: a huge
//!   transaction is many batches and only the one holding its commit carries the
//!   acknowledgement, so memory stays bounded. TRUNCATE (and DROP TABLE) of a watched
//!   table arrives as an [`Op::Truncate`](freshen::Op) event, which makes the refresher
//!   sweep; other DDL on watched tables is reported ([`SchemaChange`]). Reconnects with
//!   backoff for as long as the server is away, telling the consumer of an outage longer
//!   than `reconnect_deadline_s` (a [`Retry::Path`](freshen::Retry) error, read past);
//!   health and lag from a [`MySqlHandle`].
//! - Positions. The position after the last transaction whose batches were all
//!   acknowledged — under `AckPolicy::AfterRebuild`, whose every key was rebuilt — is
//!   stored durably, by default in a table of the target database (`freshen_positions`,
//!   one row per source `name`, written in its own transaction), or in a file; a restart
//!   resumes from it, so a SIGKILL at any point loses nothing. Why a table: the position
//!   then lives with the data it describes (a restored backup, a moved database, or — by
//!   GTID — a failover to a replica brings it along) and freshen keeps no local state,
//!   like the PostgreSQL source whose slot lives on the server. Its own writes are in the
//!   binlog too; the source recognises them and stores again only when the position
//!   moved past other transactions, so a quiet database stays quiet.
//! - [`MySqlRebuild`]: a [`freshen::Rebuild`] running your statements in one transaction
//!   per call, key parts bound as typed parameters written `$1`, `$2`, … (the PostgreSQL
//!   source's spelling: one configuration for both, and a part can be used twice, which
//!   `?` cannot say; see [`KeyType`]). On MariaDB it first waits until the dirtying
//!   transactions are visible to new snapshots: a commit reaches the binlog before
//!   InnoDB makes it visible (see the `rebuild` module docs). Failures are classified
//!   from server error numbers ([`retry_for`]).
//! - [`MySqlEnumerate`]: a [`freshen::Enumerate`] streaming keys from a query.
//! - [`MySqlGapLedger`]: views' unhealed gaps kept in the target across restarts
//!   (`freshen_gaps`), until a person acknowledges them.
//! - [`MySqlFanOut`]: a [`freshen::Expand`] mapping changed parent rows to view keys
//!   with a query (a plan → its subscribed accounts), in a snapshot that sees the change.
//! - [`MySqlIncrementalSource`] ([`incremental`]): a cursor-polling source for
//!   databases without binlog grants (SELECT only): keyset pages past a cursor column,
//!   late commits found within a lookback window, cursors stored after the rebuilds.
//! - [`check_source`], [`check_statements`]: what `freshen check` reports, each finding
//!   with its fix.
//!
//! # Server setup
//!
//! `log_bin`, `binlog_format=ROW`, `binlog_row_metadata=FULL` (column names and
//! signedness), `binlog_row_image=FULL` (whole former rows), `binlog_checksum=CRC32`;
//! uncompressed binlogs (`log_bin_compress=OFF`, `binlog_transaction_compression=OFF`).
//! The user needs REPLICATION SLAVE, REPLICATION CLIENT (BINLOG MONITOR on MariaDB),
//! SELECT, and CREATE/INSERT/UPDATE on the position table. MariaDB is tested for real;
//! MySQL 8 is supported by protocol (GTID dump, v2 rows events, binary JSON).
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use freshen::{Refresher, RowEvent};
//! use freshen_mysql::{connect_pool, KeyType, MySqlRebuild, MySqlSource, MySqlSourceConfig};
//!
//! let url = "mysql://freshen:secret@localhost:3306/app";
//! let source = MySqlSource::start(
//!     MySqlSourceConfig::new(url, "rollups").table("app.readings"),
//! )
//! .await?;
//! let rebuild = MySqlRebuild::builder(connect_pool(url, 4)?)
//!     .statement("DELETE FROM rollup WHERE device = $1")
//!     .statement("INSERT INTO rollup SELECT device, count(*), sum(value) FROM readings WHERE device = $1 GROUP BY device")
//!     .key_types([KeyType::Text])
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
//! Keys from the binlog and keys from [`MySqlEnumerate`] are the same [`freshen::Key`]
//! for the same scope: integers in decimal (unsigned above `i64` too), DECIMAL with its
//! scale's digits, dates and times as the server prints them, TIMESTAMP in UTC (this
//! crate's sessions use `time_zone = '+00:00'`), ENUM and SET as their members, text in
//! UTF-8 (utf8mb4, utf8mb3, ascii, latin1 converted), binary strings and other
//! character sets as `\x` hex. Floats are the exception; avoid floating-point scopes.
//!
//! # Features
//!
//! None. mysql_async without TLS (and so without a second crypto stack); its zlib is
//! the pure-Rust backend.

pub mod binlog;
mod check;
mod config;
mod enumerate;
mod error;
mod fanout;
mod gaps;
pub mod incremental;
mod leader;
mod params;
mod plug;
mod position;
mod reader;
mod rebuild;
mod reference;
mod schema;
mod server;
mod source;
mod store;
mod target;

pub use binlog::DdlKind;
pub use check::{check_source, check_statements};
pub use config::{MySqlSourceConfig, ResumeBy, url_problems};
pub use enumerate::{MySqlEnumerate, connect_pool, connect_pool_limited};
pub use error::{ErrorKind, MySqlError, retry_for};
pub use fanout::MySqlFanOut;
pub use freshen::SecretUrl;
pub use gaps::{GAP_TABLE, MySqlGapLedger};
pub use incremental::{MySqlIncrementalSettings, MySqlIncrementalSource};
pub use leader::{Attempt, Holder, Leadership, lock_name};
pub use mysql_async::Pool;
pub use params::KeyType;
pub use position::{Checkpoint, FilePos, Gtids, MariaGtidList, MySqlGtidSet, Start};
pub use rebuild::{MySqlRebuild, MySqlRebuildBuilder, SET_BATCH, key_types_of};
pub use schema::SchemaChange;
pub use source::{Health, Lag, MySqlHandle, MySqlSource};
pub use target::MySqlTarget;
