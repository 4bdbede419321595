//! `MySqlSourceConfig`: what the `freshen` binary reads from `[source]` with
//! `kind = "mysql"`, and what Rust programs fill in.

use std::path::PathBuf;
use std::time::Duration;

use freshen::{Backoff, SecretUrl};
use serde::{Deserialize, Deserializer};

use crate::position::Start;

/// Reads a [`SecretUrl`] from configuration.
fn secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<SecretUrl, D::Error> {
    String::deserialize(d).map(SecretUrl::new)
}

/// How a restart finds where to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResumeBy {
    /// GTIDs when the server has them (MariaDB always; MySQL with `gtid_mode=ON`),
    /// else file and offset. The default.
    #[default]
    Auto,
    /// GTIDs: survives a failover to a replica that has the same transactions.
    Gtid,
    /// Binlog file and offset: valid on this server only.
    File,
}

/// The MySQL/MariaDB binlog source.
///
/// ```toml
/// [source]
/// kind = "mysql"
/// url = "mysql://freshen:${MYSQL_PASSWORD}@127.0.0.1:3306/app"
/// name = "rollups"                  # names this capture's stored position
/// tables = ["app.readings", "app.devices"]
/// ```
///
/// Every other field has a default. The URL's database is where rebuilds run and where
/// the position table lives. `Debug` never shows the password.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlSourceConfig {
    /// `mysql://user:password@host:port/database`. The user needs REPLICATION SLAVE,
    /// REPLICATION CLIENT and SELECT (and, for the position table, CREATE, INSERT and
    /// UPDATE on it).
    #[serde(deserialize_with = "secret_url")]
    pub url: SecretUrl,
    /// The name of this capture: its row in the position table (or its file). Two
    /// sources with one name would overwrite each other's position.
    pub name: String,
    /// Tables whose row changes are delivered, as `database.table` or `database.*`.
    /// Empty: every table (except the position table and the `mysql` database).
    #[serde(default)]
    pub tables: Vec<String>,
    /// The server id this reader registers with (unique among the server's replicas).
    /// Default: derived from `name`, in 0x4000_0000..0x7fff_ffff, unlikely to clash.
    #[serde(default)]
    pub server_id: Option<u32>,
    /// Where to start when no position is stored: `"current"` (the default: the
    /// server's position when the source first starts), `"binlog.000001:4"`, or a GTID
    /// position (`"0-1-42"` on MariaDB, `"uuid:1-42"` on MySQL).
    #[serde(default = "default_start")]
    pub start: String,
    /// How positions are stored and resumed: `"auto"` (default), `"gtid"`, `"file"`.
    #[serde(default)]
    pub resume_by: ResumeBy,
    /// The table (in the URL's database, or `database.table`) that holds positions,
    /// one row per `name`, created if missing. Default `freshen_positions`.
    #[serde(default = "default_position_table")]
    pub position_table: String,
    /// Store positions in this file instead of a table (written atomically: a
    /// temporary file, fsync, rename).
    #[serde(default)]
    pub position_file: Option<PathBuf>,
    /// How often the acknowledged position is stored, at most, in ms (default 1000).
    /// A restart replays at most this much (rebuilds are idempotent).
    #[serde(default = "default_position_interval_ms")]
    pub position_interval_ms: u64,
    /// Most events in one batch (default 1024). A transaction larger than this is
    /// several batches; only the one holding its commit carries the acknowledgement.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Batches queued between the binlog reader and the consumer (default 4).
    #[serde(default = "default_queue_batches")]
    pub queue_batches: usize,
    /// How often the server sends a heartbeat when it has nothing to send, in ms
    /// (default 1000): keeps the connection alive and the lag measured.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// First delay before reconnecting, in ms (default 100); doubles per attempt.
    #[serde(default = "default_reconnect_base_ms")]
    pub reconnect_base_ms: u64,
    /// Longest delay between reconnect attempts, in ms (default 10000).
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// How long reconnecting may fail before the source reports the outage to the
    /// refresher (a [`Retry::Path`](freshen::Retry) error: reported, and read on), in
    /// seconds (default 300); again after each such period. It keeps reconnecting.
    #[serde(default = "default_reconnect_deadline_s")]
    pub reconnect_deadline_s: u64,
}

fn default_start() -> String {
    "current".into()
}
fn default_position_table() -> String {
    "freshen_positions".into()
}
fn default_position_interval_ms() -> u64 {
    1000
}
fn default_batch_size() -> usize {
    1024
}
fn default_queue_batches() -> usize {
    4
}
fn default_heartbeat_ms() -> u64 {
    1000
}
fn default_reconnect_base_ms() -> u64 {
    100
}
fn default_reconnect_max_ms() -> u64 {
    10_000
}
fn default_reconnect_deadline_s() -> u64 {
    300
}

/// A table pattern from [`MySqlSourceConfig::tables`]: `db.table` or `db.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TablePattern {
    pub(crate) database: String,
    /// `None`: every table of the database.
    pub(crate) table: Option<String>,
}

impl TablePattern {
    pub(crate) fn parse(s: &str) -> Result<TablePattern, String> {
        let unquote = |p: &str| p.trim().trim_matches('`').to_string();
        let (db, t) = s
            .split_once('.')
            .ok_or_else(|| format!("table {s:?} must be database.table or database.*"))?;
        let (db, t) = (unquote(db), unquote(t));
        if db.is_empty() || t.is_empty() {
            return Err(format!("table {s:?} must be database.table or database.*"));
        }
        Ok(TablePattern {
            database: db,
            table: (t != "*").then_some(t),
        })
    }

    pub(crate) fn matches(&self, database: &str, table: &str) -> bool {
        self.database == database && self.table.as_deref().is_none_or(|t| t == table)
    }
}

