//! The crate's one error type, with a kind that says whether retrying can help.

use std::fmt;

use freshen::BoxError;

/// What kind of failure a [`PgError`] is; decides whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration is invalid; fix it.
    Config,
    /// The server could not be reached or the connection broke; retrying can help.
    Connection,
    /// Authentication failed (wrong password, no `pg_hba.conf` entry).
    Auth,
    /// TLS could not be negotiated or the certificate did not verify.
    Tls,
    /// The database is not set up for logical replication (`wal_level`, privileges,
    /// publication); the message says what to change.
    Setup,
    /// The replication slot is missing or was invalidated: changes were lost and the
    /// message says how to recover.
    Slot,
    /// The server rejected a statement; [`PgError::sqlstate`] tells which error.
    Server,
    /// A change this rebuild must see is not yet visible to new snapshots; retrying
    /// shortly helps.
    NotVisible,
    /// The server sent something this crate could not understand.
    Protocol,
    /// The source was closed.
    Closed,
}

/// An error from `freshen-postgres`. The message is meant for a person: it names what
/// failed and, for setup problems, what to do.
#[derive(Debug, thiserror::Error)]
pub struct PgError {
    kind: ErrorKind,
    message: String,
    sqlstate: Option<String>,
    #[source]
    source: Option<BoxError>,
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl PgError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> PgError {
        PgError {
            kind,
            message: message.into(),
            sqlstate: None,
            source: None,
        }
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> PgError {
        self.source = Some(source.into());
        self
    }

    pub(crate) fn with_sqlstate(mut self, code: impl Into<String>) -> PgError {
        self.sqlstate = Some(code.into());
        self
    }

    /// A configuration error listing every problem.
    pub(crate) fn config(problems: &[String]) -> PgError {
        let mut message = String::from("invalid PostgreSQL source configuration:");
        for p in problems {
            message.push_str("\n  - ");
            message.push_str(p);
        }
        PgError::new(ErrorKind::Config, message)
    }

    /// Wraps a tokio-postgres error, keeping its SQLSTATE and classifying it.
    pub(crate) fn sql(context: impl Into<String>, e: tokio_postgres::Error) -> PgError {
        let code = e.code().map(|c| c.code().to_owned());
        let kind = match code.as_deref() {
            Some(c) if c.starts_with("28") => ErrorKind::Auth,
            Some(c) if c.starts_with("08") || c.starts_with("57P") => ErrorKind::Connection,
            Some(_) => ErrorKind::Server,
            None if e.to_string().contains("TLS") => ErrorKind::Tls,
            None => ErrorKind::Connection,
        };
        let mut err = PgError::new(kind, context).with_source(e);
        err.sqlstate = code;
        err
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The server's SQLSTATE code, when the server reported the error.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }

    /// Whether retrying the same operation later can succeed (a broken connection, a
    /// serialization failure, a change not yet visible) — as opposed to a problem a
    /// person must fix.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Connection | ErrorKind::NotVisible | ErrorKind::Protocol => true,
            ErrorKind::Server => matches!(
                self.sqlstate.as_deref(),
                Some(c) if c.starts_with("40") || c.starts_with("53") || c.starts_with("55P")
                    || c.starts_with("57") || c.starts_with("08") || c == "55006"
            ),
            _ => false,
        }
    }
}
