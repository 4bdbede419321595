//! Opening a replication session: the server checked, the session's variables, the
//! binlog dump asked from the resume point (by GTID or by file and offset), a refused
//! dump explained; and which failed sessions end the reader.

use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, GnoInterval, Opts, Sid};

use crate::binlog::Charsets;
use crate::error::ErrorKind;
use crate::server::{self, ServerInfo};
use crate::{Checkpoint, Gtids, MySqlError, MySqlSourceConfig};

/// A failed session: the error, whether streaming had begun, whether it is final.
pub(super) struct Failure {
    pub(super) error: MySqlError,
    pub(super) streamed: bool,
    pub(super) fatal: bool,
}

impl Failure {
    /// A failure, final when retrying cannot help: credentials or grants, the server's
    /// setup, a position the server no longer has, an event the reader refuses, the
    /// configuration.
    pub(super) fn retry(error: MySqlError, streamed: bool) -> Failure {
        let fatal = matches!(
            error.kind(),
            ErrorKind::Auth
                | ErrorKind::Setup
                | ErrorKind::Position
                | ErrorKind::Refused
                | ErrorKind::Config
        );
        Failure {
            error,
            streamed,
            fatal,
        }
    }
}

/// The session variables a binlog dump needs: the heartbeat period, and on MariaDB GTID
/// events and, resuming by GTID, the GTID state to start from. Each statement with its
/// one bound value, if any.
pub(super) fn session_vars(
    heartbeat_ms: u64,
    mariadb: bool,
    by_gtid: bool,
    resume: &Checkpoint,
) -> Vec<(String, Option<String>)> {
    let period_ns = heartbeat_ms.saturating_mul(1_000_000);
    let mut v = vec![(format!("SET @master_heartbeat_period = {period_ns}"), None)];
    if mariadb {
        // GTID events (instead of anonymous ones) and the GTID list event.
        v.push(("SET @mariadb_slave_capability = 4".into(), None));
        if by_gtid {
            let state = resume
                .gtids
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            v.push(("SET @slave_connect_state = ?".into(), Some(state)));
            v.push(("SET @slave_gtid_strict_mode = 0".into(), None));
            v.push(("SET @slave_gtid_ignore_duplicates = 0".into(), None));
        }
    }
    v
}

/// A session streaming from `resume`, with what it found of the server.
pub(super) struct Session {
    pub(super) stream: BinlogStream,
    pub(super) info: ServerInfo,
    pub(super) charsets: Charsets,
}

/// Connects, checks the server, prepares the session and asks for the binlog from
/// `resume`.
pub(super) async fn open(
    opts: &Opts,
    cfg: &MySqlSourceConfig,
    by_gtid: bool,
    resume: &Checkpoint,
) -> Result<Session, MySqlError> {
    let mut conn = server::connect(opts, "the binlog").await?;
    let info = server::inspect(&mut conn).await?;
    let problems = info.blocking_problems();
    if !problems.is_empty() {
        return Err(MySqlError::setup(&problems));
    }
    let charsets = server::charsets(&mut conn).await;
    for (sql, param) in session_vars(cfg.heartbeat_ms, info.mariadb, by_gtid, resume) {
        let r = match param {
            Some(p) => conn.exec_drop(sql.as_str(), (p,)).await,
            None => conn.query_drop(sql.as_str()).await,
        };
        r.map_err(|e| MySqlError::driver(format!("cannot prepare the binlog session ({sql})"), e))?;
    }
    let server_id = cfg.effective_server_id();
    let file = resume.file_pos.file.clone().into_bytes();
    let request = BinlogStreamRequest::new(server_id);
    let request = match (&resume.gtids, by_gtid) {
        (Some(Gtids::MySql(set)), true) => {
            let sids: Vec<Sid<'static>> = set
                .intervals()
                .map(|(uuid, iv)| {
                    Sid::new(*uuid).with_intervals(
                        iv.iter()
                            .map(|&(a, b)| GnoInterval::new(a, b + 1))
                            .collect(),
                    )
                })
                .collect();
            request.with_gtid().with_gtid_set(sids)
        }
        (_, true) if info.mariadb => request, // @slave_connect_state decides
        _ => request.with_filename(&file).with_pos(resume.file_pos.pos),
    };
    let stream = conn.get_binlog_stream(request).await.map_err(|e| {
        refused(
            MySqlError::driver("the server refused the binlog dump", e),
            resume,
        )
    })?;
    Ok(Session {
        stream,
        info,
        charsets,
    })
}

/// A refused binlog dump, said in what to do: a missing grant, or a position the server
/// no longer has (changes since then are lost to this source).
fn refused(e: MySqlError, resume: &Checkpoint) -> MySqlError {
    match e.code() {
        Some(1045 | 1227) => MySqlError::new(
            ErrorKind::Auth,
            "the server refused the binlog dump: the user lacks the REPLICATION SLAVE \
             grant (a SQL login works, so the password is right): GRANT REPLICATION \
             SLAVE ON *.* TO the user",
        )
        .with_source(e),
        Some(1236) => MySqlError::new(
            ErrorKind::Position,
            format!(
                "the server cannot send the binlog from {resume} (purged, or a GTID it does \
                 not have): changes since then are lost to this source; remove its \
                 stored position (or set `start`) and run a reconcile sweep"
            ),
        )
        .with_source(e),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FilePos, MariaGtidList};

    fn at(gtids: Option<Gtids>) -> Checkpoint {
        Checkpoint {
            file_pos: FilePos::new("binlog.000003", 4),
            gtids,
        }
    }

    #[test]
    fn mariadb_by_gtid_resumes_from_its_gtid_state() {
        let list: MariaGtidList = "0-1-42".parse().unwrap();
        let vars = session_vars(1500, true, true, &at(Some(Gtids::MariaDb(list))));
        let sql: Vec<&str> = vars.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(sql[0], "SET @master_heartbeat_period = 1500000000");
        assert!(
            sql.contains(&"SET @mariadb_slave_capability = 4"),
            "{sql:?}"
        );
        let state = vars
            .iter()
            .find(|(s, _)| s == "SET @slave_connect_state = ?")
            .and_then(|(_, p)| p.clone());
        assert_eq!(state.as_deref(), Some("0-1-42"), "bound, never spliced");
    }

    #[test]
    fn by_file_and_mysql_sessions_set_the_heartbeat_only() {
        let vars = session_vars(500, false, true, &at(None));
        assert_eq!(
            vars,
            [("SET @master_heartbeat_period = 500000000".into(), None)]
        );
        let vars = session_vars(500, true, false, &at(None));
        assert_eq!(
            vars.len(),
            2,
            "MariaDB by file: GTID events, no state: {vars:?}"
        );
    }

    #[test]
    fn only_what_retrying_cannot_mend_ends_the_reader() {
        for kind in [
            ErrorKind::Auth,
            ErrorKind::Setup,
            ErrorKind::Position,
            ErrorKind::Refused,
            ErrorKind::Config,
        ] {
            assert!(
                Failure::retry(MySqlError::new(kind, "x"), true).fatal,
                "{kind:?}"
            );
        }
        for kind in [ErrorKind::Connection, ErrorKind::Decode] {
            assert!(
                !Failure::retry(MySqlError::new(kind, "x"), false).fatal,
                "{kind:?}"
            );
        }
    }
}
