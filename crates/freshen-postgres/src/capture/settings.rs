//! `PgSourceSettings`: the `[source]` table with `kind = "postgres"` as the `freshen`
//! binary reads it, and how it becomes a running [`PgSource`](crate::PgSource).
//!
//! The file's names and defaults live here, beside the source they configure, so the
//! binary holds no PostgreSQL knowledge: it deserializes this type, lists
//! [`problems`](PgSourceSettings::problems) with their lines, and plugs it in through
//! [`freshen::plug::SourcePlug`].

use std::time::Duration;

use freshen::SecretUrl;
use serde::{Deserialize, Deserializer};

use crate::TableName;
use crate::TablePattern;
use crate::config::{
    ConnectionConfig, DEFAULT_READ_GAP, DEFAULT_STALL_AFTER, DEFAULT_STREAM_MEMORY,
    PublicationMode, SlotMode,
};

/// The PostgreSQL logical-replication source, as configured in a file.
///
/// ```toml
/// [source]
/// kind = "postgres"
/// url = "${DATABASE_URL}"
/// slot = "freshen"                 # default
/// publication = "freshen"          # default
/// slot_mode = "create"             # or "existing", "temporary"
/// publication_mode = "create"      # or "existing"
/// status_interval = "1s"
/// read_gap = "250us"               # pause before reading a busy stream again
/// stall_after = "30s"              # a reader that reads nothing while WAL moves on: 503
/// stream_in_progress = true        # large transactions sent while they run (PG 14+)
/// stream_memory_mb = 4             # held in memory, past it in a temporary file
/// tables = ["public.orders"]       # captured besides the views' tables
/// # tables = "public.*"            # or every table of a schema, new ones included
/// # tables = ["app.order_*"]       # or a name pattern; or "all"
/// ```
///
/// `Debug` never shows the password.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgSourceSettings {
    /// Connection URL (may hold a password; `${VAR}` references are expanded by the
    /// reader of the file).
    #[serde(deserialize_with = "secret_url")]
    pub url: SecretUrl,
    /// Replication slot name (default `freshen`).
    #[serde(default = "default_name")]
    pub slot: String,
    /// Publication name (default `freshen`).
    #[serde(default = "default_name")]
    pub publication: String,
    /// Slot lifecycle: `"create"` when missing (default), `"existing"`, `"temporary"`.
    #[serde(default)]
    pub slot_mode: SlotChoice,
    /// Publication lifecycle: `"create"` when missing (default), `"existing"`.
    #[serde(default)]
    pub publication_mode: PublicationChoice,
    /// How often feedback is sent to the server (default `1s`, at most `1h`).
    #[serde(default = "default_status_interval", deserialize_with = "duration")]
    pub status_interval: Duration,
    /// While changes keep arriving, how long the reader pauses after emptying the
    /// socket so a burst gathers (default `250us`, at most `10ms`, `0s` to read every
    /// message as it arrives); see [`PgSourceConfig::read_gap`](crate::PgSourceConfig).
    #[serde(default = "default_read_gap", deserialize_with = "duration")]
    pub read_gap: Duration,
    /// How long a streaming reader may read nothing while the server's WAL moves on
    /// before `/healthz` says it stalled (default `30s`, at most `1h`, `0s` turns the
    /// watch off); see [`PgSourceConfig::stall_after`](crate::PgSourceConfig).
    #[serde(default = "default_stall_after", deserialize_with = "duration")]
    pub stall_after: Duration,
    /// Tables captured besides the views' (for the changefeed and sinks): `schema.table`
    /// or `table`, quoted parts kept as written, unquoted ones folded to lower case; or
    /// `schema.*`: every table of the schema, those created later included (a
    /// publication `FOR TABLES IN SCHEMA`, PostgreSQL 15; each discovered table is
    /// logged); `schema.prefix_*`: the schema's tables whose names match (the schema is
    /// published, the pattern filtered by freshen); `all`: every table of the database
    /// outside system schemas and freshen's bookkeeping (`FOR ALL TABLES`). Patterns and
    /// `all` need a superuser to create the publication. One entry may stand alone:
    /// `tables = "all"`.
    #[serde(default, deserialize_with = "one_or_many")]
    pub tables: Vec<String>,
    /// How often the catalog is read for tables the pattern entries select, for what
    /// the stream cannot tell (a table that joins with rows in it needs a changefeed
    /// snapshot; default 10s).
    #[serde(default = "default_discover_every", deserialize_with = "duration")]
    pub discover_every: Duration,
    /// Ask for large in-progress transactions while they run (pgoutput protocol 2,
    /// PostgreSQL 14+; default `true`); see
    /// [`PgSourceConfig::stream_in_progress`](crate::PgSourceConfig).
    #[serde(default = "default_true")]
    pub stream_in_progress: bool,
    /// MiB of streamed transactions held in memory before the largest goes to a
    /// temporary file (default 4, at most 65536); see
    /// [`PgSourceConfig::stream_memory`](crate::PgSourceConfig).
    #[serde(default = "default_stream_memory_mb")]
    pub stream_memory_mb: u64,
    /// The primary's URL when `url` is a standby (decoding on a standby, PostgreSQL
    /// 16): freshen asks it for a standby snapshot while it creates the slot, so the
    /// creation does not wait for the primary's next checkpoint; see
    /// [`PgSourceConfig::primary`](crate::PgSourceConfig). Optional.
    #[serde(default, deserialize_with = "optional_secret_url")]
    pub primary_url: Option<SecretUrl>,
    /// Create the slot as a failover slot (PostgreSQL 17); unset: on where the server
    /// can (17+, a primary). See [`PgSourceConfig::failover`](crate::PgSourceConfig).
    #[serde(default)]
    pub failover: Option<bool>,
}

