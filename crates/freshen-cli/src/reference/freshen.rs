//! The tables `config/` reads itself: the file's top level, `[source]`'s shared keys,
//! `[target]`, `[http]`, `[log]`, `[defaults]`, `[[views]]`, `[[sinks]]`' shared keys and `[[redact]]`.

use super::{Key, Omitted::*, Range::*, Table, key};

/// The longest duration the file accepts (`config::MAX_DURATION`), in ms.
const YEAR_MS: u64 = 31_557_600_000;

pub(super) const TOP: Table = Table {
    header: "top level",
    about: "The file's tables. `[source]` is required, and at least one `[[views]]` entry unless there is a `[changefeed]` or a `[[sinks]]` entry.",
    keys: &[
        key(
            "source",
            "table",
            Required("{ kind = \"postgres\", url = \"postgres://app@db/app\" }"),
            Any,
            "Where changes come from: `[source]` with its `kind`'s keys.",
        ),
        key(
            "target",
            "table",
            Derived(
                "the source's database",
                "{ url = \"postgres://app@db/app\" }",
            ),
            Any,
            "Where rebuild and reconcile SQL runs: `[target]`. Required when the source is not a database.",
        ),
        key(
            "http",
            "table",
            Is("{}"),
            Any,
            "The `/metrics`, `/healthz`, `/status` listener: `[http]`.",
        ),
        key("log", "table", Is("{}"), Any, "Log lines: `[log]`."),
        key(
            "defaults",
            "table",
            Is("{}"),
            Any,
            "Timing and failure settings every view inherits: `[defaults]`.",
        ),
        key(
            "views",
            "array of tables",
            Unset("[]"),
            Any,
            "The derived tables kept fresh: `[[views]]`.",
        ),
        key(
            "sinks",
            "array of tables",
            Unset("[]"),
            Any,
            "Where captured changes are published: `[[sinks]]`.",
        ),
        key(
            "changefeed",
            "table",
            Unset("{ path = \"/var/lib/freshen/feed.db\" }"),
            Any,
            "The durable changefeed and its HTTP API: `[changefeed]`.",
        ),
        key(
            "key_stream",
            "table",
            Unset("{ brokers = \"k:9092\", topic = \"keys\", group = \"workers\" }"),
            Any,
            "Rebuilds spread over several instances through Kafka: `[key_stream]`.",
        ),
        key(
            "redact",
            "array of tables",
            Unset("[{ table = \"app.users\", column = \"email\", action = \"drop\" }]"),
            Any,
            "Column redaction (PII) applied to every output: `[[redact]]`.",
        ),
    ],
};

pub(super) const SOURCE: Table = Table {
    header: "[source]",
    about: "The keys every source kind shares; the others depend on `kind` (the tables that follow).",
    keys: &[
        key(
            "kind",
            "string",
            Required("\"postgres\""),
            // The kinds and their features: from the registration lines (`kinds.rs`).
            OneOf(&[]),
            "The source kind.",
        ),
        key(
            "ack",
            "string",
            Is("\"after-rebuild\""),
            OneOf(&["after-rebuild", "on-enqueue"]),
            "When a change is confirmed to the source: once every view has rebuilt its keys (at-least-once), or once queued (faster; a crash loses what was queued).",
        ),
    ],
};

pub(super) const TARGET: Table = Table {
    header: "[target]",
    about: "Where rebuild and reconcile SQL runs. Without it a database source's own database is the target; a broker source needs one.",
    keys: &[
        key(
            "url",
            "string",
            Derived("the source's `url`", "\"postgres://app@replica/app\""),
            Any,
            "The target database (`postgres://…` or, with the feature `mysql`, `mysql://…`). May hold a password: write `${VAR}`.",
        ),
        key(
            "pool_size",
            "integer",
            Derived("each view's `workers` + 1", "8"),
            Int(1, 1024),
            "The most connections one view opens.",
        ),
    ],
};

