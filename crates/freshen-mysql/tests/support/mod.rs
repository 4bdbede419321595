//! Shared helpers for the integration tests: a real server, SQL, sources.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use freshen::{Batch, RowEvent, Source};
use freshen_mysql::{MySqlSource, MySqlSourceConfig};
use freshen_testenv::MariaDbServer;
use mysql_async::prelude::Queryable;

/// A throwaway server with database `app`; fails (never skips) naming the package.
pub fn server() -> MariaDbServer {
    let db = MariaDbServer::start().unwrap_or_else(|e| panic!("MariaDB for this test: {e}"));
    db.sql("CREATE DATABASE app").unwrap();
    db
}

/// A SQL connection to `app` (UTC session).
pub async fn sql(db: &MariaDbServer) -> mysql_async::Conn {
    let opts =
        mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&db.url("app")).unwrap())
            .init(vec!["SET time_zone = '+00:00'"]);
    mysql_async::Conn::new(opts).await.expect("connect for SQL")
}

/// Runs statements (separated by `;`) on `c`.
pub async fn exec(c: &mut mysql_async::Conn, sql: &str) {
    c.query_drop(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A source configuration for `tables` of `db`, tuned for quick tests.
pub fn config(db: &MariaDbServer, name: &str, tables: &[&str]) -> MySqlSourceConfig {
    let mut c = MySqlSourceConfig::new(db.url("app"), name);
    c.tables = tables.iter().map(|t| t.to_string()).collect();
    c.position_interval_ms = 50;
    c.heartbeat_ms = 100;
    c.reconnect_base_ms = 50;
    c.reconnect_max_ms = 500;
    c
}

/// Starts a source.
pub async fn source(cfg: MySqlSourceConfig) -> MySqlSource {
    MySqlSource::start(cfg).await.expect("start the source")
}

/// Reads batches until `n` events arrived (or panics after `secs`), reading past the
/// outages the source reports and retries by itself.
pub async fn take_events(src: &mut MySqlSource, n: usize, secs: u64) -> Vec<Batch> {
    let mut got = 0;
    let mut batches: Vec<Batch> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while got < n {
        let next = tokio::time::timeout_at(deadline, src.next_batch())
            .await
            .unwrap_or_else(|_| {
                let skipped: Vec<String> = batches
                    .iter()
                    .flat_map(|b| b.skipped().iter().map(|e| e.to_string()))
                    .collect();
                panic!(
                    "only {got} of {n} events within {secs}s: {:?}\nskipped: {skipped:#?}",
                    src.health()
                )
            })
            .expect("stream ended");
        let next = match next {
            Ok(b) => b,
            Err(e) if !e.is_final() => continue,
            Err(e) => panic!("source failed: {e}"),
        };
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
