//! MySQL and MariaDB for freshen.

pub mod binlog;
mod config;
mod enumerate;
mod error;
mod params;
mod position;
mod reader;
mod rebuild;
mod schema;
mod server;
mod source;
mod store;

pub use binlog::DdlKind;
pub use config::{MySqlSourceConfig, ResumeBy, SecretUrl, redact_url};
pub use enumerate::{MySqlEnumerate, connect_pool};
pub use error::{ErrorKind, MySqlError, retry_for};
pub use mysql_async::Pool;
pub use params::KeyType;
pub use position::{Checkpoint, FilePos, Gtids, MariaGtidList, MySqlGtidSet, Start};
pub use rebuild::{MySqlRebuild, MySqlRebuildBuilder};
pub use schema::SchemaChange;
pub use source::{Health, Lag, MySqlHandle, MySqlSource};
