//! `DecodeError`: why a message could not be turned into row events.

use freshen::clip;
use std::fmt;

/// Why a message could not be decoded. The message is skipped and counted by the source
/// that read it; retrying cannot help (the bytes will not change), so every kind is
/// permanent for that message.
///
/// Error texts name fields and types, never whole payloads: a row may hold data its
/// owners would not want in a log.
#[derive(Debug)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, or JSON of the wrong shape (a field of the wrong type, a missing `type`).
    Json(serde_json::Error),
    /// A canal-json `type` or Debezium `op` this decoder does not know.
    UnknownType(String),
    /// Well-formed JSON that breaks the format's rules (an INSERT without rows, `old`
    /// and `data` of different lengths, a duplicated column).
    Malformed(String),
}

impl DecodeError {
    pub(crate) fn malformed(message: impl Into<String>) -> DecodeError {
        DecodeError::Malformed(message.into())
    }

    /// An unknown type name, cut short so that a hostile message cannot flood a log.
    pub(crate) fn unknown_type(name: &str) -> DecodeError {
        DecodeError::UnknownType(clip(name, 64).to_owned())
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Json(e) => write!(f, "invalid JSON message: {e}"),
            DecodeError::UnknownType(t) => write!(f, "unknown message type {t:?}"),
            DecodeError::Malformed(m) => write!(f, "malformed message: {m}"),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeError::Json(e) => Some(e),
            _ => None,
        }
    }
}

impl From<serde_json::Error> for DecodeError {
    fn from(e: serde_json::Error) -> DecodeError {
        DecodeError::Json(e)
    }
}
