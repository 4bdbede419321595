//! The keys of `[changefeed]` and its tables (`freshen_changefeed::ChangefeedConfig`,
//! `RetentionConfig`, `GroupDefaults`, `HttpConfig`, `TokenConfig`).

use freshen::reference::{Documented, Omitted::*, Range::*, Table, key};

const HOUR_MS: i64 = 3_600_000;
const DAY_SECS: i64 = 86_400;
const CENTURY_SECS: i64 = 100 * 365 * DAY_SECS;

const CHANGEFEED: Table = Table {
    header: "[changefeed]",
    about: "A durable log of every captured change, served over HTTP (long poll, Server-Sent Events, WebSocket, consumer groups).",
    keys: &[
        key(
            "path",
            "string",
            Required("\"/var/lib/freshen/feed.db\""),
            Any,
            "The store file; created (with its directory) when missing.",
        ),
        key(
            "durability",
            "string",
            Is("\"fsync\""),
            OneOf(&["fsync", "none"]),
            "When an append counts as done: after its group commit is fsynced, or after the commit without fsync (tests, throwaway feeds: a crash may lose the latest appends).",
        ),
        key(
            "cache_mb",
            "integer",
            Is("64"),
            Int(1, 65_536),
            "The store's page cache, in MiB.",
        ),
        key(
            "commit_delay_ms",
            "integer",
            Is("0"),
            Int(0, 1000),
            "How long the writer waits for more appends before a group commit, in ms.",
        ),
        key(
            "max_commit_events",
            "integer",
            Is("65536"),
            Int(1, 10_000_000),
            "The most events one group commit holds.",
        ),
        key(
            "key_index",
            "boolean",
            Is("true"),
            Any,
            "Keep the latest-per-key index: fills in values a source left out as unchanged; compaction and snapshots need it.",
        ),
        key(
            "snapshot",
            "string",
            Is("\"never\""),
            OneOf(&["never", "initial"]),
            "Whether the rows that already exist are read into the log (as `read` events) on first start, or only when asked (`freshen snapshot`).",
        ),
        key(
            "snapshot_chunk_rows",
            "integer",
            Is("10000"),
            Int(1, 1_000_000),
            "Rows per snapshot chunk (one primary-key-ordered SELECT each).",
        ),
        key(
            "snapshot_pause_ms",
            "integer",
            Is("0"),
            Int(0, HOUR_MS),
            "Pause between snapshot chunks, in ms.",
        ),
        key(
            "retention",
            "table",
            Is("{}"),
            Any,
            "How long events are kept: `[changefeed.retention]`.",
        ),
        key(
            "groups",
            "table",
            Is("{}"),
            Any,
            "Defaults for consumer groups: `[changefeed.groups]`.",
        ),
        key(
            "http",
            "table",
            Is("{}"),
            Any,
            "The HTTP API: `[changefeed.http]`.",
        ),
    ],
};

const RETENTION: Table = Table {
    header: "[changefeed.retention]",
    about: "What the log keeps; the policy runs in the background.",
    keys: &[
        key(
            "max_age_secs",
            "integer",
            Unset("604800"),
            Int(1, CENTURY_SECS),
            "Delete events appended longer ago, in seconds.",
        ),
        key(
            "max_events",
            "integer",
            Unset("1000000"),
            Int(1, i64::MAX),
            "Keep at most this many events (the newest).",
        ),
        key(
            "max_bytes",
            "integer",
            Unset("1073741824"),
            Int(1, i64::MAX),
            "Keep at most this many bytes of events (the newest), as the store counts them.",
        ),
        key(
            "keep",
            "string",
            Is("\"all\""),
            OneOf(&["all", "latest-per-key"]),
            "Keep every event, or the latest of each row (compaction; needs `key_index`).",
        ),
        key(
            "tombstone_secs",
            "integer",
            Is("86400"),
            Int(0, CENTURY_SECS),
            "With `keep = \"latest-per-key\"`: how long a row's DELETE stays as a tombstone, in seconds.",
        ),
        key(
            "unacknowledged",
            "string",
            Is("\"keep\""),
            OneOf(&["keep", "drop"]),
            "Events some consumer group has not acknowledged: kept, or dropped by the policy like the others.",
        ),
        key(
            "interval_secs",
            "integer",
            Is("60"),
            Int(1, DAY_SECS),
            "How often the policy runs, in seconds.",
        ),
    ],
};

const GROUPS: Table = Table {
    header: "[changefeed.groups]",
    about: "Defaults for consumer groups created without their own settings.",
    keys: &[
        key(
            "visibility_timeout_ms",
            "integer",
            Is("30000"),
            Int(1, 12 * HOUR_MS),
            "How long a received event stays leased to its consumer before it is delivered again, in ms.",
        ),
        key(
            "max_deliveries",
            "integer",
            Is("5"),
            Int(1, 4_294_967_295),
            "Deliveries after which an unacknowledged event goes to the dead-letter queue.",
        ),
    ],
};

