//! Configuration: the `[changefeed]` table of the binary's TOML file.
//!
//! ```toml
//! [changefeed]
//! path = "/var/lib/freshen/changefeed.redb"
//! durability = "fsync"          # or "none" (tests, throwaway feeds)
//! cache_mb = 64                 # the store's page cache (memory stays within it)
//! snapshot = "initial"          # read existing rows on first start (default "never")
//! snapshot_chunk_rows = 10000   # rows per chunk SELECT
//! snapshot_pause_ms = 0         # pause between chunks (less load on the source)
//!
//! [changefeed.retention]
//! max_age_secs = 604800          # 7 days
//! max_events = 10000000
//! keep = "latest-per-key"        # compaction: the last event of each row (default "all")
//! tombstone_secs = 86400         # how long a compacted row's DELETE stays
//! unacknowledged = "keep"        # or "drop": delete even what groups have not acknowledged
//!
//! [changefeed.http]
//! listen = "127.0.0.1:8089"
//! cors_allow_origins = ["https://app.example.com"]
//! allowed_hosts = ["feed.internal"]   # besides localhost and IP addresses
//! header_timeout = "10s"          # or header_timeout_ms = 10000, as [http] or in ms
//! request_timeout = "30s"
//! max_connections = 512
//!
//! [[changefeed.http.tokens]]
//! token_env = "FRESHEN_CHANGEFEED_READ_TOKEN"
//! scope = "read"
//! ```
//!
//! Every table and field has a default except `path`. Unknown fields are rejected.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// The changefeed's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangefeedConfig {
    /// The store file; created (with its directory) when missing.
    pub path: PathBuf,
    /// When an append counts as done.
    #[serde(default)]
    pub durability: Durability,
    /// The store's page cache, in MiB: what the log keeps in memory (the store's own
    /// default, a GiB, grew a 1M-row snapshot's process to 600 MiB).
    #[serde(default = "defaults::cache_mb")]
    pub cache_mb: usize,
    /// How long the writer waits for more appends before a group commit, in
    /// milliseconds (0: commit as soon as the previous commit ends; appends that arrive
    /// meanwhile share the next commit anyway).
    #[serde(default)]
    pub commit_delay_ms: u64,
    /// The most events one group commit holds.
    #[serde(default = "defaults::max_commit_events")]
    pub max_commit_events: usize,
    /// Keep the latest-per-key index (the sequence of each row's latest event): it fills
    /// in values a source left out as unchanged, and compaction needs it. On by default;
    /// off saves one index write per appended event.
    #[serde(default = "defaults::key_index")]
    pub key_index: bool,
    /// Whether the rows that already exist are read into the log (as `read` events),
    /// not only the changes from now on.
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// Rows per snapshot chunk (one primary-key-ordered SELECT each).
    #[serde(default = "defaults::snapshot_chunk_rows")]
    pub snapshot_chunk_rows: usize,
    /// Pause between snapshot chunks, in milliseconds: bounds the load a snapshot puts
    /// on the source.
    #[serde(default)]
    pub snapshot_pause_ms: u64,
    /// How long events are kept.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Defaults for consumer groups created without their own settings.
    #[serde(default)]
    pub groups: GroupDefaults,
    /// The HTTP API.
    #[serde(default)]
    pub http: HttpConfig,
}

impl ChangefeedConfig {
    /// Settings with every default and the store at `path`.
    pub fn new(path: impl Into<PathBuf>) -> ChangefeedConfig {
        ChangefeedConfig {
            path: path.into(),
            durability: Durability::default(),
            cache_mb: defaults::cache_mb(),
            commit_delay_ms: 0,
            max_commit_events: defaults::max_commit_events(),
            key_index: defaults::key_index(),
            snapshot: SnapshotMode::default(),
            snapshot_chunk_rows: defaults::snapshot_chunk_rows(),
            snapshot_pause_ms: 0,
            retention: RetentionConfig::default(),
            groups: GroupDefaults::default(),
            http: HttpConfig::default(),
        }
    }

