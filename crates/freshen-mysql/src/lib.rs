//! MySQL and MariaDB for freshen.

pub mod binlog;
mod config;
mod error;
mod position;

pub use config::{MySqlSourceConfig, ResumeBy, SecretUrl, redact_url};
pub use error::{ErrorKind, MySqlError, retry_for};
pub use position::{Checkpoint, FilePos, Gtids, MariaGtidList, MySqlGtidSet, Start};
