//! What `freshen check` asks of a MySQL source: the server's binlog settings, the
//! user's grants (proven by a real binlog dump, since a missing REPLICATION SLAVE
//! answers like a wrong password), the stored position, and that every statement
//! prepares. Each finding says what is wrong and how to fix it.

use futures_util::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Pool};

use crate::params;
use crate::server::{self, ServerInfo};
use crate::store::Store;
use crate::{MySqlSourceConfig, ResumeBy};
use freshen::plug::{Finding, Level};

/// One thing found, with its fix; turned into a [`Finding`] (whose message says both)
/// by the public functions, which know its subject.
struct Found {
    level: Level,
    what: String,
    fix: String,
}

impl Found {
    fn error(what: impl Into<String>, fix: impl Into<String>) -> Found {
        Found {
            level: Level::Error,
            what: what.into(),
            fix: fix.into(),
        }
    }

    fn warning(what: impl Into<String>, fix: impl Into<String>) -> Found {
        Found {
            level: Level::Warning,
            what: what.into(),
            fix: fix.into(),
        }
    }

    fn into_finding(self, check: &'static str, subject: &str) -> Finding {
        Finding::new(
            self.level,
            check,
            subject,
            format!("{}; fix: {}", self.what, self.fix),
        )
    }
}

/// Checks everything the source needs from the server and the user.
pub async fn check_source(config: &MySqlSourceConfig) -> Vec<Finding> {
    let subject = config.url.redacted();
    found_source(config)
        .await
        .into_iter()
        .map(|f| f.into_finding("source", &subject))
        .collect()
}

async fn found_source(config: &MySqlSourceConfig) -> Vec<Found> {
    let mut out: Vec<Found> = config
        .problems()
        .into_iter()
        .map(|p| Found::error(p, "correct the [source] section"))
        .collect();
    if !out.is_empty() {
        return out;
    }
    let opts = match server::opts(config.url.expose()) {
        Ok(o) => o,
        Err(e) => {
            out.push(Found::error(e.to_string(), "correct the url"));
            return out;
        }
    };
    let user = opts.user().unwrap_or("").to_string();
    let mut conn = match server::connect(&opts, "check").await {
        Ok(c) => c,
        Err(e) if e.code() == Some(1045) || e.kind() == crate::ErrorKind::Auth => {
            out.push(Found::error(
                format!("the server refused user {user:?} (error 1045): wrong user or password"),
                "correct the user and password in the url",
            ));
            return out;
        }
        Err(e) => {
            out.push(Found::error(
                format!("cannot connect: {e}"),
                "check the host and port, and that the server runs",
            ));
            return out;
        }
    };
    let info = match server::inspect(&mut conn).await {
        Ok(i) => i,
        Err(e) => {
            out.push(Found::error(
                e.to_string(),
                "grant REPLICATION CLIENT (BINLOG MONITOR on MariaDB)",
            ));
            return out;
        }
    };
    settings(&info, &mut out);
    grants(&mut conn, &info, &user, &mut out).await;
    let _ = conn.disconnect().await;
    dump_probe(config, &opts, &user, &mut out).await;
    stored_position(config, &opts, &info, &mut out).await;
    out
}

fn settings(info: &ServerInfo, out: &mut Vec<Found>) {
    for p in info.blocking_problems() {
        out.push(Found::error(
            p,
            "change the server setting (and its configuration file, so it survives a restart)",
        ));
    }
    if !info.row_image.eq_ignore_ascii_case("FULL") && info.log_bin {
        out.push(Found::warning(
            format!(
                "binlog_row_image is {}: updates and deletes carry only the primary key of the former row, so a row that moves between scopes does not dirty its old scope",
                info.row_image
            ),
            "SET GLOBAL binlog_row_image = 'FULL' (or run a reconcile sweep often)",
        ));
    }
    if info.checksum.eq_ignore_ascii_case("NONE") {
        out.push(Found::warning(
            "binlog_checksum is NONE: a corrupted event would not be detected",
            "SET GLOBAL binlog_checksum = 'CRC32'",
        ));
    }
    if !info.has_gtids() {
        out.push(Found::warning(
            format!("gtid_mode is {}: positions are stored as file and offset, which do not survive a failover to a replica", info.gtid_mode),
            "enable GTIDs (gtid_mode = ON, enforce_gtid_consistency = ON)",
        ));
    }
    if !info.mariadb {
        out.push(Found::warning(
            format!("MySQL {} has no snapshot binlog position: rebuilds cannot wait until a dirtying commit is visible (MariaDB can)", info.version),
            "keep coalesce above the commit latency of semi-synchronous replication, and keep a reconcile sweep",
        ));
    }
}

async fn grants(conn: &mut mysql_async::Conn, info: &ServerInfo, user: &str, out: &mut Vec<Found>) {
    let rows: Vec<String> = match conn.query("SHOW GRANTS FOR CURRENT_USER()").await {
        Ok(r) => r,
        Err(e) => {
            out.push(Found::warning(
                format!("cannot read the grants: {e}"),
                "run check as the source's user",
            ));
            return;
        }
    };
    let text = rows.join("\n").to_ascii_uppercase();
    let all = text.contains("GRANT ALL PRIVILEGES ON *.*");
    let has = |p: &str| all || text.contains(p);
    if !has("REPLICATION CLIENT") && !has("BINLOG MONITOR") && !has("SUPER") {
        out.push(Found::error(
            format!("user {user:?} cannot read the binlog position"),
            if info.mariadb {
                format!("GRANT BINLOG MONITOR ON *.* TO '{user}'@'…'")
            } else {
                format!("GRANT REPLICATION CLIENT ON *.* TO '{user}'@'…'")
            },
        ));
    }
    if !has("SELECT") {
        out.push(Found::error(
            format!("user {user:?} has no SELECT grant"),
            format!("GRANT SELECT ON the watched databases TO '{user}'@'…'"),
        ));
    }
}

