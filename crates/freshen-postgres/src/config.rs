//! Plain-data configuration: how to connect, and what the source streams.
//!
//! The `freshen` binary builds these from its TOML; Rust programs use the builders.
//! Passwords are never printed: `Debug` shows `***`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use freshen::Backoff;

use crate::{Lsn, PgError, TableName};

/// How the connection uses TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain (the libpq default). Does not verify
    /// the certificate.
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not verified (encryption without authentication).
    Require,
    /// TLS or fail; the certificate must chain to `sslrootcert` and name the host.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(s: &str) -> Result<SslMode, String> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-full" => Ok(SslMode::VerifyFull),
            "allow" | "verify-ca" => Err(format!(
                "sslmode {s:?} is not supported; use disable, prefer, require or verify-full"
            )),
            // The value is not echoed: error messages never quote a URL's values.
            _ => Err("unknown sslmode; use disable, prefer, require or verify-full".to_owned()),
        }
    }
}

/// The longest `connect_timeout`: an hour. Longer is no longer a timeout, and keeps
/// deadline arithmetic far from overflowing.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The default [`PgSourceConfig::read_gap`]: in the capture benchmark's sweeps (0 to
/// 4000 µs) the shortest pause that, with the wake-up threshold, brought the server's CPU
/// per row to supabase/etl's level; 125–150 µs streamed one big transaction ~15 % faster
/// for ~15 % more server CPU per row, and from 500 µs on the pauses slowed the stream.
pub const DEFAULT_READ_GAP: Duration = Duration::from_micros(250);

/// The longest [`PgSourceConfig::read_gap`]: past it the pause is latency, not batching.
pub const MAX_READ_GAP: Duration = Duration::from_millis(10);

/// The default [`PgSourceConfig::stream_memory`]: 4 MiB of streamed in-progress
/// transactions held in memory before the largest goes to a temporary file.
pub const DEFAULT_STREAM_MEMORY: usize = 4 * 1024 * 1024;

/// The largest [`PgSourceConfig::stream_memory`] (64 GiB).
pub const MAX_STREAM_MEMORY: usize = 64 * 1024 * 1024 * 1024;

/// The default [`PgSourceConfig::stall_after`]: long enough that a reader waiting on a
/// busy pipeline for a moment is not called stalled, short against how long an
/// orchestrator or a person waits for a health check to notice.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(30);

/// The longest `status_interval`: an hour (PostgreSQL's `wal_sender_timeout` is a
/// minute by default; longer only retains WAL).
pub const MAX_STATUS_INTERVAL: Duration = Duration::from_secs(3600);

/// Which of several hosts a connection may use (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAttrs {
    /// The first host that answers.
    #[default]
    Any,
    /// The first host that accepts writes: a primary, not a standby (`read-write`, and
    /// `primary`, which freshen treats the same).
    ReadWrite,
}

/// Where and as whom to connect. Plain data; [`ConnectionConfig::from_url`] parses a
/// `postgres://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Host name, IP address, or an absolute path to a unix socket directory.
    pub host: String,
    /// TCP port (also names the socket file in a socket directory).
    pub port: u16,
    /// Hosts tried after `host:port`, in order, with their ports
    /// (`postgres://h1:5432,h2:5433/db`, or `?host=h1,h2&port=5432,5433`): with
    /// [`target_session_attrs`](Self::target_session_attrs) `ReadWrite`, freshen follows
    /// a promotion to whichever is the primary, without a restart.
    pub more_hosts: Vec<(String, u16)>,
    /// Which of the hosts to use.
    pub target_session_attrs: SessionAttrs,
    /// User; logical replication needs the `REPLICATION` attribute (or superuser).
    pub user: String,
    /// Password, if the server asks for one. Never logged.
    pub password: Option<String>,
    /// Database.
    pub dbname: String,
    /// TLS use.
    pub sslmode: SslMode,
    /// PEM file of the CA certificates that `verify-full` trusts.
    pub sslrootcert: Option<PathBuf>,
    /// `application_name` shown in `pg_stat_activity`.
    pub application_name: String,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// The server cancels a statement running longer than this (`statement_timeout`,
    /// set for the session at connect); `None` keeps the server's setting.
    pub statement_timeout: Option<Duration>,
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("more_hosts", &self.more_hosts)
            .field("target_session_attrs", &self.target_session_attrs)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

