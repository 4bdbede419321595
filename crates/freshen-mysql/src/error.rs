//! The crate's one error type; [`MySqlError::retry`] classifies it from the server's
//! error number (never its message text).

use std::fmt;

use freshen::{BoxError, Retry};

/// What kind of failure a [`MySqlError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration is invalid; every problem is listed.
    Config,
    /// The server could not be reached or the connection broke.
    Connection,
    /// The server refused the user (error 1045). For the binlog connection this is
    /// also what a missing REPLICATION SLAVE grant looks like; the message says which.
    Auth,
    /// The server is not set up for row-based binlog capture (binlog settings, grants);
    /// the message says what to change.
    Setup,
    /// The resume position is gone from the server (binlogs purged) or invalid: changes
    /// may be lost; the message says how to recover.
    Position,
    /// The server rejected a statement; [`MySqlError::code`] says which error.
    Server,
    /// The binlog holds something this crate refuses to read (compressed events); the
    /// message names the setting to change.
    Refused,
    /// An event could not be decoded.
    Decode,
    /// A key part cannot be bound to its statement parameter (not a number where one
    /// is declared): the key's own fault.
    Key,
    /// A change a rebuild must see is not yet visible to new snapshots.
    NotVisible,
    /// The source was closed.
    Closed,
}

/// An error from `freshen-mysql`. The message is for a person: it names what failed
/// and, for setup problems, what to do.
#[derive(Debug, thiserror::Error)]
pub struct MySqlError {
    kind: ErrorKind,
    message: String,
    code: Option<u16>,
    #[source]
    source: Option<BoxError>,
}

impl fmt::Display for MySqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl MySqlError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> MySqlError {
        MySqlError {
            kind,
            message: message.into(),
            code: None,
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> MySqlError {
        self.source = Some(source.into());
        self
    }

    /// A configuration error listing every problem.
    pub(crate) fn config(what: &str, problems: &[String]) -> MySqlError {
        let mut message = format!("invalid {what}:");
        for p in problems {
            message.push_str("\n  - ");
            message.push_str(p);
        }
        MySqlError::new(ErrorKind::Config, message)
    }

    /// A server that is not set up for binlog capture, every problem with its fix.
    pub(crate) fn setup(problems: &[String]) -> MySqlError {
        let mut e = MySqlError::config("server setup for binlog capture", problems);
        e.kind = ErrorKind::Setup;
        e
    }

    /// Wraps a driver error, keeping the server's error number and classifying it.
    pub(crate) fn driver(context: impl Into<String>, e: mysql_async::Error) -> MySqlError {
        let (kind, code) = match &e {
            mysql_async::Error::Server(s) => {
                let kind = match s.code {
                    1045 => ErrorKind::Auth,
                    1236 => ErrorKind::Position,
                    c if retry_for(c) == Retry::Path => ErrorKind::Connection,
                    _ => ErrorKind::Server,
                };
                (kind, Some(s.code))
            }
            mysql_async::Error::Url(_) => (ErrorKind::Config, None),
            _ => (ErrorKind::Connection, None),
        };
        MySqlError {
            kind,
            message: context.into(),
            code,
            source: Some(Box::new(e)),
        }
    }

    /// The underlying error's text (the server's message), or the message.
    pub(crate) fn source_text(&self) -> String {
        self.source
            .as_ref()
            .map_or_else(|| self.message.clone(), |s| s.to_string())
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The server's error number, when the server reported the error.
    pub fn code(&self) -> Option<u16> {
        self.code
    }

    /// Whose fault the failure is, for the refresher: the key's data, the way to the
    /// database, or something a person must fix.
    pub fn retry(&self) -> Retry {
        match self.kind {
            ErrorKind::Connection | ErrorKind::NotVisible | ErrorKind::Closed => Retry::Path,
            ErrorKind::Config
            | ErrorKind::Auth
            | ErrorKind::Setup
            | ErrorKind::Position
            | ErrorKind::Refused => Retry::Fix,
            ErrorKind::Decode | ErrorKind::Key => Retry::Key,
            ErrorKind::Server => self.code.map_or(Retry::Key, retry_for),
        }
    }
}

/// The retry directive for a MySQL/MariaDB server error number.
///
/// `Path`: the statement would succeed on another attempt (deadlock, lock wait timeout,
/// connection lost or killed, server shutting down or read-only during a failover, too
/// many connections, out of memory, statement timeout). `Fix`: no attempt can succeed
/// until a person acts (unknown table/column/database, access denied, syntax, a
/// statement that cannot be prepared). Everything else — duplicate key, NOT NULL,
/// out-of-range and conversion errors, foreign keys, division by zero — is the key's
/// data: `Key`.
pub fn retry_for(code: u16) -> Retry {
    match code {
        // Deadlock, lock wait timeout, too many concurrent transactions.
        1205 | 1213 | 1637
        // Too many connections (global, per user), user resource limits.
        | 1040 | 1203 | 1226
        // Server shutting down, connection killed/aborted, net read/write errors.
        | 1053 | 1077 | 1152 | 1153..=1161 | 1927 | 4031
        // Query interrupted, statement timeouts (MySQL max_execution_time, MariaDB
        // max_statement_time).
        | 1317 | 3024 | 1969
        // Read-only (during a failover), out of memory / resources, disk full.
        | 1290 | 1836 | 1792 | 1037 | 1038 | 1041 | 1021 | 1114
        // Lost connection to a storage engine or a Galera node not ready.
        | 1030 | 1047 | 1180 | 1181 => Retry::Path,
        // Access denied (user, database, table, column, privilege, definer).
        1044 | 1045 | 1142 | 1143 | 1227 | 1370 | 1449 | 1211
        // No database selected, unknown database / table / column / procedure.
        | 1046 | 1049 | 1051 | 1054 | 1109 | 1146 | 1305 | 1356
        // Syntax and statement errors no data can fix.
        | 1064 | 1149 | 1052 | 1136 | 1210 | 1295 | 1288 | 1243 | 1105 => Retry::Fix,
        _ => Retry::Key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_error_number() {
        assert_eq!(retry_for(1213), Retry::Path); // deadlock
        assert_eq!(retry_for(1205), Retry::Path); // lock wait timeout
        assert_eq!(retry_for(1927), Retry::Path); // connection killed
        assert_eq!(retry_for(1146), Retry::Fix); // no such table
        assert_eq!(retry_for(1054), Retry::Fix); // unknown column
        assert_eq!(retry_for(1142), Retry::Fix); // table access denied
        assert_eq!(retry_for(1062), Retry::Key); // duplicate key
        assert_eq!(retry_for(1048), Retry::Key); // column cannot be null
        assert_eq!(retry_for(1365), Retry::Key); // division by zero
    }

    #[test]
    fn kinds_say_whose_fault() {
        assert_eq!(
            MySqlError::new(ErrorKind::Connection, "x").retry(),
            Retry::Path
        );
        assert_eq!(
            MySqlError::new(ErrorKind::NotVisible, "x").retry(),
            Retry::Path
        );
        assert_eq!(MySqlError::new(ErrorKind::Setup, "x").retry(), Retry::Fix);
        let mut e = MySqlError::new(ErrorKind::Server, "x");
        e.code = Some(1264);
        assert_eq!(e.retry(), Retry::Key);
        e.code = Some(1213);
        assert_eq!(e.retry(), Retry::Path);
    }
}