fn optional_secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretUrl>, D::Error> {
    Option::<String>::deserialize(d).map(|o| o.map(SecretUrl::new))
}

fn default_true() -> bool {
    true
}

fn default_stream_memory_mb() -> u64 {
    (DEFAULT_STREAM_MEMORY / (1024 * 1024)) as u64
}

/// The largest `stream_memory_mb`.
pub(crate) const MAX_STREAM_MEMORY_MB: u64 = 65_536;

fn default_discover_every() -> Duration {
    Duration::from_secs(10)
}

/// `slot_mode` as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotChoice {
    /// Create it when missing, reuse it otherwise.
    #[default]
    Create,
    /// It must exist already.
    Existing,
    /// A temporary slot that disappears with the connection (a restart loses changes:
    /// pair it with a reconcile sweep).
    Temporary,
}

/// `publication_mode` as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublicationChoice {
    /// Create it for the watched tables when missing (marked as freshen's, so that
    /// `freshen drop` may drop it).
    #[default]
    Create,
    /// It must exist and cover the watched tables.
    Existing,
}

impl From<SlotChoice> for SlotMode {
    fn from(c: SlotChoice) -> SlotMode {
        match c {
            SlotChoice::Create => SlotMode::CreateIfMissing,
            SlotChoice::Existing => SlotMode::MustExist,
            SlotChoice::Temporary => SlotMode::Temporary,
        }
    }
}

impl From<PublicationChoice> for PublicationMode {
    fn from(c: PublicationChoice) -> PublicationMode {
        match c {
            PublicationChoice::Create => PublicationMode::CreateIfMissing,
            PublicationChoice::Existing => PublicationMode::MustExist,
        }
    }
}

fn default_name() -> String {
    "freshen".into()
}

fn default_read_gap() -> Duration {
    DEFAULT_READ_GAP
}

fn default_stall_after() -> Duration {
    DEFAULT_STALL_AFTER
}

fn default_status_interval() -> Duration {
    Duration::from_secs(1)
}

pub(crate) fn secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<SecretUrl, D::Error> {
    String::deserialize(d).map(SecretUrl::new)
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration ({e})")))
}

/// A slot or publication name freshen creates: what PostgreSQL accepts unquoted for a
/// slot, so both print and compare the same everywhere.
pub(crate) fn valid_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// The problems of a PostgreSQL URL, one per line, never quoting a value (the parser's
/// messages never do).
pub fn url_problems(url: &str) -> Vec<String> {
    match ConnectionConfig::from_url(url) {
        Ok(c) => c.problems(),
        // The error lists its problems as "  - …" under a heading.
        Err(e) => {
            let text = e.to_string();
            let items: Vec<String> = text
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("- "))
                .map(str::to_owned)
                .collect();
            if items.is_empty() { vec![text] } else { items }
        }
    }
}