impl Default for ConnectionConfig {
    fn default() -> ConnectionConfig {
        ConnectionConfig {
            host: "localhost".into(),
            port: 5432,
            more_hosts: Vec::new(),
            target_session_attrs: SessionAttrs::Any,
            user: "postgres".into(),
            password: None,
            dbname: "postgres".into(),
            sslmode: SslMode::default(),
            sslrootcert: None,
            application_name: "freshen".into(),
            connect_timeout: Duration::from_secs(10),
            statement_timeout: None,
        }
    }
}

impl ConnectionConfig {
    /// Parses `postgres://[user[:password]@][host][:port][,host[:port]…][/dbname][?param=value&…]`
    /// (also `postgresql://`). Parameters: `sslmode`, `sslrootcert`,
    /// `application_name`, `connect_timeout` (seconds), `host` (a socket directory, or
    /// hosts separated by commas), `port` (one, or one per host), `user`, `password`,
    /// `dbname`, `target_session_attrs` (`any`, `read-write`, `primary`).
    /// Percent-escapes are decoded.
    pub fn from_url(url: &str) -> Result<ConnectionConfig, PgError> {
        let bad = |why: &str| {
            // Never echo the URL: it may hold a password.
            PgError::config(&[format!("invalid PostgreSQL URL: {why}")])
        };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("it must start with postgres:// or postgresql://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let mut cfg = ConnectionConfig::default();
        let hostport = match authority.rsplit_once('@') {
            Some((userinfo, hp)) => {
                let (user, pw) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                if !user.is_empty() {
                    cfg.user = decode(user).map_err(|e| bad(&e))?;
                }
                cfg.password = pw.map(decode).transpose().map_err(|e| bad(&e))?;
                hp
            }
            None => authority,
        };
        let mut hosts = Vec::new();
        for hostport in hostport.split(',') {
            let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
                let (h, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("unclosed [ in host"))?;
                (h.to_owned(), after.strip_prefix(':'))
            } else {
                match hostport.rsplit_once(':') {
                    Some((h, p)) => (h.to_owned(), Some(p)),
                    None => (hostport.to_owned(), None),
                }
            };
            let host = if host.is_empty() {
                cfg.host.clone()
            } else {
                decode(&host).map_err(|e| bad(&e))?
            };
            let port = match port.filter(|p| !p.is_empty()) {
                Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
                None => cfg.port,
            };
            hosts.push((host, port));
        }
        cfg.set_hosts(hosts);
        // `host=` and `port=` parameters, applied after the query is read.
        let mut host_param: Option<Vec<String>> = None;
        let mut port_param: Option<Vec<u16>> = None;
        if let Some(db) = path.filter(|p| !p.is_empty()) {
            cfg.dbname = decode(db).map_err(|e| bad(&e))?;
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            // A part without `=` is not named in the error: it may be a pasted secret.
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad("a query parameter has no `=` (write name=value)"))?;
            let v = decode(v).map_err(|e| bad(&e))?;
            match k {
                "sslmode" => cfg.sslmode = v.parse().map_err(|e: String| bad(&e))?,
                "sslrootcert" => cfg.sslrootcert = Some(PathBuf::from(v)),
                "application_name" => cfg.application_name = v,
                "connect_timeout" => {
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| bad("connect_timeout is not a number"))?;
                    if secs > MAX_CONNECT_TIMEOUT.as_secs() {
                        return Err(bad(&format!(
                            "connect_timeout must be at most {} (seconds)",
                            MAX_CONNECT_TIMEOUT.as_secs()
                        )));
                    }
                    cfg.connect_timeout = Duration::from_secs(secs.max(1));
                }
                "host" => host_param = Some(v.split(',').map(str::to_owned).collect()),
                "port" => {
                    port_param = Some(
                        v.split(',')
                            .map(|p| p.parse().map_err(|_| bad("port is not a number")))
                            .collect::<Result<_, _>>()?,
                    )
                }
                "target_session_attrs" => {
                    cfg.target_session_attrs = match v.as_str() {
                        "any" => SessionAttrs::Any,
                        "read-write" | "primary" => SessionAttrs::ReadWrite,
                        _ => {
                            return Err(bad(
                                "target_session_attrs must be any, read-write or primary",
                            ));
                        }
                    }
                }
                "user" => cfg.user = v,
                "password" => cfg.password = Some(v),
                "dbname" => cfg.dbname = v,
                other => {
                    // The name only, and only when it looks like one: a misspelled
                    // `passwd=` is named, its value never; a pasted secret is not.
                    return Err(bad(&format!(
                        "unknown parameter {:?} (known: sslmode, sslrootcert, application_name, connect_timeout, host, port, user, password, dbname, target_session_attrs)",
                        freshen::parameter_name(other)
                    )));
                }
            }
        }
        if host_param.is_some() || port_param.is_some() {
            let hosts =
                host_param.unwrap_or_else(|| cfg.hosts().map(|(h, _)| h.to_owned()).collect());
            let ports = port_param.unwrap_or_else(|| vec![cfg.port]);
            let ports: Vec<u16> = match ports.len() {
                1 => vec![ports[0]; hosts.len()],
                n if n == hosts.len() => ports,
                _ => return Err(bad("give one port, or one per host")),
            };
            cfg.set_hosts(hosts.into_iter().zip(ports).collect());
        }
        Ok(cfg)
    }

    /// Every host, with its port: `host:port` first, then [`more_hosts`](Self::more_hosts).
    pub fn hosts(&self) -> impl Iterator<Item = (&str, u16)> {
        std::iter::once((self.host.as_str(), self.port))
            .chain(self.more_hosts.iter().map(|(h, p)| (h.as_str(), *p)))
    }

    fn set_hosts(&mut self, hosts: Vec<(String, u16)>) {
        let mut hosts = hosts.into_iter();
        if let Some((h, p)) = hosts.next() {
            self.host = h;
            self.port = p;
        }
        self.more_hosts = hosts.collect();
    }

    /// One configuration per host, in order (each with that host alone).
    pub fn each_host(&self) -> Vec<ConnectionConfig> {
        self.hosts()
            .map(|(h, p)| ConnectionConfig {
                host: h.to_owned(),
                port: p,
                more_hosts: Vec::new(),
                ..self.clone()
            })
            .collect()
    }

    /// Whether `host` is a unix socket directory.
    pub fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// Problems with this configuration (empty when valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.host.is_empty() {
            p.push("connection host is empty".into());
        }
        if self.user.is_empty() {
            p.push("connection user is empty".into());
        }
        if self.dbname.is_empty() {
            p.push("connection dbname is empty".into());
        }
        if self.sslmode == SslMode::VerifyFull && self.sslrootcert.is_none() {
            p.push(
                "sslmode verify-full needs sslrootcert (a PEM file of trusted CA certificates)"
                    .into(),
            );
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_CONNECT_TIMEOUT {
            p.push(format!(
                "connect_timeout must be between 1 s and {} s",
                MAX_CONNECT_TIMEOUT.as_secs()
            ));
        }
        p
    }

    /// The tokio-postgres configuration for SQL connections.
    pub(crate) fn to_tokio(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        for (host, port) in self.hosts() {
            if host.starts_with('/') {
                c.host_path(host);
            } else {
                c.host(host);
            }
            c.port(port);
        }
        c.target_session_attrs(match self.target_session_attrs {
            SessionAttrs::Any => tokio_postgres::config::TargetSessionAttrs::Any,
            SessionAttrs::ReadWrite => tokio_postgres::config::TargetSessionAttrs::ReadWrite,
        });
        c.user(&self.user)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .connect_timeout(self.connect_timeout)
            .ssl_mode(match self.sslmode {
                SslMode::Disable => tokio_postgres::config::SslMode::Disable,
                SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
            });
        if let Some(pw) = &self.password {
            c.password(pw);
        }
        if let Some(t) = self.statement_timeout {
            // A startup option: no extra round trip per connection or statement.
            c.options(format!("-c statement_timeout={}", t.as_millis().max(1)));
        }
        c
    }
}