    /// Every problem with these settings, each naming its field; empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.path.as_os_str().is_empty() {
            p.push("changefeed.path: must name a file".to_owned());
        }
        if self.max_commit_events == 0 {
            p.push("changefeed.max_commit_events: must be at least 1".to_owned());
        }
        if self.commit_delay_ms > 1000 {
            p.push("changefeed.commit_delay_ms: at most 1000".to_owned());
        }
        if self.retention.keep == Keep::LatestPerKey && !self.key_index {
            p.push(
                "changefeed.retention.keep: \"latest-per-key\" needs key_index = true".to_owned(),
            );
        }
        if !(1..=limits::MAX_CACHE_MB).contains(&self.cache_mb) {
            p.push(format!(
                "changefeed.cache_mb: between 1 and {}",
                limits::MAX_CACHE_MB
            ));
        }
        if !(1..=limits::MAX_CHUNK_ROWS).contains(&self.snapshot_chunk_rows) {
            p.push(format!(
                "changefeed.snapshot_chunk_rows: between 1 and {}",
                limits::MAX_CHUNK_ROWS
            ));
        }
        if self.snapshot_pause_ms > limits::HOUR_MS {
            p.push(format!(
                "changefeed.snapshot_pause_ms: at most {} (an hour)",
                limits::HOUR_MS
            ));
        }
        if self.snapshot == SnapshotMode::Initial && !self.key_index {
            p.push(
                "changefeed.snapshot: \"initial\" needs key_index = true (a chunk's rows are checked against each row's latest event)"
                    .to_owned(),
            );
        }
        if self.max_commit_events > limits::MAX_COMMIT_EVENTS {
            p.push(format!(
                "changefeed.max_commit_events: at most {}",
                limits::MAX_COMMIT_EVENTS
            ));
        }
        if !(1..=limits::DAY_SECS).contains(&self.retention.interval_secs) {
            p.push(format!(
                "changefeed.retention.interval_secs: between 1 and {} (a day)",
                limits::DAY_SECS
            ));
        }
        if self
            .retention
            .max_age_secs
            .is_some_and(|a| !(1..=limits::MAX_AGE_SECS).contains(&a))
        {
            p.push(format!(
                "changefeed.retention.max_age_secs: between 1 and {} (100 years)",
                limits::MAX_AGE_SECS
            ));
        }
        if self.retention.tombstone_secs > limits::MAX_AGE_SECS {
            p.push(format!(
                "changefeed.retention.tombstone_secs: at most {} (100 years)",
                limits::MAX_AGE_SECS
            ));
        }
        if self.retention.max_events == Some(0) || self.retention.max_bytes == Some(0) {
            p.push(
                "changefeed.retention.max_events and max_bytes: at least 1 (leave them out for no limit)"
                    .to_owned(),
            );
        }
        if self.groups.max_deliveries == 0 {
            p.push("changefeed.groups.max_deliveries: must be at least 1".to_owned());
        }
        if !(1..=limits::MAX_VISIBILITY_MS).contains(&self.groups.visibility_timeout_ms) {
            p.push(format!(
                "changefeed.groups.visibility_timeout_ms: between 1 and {} (12 hours)",
                limits::MAX_VISIBILITY_MS
            ));
        }
        self.http.problems(&mut p);
        p
    }
}

/// When an append counts as done (and its batch is acknowledged to the source).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// After the group commit holding it is fsynced: survives a power loss.
    #[default]
    Fsync,
    /// After the commit, without fsync: a crash (even of the process alone) may lose the
    /// latest appends, which the source no longer replays. For tests and throwaway feeds.
    None,
}

/// Whether the changefeed reads the rows that already exist (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotMode {
    /// Only changes from now on; snapshots run when asked for
    /// (`POST /changefeed/snapshot`).
    #[default]
    Never,
    /// On start, every captured table without a completed snapshot is read (and an
    /// unfinished one resumes), then changes stream as usual.
    Initial,
}

