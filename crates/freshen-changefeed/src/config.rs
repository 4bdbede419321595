//! Configuration: the `[changefeed]` table of the binary's TOML file.
//!
//! ```toml
//! [changefeed]
//! path = "/var/lib/freshen/changefeed.redb"
//! durability = "fsync"          # or "none" (tests, throwaway feeds)
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
            commit_delay_ms: 0,
            max_commit_events: defaults::max_commit_events(),
            key_index: defaults::key_index(),
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
        if self.retention.interval_secs == 0 {
            p.push("changefeed.retention.interval_secs: must be at least 1".to_owned());
        }
        if self.groups.max_deliveries == 0 {
            p.push("changefeed.groups.max_deliveries: must be at least 1".to_owned());
        }
        if self.groups.visibility_timeout_ms == 0 {
            p.push("changefeed.groups.visibility_timeout_ms: must be at least 1".to_owned());
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
            heartbeat_ms: defaults::heartbeat_ms(),
            retry_ms: defaults::retry_ms(),
            max_events_per_frame: defaults::max_events_per_frame(),
            ws_pending_window: defaults::ws_pending_window(),
            ws_ack_timeout_ms: defaults::ws_ack_timeout_ms(),
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
        if self.max_long_poll_ms > 60_000 {
            p.push("changefeed.http.max_long_poll_ms: at most 60000".to_owned());
        }
        if self.heartbeat_ms < 100 {
            p.push("changefeed.http.heartbeat_ms: at least 100".to_owned());
        }
        if self.retry_ms < 100 {
            p.push("changefeed.http.retry_ms: at least 100".to_owned());
        }
        if self.max_events_per_frame == 0 {
            p.push("changefeed.http.max_events_per_frame: must be at least 1".to_owned());
        }
        if self.ws_pending_window == 0 {
            p.push("changefeed.http.ws_pending_window: must be at least 1".to_owned());
        }
        if self.ws_ack_timeout_ms == 0 {
            p.push("changefeed.http.ws_ack_timeout_ms: must be at least 1".to_owned());
        }
    }
}

mod defaults {
    use std::net::{Ipv4Addr, SocketAddr};

    pub(super) fn max_commit_events() -> usize {
        65_536
    }
    pub(super) fn key_index() -> bool {
        true
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
    fn compaction_needs_the_key_index() {
        let mut c = ChangefeedConfig::new("x");
        c.retention.keep = Keep::LatestPerKey;
        c.key_index = false;
        let p = c.problems();
        assert!(p.len() == 1 && p[0].contains("key_index"), "{p:?}");
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