/// Percent-decoding for URL parts.
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "bad percent-escape".to_string())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-escapes do not form UTF-8".to_string())
}

/// What the source does about its replication slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotMode {
    /// Use the slot; create it (persistent, `pgoutput`) if it does not exist.
    #[default]
    CreateIfMissing,
    /// The slot must exist; a missing slot is an error.
    MustExist,
    /// A temporary slot for this connection only: dropped when it ends, so a reconnect
    /// or a restart loses changes (not recoverable; for tests and ad-hoc tools).
    Temporary,
}

/// What the source does about its publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublicationMode {
    /// Create the publication for the watched tables if it does not exist; an existing
    /// one must cover them.
    #[default]
    CreateIfMissing,
    /// The publication must exist and cover the watched tables.
    MustExist,
}

/// Where streaming starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Where the slot's confirmed position is (resume; at-least-once).
    #[default]
    Slot,
    /// Skip transactions that committed before this position. The slot's confirmed
    /// position is not moved by this: it advances only as batches are acknowledged.
    Lsn(Lsn),
}

/// Everything a [`PgSource`](crate::PgSource) needs. Plain data; see the field docs for
/// defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PgSourceConfig {
    /// Where to connect (replication and SQL connections alike).
    pub connection: ConnectionConfig,
    /// Replication slot name: lower-case letters, digits and `_`, at most 63 bytes.
    pub slot: String,
    /// Slot lifecycle (default: create if missing).
    pub slot_mode: SlotMode,
    /// Publication name.
    pub publication: String,
    /// Publication lifecycle (default: create if missing).
    pub publication_mode: PublicationMode,
    /// Tables whose changes are delivered. With a publication that must exist this may
    /// be empty: then every table the publication covers is delivered.
    pub tables: Vec<TableName>,
    /// Schemas whose every table is delivered, those there now and those created later:
    /// the publication is created `FOR TABLES IN SCHEMA` (PostgreSQL 15), and a table
    /// first seen in the stream is logged as discovered. Every table in them is published,
    /// so each must carry UPDATE and DELETE (a primary key, or REPLICA IDENTITY FULL):
    /// the source refuses to start otherwise, and logs an error for a later one that
    /// cannot.
    pub schemas: Vec<String>,
    /// Tables selected by pattern: `All` (a publication `FOR ALL TABLES`) or a name
    /// pattern in a schema (the schema is published, the pattern filtered here). As with
    /// `schemas`, a table first seen in the stream is logged as discovered.
    pub patterns: Vec<crate::TablePattern>,
    /// Where streaming starts (default: the slot's position).
    pub start: StartPosition,
    /// Most events in one batch (default 1024). A transaction larger than this arrives
    /// as several batches; only the one holding its commit carries the acknowledgement.
    /// A partly filled batch is handed over once the stream has been quiet for 1 ms, or,
    /// while rows keep coming, once it is 5 ms old and the reader has caught up.
    pub batch_size: usize,
    /// Batches queued between the replication reader and the consumer (default 4);
    /// beyond that the reader waits (back-pressure).
    pub queue_batches: usize,
    /// Wire messages buffered by the replication client (default 4096).
    pub wire_buffer: usize,
    /// While changes keep arriving, how long the reader pauses after emptying the
    /// socket before it reads again (default 250 µs, at most 10 ms; zero reads each
    /// message as it arrives). The pause lets a burst gather in the socket: the server
    /// then sends without waking the reader for every message, which on a busy source
    /// more than halves the server's CPU per row. On a loopback TCP connection the
    /// socket's wake-up threshold is raised too while the stream is busy (64 KiB, Linux),
    /// and lowered `read_gap` after the last data. It delays a change by at most this
    /// much (twice, where the threshold holds it), and a quiet stream is read as soon as
    /// data comes.
    pub read_gap: Duration,
    /// How often a standby status update is sent, at least (default 1 s). Acks are
    /// reported at this pace too.
    pub status_interval: Duration,
    /// Delays between reconnect attempts (default 100 ms doubling to 10 s, jittered).
    pub reconnect: Backoff,
    /// How long reconnecting may go on without streaming before the source gives up
    /// with an error (default 5 minutes).
    pub reconnect_deadline: Duration,
    /// A streaming reader that takes nothing from its session for this long while the
    /// server's WAL (read on another connection) is ahead of it is stalled: the source
    /// reports it as a problem (`/healthz` 503) until it reads again (default 30 s;
    /// zero turns the watch off). It is judged when the source is sampled, so it shows
    /// within this plus the sampling interval.
    pub stall_after: Duration,
    /// Ask the server to stream large in-progress transactions (pgoutput protocol 2,
    /// PostgreSQL 14 and later; default on, ignored on older servers). A transaction
    /// past the server's `logical_decoding_work_mem` is then sent while it runs instead
    /// of being written to the server's disk and decoded again at its commit: on one
    /// 1M-row transaction the walsender used about a quarter less CPU. freshen holds
    /// a streamed transaction (up to [`stream_memory`](Self::stream_memory), then in a
    /// temporary file) and hands it over at its commit, exactly as if it had been sent
    /// whole; an aborted one (or an aborted savepoint in it) never reaches a view.
    pub stream_in_progress: bool,
    /// Bytes of streamed transactions held in memory (default 4 MiB, at most 64 GiB);
    /// past it the largest goes to an unlinked file in the temporary directory
    /// (`TMPDIR`), written once and read back once at its commit.
    pub stream_memory: usize,
    /// The directory of those files (default `None`: the temporary directory, `TMPDIR`
    /// or `/tmp`). Should a file there fail to be written, later sessions ask for whole
    /// transactions (protocol 1) instead, with a warning: the server then spills them to
    /// its own disk, as before streaming.
    pub stream_spill_dir: Option<std::path::PathBuf>,
    /// The primary, when [`connection`](Self::connection) is a standby (decoding on a
    /// standby, PostgreSQL 16): while the slot is created there, freshen asks the
    /// primary for a standby snapshot (`pg_log_standby_snapshot()`) every second, so the
    /// creation ends at once instead of at the primary's next checkpoint (up to
    /// `checkpoint_timeout`, 5 minutes by default, on an idle primary). Optional.
    pub primary: Option<ConnectionConfig>,
    /// Whether a slot freshen creates is a failover slot (PostgreSQL 17,
    /// `pg_create_logical_replication_slot(…, failover => true)`): standbys with
    /// `sync_replication_slots = on` keep a synchronized copy, so a promotion does not
    /// lose the slot. `None` (default): on where the server can (17 and later, a
    /// primary); the flag costs nothing where no standby synchronizes slots. `Some(true)`
    /// on a server that cannot is a setup error.
    pub failover: Option<bool>,
}