pub(super) const HTTP: Table = Table {
    header: "[http]",
    about: "The listener of `/metrics`, `/healthz`, `/status`, the status page and `/admin`.",
    keys: &[
        key(
            "listen",
            "string",
            Is("\"127.0.0.1:9187\""),
            Any,
            "The address to listen on, or `\"off\"`. Loopback unless told otherwise.",
        ),
        key(
            "allowed_hosts",
            "array of strings",
            Is("[]"),
            Any,
            "Host names served besides `localhost` and IP addresses (DNS rebinding guard; on a non-loopback address only when not empty).",
        ),
        key(
            "header_timeout",
            "duration",
            Is("\"10s\""),
            Millis(1000, 300_000),
            "How long a client may take to send a request's headers; also the idle keep-alive timeout.",
        ),
        key(
            "request_timeout",
            "duration",
            Is("\"30s\""),
            Millis(1000, 3_600_000),
            "How long a request may take to be answered.",
        ),
        key(
            "max_connections",
            "integer",
            Is("64"),
            Int(1, 65_536),
            "Connections served at once. At the limit a new connection takes the place of the oldest one that has not sent a request; when all have, new ones wait in the listen queue.",
        ),
        key(
            "admin_token",
            "string",
            Unset("\"0123456789abcdef0123\""),
            Any,
            "Bearer token the `/admin` endpoints require (at least 16 characters; write `${VAR}`). Without it `/admin` is open on loopback and off elsewhere.",
        ),
    ],
};

pub(super) const LOG: Table = Table {
    header: "[log]",
    about: "Log lines (on standard error; `RUST_LOG` sets the levels).",
    keys: &[key(
        "format",
        "string",
        Is("\"text\""),
        OneOf(&["text", "json"]),
        "One line of text per event, or one JSON object.",
    )],
};

/// The timing keys of `[defaults]`, which every `[[views]]` entry may set too.
const TIMING: [Key; 11] = [
    key(
        "coalesce",
        "duration",
        Is("\"100ms\""),
        Millis(0, 5000),
        "Quiet period after a key's last change before it is rebuilt. At most `max_wait`.",
    ),
    key(
        "max_wait",
        "duration",
        Is("\"5s\""),
        Millis(100, YEAR_MS),
        "Longest a changed key waits for its rebuild while changes keep coming. At least `coalesce`.",
    ),
    key(
        "workers",
        "integer",
        Is("4"),
        Int(1, 1024),
        "Rebuilds at once.",
    ),
    key(
        "poison_after",
        "integer",
        Is("5"),
        Int(1, 65_535),
        "Failures in a row before a key is quarantined (retried only by reconcile or `/admin`).",
    ),
    key(
        "backoff",
        "table",
        Is("{ base = \"100ms\", max = \"30s\" }"),
        Any,
        "Retry delays of a failing key: `base` doubling up to `max`.",
    ),
    key(
        "shutdown_grace",
        "duration",
        Is("\"10s\""),
        Millis(0, YEAR_MS),
        "How long a stopping view waits for running rebuilds before cancelling them.",
    ),
    key(
        "release_quarantined_after",
        "duration",
        Unset("\"1h\""),
        Millis(0, YEAR_MS),
        "For a view without reconcile: how long a quarantined key may hold its transactions unconfirmed (and the source's WAL) before they are released unrebuilt. Unset: until it rebuilds.",
    ),
    key(
        "statement_timeout",
        "duration",
        Is("\"30s\""),
        Millis(0, YEAR_MS),
        "The target cancels a rebuild statement running longer (then retried with backoff); `\"0s\"`: no limit.",
    ),
    key(
        "stale_after",
        "duration",
        Is("\"10m\""),
        Millis(0, YEAR_MS),
        "A change waiting longer for its rebuild makes `/healthz` unhealthy naming the view; `\"0s\"`: never.",
    ),
    key(
        "rebuild_by",
        "string",
        Is("\"auto\""),
        OneOf(&["auto", "per-key", "set"]),
        "How keys are rebuilt: `\"auto\"` chooses per call from what it measures — a trickle in batches of `rebuild_batch` keys, a backlog in set calls, and for a plain `query` the whole table at once past the share of it where that is cheaper (shown as `whole_threshold` in `/status`), and an empty table built whole at start; `\"per-key\"` never grows a call nor recomputes the whole table; `\"set\"` makes every call as large a set as waits.",
    ),
    key(
        "whole_timeout",
        "duration",
        Is("\"1h\""),
        Millis(0, YEAR_MS),
        "The statement timeout of a whole-table run (a first build, a backlog past the threshold): longer than `statement_timeout`, which still bounds how long it waits for a lock; `\"0s\"`: no limit.",
    ),
];

pub(super) const DEFAULTS: Table = Table {
    header: "[defaults]",
    about: "Timing and failure settings every view inherits; a `[[views]]` entry may set each of them for itself.",
    keys: &TIMING,
};

pub(super) const BACKOFF: Table = Table {
    header: "backoff = { base, max }",
    about: "The `backoff` table of `[defaults]` or of a view.",
    keys: &[
        key(
            "base",
            "duration",
            Is("\"100ms\""),
            Millis(1, 30_000),
            "First retry delay, doubled per failure. Above zero, at most `max`.",
        ),
        key(
            "max",
            "duration",
            Is("\"30s\""),
            Millis(100, YEAR_MS),
            "Longest retry delay. At least `base`.",
        ),
    ],
};

