//! How often a MariaDB commit reaches the binlog stream before new snapshots see it,
//! with no semi-synchronous replication: one writer inserts rows one by one while, the
//! moment each row event arrives from the stream, another connection looks the row up.
//! A miss is a row the stream delivered that a fresh snapshot could not see yet — what
//! `MySqlRebuild`'s visibility check waits out.
//!
//! `cargo run --release -p freshen-mysql --example visibility_gap [rows]` (starts its own
//! throwaway server; needs mariadb-server).

use std::time::Instant;

use freshen::{Source, Value};
use freshen_mysql::{MySqlSource, MySqlSourceConfig};
use mysql_async::prelude::Queryable;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rows: i64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let db = freshen_testenv::MariaDbServer::start()?;
    db.sql("CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY)")?;
    let url = db.url("app");
    let mut cfg = MySqlSourceConfig::new(url.clone(), "gap");
    cfg.tables = vec!["app.t".into()];
    cfg.batch_size = 1;
    let mut src = MySqlSource::start(cfg).await?;
    let writer_url = url.clone();
    let writer = tokio::spawn(async move {
        let mut w = mysql_async::Conn::from_url(&writer_url).await?;
        for id in 1..=rows {
            w.exec_drop("INSERT INTO app.t VALUES (?)", (id,)).await?;
        }
        Ok::<_, mysql_async::Error>(())
    });
    let mut reader = mysql_async::Conn::from_url(&url).await?;
    let lookup = reader
        .prep("SELECT count(*) FROM app.t WHERE id = ?")
        .await?;
    let (mut seen, mut misses) = (0i64, 0i64);
    let t0 = Instant::now();
    while seen < rows {
        let Some(batch) = src.next_batch().await else {
            break;
        };
        let batch = batch?;
        for e in batch.events() {
            let Some(Value::Int(id)) = e.new.as_ref().and_then(|r| r.get("id")).cloned() else {
                continue;
            };
            seen += 1;
            let n: Option<i64> = reader.exec_first(&lookup, (id,)).await?;
            if n != Some(1) {
                misses += 1;
            }
        }
        batch.into_parts().2.ack();
    }
    writer.await??;
    println!(
        "{seen} rows streamed in {:?}; {misses} not yet visible to a new snapshot when their event arrived ({:.3}%)",
        t0.elapsed(),
        100.0 * misses as f64 / seen.max(1) as f64
    );
    Ok(())
}
