//! The crate's error type.

use std::path::PathBuf;

/// What went wrong in the changefeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store file could not be opened (missing directory, permissions, another
    /// process holding it).
    #[error("cannot open the changefeed store {path}: {source}")]
    Open {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: redb::DatabaseError,
    },
    /// The store failed to read or write (I/O error, full disk). After a failed commit
    /// the changefeed stops accepting writes: an fsync that failed cannot be retried
    /// safely.
    #[error("changefeed store: {0}")]
    Store(#[from] redb::Error),
    /// The store holds data this version cannot read.
    #[error("changefeed store: {0}")]
    Format(String),
    /// The changefeed was closed, or stopped after a store failure (`reason`).
    #[error("the changefeed is closed{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed {
        /// The failure that stopped it, if one did.
        reason: Option<String>,
    },
    /// No consumer group of that name.
    #[error("no consumer group named {0:?}")]
    UnknownGroup(String),
    /// A consumer group of that name exists with a different definition.
    #[error("consumer group {0:?} already exists with a different definition")]
    GroupExists(String),
    /// No dead letter with that sequence in the group.
    #[error("no dead letter with sequence {sequence} in consumer group {group:?}")]
    UnknownDeadLetter {
        /// The group.
        group: String,
        /// The sequence asked for.
        sequence: u64,
    },
    /// A request the changefeed cannot honour (bad group name, zero deliveries, …).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// Whether trying again later can help: `false` for mistakes in the request and for
    /// a changefeed that stopped for good.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Open { .. })
    }
}

impl From<redb::TransactionError> for Error {
    fn from(e: redb::TransactionError) -> Error {
        Error::Store(e.into())
    }
}

impl From<redb::TableError> for Error {
    fn from(e: redb::TableError) -> Error {
        Error::Store(e.into())
    }
}

impl From<redb::StorageError> for Error {
    fn from(e: redb::StorageError) -> Error {
        Error::Store(e.into())
    }
}

impl From<redb::CommitError> for Error {
    fn from(e: redb::CommitError) -> Error {
        Error::Store(e.into())
    }
}

impl From<redb::SetDurabilityError> for Error {
    fn from(e: redb::SetDurabilityError) -> Error {
        Error::Store(e.into())
    }
}