const HTTP: Table = Table {
    header: "[changefeed.http]",
    about: "The changefeed's HTTP API.",
    keys: &[
        key(
            "listen",
            "string",
            Is("\"127.0.0.1:8089\""),
            Any,
            "Where the API listens. A non-loopback address is refused unless `tokens` are set or `allow_unauthenticated_remote` is.",
        ),
        key(
            "allow_unauthenticated_remote",
            "boolean",
            Is("false"),
            Any,
            "Serve a non-loopback address without tokens (anyone who can reach it reads every change).",
        ),
        key(
            "tokens",
            "array of tables",
            Is("[]"),
            Any,
            "Bearer tokens (`[[changefeed.http.tokens]]`); with none, requests need no token.",
        ),
        key(
            "query_token",
            "boolean",
            Is("false"),
            Any,
            "Also accept the token as an `access_token` query parameter on the streaming endpoints (browsers' `EventSource` and `WebSocket` cannot send headers; query strings end up in proxy logs).",
        ),
        key(
            "cors_allow_origins",
            "array of strings",
            Is("[]"),
            Any,
            "Origins allowed to call the API from a browser: `\"*\"` or `http(s)://…` origins.",
        ),
        key(
            "default_limit",
            "integer",
            Is("100"),
            Int(1, 10_000),
            "Events per long-poll response when the request gives no `limit`; at most `max_limit`.",
        ),
        key(
            "max_limit",
            "integer",
            Is("10000"),
            Int(100, 1_000_000),
            "The largest `limit` honoured; at least `default_limit`.",
        ),
        key(
            "max_long_poll_ms",
            "integer",
            Is("60000"),
            Int(0, 60_000),
            "The longest long-poll wait honoured, in ms.",
        ),
        key(
            "transaction_markers",
            "boolean",
            Is("false"),
            Any,
            "A `TRANSACTION_COMMIT` marker after the last event of each source transaction (long poll, Server-Sent Events and WebSocket; never for consumer groups) for every reader unless it asks `tx=0`; off: only readers asking `tx=1` get them.",
        ),
        key(
            "heartbeat_ms",
            "integer",
            Is("15000"),
            Int(100, 300_000),
            "Server-Sent Events: idle time before a heartbeat comment, in ms.",
        ),
        key(
            "retry_ms",
            "integer",
            Is("3000"),
            Int(100, 120_000),
            "Server-Sent Events: the reconnect delay advised to clients, in ms.",
        ),
        key(
            "max_events_per_frame",
            "integer",
            Is("1000"),
            Int(1, 1_000_000),
            "Server-Sent Events: the most events in one frame.",
        ),
        key(
            "ws_pending_window",
            "integer",
            Is("1000"),
            Int(1, 1_000_000),
            "WebSocket: events sent but not yet acknowledged, per subscription, before delivery pauses.",
        ),
        key(
            "ws_ack_timeout_ms",
            "integer",
            Is("30000"),
            Int(1, HOUR_MS),
            "WebSocket: how long an unacknowledged event waits before it is sent again, in ms.",
        ),
        key(
            "allowed_hosts",
            "array of strings",
            Is("[]"),
            Any,
            "Host names served besides `localhost` and IP addresses (DNS rebinding guard; on a non-loopback listener only when not empty).",
        ),
        key(
            "header_timeout_ms",
            "integer",
            Is("10000"),
            Int(1000, 300_000),
            "How long a client may take to send a request's headers, in ms; also the idle keep-alive timeout.",
        ),
        key(
            "header_timeout",
            "duration",
            Is("\"10s\""),
            Millis(1000, 300_000),
            "`header_timeout_ms` as a duration, as `[http]` spells it.",
        ),
        key(
            "request_timeout_ms",
            "integer",
            Is("30000"),
            Int(1000, HOUR_MS),
            "How long a non-streaming request may take, in ms (long polls get their wait on top).",
        ),
        key(
            "request_timeout",
            "duration",
            Is("\"30s\""),
            Millis(1000, 3_600_000),
            "`request_timeout_ms` as a duration, as `[http]` spells it.",
        ),
        key(
            "max_connections",
            "integer",
            Is("512"),
            Int(1, 65_536),
            "Connections served at once. At the limit a new connection takes the place of the oldest one that has not sent a request; when all have, new ones wait in the listen queue.",
        ),
    ],
};

const TOKENS: Table = Table {
    header: "[[changefeed.http.tokens]]",
    about: "One bearer token of the API: its value (inline or from the environment) and scope.",
    keys: &[
        key(
            "token",
            "string",
            Derived("required unless `token_env`", "\"0123456789abcdef\""),
            Any,
            "The token itself; prefer `token_env` to keep it out of the file.",
        ),
        key(
            "token_env",
            "string",
            Derived("required unless `token`", "\"PATH\""),
            Any,
            "The environment variable holding the token.",
        ),
        key(
            "scope",
            "string",
            Required("\"read\""),
            OneOf(&["read", "admin"]),
            "`read`: events, streams, consumer groups, dead letters; `admin`: also stats, retention, creating and deleting groups, replaying and deleting dead letters.",
        ),
    ],
};

impl Documented for crate::ChangefeedConfig {
    const REFERENCE: &'static [Table] = &[CHANGEFEED, RETENTION, GROUPS, HTTP, TOKENS];
}

#[cfg(test)]
mod tests {
    use freshen_testenv::reference::{fields, same_keys};

    use super::*;

    #[test]
    fn every_key_the_parser_accepts_is_documented_and_no_other() {
        use crate as cf;
        same_keys(&CHANGEFEED, fields::<cf::ChangefeedConfig>());
        same_keys(&RETENTION, fields::<cf::RetentionConfig>());
        same_keys(&GROUPS, fields::<cf::GroupDefaults>());
        same_keys(&HTTP, fields::<cf::HttpConfig>());
        same_keys(&TOKENS, fields::<cf::TokenConfig>());
    }
}