/// Opens a real binlog dump (non-blocking, from the current position): the only way to
/// know REPLICATION SLAVE is granted, because without it the server answers the dump
/// with an access error while SQL logins work.
async fn dump_probe(
    config: &MySqlSourceConfig,
    opts: &mysql_async::Opts,
    user: &str,
    out: &mut Vec<Found>,
) {
    let Ok(mut conn) = server::connect(opts, "check").await else {
        return;
    };
    let Ok(info) = server::inspect(&mut conn).await else {
        return;
    };
    let Some(here) = info.position else { return };
    if info.mariadb {
        let _ = conn.query_drop("SET @mariadb_slave_capability = 4").await;
    }
    // Another server id than the source's: a dump with the source's id would end the
    // running source's session.
    let id = config.effective_server_id() ^ 0x1;
    let file = here.file.into_bytes();
    let request = BinlogStreamRequest::new(id)
        .with_filename(&file)
        .with_pos(here.pos)
        .with_non_blocking();
    match conn.get_binlog_stream(request).await {
        Ok(mut stream) => {
            let first =
                tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await;
            if let Ok(Some(Err(mysql_async::Error::Server(e)))) = first {
                out.push(dump_refused(user, e.code));
            }
            let _ = stream.close().await;
        }
        Err(mysql_async::Error::Server(e)) => out.push(dump_refused(user, e.code)),
        Err(e) => out.push(Found::error(
            format!("the binlog dump failed: {e}"),
            "check the server's log",
        )),
    }
}

fn dump_refused(user: &str, code: u16) -> Found {
    match code {
        1045 | 1227 => Found::error(
            format!(
                "the server refused the binlog dump (error {code}) although user {user:?} logs in: \
                 the REPLICATION SLAVE grant is missing (not a wrong password)"
            ),
            format!("GRANT REPLICATION SLAVE ON *.* TO '{user}'@'…'"),
        ),
        _ => Found::error(
            format!("the server refused the binlog dump (error {code})"),
            "check the server's log",
        ),
    }
}

async fn stored_position(
    config: &MySqlSourceConfig,
    opts: &mysql_async::Opts,
    info: &ServerInfo,
    out: &mut Vec<Found>,
) {
    let store = match &config.position_file {
        Some(p) => Store::file(p.clone(), &config.name),
        None => {
            let pool = Pool::new(opts.clone());
            let db = opts.db_name().unwrap_or_default().to_string();
            Store::table(pool, &db, &config.position_table, &config.name)
        }
    };
    let cp = match store.load(info.mariadb).await {
        Ok(Some(cp)) => cp,
        // A missing table is fine: the source creates it.
        Ok(None) => return,
        Err(e) if e.code() == Some(1146) => return,
        Err(e) => {
            out.push(Found::error(
                e.to_string(),
                "fix or remove the stored position",
            ));
            return;
        }
    };
    if config.resume_by == ResumeBy::Gtid
        || (config.resume_by == ResumeBy::Auto && cp.gtids.is_some())
    {
        return; // the server resolves GTIDs itself; a purged GTID fails at start, clearly
    }
    let Ok(mut conn) = server::connect(opts, "check").await else {
        return;
    };
    let logs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.unwrap_or_default();
    let present = logs
        .iter()
        .any(|r| r.get::<String, _>(0).as_deref() == Some(cp.file_pos.file.as_str()));
    if !present && !logs.is_empty() {
        out.push(Found::error(
            format!("the stored position {} is in a binlog the server no longer has: changes since then are lost to this source", cp.file_pos),
            "delete the source's row from the position table (it then starts at `start`) and run a reconcile sweep",
        ));
    }
}

/// Checks that every statement has valid `$n` placeholders and prepares on the server.
pub async fn check_statements(pool: &Pool, what: &str, statements: &[String]) -> Vec<Finding> {
    found_statements(pool, what, statements)
        .await
        .into_iter()
        .map(|f| f.into_finding("statement", what))
        .collect()
}

async fn found_statements(pool: &Pool, what: &str, statements: &[String]) -> Vec<Found> {
    let mut out = Vec::new();
    let mut conn = match pool.get_conn().await {
        Ok(c) => c,
        Err(e) => {
            out.push(Found::error(
                format!("{what}: cannot connect: {e}"),
                "check the target url",
            ));
            return out;
        }
    };
    for (i, sql) in statements.iter().enumerate() {
        let rewritten = match params::rewrite(sql) {
            Ok(r) => r,
            Err(e) => {
                out.push(Found::error(
                    format!("{what} statement {}: {e}", i + 1),
                    "correct the statement",
                ));
                continue;
            }
        };
        if let Err(e) = conn.prep(rewritten.sql.as_str()).await {
            out.push(Found::error(
                format!("{what} statement {} does not prepare: {e}", i + 1),
                "correct the statement (and check the user's grants on its tables)",
            ));
        }
    }
    out
}
