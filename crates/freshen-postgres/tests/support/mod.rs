//! Shared helpers for the integration tests: a real server, SQL clients, sources.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use freshen::{Batch, RowEvent, Source};
use freshen_postgres::{
    ConnectionConfig, Lsn, PgSource, PgSourceConfig, PublicationMode, SlotMode, TableName,
};
use freshen_testenv::PgServer;
use tokio_postgres::{Client, NoTls};

/// A throwaway server; fails (never skips) with the package to install.
pub fn server() -> PgServer {
    PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"))
}

/// A SQL client (the connection runs on the current runtime).
pub async fn sql(pg: &PgServer) -> Client {
    let (client, conn) = tokio_postgres::connect(&pg.url(), NoTls)
        .await
        .expect("connect for SQL");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A source configuration for `tables` on `pg`, tuned for quick tests.
pub fn config(pg: &PgServer, slot: &str, tables: &[&str]) -> PgSourceConfig {
    config_at(&pg.url(), slot, tables)
}

/// [`config`] for the database at `url`.
pub fn config_at(url: &str, slot: &str, tables: &[&str]) -> PgSourceConfig {
    PgSourceConfig {
        connection: ConnectionConfig::from_url(url).unwrap(),
        slot: slot.into(),
        slot_mode: SlotMode::CreateIfMissing,
        publication: format!("{slot}_pub"),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: tables
            .iter()
            .map(|t| t.parse::<TableName>().unwrap())
            .collect(),
        status_interval: Duration::from_millis(100),
        reconnect: freshen::Backoff::new(Duration::from_millis(50), Duration::from_millis(500)),
        ..PgSourceConfig::default()
    }
}

/// Starts a source.
pub async fn source(cfg: PgSourceConfig) -> PgSource {
    PgSource::start(cfg).await.expect("start the source")
}

/// Reads batches until `n` events arrived (or panics after `secs`).
pub async fn take_events(src: &mut PgSource, n: usize, secs: u64) -> Vec<Batch> {
    let mut got = 0;
    let mut batches = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while got < n {
        let next = tokio::time::timeout_at(deadline, src.next_batch())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "only {got} of {n} events within {secs}s: {:?}",
                    src.health()
                )
            })
            .expect("stream ended")
            .expect("source failed");
        got += next.events().len();
        batches.push(next);
    }
    batches
}

/// The events of `batches`, in order.
pub fn events(batches: &[Batch]) -> Vec<RowEvent> {
    batches
        .iter()
        .flat_map(|b| b.events().iter().cloned())
        .collect()
}

/// Polls an async check with a deadline (the workspace's one helper).
#[allow(unused_imports)]
pub use freshen_testenv::refresher::eventually;

/// The slot's `confirmed_flush_lsn`.
pub async fn confirmed_flush(c: &Client, slot: &str) -> Lsn {
    let row = c
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// The server's current WAL position.
pub async fn current_lsn(c: &Client) -> Lsn {
    let row = c
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// A count and sum per device of `readings`, computed fresh: what the `rollup` view of
/// the refresher tests must equal.
pub const ROLLUP_TRUTH: &str =
    "SELECT device, count(*)::int8, sum(value)::int8 FROM readings GROUP BY device ORDER BY device";

/// The `rollup` view's rows, in the order of [`ROLLUP_TRUTH`].
pub const ROLLUP_DERIVED: &str = "SELECT device, n, total FROM rollup ORDER BY device";

/// The (device, n, total) rows `sql` returns.
pub async fn rollup_rows(c: &Client, sql: &str) -> Vec<(String, i64, i64)> {
    c.query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The `rollup` view's rebuild: a device's row deleted and computed again from
/// `readings`, on a pool of `connections`.
pub async fn rollup_rebuild(pg: &PgServer, connections: usize) -> freshen_postgres::SqlRebuild {
    rollup_rebuild_at(&pg.url(), connections).await
}

/// [`rollup_rebuild`] for the database at `url`.
pub async fn rollup_rebuild_at(url: &str, connections: usize) -> freshen_postgres::SqlRebuild {
    let connection = ConnectionConfig::from_url(url).unwrap();
    let pool = freshen_postgres::connect_pool(&connection, connections).unwrap();
    freshen_postgres::SqlRebuild::builder(pool)
        .statement("DELETE FROM rollup WHERE device = $1")
        .statement(
            "INSERT INTO rollup SELECT device, count(*), sum(value) FROM readings \
             WHERE device = $1 GROUP BY device",
        )
        .build()
        .await
        .unwrap()
}

/// The `rollup` view's refresher: keyed by `device`, acknowledging after rebuilds, with
/// a short debounce.
pub fn rollup_refresher(
    src: PgSource,
    rebuild: freshen_postgres::SqlRebuild,
) -> freshen::Refresher {
    freshen::Refresher::builder()
        .source(src)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild_with(rebuild)
        .ack(freshen::AckPolicy::AfterRebuild)
        .coalesce(Duration::from_millis(20))
        .max_wait(Duration::from_millis(200))
        .build()
        .unwrap()
}
