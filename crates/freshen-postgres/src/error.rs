//! The crate's one error type, with a kind and a [`Retry`] directive read from the
//! server's SQLSTATE.

use std::fmt;

use freshen::{BoxError, Retry};

/// What kind of failure a [`PgError`] is.
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
/// failed, carries the server's own message and SQLSTATE, and for setup problems says
/// what to do.
///
/// It is a leaf: its `Display` already includes its cause, so `source()` is empty and a
/// chain printer never shows a cause twice.
#[derive(Debug)]
pub struct PgError {
    kind: ErrorKind,
    message: String,
    sqlstate: Option<String>,
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PgError {}

/// A cause as a person should read it: a server error as `ERROR 22012: division by
/// zero` with its detail and hint, anything else with its whole chain of causes.
///
/// The detail of a data exception or an integrity violation (SQLSTATE classes 22 and
/// 23) is left out: it quotes row values (`Key (email)=(…) already exists`, `Failing
/// row contains (…)`), which would land in logs and `/status`, where no `[[redact]]`
/// rule reaches; so is what a data exception's message quotes (the value). The message
/// and the SQLSTATE say what failed.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(db) = find_db_error(e) {
        let code = db.code().code();
        let message = if code.starts_with("22") {
            hide_quoted(db.message())
        } else {
            db.message().to_owned()
        };
        let mut s = format!("{} {code}: {message}", db.severity());
        if let Some(d) = db.detail().filter(|_| !quotes_rows(code)) {
            s.push_str(&format!(" (DETAIL: {d})"));
        }
        if let Some(h) = db.hint() {
            s.push_str(&format!(" (HINT: {h})"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        // Some causes repeat their parent's words; say each thing once.
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        next = cause.source();
    }
    s
}

/// Whether errors of `sqlstate` carry row values in their detail.
fn quotes_rows(sqlstate: &str) -> bool {
    matches!(sqlstate.get(..2), Some("22" | "23"))
}

/// `message` with what it quotes in double quotes hidden: a data exception's message
/// (class 22) quotes the value it could not take (`invalid input syntax for type
/// integer: "…"`). An integrity violation's message quotes only names (its relation,
/// constraint, column): kept.
fn hide_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        if c == '"' {
            if quoted {
                out.push('…');
            }
            quoted = !quoted;
            out.push(c);
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

fn find_db_error<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a tokio_postgres::error::DbError> {
    let mut next = Some(e);
    while let Some(cur) = next {
        if let Some(db) = cur.downcast_ref::<tokio_postgres::error::DbError>() {
            return Some(db);
        }
        if let Some(pg) = cur.downcast_ref::<tokio_postgres::Error>()
            && let Some(db) = pg.as_db_error()
        {
            return Some(db);
        }
        next = cur.source();
    }
    None
}

impl PgError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> PgError {
        PgError {
            kind,
            message: message.into(),
            sqlstate: None,
        }
    }

    /// Appends the cause to the message (see [`describe`]).
    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> PgError {
        let source: BoxError = source.into();
        if let Some(pg) = source.downcast_ref::<PgError>()
            && self.sqlstate.is_none()
        {
            self.sqlstate = pg.sqlstate.clone();
        }
        self.message.push_str(": ");
        self.message.push_str(&describe(&*source));
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
            None if find_tls(&e) => ErrorKind::Tls,
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

    /// Whether retrying can help, and whose fault it was: for a rebuild, [`Retry::Key`]
    /// means this key's data made a statement fail (it counts toward quarantine);
    /// [`Retry::Path`] an outage, overload, conflict or timeout; [`Retry::Fix`] something
    /// a person must change. Read from the SQLSTATE class, never from message text.
    pub fn retry(&self) -> Retry {
        match self.kind {
            ErrorKind::Connection
            | ErrorKind::NotVisible
            | ErrorKind::Protocol
            | ErrorKind::Closed => Retry::Path,
            ErrorKind::Config
            | ErrorKind::Auth
            | ErrorKind::Tls
            | ErrorKind::Setup
            | ErrorKind::Slot => Retry::Fix,
            ErrorKind::Server => self.sqlstate.as_deref().map_or(Retry::Key, retry_of),
        }
    }
}

/// The directive for a SQLSTATE, by class (the first two characters) and a few codes.
pub fn retry_of(sqlstate: &str) -> Retry {
    match sqlstate {
        // lock_not_available (lock_timeout), object_in_use
        "55P03" | "55006" => return Retry::Path,
        // read_only_sql_transaction: the target is a standby or read-only by setting.
        // A failover never causes it (a demoted server restarts, breaking connections,
        // and `target_session_attrs=read-write` keeps new ones off standbys): a person
        // points [target] at the primary.
        "25006" => return Retry::Fix,
        _ => {}
    }
    match sqlstate.get(..2).unwrap_or("") {
        // connection exception; transaction rollback (serialization, deadlock);
        // insufficient resources (too many connections, disk full, out of memory);
        // operator intervention (statement timeout, admin shutdown, cannot connect
        // now, crash shutdown); system error (I/O); invalid transaction state
        "08" | "40" | "53" | "57" | "58" | "25" => Retry::Path,
        // syntax error or access rule violation (undefined table or column,
        // insufficient privilege); invalid catalog or schema; authorization; feature
        // not supported; object not in prerequisite state; configuration file error
        "42" | "3D" | "3F" | "28" | "0A" | "55" | "F0" => Retry::Fix,
        // data exception, integrity constraint, cardinality, RAISE, program limits,
        // corrupted data, and anything else: the statement failed for this data
        _ => Retry::Key,
    }
}

/// Whether a TLS error is in the chain (rustls' error, possibly inside an I/O error).
fn find_tls(e: &tokio_postgres::Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cur) = next {
        if cur.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = cur.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return true;
        }
        next = cur.source();
    }
    false
}

/// The server's own message for a SQL error (tokio-postgres' Display is just "db error").
pub fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = db.message().to_string();
            if let Some(hint) = db.hint() {
                m.push_str(&format!(" (hint: {hint})"));
            }
            m
        }
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_of_data_errors_are_hidden() {
        assert_eq!(
            hide_quoted(r#"invalid input syntax for type integer: "SSN-555""#),
            r#"invalid input syntax for type integer: "…""#
        );
        assert_eq!(hide_quoted("division by zero"), "division by zero");
        assert_eq!(
            hide_quoted(r#"a "b" c "d"#),
            r#"a "…" c ""#,
            "an unclosed quote hides to the end"
        );
        assert!(quotes_rows("22P02") && quotes_rows("23505") && !quotes_rows("42P01"));
    }

    #[test]
    fn sqlstate_classes_decide_whose_fault_it_is() {
        for (code, want) in [
            ("22012", Retry::Key),  // division_by_zero
            ("23505", Retry::Key),  // unique_violation
            ("P0001", Retry::Key),  // raise_exception
            ("22P02", Retry::Key),  // invalid_text_representation
            ("40001", Retry::Path), // serialization_failure
            ("40P01", Retry::Path), // deadlock_detected
            ("57014", Retry::Path), // query_canceled (statement_timeout)
            ("57P01", Retry::Path), // admin_shutdown
            ("57P03", Retry::Path), // cannot_connect_now
            ("53300", Retry::Path), // too_many_connections
            ("08006", Retry::Path), // connection_failure
            ("55P03", Retry::Path), // lock_not_available
            ("25006", Retry::Fix),  // read_only_sql_transaction
            ("58030", Retry::Path), // io_error
            ("42P01", Retry::Fix),  // undefined_table
            ("42501", Retry::Fix),  // insufficient_privilege
            ("42703", Retry::Fix),  // undefined_column
        ] {
            assert_eq!(retry_of(code), want, "{code}");
            let e = PgError::new(ErrorKind::Server, "x").with_sqlstate(code);
            assert_eq!(e.retry(), want, "{code}");
        }
        assert_eq!(
            PgError::new(ErrorKind::Connection, "x").retry(),
            Retry::Path
        );
        assert_eq!(
            PgError::new(ErrorKind::NotVisible, "x").retry(),
            Retry::Path
        );
        assert_eq!(PgError::new(ErrorKind::Slot, "x").retry(), Retry::Fix);
    }

    #[test]
    fn a_wrapped_cause_is_said_once() {
        let inner = PgError::new(ErrorKind::Connection, "FATAL 57P01: terminating");
        let outer =
            PgError::new(ErrorKind::Connection, "replication stream down").with_source(inner);
        assert_eq!(
            outer.to_string(),
            "replication stream down: FATAL 57P01: terminating"
        );
        assert!(std::error::Error::source(&outer).is_none());
    }
}