/// Which events retention keeps, beyond its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keep {
    /// Every event (within the limits).
    #[default]
    All,
    /// Compaction: only the last event of each row (by table and primary key); a
    /// DELETE stays as a tombstone for `tombstone_secs`. Events of tables without a
    /// primary key are all kept. A consumer that replays the compacted log by key ends
    /// with the table's state.
    LatestPerKey,
}

/// What retention does with events some consumer group has not acknowledged yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unacknowledged {
    /// Keep them: nothing after a group's committed offset is deleted or compacted.
    #[default]
    Keep,
    /// Delete them anyway; a group that had not received them is told so (a gap).
    Drop,
}

/// Retention: events older or beyond these limits are deleted in the background.
/// Every limit is optional; with none set, events are kept until deleted over HTTP.
/// By default nothing a consumer group has not acknowledged is deleted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Delete events appended longer ago than this, in seconds.
    #[serde(default)]
    pub max_age_secs: Option<u64>,
    /// Keep at most this many events (the newest).
    #[serde(default)]
    pub max_events: Option<u64>,
    /// Keep at most this many bytes of events (the newest), as the store counts them.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Which events to keep: all, or the latest of each row (compaction).
    #[serde(default)]
    pub keep: Keep,
    /// With `keep = "latest-per-key"`: how long a row's DELETE stays as a tombstone, in
    /// seconds, so that readers behind it learn the row is gone.
    #[serde(default = "defaults::tombstone_secs")]
    pub tombstone_secs: u64,
    /// Events some consumer group has not acknowledged: kept (default) or dropped.
    #[serde(default)]
    pub unacknowledged: Unacknowledged,
    /// How often the policy runs, in seconds.
    #[serde(default = "defaults::retention_interval_secs")]
    pub interval_secs: u64,
}

impl Default for RetentionConfig {
    fn default() -> RetentionConfig {
        RetentionConfig {
            max_age_secs: None,
            max_events: None,
            max_bytes: None,
            keep: Keep::All,
            tombstone_secs: defaults::tombstone_secs(),
            unacknowledged: Unacknowledged::Keep,
            interval_secs: defaults::retention_interval_secs(),
        }
    }
}

impl RetentionConfig {
    /// Whether any limit is set, or compaction.
    pub fn is_enabled(&self) -> bool {
        self.max_age_secs.is_some()
            || self.max_events.is_some()
            || self.max_bytes.is_some()
            || self.keep == Keep::LatestPerKey
    }
}

/// Defaults for consumer groups.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupDefaults {
    /// How long a received event stays leased to its consumer before it is delivered
    /// again, in milliseconds.
    #[serde(default = "defaults::visibility_timeout_ms")]
    pub visibility_timeout_ms: u64,
    /// Deliveries after which an unacknowledged event goes to the dead-letter queue.
    #[serde(default = "defaults::max_deliveries")]
    pub max_deliveries: u32,
}

impl Default for GroupDefaults {
    fn default() -> GroupDefaults {
        GroupDefaults {
            visibility_timeout_ms: defaults::visibility_timeout_ms(),
            max_deliveries: defaults::max_deliveries(),
        }
    }
}

/// What a bearer token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Read events, stream, use consumer groups (receive, ack, nack), list dead letters.
    Read,
    /// Everything `read` may, plus stats, retention, creating and deleting groups,
    /// replaying and deleting dead letters.
    Admin,
}

/// One bearer token: its value (inline or from an environment variable) and scope.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The token itself. Prefer `token_env` so that the secret stays out of the file.
    #[serde(default)]
    pub token: Option<String>,
    /// The environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// What the token may do.
    pub scope: Scope,
}

impl fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("TokenConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_env", &self.token_env)
            .field("scope", &self.scope)
            .finish()
    }
}

