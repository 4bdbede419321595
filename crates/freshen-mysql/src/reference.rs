//! The `[source]` keys of the MySQL kinds (`freshen_mysql::MySqlSourceConfig`,
//! `freshen_mysql::MySqlIncrementalSettings` and its per-table `TableSettings`).

use freshen::reference::{Documented, HOUR_MS, Omitted::*, Range::*, Table, key};

const SOURCE: Table = Table {
    header: "[source] kind = \"mysql\"",
    about: "MySQL or MariaDB row-based binlog; its position is stored in a table (or a file).",
    keys: &[
        key(
            "url",
            "string",
            Required("\"mysql://freshen@db:3306/app\""),
            Any,
            "`mysql://user:password@host:port/database`; the user needs REPLICATION SLAVE, REPLICATION CLIENT and SELECT. Write the password as `${VAR}`.",
        ),
        key(
            "name",
            "string",
            Required("\"rollups\""),
            Any,
            "The name of this capture: its row in the position table (or its file). Two sources with one name overwrite each other's position.",
        ),
        key(
            "tables",
            "array of strings",
            Is("[]"),
            Any,
            "Tables whose changes are delivered besides the views', `database.table` or `database.*`; empty: every table.",
        ),
        key(
            "server_id",
            "integer",
            Derived("derived from `name`", "4242"),
            Int(1, 4_294_967_295),
            "The server id this reader registers with (unique among the server's replicas).",
        ),
        key(
            "start",
            "string",
            Is("\"current\""),
            Any,
            "Where to start when no position is stored: `\"current\"`, `\"binlog.000001:4\"`, or a GTID position (`\"0-1-42\"` on MariaDB, `\"uuid:1-42\"` on MySQL).",
        ),
        key(
            "resume_by",
            "string",
            Is("\"auto\""),
            OneOf(&["auto", "gtid", "file"]),
            "How positions are stored and resumed.",
        ),
        key(
            "position_table",
            "string",
            Is("\"freshen_positions\""),
            Any,
            "The table (in the URL's database, or `database.table`) holding positions, one row per `name`, created if missing.",
        ),
        key(
            "position_file",
            "string",
            Unset("\"/var/lib/freshen/position\""),
            Any,
            "Store positions in this file instead (written atomically).",
        ),
        key(
            "position_interval_ms",
            "integer",
            Is("1000"),
            Int(1, i64::MAX),
            "How often the acknowledged position is stored, at most, in ms; a restart replays at most this much.",
        ),
        key(
            "batch_size",
            "integer",
            Is("1024"),
            Int(1, i64::MAX),
            "Most events in one batch.",
        ),
        key(
            "queue_batches",
            "integer",
            Is("4"),
            Int(1, i64::MAX),
            "Batches queued between the binlog reader and the consumer.",
        ),
        key(
            "heartbeat_ms",
            "integer",
            Is("1000"),
            Int(1, 4_294_967),
            "How often the server sends a heartbeat when it has nothing to send, in ms.",
        ),
        key(
            "reconnect_base_ms",
            "integer",
            Is("100"),
            Int(1, 10_000),
            "First delay before reconnecting, in ms, doubled per attempt; at most `reconnect_max_ms`.",
        ),
        key(
            "reconnect_max_ms",
            "integer",
            Is("10000"),
            Int(100, i64::MAX),
            "Longest delay between reconnect attempts, in ms; at least `reconnect_base_ms`.",
        ),
        key(
            "reconnect_deadline_s",
            "integer",
            Is("300"),
            Int(0, i64::MAX),
            "How long reconnecting may fail before the source reports the outage (again after each such period), in seconds; it keeps reconnecting.",
        ),
    ],
};

const INCREMENTAL: Table = Table {
    header: "[source] kind = \"mysql-incremental\"",
    about: "MySQL or MariaDB without binlog grants: polls each table by a cursor column (`SELECT` only). Rows deleted are not seen: pair views with reconcile.",
    keys: &[
        key(
            "url",
            "string",
            Required("\"mysql://reader@db:3306/app\""),
            Any,
            "The polled database's URL. Write the password as `${VAR}`.",
        ),
        key(
            "cursor",
            "string",
            Unset("\"updated_at\""),
            Any,
            "The cursor column of every table without its own.",
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
            Is("\"30s\""),
            Millis(0, HOUR_MS),
            "How long a read position is held and its range read again before it may be stored: the only cover for rows committed late with an earlier cursor value (keep it above the longest write transaction).",
        ),
        key(
            "name",
            "string",
            Is("\"freshen\""),
            Any,
            "Keys this source's rows in the cursor table (at most 64 bytes).",
        ),
        key(
            "store_table",
            "string",
            Is("\"freshen_cursors\""),
            Any,
            "The cursor table, `table` (in the URL's database) or `database.table`, created if missing.",
        ),
        key(
            "store_url",
            "string",
            Derived("`url`", "\"mysql://writer@db:3306/app\""),
            Any,
            "The database of the cursor table, when the polled one is read-only.",
        ),
        key(
            "tables",
            "table of tables",
            Is("{}"),
            Any,
            "Tables polled besides the views', by name (`[source.tables.\"database.table\"]`), each with its own settings (the next table).",
        ),
    ],
};

const INCREMENTAL_TABLE: Table = Table {
    header: "[source.tables.\"database.table\"] (mysql-incremental)",
    about: "One polled table's own settings; each defaults to the `[source]` key of the same name.",
    keys: &freshen::poller::TABLE_REFERENCE,
};

impl Documented for crate::MySqlSourceConfig {
    const REFERENCE: &'static [Table] = &[SOURCE];
}

impl Documented for crate::MySqlIncrementalSettings {
    const REFERENCE: &'static [Table] = &[INCREMENTAL, INCREMENTAL_TABLE];
}

#[cfg(test)]
mod tests {
    use freshen_testenv::reference::{fields, same_keys};

    use super::*;

    #[test]
    fn every_key_the_parser_accepts_is_documented_and_no_other() {
        same_keys(&SOURCE, fields::<crate::MySqlSourceConfig>());
        same_keys(&INCREMENTAL, fields::<crate::MySqlIncrementalSettings>());
        same_keys(
            &INCREMENTAL_TABLE,
            fields::<crate::incremental::TableSettings>(),
        );
    }
}
