//! `Error`: the one error type of this crate.

use std::fmt;

/// `ServerError` codes that no retry can fix.
const AUTHENTICATION_ERROR: i32 = 3;
const AUTHORIZATION_ERROR: i32 = 4;
const UNSUPPORTED_VERSION: i32 = 10;
const TOPIC_TERMINATED: i32 = 15;
const INVALID_TOPIC_NAME: i32 = 17;
const NOT_ALLOWED: i32 = 22;

/// What went wrong talking to Pulsar.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; every problem found, one sentence each. Permanent.
    Config(Vec<String>),
    /// The network failed (connecting, reading, writing). Retriable.
    Io(std::io::Error),
    /// The broker broke the protocol, or the connection closed under a request.
    /// Retriable on a new connection.
    Protocol(String),
    /// The broker refused a request.
    Server {
        /// Its `ServerError` code.
        code: i32,
        /// Its message.
        message: String,
    },
    /// No answer in time. Retriable.
    Timeout(&'static str),
}

impl Error {
    /// Whether trying again (on a new connection, after a pause) may succeed
    /// ([`Retry::Path`](freshen::Retry)) or a person must act first
    /// ([`Retry::Fix`](freshen::Retry)). Read from the broker's error code.
    pub fn retry(&self) -> freshen::Retry {
        match self {
            Error::Config(_) => freshen::Retry::Fix,
            Error::Server { code, .. }
                if matches!(
                    *code,
                    AUTHENTICATION_ERROR
                        | AUTHORIZATION_ERROR
                        | UNSUPPORTED_VERSION
                        | TOPIC_TERMINATED
                        | INVALID_TOPIC_NAME
                        | NOT_ALLOWED
                ) =>
            {
                freshen::Retry::Fix
            }
            Error::Server { .. } | Error::Io(_) | Error::Protocol(_) | Error::Timeout(_) => {
                freshen::Retry::Path
            }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(problems) => {
                write!(f, "invalid Pulsar configuration:")?;
                for p in problems {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
            Error::Io(e) => write!(f, "Pulsar connection failed: {e}"),
            Error::Protocol(m) => write!(f, "Pulsar protocol error: {m}"),
            Error::Server { code, message } => write!(f, "Pulsar broker error {code}: {message}"),
            Error::Timeout(what) => write!(f, "Pulsar broker did not answer {what} in time"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}