/// The HTTP API's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Where the binary binds the API. Loopback by default; a non-loopback address is
    /// refused unless tokens are configured or `allow_unauthenticated_remote` is set.
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Serve a non-loopback address without tokens (anyone who can reach it reads
    /// every change). Off by default.
    #[serde(default)]
    pub allow_unauthenticated_remote: bool,
    /// Bearer tokens; with none, requests need no token.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Also accept the token as an `access_token` query parameter on the streaming
    /// endpoints, for browsers (`EventSource` and `WebSocket` cannot send headers).
    /// Query strings end up in proxy logs: off by default.
    #[serde(default)]
    pub query_token: bool,
    /// Origins allowed to call the API from a browser (`"*"` for any); none by default.
    #[serde(default)]
    pub cors_allow_origins: Vec<String>,
    /// Events per long-poll response when the request gives no `limit`.
    #[serde(default = "defaults::default_limit")]
    pub default_limit: usize,
    /// The largest `limit` honoured; larger requests are capped.
    #[serde(default = "defaults::max_limit")]
    pub max_limit: usize,
    /// The longest long-poll wait honoured, in milliseconds (at most 60000).
    #[serde(default = "defaults::max_long_poll_ms")]
    pub max_long_poll_ms: u64,
    /// Long-poll, Server-Sent Events and WebSocket readers get a `TRANSACTION_COMMIT`
    /// marker after each source transaction unless they ask `tx=0` (`"tx":false` in a
    /// WebSocket subscription); without it, only those asking `tx=1` do. Consumer groups
    /// never do.
    #[serde(default)]
    pub transaction_markers: bool,
    /// Server-Sent Events: idle time before a `: heartbeat` comment, in milliseconds.
    #[serde(default = "defaults::heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Server-Sent Events: the reconnect delay advised to clients (`retry:`), in ms.
    #[serde(default = "defaults::retry_ms")]
    pub retry_ms: u64,
    /// Server-Sent Events: the most events written in one frame.
    #[serde(default = "defaults::max_events_per_frame")]
    pub max_events_per_frame: usize,
    /// WebSocket: events sent but not yet acknowledged, per subscription, before
    /// delivery pauses.
    #[serde(default = "defaults::ws_pending_window")]
    pub ws_pending_window: usize,
    /// WebSocket: how long an unacknowledged event waits before it is sent again, in ms.
    #[serde(default = "defaults::ws_ack_timeout_ms")]
    pub ws_ack_timeout_ms: u64,
    /// Host names served besides `localhost` and IP addresses. On a loopback listener
    /// a request naming any other host is refused (`421`), so that a web page cannot
    /// reach the API by pointing a name of its own at 127.0.0.1 (DNS rebinding); on
    /// another listener the list applies only when it is not empty.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// How long a connection may take to send a request's headers, in ms; also how long
    /// an idle kept-alive connection stays open (default 10000). Also read as
    /// `header_timeout = "10s"`, the `[http]` listener's spelling.
    #[serde(
        default = "defaults::header_timeout_ms",
        alias = "header_timeout",
        deserialize_with = "millis"
    )]
    pub header_timeout_ms: u64,
    /// How long a request may take to be answered, in ms (default 30000). Long polls
    /// and group receives get their own wait on top; streams (SSE, WebSocket) are not
    /// cut once they have started. Also read as `request_timeout = "30s"`.
    #[serde(
        default = "defaults::request_timeout_ms",
        alias = "request_timeout",
        deserialize_with = "millis"
    )]
    pub request_timeout_ms: u64,
    /// Most connections served at once (default 512). At the limit a new connection
    /// takes the place of the oldest one that has not sent a request head; when every
    /// one has, further ones wait in the listen queue (see `freshen_http::serve`).
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
}