/// What is wrong with a `mysql://` URL (where rebuilds and positions live), never
/// quoting its password.
pub fn url_problems(url: &str) -> Vec<String> {
    match mysql_async::Opts::from_url(url) {
        Ok(o) if o.db_name().is_none() => vec![
            "url must name a database (mysql://user@host:3306/app): rebuilds and the \
             position table live there"
                .into(),
        ],
        Ok(_) => Vec::new(),
        Err(_) => vec![format!(
            "url {} is not a valid mysql:// URL",
            freshen::redact_url(url)
        )],
    }
}

impl MySqlSourceConfig {
    /// A configuration with every default.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> MySqlSourceConfig {
        MySqlSourceConfig {
            url: SecretUrl::new(url),
            name: name.into(),
            tables: Vec::new(),
            server_id: None,
            start: default_start(),
            resume_by: ResumeBy::default(),
            position_table: default_position_table(),
            position_file: None,
            position_interval_ms: default_position_interval_ms(),
            batch_size: default_batch_size(),
            queue_batches: default_queue_batches(),
            heartbeat_ms: default_heartbeat_ms(),
            reconnect_base_ms: default_reconnect_base_ms(),
            reconnect_max_ms: default_reconnect_max_ms(),
            reconnect_deadline_s: default_reconnect_deadline_s(),
        }
    }

    /// Watches `database.table` (or `database.*`).
    pub fn table(mut self, pattern: impl Into<String>) -> MySqlSourceConfig {
        self.tables.push(pattern.into());
        self
    }

    /// Every problem with this configuration, one sentence each (empty when valid).
    pub fn problems(&self) -> Vec<String> {
        let mut p = url_problems(self.url.expose());
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            p.push(format!(
                "name {:?} must be 1-64 letters, digits, '_' or '-'",
                self.name
            ));
        }
        for t in &self.tables {
            if let Err(e) = TablePattern::parse(t) {
                p.push(e);
            }
        }
        if self.server_id == Some(0) {
            p.push("server_id must not be 0 (the server refuses a replica with id 0)".into());
        }
        if let Err(e) = self.start.parse::<Start>() {
            p.push(e);
        }
        if self.position_file.is_none() && !valid_table_name(&self.position_table) {
            p.push(format!(
                "position_table {:?} must be table or database.table (letters, digits, '_', '$')",
                self.position_table
            ));
        }
        if self.position_interval_ms == 0 {
            p.push("position_interval_ms must be greater than zero".into());
        }
        if self.batch_size == 0 {
            p.push("batch_size must be at least 1".into());
        }
        if self.queue_batches == 0 {
            p.push("queue_batches must be at least 1".into());
        }
        if self.heartbeat_ms == 0 || self.heartbeat_ms > 4_294_967 {
            p.push("heartbeat_ms must be between 1 and 4294967".into());
        }
        if self.reconnect_base_ms == 0 || self.reconnect_base_ms > self.reconnect_max_ms {
            p.push("reconnect_base_ms must be > 0 and not exceed reconnect_max_ms".into());
        }
        p
    }

    /// The server id to register with.
    pub(crate) fn effective_server_id(&self) -> u32 {
        self.server_id.unwrap_or_else(|| {
            // FNV-1a of the name, folded into a high range people rarely use.
            let h = self.name.bytes().fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            0x4000_0000 | (h & 0x3fff_ffff)
        })
    }

    pub(crate) fn reconnect(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.reconnect_base_ms),
            Duration::from_millis(self.reconnect_max_ms),
        )
    }

    pub(crate) fn patterns(&self) -> Vec<TablePattern> {
        self.tables
            .iter()
            .filter_map(|t| TablePattern::parse(t).ok())
            .collect()
    }
}

fn valid_table_name(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 64
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
    };
    match s.split_once('.') {
        Some((db, t)) => ok(db) && ok(t),
        None => ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<MySqlSourceConfig, String> {
        toml_edit::de::from_str(toml).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_toml_gets_defaults() {
        let c = parse(
            r#"
            url = "mysql://u:pw@127.0.0.1:3306/app"
            name = "r"
            tables = ["app.readings"]
            "#,
        )
        .unwrap();
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!(c.batch_size, 1024);
        assert_eq!(c.position_table, "freshen_positions");
        assert_eq!(c.resume_by, ResumeBy::Auto);
        assert!(c.effective_server_id() >= 0x4000_0000);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = parse("url = \"mysql://h/app\"\nname = \"r\"\nslot = \"x\"").unwrap_err();
        assert!(e.contains("slot"), "{e}");
    }

    #[test]
    fn every_problem_at_once() {
        let mut c = MySqlSourceConfig::new("mysql://u:hunter2@h:3306", "bad name");
        c.tables = vec!["readings".into()];
        c.server_id = Some(0);
        c.start = "yesterday".into();
        c.batch_size = 0;
        c.position_table = "a.b.c".into();
        let p = c.problems();
        assert_eq!(p.len(), 7, "{p:#?}");
        assert!(p.iter().all(|s| !s.contains("hunter2")));
    }

    #[test]
    fn secrets_never_show() {
        let c = MySqlSourceConfig::new("mysql://u:hunter2@h:3306/app?password=x", "r");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("u:***@h:3306/app?password=***"), "{shown}");
        assert_eq!(SecretUrl::new("mysql://h/app").redacted(), "mysql://h/app");
    }

    #[test]
    fn table_patterns() {
        let p = TablePattern::parse("app.*").unwrap();
        assert!(p.matches("app", "x"));
        assert!(!p.matches("other", "x"));
        let q = TablePattern::parse("`app`.`t`").unwrap();
        assert!(q.matches("app", "t") && !q.matches("app", "u"));
        assert!(TablePattern::parse("t").is_err());
    }
}