/// A view's own keys, then the timing keys it may set.
const VIEW_KEYS: [Key; 22] = {
    let own = [
        key(
            "name",
            "string",
            Required("\"totals\""),
            Any,
            "A unique name: in metrics, logs, `/status` and `/admin`.",
        ),
        key(
            "watch",
            "array of tables",
            Required("[{ table = \"orders\", key = [\"customer_id\"] }]"),
            Any,
            "The tables whose changes dirty the view, each with its key columns (`[[views.watch]]`).",
        ),
        key(
            "rebuild",
            "string or array of strings",
            Derived(
                "required unless `into` and `query`",
                "\"SELECT 1 WHERE $1::text IS NOT NULL\"",
            ),
            Any,
            "Statements that recompute one key, the key's parts as `$1..$n`, run in one transaction.",
        ),
        key(
            "into",
            "string",
            Unset("\"app.totals\""),
            Any,
            "With `query`: the table the query's rows are written into (set-based, in batches of keys); its key columns are the view's key.",
        ),
        key(
            "query",
            "string",
            Unset(
                "\"SELECT customer_id, sum(amount) AS total FROM orders WHERE customer_id = ANY($1) GROUP BY customer_id\"",
            ),
            Any,
            "With `into`: the rows of `into` — a plain SELECT, as for `CREATE MATERIALIZED VIEW` (freshen writes the batch filter around it), or one that selects a batch of keys itself with one array parameter per key part (`WHERE customer_id = ANY($1)`).",
        ),
        key(
            "key",
            "array of strings",
            Derived(
                "the primary key (or only unique index) of `into`",
                "[\"region\", \"day\"]",
            ),
            Any,
            "With `query`: the key columns of `into` the query's rows are matched on, `$1..$n` in this order.",
        ),
        key(
            "rebuild_batch",
            "integer",
            Derived("one key per rebuild; with `query`, 64", "50"),
            Int(1, 100_000),
            "Keys per rebuild round trip: statements written over arrays of keys.",
        ),
        key(
            "keys_per_transaction",
            "integer",
            Is("16"),
            Int(1, 10_000),
            "With per-key `rebuild` statements: keys rebuilt in one transaction.",
        ),
        key(
            "rebuild_set",
            "string or array of strings",
            Unset(
                "[\"DELETE FROM totals t WHERE t.customer_id = ANY($1) AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = t.customer_id)\", \"INSERT INTO totals SELECT customer_id, sum(amount) FROM orders WHERE customer_id = ANY($1) GROUP BY customer_id ON CONFLICT (customer_id) DO UPDATE SET total = excluded.total WHERE totals.total IS DISTINCT FROM excluded.total\"]",
            ),
            Any,
            "With `rebuild` statements: statements that recompute a set of keys at once, the key's parts as arrays `$1..$n` (`= ANY($1)`), run instead of `rebuild` for a call larger than a batch (a backlog, a large fan-out, a sweep), up to 10 000 keys; best written to change only the rows that differ. On MySQL/MariaDB each `$n` is a JSON array (`JSON_TABLE($1, '$[*]' COLUMNS (id BIGINT PATH '$'))`). Unset: `rebuild` serves every call.",
        ),
        key(
            "reconcile",
            "table",
            Unset("{ every = \"1h\", keys = \"SELECT customer_id FROM orders\" }"),
            Any,
            "A sweep rebuilding every live key periodically (`every`, `keys`): the safety net, and what releases quarantined keys.",
        ),
        key(
            "static",
            "array of strings",
            Is("[]"),
            Any,
            "Tables the rebuild reads whose changes need not dirty the view (lookup tables); `check` stops warning about them.",
        ),
    ];
    let mut all = [own[0]; 22];
    let mut i = 0;
    while i < own.len() {
        all[i] = own[i];
        i += 1;
    }
    let mut j = 0;
    while j < TIMING.len() {
        all[own.len() + j] = TIMING[j];
        j += 1;
    }
    all
};

pub(super) const VIEWS: Table = Table {
    header: "[[views]]",
    about: "One derived table kept fresh: what dirties it, how a key is rebuilt, and its own timing (the keys of `[defaults]`, which it overrides).",
    keys: &VIEW_KEYS,
};