/// Milliseconds, written as an integer of them or as a duration (`"10s"`, `"500ms"`), so
/// that the `[http]` listener's spelling reads here too.
fn millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Millis;
    impl serde::de::Visitor<'_> for Millis {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("milliseconds, or a duration such as \"10s\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom("a duration cannot be negative"))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
            let d = humantime::parse_duration(v.trim()).map_err(|e| {
                E::custom(format!(
                    "`{v}` is not a duration ({e}); write e.g. \"10s\", \"500ms\""
                ))
            })?;
            u64::try_from(d.as_millis()).map_err(|_| E::custom("a duration too long"))
        }
    }
    d.deserialize_any(Millis)
}

impl HttpConfig {
    /// The serving settings these give, for [`freshen_http::serve`].
    pub(crate) fn serving(&self) -> freshen_http::ListenerConfig {
        let mut s = freshen_http::ListenerConfig::new("changefeed");
        s.allowed_hosts = self.allowed_hosts.clone();
        s.allowed_origins = self.cors_allow_origins.clone();
        s.header_timeout = std::time::Duration::from_millis(self.header_timeout_ms);
        // Applied per route by `app`, where long polls get their wait on top.
        s.request_timeout = None;
        s.max_connections = self.max_connections;
        s
    }
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            listen: defaults::listen(),
            allow_unauthenticated_remote: false,
            tokens: Vec::new(),
            query_token: false,
            cors_allow_origins: Vec::new(),
            default_limit: defaults::default_limit(),
            max_limit: defaults::max_limit(),
            max_long_poll_ms: defaults::max_long_poll_ms(),
            transaction_markers: false,
            heartbeat_ms: defaults::heartbeat_ms(),
            retry_ms: defaults::retry_ms(),
            max_events_per_frame: defaults::max_events_per_frame(),
            ws_pending_window: defaults::ws_pending_window(),
            ws_ack_timeout_ms: defaults::ws_ack_timeout_ms(),
            allowed_hosts: Vec::new(),
            header_timeout_ms: defaults::header_timeout_ms(),
            request_timeout_ms: defaults::request_timeout_ms(),
            max_connections: defaults::max_connections(),
        }
    }
}

