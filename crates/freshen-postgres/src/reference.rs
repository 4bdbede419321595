//! The `[source]` keys of the PostgreSQL kinds, for the configuration reference:
//! [`PgSourceSettings`](crate::PgSourceSettings), [`PgIncrementalSettings`](crate::PgIncrementalSettings)
//! and its per-table settings (the keys every polling kind shares).

use freshen::reference::{Documented, HOUR_MS, Omitted::*, Range::*, Table, key};

const SOURCE: Table = Table {
    header: "[source] kind = \"postgres\"",
    about: "PostgreSQL logical replication (pgoutput): a slot and a publication.",
    keys: &[
        key(
            "url",
            "string",
            Required("\"postgres://app@db/app\""),
            Any,
            "Connection URL; the user needs REPLICATION. May hold a password: write `${VAR}`. Several hosts (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`): freshen uses the first that accepts writes, and follows a promotion.",
        ),
        key(
            "slot",
            "string",
            Is("\"freshen\""),
            Any,
            "Replication slot name (a PostgreSQL identifier, at most 63 bytes).",
        ),
        key(
            "publication",
            "string",
            Is("\"freshen\""),
            Any,
            "Publication name (at most 63 bytes).",
        ),
        key(
            "slot_mode",
            "string",
            Is("\"create\""),
            OneOf(&["create", "existing", "temporary"]),
            "Create the slot when missing; require it; or a temporary slot that disappears with the connection (a restart loses changes: pair it with reconcile).",
        ),
        key(
            "publication_mode",
            "string",
            Is("\"create\""),
            OneOf(&["create", "existing"]),
            "Create the publication for the watched tables when missing (marked as freshen's, so `freshen drop` may drop it), or require it.",
        ),
        key(
            "status_interval",
            "duration",
            Is("\"1s\""),
            Millis(1, HOUR_MS),
            "How often feedback (the confirmed position) is sent to the server.",
        ),
        key(
            "read_gap",
            "duration",
            Is("\"250us\""),
            Millis(0, 10),
            "While changes keep arriving, how long the reader pauses after emptying the socket so a burst gathers; `\"0s\"` reads every message as it arrives.",
        ),
        key(
            "stall_after",
            "duration",
            Is("\"30s\""),
            Millis(0, HOUR_MS),
            "How long a streaming reader may read nothing while the server's WAL moves on before `/healthz` says it stalled; `\"0s\"`: no watch.",
        ),
        key(
            "stream_in_progress",
            "boolean",
            Is("true"),
            Any,
            "Ask PostgreSQL 14+ to send large transactions while they run (pgoutput protocol 2) instead of spilling them to its disk and decoding them again at commit; freshen holds them and hands them over at their commit.",
        ),
        key(
            "stream_memory_mb",
            "integer",
            Is("4"),
            Int(0, 65_536),
            "MiB of streamed transactions held in memory; past it the largest goes to an unlinked temporary file (`TMPDIR`), written once and read back once at its commit. Should that file fail to be written, freshen warns and asks for whole transactions from then on.",
        ),
        key(
            "primary_url",
            "string",
            Unset("\"postgres://freshen@primary/app\""),
            Any,
            "When `url` is a standby (decoding on a standby, PostgreSQL 16): the primary's URL. While freshen creates the slot on the standby it asks the primary for a standby snapshot every second (`pg_log_standby_snapshot()`), so the creation does not wait for the primary's next checkpoint (up to `checkpoint_timeout` on an idle primary). May hold a password: write `${VAR}`.",
        ),
        key(
            "failover",
            "boolean",
            Derived(
                "true on PostgreSQL 17 and later when the source is a primary, else false",
                "true",
            ),
            Any,
            "Create the slot as a failover slot (PostgreSQL 17): a standby with `sync_replication_slots = on` keeps a copy, so after a promotion freshen resumes there from what it confirmed. `check` warns when an existing slot is not one. A standby cannot create one.",
        ),
        key(
            "tables",
            "string or array of strings",
            Is("[]"),
            Any,
            "Tables captured besides the views' (for the changefeed and sinks): `schema.table`, `table`, `schema.*` (the schema's tables, later ones included; PostgreSQL 15), `schema.prefix_*`, or `all` (every table outside system schemas). Patterns and `all` need a superuser to create the publication.",
        ),
        key(
            "discover_every",
            "duration",
            Is("\"10s\""),
            Any,
            "How often the catalog is read for tables the pattern entries select.",
        ),
    ],
};

const INCREMENTAL: Table = Table {
    header: "[source] kind = \"postgres-incremental\"",
    about: "PostgreSQL without replication grants: polls each table by a cursor column (`SELECT` only). Rows deleted are not seen: pair views with reconcile.",
    keys: &[
        key(
            "url",
            "string",
            Required("\"postgres://reader@db/app\""),
            Any,
            "The polled database's URL. May hold a password: write `${VAR}`.",
        ),
        key(
            "cursor",
            "string",
            Unset("\"updated_at\""),
            Any,
            "The cursor column of every table without its own (a timestamp or an increasing id).",
        ),
        key(
            "poll_interval",
            "duration",
            Is("\"1s\""),
            Millis(1, HOUR_MS),
            "Time between polls of a table once caught up.",
        ),
        key(
            "page_size",
            "integer",
            Is("1000"),
            Int(1, 100_000),
            "Rows per page.",
        ),
        key(
            "lookback",
            "duration",
            Is("\"5s\""),
            Millis(0, HOUR_MS),
            "How long a read position is held and its range read again before it may be stored: covers transactions that commit late with an earlier cursor value.",
        ),
        key(
            "name",
            "string",
            Is("\"freshen\""),
            Any,
            "Keys this source's rows in the cursor table (at most 63 bytes).",
        ),
        key(
            "store_table",
            "string",
            Is("\"freshen_cursors\""),
            Any,
            "The cursor table, `table` or `schema.table`, created if missing.",
        ),
        key(
            "store_url",
            "string",
            Derived("`url`", "\"postgres://writer@db/app\""),
            Any,
            "The database of the cursor table, when the polled one is read-only.",
        ),
        key(
            "tables",
            "table of tables",
            Is("{}"),
            Any,
            "Tables polled besides the views', by name (`[source.tables.\"schema.table\"]`), each with its own settings (the next table).",
        ),
    ],
};

const INCREMENTAL_TABLE: Table = Table {
    header: "[source.tables.\"schema.table\"] (postgres-incremental)",
    about: "One polled table's own settings; each defaults to the `[source]` key of the same name.",
    keys: &freshen::poller::TABLE_REFERENCE,
};

impl Documented for crate::PgSourceSettings {
    const REFERENCE: &'static [Table] = &[SOURCE];
}

impl Documented for crate::PgIncrementalSettings {
    const REFERENCE: &'static [Table] = &[INCREMENTAL, INCREMENTAL_TABLE];
}

#[cfg(test)]
mod tests {
    use freshen_testenv::reference::{fields, same_keys};

    use super::*;

    #[test]
    fn every_key_the_parser_accepts_is_documented_and_no_other() {
        same_keys(&SOURCE, fields::<crate::PgSourceSettings>());
        same_keys(&INCREMENTAL, fields::<crate::PgIncrementalSettings>());
        same_keys(
            &INCREMENTAL_TABLE,
            fields::<crate::incremental::TableSettings>(),
        );
    }
}