pub(super) const WATCH: Table = Table {
    header: "[[views.watch]]",
    about: "One watched table of a view.",
    keys: &[
        key(
            "table",
            "string",
            Required("\"orders\""),
            Any,
            "`schema.table` or `table` (the source's default schema), as the source kind spells names.",
        ),
        key(
            "key",
            "array of strings",
            Required("[\"customer_id\"]"),
            Any,
            "The columns whose values are the view's key (with `keys`: the parent key the query takes).",
        ),
        key(
            "keys",
            "string",
            Unset("\"SELECT customer_id FROM subscriptions WHERE plan_id = $1\""),
            Any,
            "A fan-out: SQL mapping the changed row's `key` columns (`$1..$n`) to the view's keys.",
        ),
        key(
            "fixed_key",
            "boolean",
            Is("false"),
            Any,
            "Declares that no UPDATE changes the key columns and rows are not deleted: the view needs no old key (`check`'s replica identity advice).",
        ),
    ],
};

pub(super) const RECONCILE: Table = Table {
    header: "reconcile = { every, keys }",
    about: "A view's periodic sweep: the safety net that heals what no change reached (a TRUNCATE, a gap, a quarantined key).",
    keys: &[
        key(
            "every",
            "duration",
            Required("\"1h\""),
            Millis(1, YEAR_MS),
            "The sweep interval.",
        ),
        key(
            "keys",
            "string",
            Derived(
                "required, but for a view given as a plain query",
                "\"SELECT customer_id FROM orders\"",
            ),
            Any,
            "A query listing every live key (the target's and the source's). A view given as a plain query needs none: its sweep is one whole-table diff (its keys listed from the query and the target only if a whole run cannot run).",
        ),
    ],
};

pub(super) const SINKS: Table = Table {
    header: "[[sinks]]",
    about: "The keys every sink kind shares; the others depend on `kind`. Snapshots publish the rows that already exist (DBLog chunks beside the stream; a PostgreSQL replication source).",
    keys: &[
        key(
            "kind",
            "string",
            Required("\"kafka\""),
            // The kinds and their features: from the registration lines (`kinds.rs`).
            OneOf(&[]),
            "The sink kind.",
        ),
        key(
            "snapshot",
            "string",
            Is("\"never\""),
            OneOf(&["initial", "never"]),
            "`\"initial\"`: on first start (and for a sink new to a deployment) every captured table; `\"never\"`: only tables asked for with `freshen snapshot --sink N`.",
        ),
        key(
            "snapshot_chunk_rows",
            "integer",
            Is("10000"),
            Int(1, 1_000_000),
            "Rows per snapshot chunk SELECT.",
        ),
        key(
            "snapshot_pause_ms",
            "integer",
            Is("0"),
            Int(0, 3_600_000),
            "Pause between snapshot chunks, in ms.",
        ),
    ],
};

pub(super) const REDACT: Table = Table {
    header: "[[redact]]",
    about: "Column redaction (PII), one entry per table and column, applied wherever a row leaves freshen: the changefeed's values, before/after images and snapshot rows (before they are stored), and every sink's events and snapshot rows. Never applied to rebuilds (they read the database). NULL stays NULL.",
    keys: &[
        key(
            "table",
            "string",
            Required("\"app.users\""),
            Any,
            "`schema.table`, or `table` for the table in any schema; read as the source reads table names (unquoted parts folded), and one column takes one rule however its table is spelt.",
        ),
        key(
            "column",
            "string",
            Required("\"email\""),
            Any,
            "The column whose values are redacted (one entry per column).",
        ),
        key(
            "action",
            "string",
            Required("\"mask\""),
            OneOf(&["drop", "mask", "hash", "truncate"]),
            "`drop`: the column is left out of every image; `mask`: `*` characters (`length`, or `keep`); `hash`: the lower-case hex HMAC-SHA-256 of the value under the key in `key_env` (equal values stay joinable); `truncate`: the first `length` characters.",
        ),
        key(
            "length",
            "integer",
            Derived("8 for `mask`; required for `truncate`", "4"),
            Int(1, 65_536),
            "`mask`: always this many `*` (the value's length is hidden too); `truncate`: the characters kept. Only for those actions.",
        ),
        key(
            "keep",
            "integer",
            Unset("4"),
            Int(0, 65_536),
            "`mask` only, instead of `length`: every character but the last `keep` masked (a value no longer than that is masked whole).",
        ),
        key(
            "key_env",
            "string",
            Unset("\"FRESHEN_REDACT_KEY\""),
            Any,
            "`hash` only, required there: the environment variable holding the key (at least 16 bytes; read at start, never logged, never in the file).",
        ),
    ],
};