impl HttpConfig {
    fn problems(&self, p: &mut Vec<String>) {
        for (i, t) in self.tokens.iter().enumerate() {
            let at = format!("changefeed.http.tokens[{i}]");
            match (&t.token, &t.token_env) {
                (Some(_), Some(_)) => p.push(format!("{at}: give token or token_env, not both")),
                (None, None) => p.push(format!("{at}: give token or token_env")),
                (Some(tok), None) if tok.trim().is_empty() => {
                    p.push(format!("{at}.token: must not be empty"));
                }
                (None, Some(var)) => match std::env::var(var) {
                    Ok(v) if !v.trim().is_empty() => {}
                    _ => p.push(format!(
                        "{at}.token_env: environment variable {var} is unset or empty"
                    )),
                },
                _ => {}
            }
        }
        for o in &self.cors_allow_origins {
            if o != "*" && !(o.starts_with("http://") || o.starts_with("https://")) {
                p.push(format!(
                    "changefeed.http.cors_allow_origins: {o:?} is not \"*\" or an http(s) origin"
                ));
            }
        }
        if self.default_limit == 0 || self.max_limit == 0 {
            p.push("changefeed.http.default_limit and max_limit: must be at least 1".to_owned());
        }
        if self.default_limit > self.max_limit {
            p.push("changefeed.http.default_limit: must not exceed max_limit".to_owned());
        }
        if self.max_limit > limits::MAX_EVENTS_PER_RESPONSE {
            p.push(format!(
                "changefeed.http.max_limit: at most {}",
                limits::MAX_EVENTS_PER_RESPONSE
            ));
        }
        if self.max_long_poll_ms > 60_000 {
            p.push("changefeed.http.max_long_poll_ms: at most 60000".to_owned());
        }
        // The same bounds the stream endpoint applies to its query parameters.
        if !(100..=300_000).contains(&self.heartbeat_ms) {
            p.push("changefeed.http.heartbeat_ms: between 100 and 300000".to_owned());
        }
        if !(100..=120_000).contains(&self.retry_ms) {
            p.push("changefeed.http.retry_ms: between 100 and 120000".to_owned());
        }
        if !(1..=limits::MAX_EVENTS_PER_RESPONSE).contains(&self.max_events_per_frame) {
            p.push(format!(
                "changefeed.http.max_events_per_frame: between 1 and {}",
                limits::MAX_EVENTS_PER_RESPONSE
            ));
        }
        if !(1..=limits::MAX_EVENTS_PER_RESPONSE).contains(&self.ws_pending_window) {
            p.push(format!(
                "changefeed.http.ws_pending_window: between 1 and {}",
                limits::MAX_EVENTS_PER_RESPONSE
            ));
        }
        if !(1..=limits::HOUR_MS).contains(&self.ws_ack_timeout_ms) {
            p.push(format!(
                "changefeed.http.ws_ack_timeout_ms: between 1 and {} (an hour)",
                limits::HOUR_MS
            ));
        }
        for h in &self.allowed_hosts {
            if let Some(why) = freshen_http::host_problem(h) {
                p.push(format!("changefeed.http.allowed_hosts: {why}"));
            }
        }
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        use freshen_http::limits as l;
        if !(ms(l::MIN_HEADER_TIMEOUT)..=ms(l::MAX_HEADER_TIMEOUT))
            .contains(&self.header_timeout_ms)
        {
            p.push(format!(
                "changefeed.http.header_timeout_ms: between {} and {}",
                ms(l::MIN_HEADER_TIMEOUT),
                ms(l::MAX_HEADER_TIMEOUT)
            ));
        }
        if !(ms(l::MIN_REQUEST_TIMEOUT)..=ms(l::MAX_REQUEST_TIMEOUT))
            .contains(&self.request_timeout_ms)
        {
            p.push(format!(
                "changefeed.http.request_timeout_ms: between {} and {}",
                ms(l::MIN_REQUEST_TIMEOUT),
                ms(l::MAX_REQUEST_TIMEOUT)
            ));
        }
        if !(1..=l::MAX_CONNECTIONS).contains(&self.max_connections) {
            p.push(format!(
                "changefeed.http.max_connections: between 1 and {}",
                l::MAX_CONNECTIONS
            ));
        }
    }
}

/// Upper bounds: each far above any sensible setting and far below where arithmetic on
/// times and sizes overflows, so that a typo is an error with a line, not a panic later.
pub(crate) mod limits {
    /// A day, in seconds: the longest pause between retention passes.
    pub(crate) const DAY_SECS: u64 = 86_400;
    /// 100 years, in seconds: the longest retention by age.
    pub(crate) const MAX_AGE_SECS: u64 = 100 * 365 * DAY_SECS;
    /// 12 hours, in ms: the longest lease (SQS's limit too); longer hides a dead consumer.
    pub(crate) const MAX_VISIBILITY_MS: u64 = 12 * 3_600_000;
    /// An hour, in ms.
    pub(crate) const HOUR_MS: u64 = 3_600_000;
    /// Events in one response, frame or window: responses are built in memory.
    pub(crate) const MAX_EVENTS_PER_RESPONSE: usize = 1_000_000;
    /// The store's page cache, in MiB (64 GiB).
    pub(crate) const MAX_CACHE_MB: usize = 65_536;
    /// Rows in one snapshot chunk (a chunk is held in memory until its watermark).
    pub(crate) const MAX_CHUNK_ROWS: usize = 1_000_000;
    /// Events in one group commit (a commit is one store transaction held in memory).
    pub(crate) const MAX_COMMIT_EVENTS: usize = 10_000_000;
}

mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};

    pub(super) fn max_commit_events() -> usize {
        65_536
    }
    pub(super) fn key_index() -> bool {
        true
    }
    pub(super) fn snapshot_chunk_rows() -> usize {
        10_000
    }
    pub(super) fn cache_mb() -> usize {
        64
    }
    pub(super) fn tombstone_secs() -> u64 {
        86_400
    }
    pub(super) fn retention_interval_secs() -> u64 {
        60
    }
    pub(super) fn visibility_timeout_ms() -> u64 {
        30_000
    }
    pub(super) fn max_deliveries() -> u32 {
        5
    }
    pub(super) fn listen() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 8089))
    }
    pub(super) fn default_limit() -> usize {
        100
    }
    pub(super) fn max_limit() -> usize {
        10_000
    }
    pub(super) fn max_long_poll_ms() -> u64 {
        60_000
    }
    pub(super) fn heartbeat_ms() -> u64 {
        15_000
    }
    pub(super) fn retry_ms() -> u64 {
        3_000
    }
    pub(super) fn max_events_per_frame() -> usize {
        1_000
    }
    pub(super) fn ws_pending_window() -> usize {
        1_000
    }
    pub(super) fn ws_ack_timeout_ms() -> u64 {
        30_000
    }
    pub(super) fn header_timeout_ms() -> u64 {
        10_000
    }
    pub(super) fn request_timeout_ms() -> u64 {
        30_000
    }
    pub(super) fn max_connections() -> usize {
        512
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_and_full_configs_parse() {
        let c: ChangefeedConfig =
            serde_json::from_value(serde_json::json!({"path": "/tmp/x"})).unwrap();
        assert_eq!(c.durability, Durability::Fsync);
        assert!(c.http.listen.ip().is_loopback());
        assert!(c.problems().is_empty());
        let c: ChangefeedConfig = serde_json::from_value(serde_json::json!({
            "path": "/tmp/x", "durability": "none",
            "retention": {"max_events": 10},
            "http": {"tokens": [{"token": "s3cret", "scope": "admin"}], "cors_allow_origins": ["*"]}
        }))
        .unwrap();
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "secrets are not printed"
        );
        let c: ChangefeedConfig = serde_json::from_value(serde_json::json!({
            "path": "/tmp/x",
            "retention": {"keep": "latest-per-key", "tombstone_secs": 60, "unacknowledged": "drop"}
        }))
        .unwrap();
        assert_eq!(c.retention.keep, Keep::LatestPerKey);
        assert_eq!(c.retention.unacknowledged, Unacknowledged::Drop);
        assert!(c.retention.is_enabled() && c.key_index);
        assert!(c.problems().is_empty());
    }

    #[test]
    fn the_page_cache_is_bounded_and_defaults_small() {
        let c = ChangefeedConfig::new("x");
        assert_eq!(c.cache_mb, 64);
        for (mb, ok) in [(0, false), (1, true), (65_536, true), (65_537, false)] {
            let c: ChangefeedConfig =
                serde_json::from_value(serde_json::json!({ "path": "x", "cache_mb": mb })).unwrap();
            let p = c.problems();
            assert_eq!(p.is_empty(), ok, "{mb}: {p:?}");
            assert!(ok || p[0].starts_with("changefeed.cache_mb"), "{p:?}");
        }
    }

    #[test]
    fn snapshots_parse_and_need_the_key_index() {
        let c: ChangefeedConfig = serde_json::from_value(serde_json::json!({
            "path": "x", "snapshot": "initial", "snapshot_chunk_rows": 500, "snapshot_pause_ms": 20
        }))
        .unwrap();
        assert_eq!(c.snapshot, SnapshotMode::Initial);
        assert_eq!((c.snapshot_chunk_rows, c.snapshot_pause_ms), (500, 20));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let mut c = c;
        c.key_index = false;
        c.snapshot_chunk_rows = 0;
        let p = c.problems();
        assert!(
            p.iter().any(|m| m.starts_with("changefeed.snapshot:")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|m| m.starts_with("changefeed.snapshot_chunk_rows:")),
            "{p:?}"
        );
        let e = serde_json::from_value::<ChangefeedConfig>(
            serde_json::json!({"path": "x", "snapshot": "always"}),
        );
        assert!(e.unwrap_err().to_string().contains("always"));
    }

    #[test]
    fn compaction_needs_the_key_index() {
        let mut c = ChangefeedConfig::new("x");
        c.retention.keep = Keep::LatestPerKey;
        c.key_index = false;
        let p = c.problems();
        assert!(p.len() == 1 && p[0].contains("key_index"), "{p:?}");
    }

    #[test]
    fn listener_timeouts_read_as_the_http_listener_writes_them_too() {
        let http = |v: serde_json::Value| {
            serde_json::from_value::<ChangefeedConfig>(serde_json::json!({"path": "x", "http": v}))
                .map(|c| (c.http.header_timeout_ms, c.http.request_timeout_ms))
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            http(serde_json::json!({"header_timeout": "15s", "request_timeout": "1m"})),
            Ok((15_000, 60_000))
        );
        assert_eq!(
            http(serde_json::json!({"header_timeout_ms": 2500, "request_timeout_ms": 4000})),
            Ok((2_500, 4_000))
        );
        assert_eq!(http(serde_json::json!({})), Ok((10_000, 30_000)));
        let e = http(serde_json::json!({"header_timeout": "soon"})).unwrap_err();
        assert!(e.contains("`soon` is not a duration"), "{e}");
        let e = http(serde_json::json!({"header_timeout": "5s", "header_timeout_ms": 5000}))
            .unwrap_err();
        assert!(e.contains("duplicate field"), "{e}");
    }

    #[test]
    fn huge_values_are_problems_not_panics() {
        let huge = u64::MAX;
        let c: ChangefeedConfig = serde_json::from_value(serde_json::json!({
            "path": "x",
            "max_commit_events": huge,
            "snapshot_chunk_rows": huge, "snapshot_pause_ms": huge,
            "retention": {"max_age_secs": huge, "interval_secs": huge},
            "groups": {"visibility_timeout_ms": huge},
            "http": {
                "max_limit": huge, "heartbeat_ms": huge, "retry_ms": huge,
                "max_events_per_frame": huge, "ws_pending_window": huge,
                "ws_ack_timeout_ms": huge, "header_timeout_ms": huge,
                "request_timeout_ms": huge, "max_connections": huge,
                "allowed_hosts": ["http://x/"]
            }
        }))
        .unwrap();
        let p = c.problems();
        for field in [
            "max_commit_events",
            "snapshot_chunk_rows",
            "snapshot_pause_ms",
            "retention.max_age_secs",
            "retention.interval_secs",
            "groups.visibility_timeout_ms",
            "http.max_limit",
            "http.heartbeat_ms",
            "http.retry_ms",
            "http.max_events_per_frame",
            "http.ws_pending_window",
            "http.ws_ack_timeout_ms",
            "http.header_timeout_ms",
            "http.request_timeout_ms",
            "http.max_connections",
            "http.allowed_hosts",
        ] {
            let name = format!("changefeed.{field}:");
            assert!(p.iter().any(|m| m.starts_with(&name)), "{field}: {p:?}");
        }
    }

    #[test]
    fn unknown_fields_and_every_problem_are_reported() {
        let e =
            serde_json::from_value::<ChangefeedConfig>(serde_json::json!({"path": "x", "typo": 1}));
        assert!(e.unwrap_err().to_string().contains("typo"));
        let mut c = ChangefeedConfig::new("x");
        c.max_commit_events = 0;
        c.http.default_limit = 20_000;
        c.http.tokens.push(TokenConfig {
            token: None,
            token_env: None,
            scope: Scope::Read,
        });
        let p = c.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.iter().any(|m| m.contains("tokens[0]")));
    }
}