impl PgSourceSettings {
    /// The source's tables of its own (`tables`), parsed (pattern entries aside).
    pub fn table_names(&self) -> Vec<TableName> {
        self.tables
            .iter()
            .filter(|t| TablePattern::parse(t).is_none())
            .filter_map(|t| t.parse().ok())
            .collect()
    }

    /// The entries that select tables by pattern: `"all"`, `"schema.*"`,
    /// `"schema.prefix_*"` ([`TablePattern`]).
    pub fn patterns(&self) -> Vec<TablePattern> {
        self.tables
            .iter()
            .filter_map(|t| TablePattern::parse(t)?.ok())
            .collect()
    }

    /// The connection, parsed.
    pub fn connection(&self) -> Result<ConnectionConfig, crate::PgError> {
        ConnectionConfig::from_url(self.url.expose())
    }

    /// The primary's connection (`primary_url`), parsed, when one is set.
    pub fn primary(&self) -> Result<Option<ConnectionConfig>, crate::PgError> {
        self.primary_url
            .as_ref()
            .map(|u| ConnectionConfig::from_url(u.expose()))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use freshen::plug::SourcePlug;

    use super::*;

    fn settings(url: &str) -> PgSourceSettings {
        PgSourceSettings {
            url: SecretUrl::new(url),
            slot: default_name(),
            publication: default_name(),
            slot_mode: SlotChoice::default(),
            publication_mode: PublicationChoice::default(),
            status_interval: default_status_interval(),
            read_gap: default_read_gap(),
            stall_after: default_stall_after(),
            tables: vec![],
            discover_every: default_discover_every(),
            stream_in_progress: true,
            stream_memory_mb: default_stream_memory_mb(),
            primary_url: None,
            failover: None,
        }
    }

    #[test]
    fn schema_entries_capture_whole_schemas() {
        let mut s = settings("postgres://u@h/db");
        s.tables = vec![
            "sales.*".into(),
            "\"Audit\".*".into(),
            "public.orders".into(),
        ];
        assert_eq!(
            s.patterns(),
            [TablePattern::schema("sales"), TablePattern::schema("Audit")]
        );
        assert_eq!(s.table_names(), [TableName::new("public", "orders")]);
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        s.tables = vec!["a.b.*".into()];
        assert_eq!(s.problems().len(), 1, "{:?}", s.problems());
        let one: PgSourceSettings =
            serde_json::from_str(r#"{"url": "postgres://u@h/db", "tables": "public.*"}"#).unwrap();
        assert_eq!(one.patterns(), [TablePattern::schema("public")]);
        assert!(s.patterns().is_empty());
        s.tables = vec!["all".into(), "app.order_*".into(), "app.orders".into()];
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(
            s.patterns(),
            [
                TablePattern::All,
                TablePattern::In {
                    schema: "app".into(),
                    name: "order_*".into()
                }
            ]
        );
        assert_eq!(s.table_names(), [TableName::new("app", "orders")]);
    }

    #[test]
    fn problems_name_their_field_and_never_the_password() {
        let mut s = settings("postgres://app:hunter2@db/app?connect_timeout=99999");
        s.slot = "Bad-Slot".into();
        s.tables = vec!["a.b.c".into(), "\"Mixed\".t".into()];
        s.status_interval = Duration::ZERO;
        s.read_gap = Duration::from_millis(11);
        s.stream_memory_mb = MAX_STREAM_MEMORY_MB + 1;
        let p = s.problems();
        assert_eq!(p.len(), 6, "{p:?}");
        assert!(p[0].starts_with("url: ") && p[0].contains("connect_timeout"));
        assert!(p[1].starts_with("slot: ") && p[1].contains("Bad-Slot"));
        assert!(p[2].starts_with("status_interval: "));
        assert!(p[3].starts_with("read_gap: "));
        assert!(p[4].starts_with("stream_memory_mb: "));
        assert!(p[5].starts_with("tables: ") && p[5].contains("a.b.c"));
        assert!(p.iter().all(|l| !l.contains("hunter2")));
        assert_eq!(
            s.tables(),
            vec![("Mixed".to_string(), "t".to_string())],
            "quoted parts keep their case"
        );
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