impl Default for PgSourceConfig {
    fn default() -> PgSourceConfig {
        PgSourceConfig {
            connection: ConnectionConfig::default(),
            slot: String::new(),
            slot_mode: SlotMode::default(),
            publication: String::new(),
            publication_mode: PublicationMode::default(),
            tables: Vec::new(),
            schemas: Vec::new(),
            patterns: Vec::new(),
            start: StartPosition::default(),
            batch_size: 1024,
            queue_batches: 4,
            wire_buffer: 4096,
            read_gap: DEFAULT_READ_GAP,
            status_interval: Duration::from_secs(1),
            reconnect: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            reconnect_deadline: Duration::from_secs(300),
            stall_after: DEFAULT_STALL_AFTER,
            stream_in_progress: true,
            stream_memory: DEFAULT_STREAM_MEMORY,
            stream_spill_dir: None,
            primary: None,
            failover: None,
        }
    }
}

impl PgSourceConfig {
    /// Every pattern the source captures: each of `schemas` as a whole schema, then
    /// `patterns`.
    pub fn selection(&self) -> Vec<crate::TablePattern> {
        self.schemas
            .iter()
            .map(crate::TablePattern::schema)
            .chain(self.patterns.iter().cloned())
            .collect()
    }

    /// Every problem with this configuration, one sentence each (empty when valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = self.connection.problems();
        if self.slot.is_empty() {
            p.push("a replication slot name is required".into());
        } else if self.slot.len() > 63
            || !self
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            p.push(format!(
                "slot name {:?} is invalid: use lower-case letters, digits and _, at most 63 bytes",
                self.slot
            ));
        }
        if self.publication.is_empty() {
            p.push("a publication name is required".into());
        } else if self.publication.len() > 63
            || self
                .publication
                .chars()
                .any(|c| c == ',' || c.is_whitespace() || c.is_control())
        {
            p.push(format!(
                "publication name {:?} is invalid: at most 63 bytes, no commas, spaces or control characters",
                self.publication
            ));
        }
        if self.tables.is_empty()
            && self.schemas.is_empty()
            && self.patterns.is_empty()
            && self.publication_mode == PublicationMode::CreateIfMissing
        {
            p.push("list the tables to watch (a publication is created for them)".into());
        }
        for s in &self.schemas {
            if s.is_empty() || s.len() > 63 || s.chars().any(char::is_control) {
                p.push(format!("schema name {s:?} is invalid"));
            }
        }
        if self.batch_size == 0 {
            p.push("batch_size must be at least 1".into());
        }
        if self.queue_batches == 0 {
            p.push("queue_batches must be at least 1".into());
        }
        if self.wire_buffer == 0 {
            p.push("wire_buffer must be at least 1".into());
        }
        if self.read_gap > MAX_READ_GAP {
            p.push(format!(
                "read_gap must be at most {} ms",
                MAX_READ_GAP.as_millis()
            ));
        }
        if self.stream_memory > MAX_STREAM_MEMORY {
            p.push("stream_memory must be at most 64 GiB".into());
        }
        if self.status_interval.is_zero() || self.status_interval > MAX_STATUS_INTERVAL {
            p.push(format!(
                "status_interval must be above zero and at most {} s",
                MAX_STATUS_INTERVAL.as_secs()
            ));
        }
        if self.reconnect.max > MAX_STATUS_INTERVAL
            || self.reconnect_deadline > Duration::from_secs(365 * 24 * 3600)
        {
            p.push(
                "reconnect backoff max must be at most an hour, reconnect_deadline at most a year"
                    .into(),
            );
        }
        if self.reconnect.base.is_zero() || self.reconnect.base > self.reconnect.max {
            p.push("reconnect backoff: base must be > 0 and not exceed max".into());
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = ConnectionConfig::from_url(
            "postgres://rep:p%40ss@db.example:6543/app?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 6543);
        assert_eq!(c.user, "rep");
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.dbname, "app");
        assert_eq!(c.sslmode, SslMode::VerifyFull);
        assert_eq!(c.sslrootcert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(c.application_name, "x");
        let v6 = ConnectionConfig::from_url("postgresql://[::1]:5433").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 5433));
        let sock = ConnectionConfig::from_url("postgres:///db?host=/var/run/postgresql").unwrap();
        assert!(sock.is_unix_socket());
        assert_eq!(sock.dbname, "db");
    }

    #[test]
    fn huge_numbers_in_urls_are_errors() {
        let e = ConnectionConfig::from_url("postgres://h/db?connect_timeout=18446744073709551615")
            .unwrap_err();
        assert!(e.to_string().contains("connect_timeout"), "{e}");
        assert!(
            ConnectionConfig::from_url("postgres://h/db?connect_timeout=99999999999999999999")
                .is_err()
        );
        assert!(ConnectionConfig::from_url("postgres://h:99999/db").is_err());
        let c = ConnectionConfig::from_url("postgres://h/db?connect_timeout=3600").unwrap();
        assert!(c.problems().is_empty());
        let cfg = PgSourceConfig {
            status_interval: Duration::MAX,
            ..PgSourceConfig::default()
        };
        assert!(cfg.problems().iter().any(|p| p.contains("status_interval")));
    }

    #[test]
    fn errors_name_unknown_parameters_but_never_their_values() {
        for url in [
            "postgres://u@h/db?passwd=hunter2",
            "postgres://u@h/db?sslpassword=hunter2",
            "postgres://u@h/db?hunter2",
            "postgres://u@h/db?hunter2!=x",
            "postgres://u@h/db?password=hunter2&connect_timeout=hunter2",
            "postgres://u@h/db?password=hunter2&sslmode=hunter2x",
        ] {
            let e = ConnectionConfig::from_url(url).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
        let e = ConnectionConfig::from_url("postgres://u@h/db?passwd=x").unwrap_err();
        assert!(e.to_string().contains("\"passwd\""), "the name helps: {e}");
    }

    #[test]
    fn bad_urls_never_echo_the_password() {
        let e = ConnectionConfig::from_url("postgres://u:hunter2@h:notaport/db").unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
        assert!(ConnectionConfig::from_url("mysql://x").is_err());
        assert!(ConnectionConfig::from_url("postgres://h/db?sslmode=verify-ca").is_err());
        assert!(ConnectionConfig::from_url("postgres://h/db?bogus=1").is_err());
    }

    #[test]
    fn several_hosts_in_the_authority_or_the_parameters() {
        let c = ConnectionConfig::from_url(
            "postgres://u:p,w@h1:5433,h2,[::1]:7/db?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            c.password.as_deref(),
            Some("p,w"),
            "a comma in the password stays"
        );
        assert_eq!(
            c.hosts().collect::<Vec<_>>(),
            [("h1", 5433), ("h2", 5432), ("::1", 7)]
        );
        assert_eq!(c.target_session_attrs, SessionAttrs::ReadWrite);
        assert_eq!(c.each_host()[1].hosts().collect::<Vec<_>>(), [("h2", 5432)]);
        let c = ConnectionConfig::from_url(
            "postgres:///db?host=a,b&port=1,2&target_session_attrs=primary",
        )
        .unwrap();
        assert_eq!(c.hosts().collect::<Vec<_>>(), [("a", 1), ("b", 2)]);
        assert_eq!(c.target_session_attrs, SessionAttrs::ReadWrite);
        let c = ConnectionConfig::from_url("postgres:///db?host=a,b&port=9").unwrap();
        assert_eq!(c.hosts().collect::<Vec<_>>(), [("a", 9), ("b", 9)]);
        assert!(ConnectionConfig::from_url("postgres:///db?host=a,b&port=1,2,3").is_err());
        assert!(
            ConnectionConfig::from_url("postgres://h/db?target_session_attrs=standby").is_err()
        );
        let one = ConnectionConfig::from_url("postgres://h:1/db").unwrap();
        assert!(one.more_hosts.is_empty());
        assert_eq!(one.target_session_attrs, SessionAttrs::Any);
    }

    #[test]
    fn debug_hides_the_password() {
        let c = ConnectionConfig {
            password: Some("hunter2".into()),
            ..ConnectionConfig::default()
        };
        let cfg = PgSourceConfig {
            connection: c,
            ..PgSourceConfig::default()
        };
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hunter2"));
        assert!(shown.contains("***"));
    }

    #[test]
    fn validation_lists_every_problem() {
        let cfg = PgSourceConfig {
            slot: "Bad-Slot".into(),
            batch_size: 0,
            ..PgSourceConfig::default()
        };
        let p = cfg.problems();
        assert!(p.iter().any(|s| s.contains("slot name")));
        assert!(p.iter().any(|s| s.contains("publication name is required")));
        assert!(p.iter().any(|s| s.contains("tables")));
        assert!(p.iter().any(|s| s.contains("batch_size")));
    }
}
