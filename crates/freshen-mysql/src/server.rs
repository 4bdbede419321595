//! What the source needs to know about the server, read once per connection: flavour,
//! binlog settings, current position, GTID state, collations.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::binlog::Charsets;
use crate::error::ErrorKind;
use crate::{FilePos, Gtids, MySqlError};

/// The server's binlog settings and position.
#[derive(Debug, Clone)]
pub(crate) struct ServerInfo {
    pub(crate) mariadb: bool,
    pub(crate) version: String,
    pub(crate) log_bin: bool,
    pub(crate) binlog_format: String,
    pub(crate) row_image: String,
    pub(crate) row_metadata: String,
    pub(crate) checksum: String,
    /// MySQL's `gtid_mode` (`ON`, `OFF`, …); MariaDB always has GTIDs.
    pub(crate) gtid_mode: String,
    /// `log_bin_compress` (MariaDB) or `binlog_transaction_compression` (MySQL).
    pub(crate) compression: bool,
    /// The binlog's end, when binary logging is on.
    pub(crate) position: Option<FilePos>,
    /// `@@gtid_binlog_pos` (MariaDB) or `@@gtid_executed` (MySQL), as text.
    pub(crate) gtid_text: String,
}

impl ServerInfo {
    pub(crate) fn has_gtids(&self) -> bool {
        self.mariadb || self.gtid_mode.eq_ignore_ascii_case("ON")
    }

    pub(crate) fn current_gtids(&self) -> Result<Option<Gtids>, MySqlError> {
        if !self.has_gtids() {
            return Ok(None);
        }
        Gtids::parse(&self.gtid_text, self.mariadb)
            .map(Some)
            .map_err(|e| {
                MySqlError::new(ErrorKind::Setup, format!("the server's GTID position: {e}"))
            })
    }

    /// Settings without which the source cannot work, each with its fix.
    pub(crate) fn blocking_problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !self.log_bin {
            p.push("binary logging is off: start the server with log_bin (and server_id)".into());
        }
        if !self.binlog_format.eq_ignore_ascii_case("ROW") {
            p.push(format!(
                "binlog_format is {}: row changes need binlog_format=ROW (SET GLOBAL binlog_format = 'ROW', and in the server's configuration)",
                self.binlog_format
            ));
        }
        if !self.row_metadata.eq_ignore_ascii_case("FULL") {
            p.push(format!(
                "binlog_row_metadata is {}: without FULL the binlog has no column names and no \
                 signedness (SET GLOBAL binlog_row_metadata = 'FULL')",
                if self.row_metadata.is_empty() {
                    "unsupported by this server"
                } else {
                    &self.row_metadata
                }
            ));
        }
        if self.compression {
            p.push(if self.mariadb {
                "log_bin_compress is ON: freshen reads uncompressed binlogs only (SET GLOBAL log_bin_compress = OFF)".into()
            } else {
                "binlog_transaction_compression is ON: freshen reads uncompressed binlogs only (SET GLOBAL binlog_transaction_compression = OFF)".into()
            });
        }
        p
    }
}

/// Connection options from a URL, with the session settings every connection of this
/// crate uses: UTC for TIMESTAMP text, utf8mb4. They are setup commands, run again
/// whenever a pool resets a session it takes back (init commands are not: a reset
/// session would read TIMESTAMPs in the server's zone).
pub(crate) fn opts(url: &str) -> Result<Opts, MySqlError> {
    let base = Opts::from_url(url).map_err(|_| {
        MySqlError::new(
            ErrorKind::Config,
            format!("invalid MySQL URL {}", freshen::redact_url(url)),
        )
    })?;
    Ok(OptsBuilder::from_opts(base)
        .prefer_socket(false)
        .setup(vec!["SET time_zone = '+00:00', NAMES utf8mb4"])
        .into())
}

pub(crate) async fn connect(opts: &Opts, what: &str) -> Result<Conn, MySqlError> {
    Conn::new(opts.clone()).await.map_err(|e| {
        let e = MySqlError::driver(format!("cannot connect for {what}"), e);
        if e.code() == Some(1045) {
            MySqlError::new(
                ErrorKind::Auth,
                format!(
                    "the server refused the user for {what} (error 1045): check the user and password in the URL"
                ),
            )
            .with_source(e)
        } else {
            e
        }
    })
}

async fn var(conn: &mut Conn, name: &str) -> Result<String, MySqlError> {
    // Names are this crate's constants, never user input.
    let v: Option<Option<String>> = conn
        .query_first(format!("SELECT CAST(@@GLOBAL.{name} AS CHAR)"))
        .await
        .or_else(|e| match &e {
            // 1193: unknown system variable (a setting this flavour lacks).
            mysql_async::Error::Server(s) if s.code == 1193 => Ok(None),
            _ => Err(e),
        })
        .map_err(|e| MySqlError::driver(format!("cannot read @@{name}"), e))?;
    Ok(v.flatten().unwrap_or_default())
}

/// A boolean setting's text (`ON`, `1`).
fn on(v: &str) -> bool {
    v == "1" || v.eq_ignore_ascii_case("ON")
}

/// Reads the settings and the position.
pub(crate) async fn inspect(conn: &mut Conn) -> Result<ServerInfo, MySqlError> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| MySqlError::driver("cannot read the server version", e))?
        .unwrap_or_default();
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let log_bin = on(&var(conn, "log_bin").await?);
    let compression = if mariadb {
        var(conn, "log_bin_compress").await?
    } else {
        var(conn, "binlog_transaction_compression").await?
    };
    let position = if log_bin {
        let stmt = if mariadb || version.starts_with('5') || version.starts_with("8.0") {
            "SHOW MASTER STATUS"
        } else {
            "SHOW BINARY LOG STATUS"
        };
        let row: Option<mysql_async::Row> = conn.query_first(stmt).await.map_err(|e| {
            MySqlError::driver(
                "cannot read the binlog position (needs REPLICATION CLIENT or BINLOG MONITOR)",
                e,
            )
        })?;
        row.and_then(|r| Some(FilePos::new(r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
    } else {
        None
    };
    let gtid_text = if mariadb {
        var(conn, "gtid_binlog_pos").await?
    } else {
        var(conn, "gtid_executed").await?.replace('\n', "")
    };
    Ok(ServerInfo {
        mariadb,
        log_bin,
        binlog_format: var(conn, "binlog_format").await?,
        row_image: var(conn, "binlog_row_image").await?,
        row_metadata: var(conn, "binlog_row_metadata").await?,
        checksum: var(conn, "binlog_checksum").await?,
        gtid_mode: if mariadb {
            "ON".into()
        } else {
            var(conn, "gtid_mode").await?
        },
        compression: on(&compression),
        position,
        gtid_text,
        version,
    })
}

/// The server's collation ids and their character sets.
pub(crate) async fn charsets(conn: &mut Conn) -> Charsets {
    let mut list: Vec<(u16, String)> = conn
        .query(
            "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID IS NOT NULL",
        )
        .await
        .unwrap_or_default();
    // MariaDB 10.10+ lists collations shared by several character sets (uca1400) here.
    let more: Vec<(u16, String)> = conn
        .query(
            "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATION_CHARACTER_SET_APPLICABILITY \
             WHERE ID IS NOT NULL",
        )
        .await
        .unwrap_or_default();
    list.extend(more);
    Charsets::with_server(list)
}
