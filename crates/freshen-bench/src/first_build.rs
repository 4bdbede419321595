//! First build: a view given as its matview's plain SELECT over an existing table, and
//! an empty derived table. freshen builds it whole at its first start (one `INSERT …
//! SELECT … ORDER BY key` in a snapshot taken after its slot) against what a person does
//! by hand on the same data: `CREATE TABLE AS` plus its primary key.
//!
//! Then a whole-table recompute of the built table that finds nothing changed (the
//! `diff` way: what a reconcile sweep of a plain query runs once its keys reach the
//! threshold): its time and the WAL it writes, beside `REFRESH MATERIALIZED VIEW` and
//! `REFRESH … CONCURRENTLY` of a matview of the same query, which also find nothing
//! changed.
//!
//! 10M source rows over 1M keys by default (`--quick`: 20 000 over 2 000); two rounds
//! on fresh servers, freshen first in one, last in the other.

use std::sync::Arc;
use std::time::{Duration, Instant};

use freshen::{Rebuild, WholeWay};
use freshen_postgres::{ConnectionConfig, QueryRebuild, TableName, connect_pool};

use crate::Opts;
use crate::report::{Table, dur, rate};
use crate::workload::{Freshen, connect, runtime, server};

const QUERY: &str = "SELECT cid, count(*) AS n, sum(v) AS total FROM items GROUP BY cid";

fn config(url: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"

[http]
listen = "off"

[[views]]
name = "totals"
into = "totals"
query = "{QUERY}"
"#
    )
}

async fn wal(c: &tokio_postgres::Client) -> anyhow::Result<String> {
    Ok(c.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0))
}

async fn wal_since(c: &tokio_postgres::Client, lsn: &str) -> anyhow::Result<i64> {
    Ok(c.query_one(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
        &[&lsn],
    )
    .await?
    .get(0))
}

struct Round {
    freshen: Duration,
    ctas: Duration,
    diff: Duration,
    diff_wal: i64,
    diff_written: u64,
    refresh: Duration,
    refresh_wal: i64,
    concurrently: Duration,
    concurrently_wal: i64,
    equal: bool,
}

async fn round(rows: i64, keys: i64, freshen_first: bool) -> anyhow::Result<Round> {
    let pg = server(&[])?;
    let c = connect(&pg.url()).await?;
    c.batch_execute(
        "CREATE TABLE items (id bigint PRIMARY KEY, cid int NOT NULL, v int NOT NULL);
         CREATE INDEX ON items (cid);
         CREATE TABLE totals (cid int PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL);",
    )
    .await?;
    c.execute(
        "INSERT INTO items SELECT g, g % $2::bigint, 1 + g % 7 FROM generate_series(1, $1::bigint) g",
        &[&rows, &keys],
    )
    .await?;
    // One statement a call: several in one simple query are one transaction, and VACUUM
    // cannot run inside one.
    c.batch_execute("VACUUM (ANALYZE)").await?;
    c.batch_execute("CHECKPOINT").await?;
    let by_hand = async {
        let t = Instant::now();
        c.batch_execute(&format!(
            "CREATE TABLE by_hand AS {QUERY}; ALTER TABLE by_hand ADD PRIMARY KEY (cid)"
        ))
        .await?;
        anyhow::Ok(t.elapsed())
    };
    let build = async {
        let t = Instant::now();
        let f = Freshen::start(&config(&pg.url())).await?;
        f.wait("the first build", |f| f.stats().whole_runs >= 1)
            .await?;
        let took = t.elapsed();
        f.stop().await?;
        anyhow::Ok(took)
    };
    let (freshen, ctas) = if freshen_first {
        let f = build.await?;
        (f, by_hand.await?)
    } else {
        let h = by_hand.await?;
        (build.await?, h)
    };
    let equal: i64 = c
        .query_one(
            "SELECT count(*) FROM ((TABLE totals EXCEPT TABLE by_hand) UNION ALL (TABLE by_hand EXCEPT TABLE totals)) d",
            &[],
        )
        .await?
        .get(0);
    c.batch_execute(&format!(
        "CHECKPOINT; CREATE MATERIALIZED VIEW mv AS {QUERY}; CREATE UNIQUE INDEX ON mv (cid)"
    ))
    .await?;
    c.batch_execute("VACUUM (ANALYZE)").await?;
    c.batch_execute("CHECKPOINT").await?;
    // The whole-table diff, run as freshen runs it, finding nothing changed.
    let pool = connect_pool(&ConnectionConfig::from_url(&pg.url())?, 1)?;
    let rebuild = QueryRebuild::builder(
        pool,
        TableName::new("public", "totals"),
        vec!["cid".to_owned()],
        QUERY,
    )
    .build()
    .await?;
    let whole = rebuild
        .whole()
        .ok_or_else(|| anyhow::anyhow!("a plain query has a whole-table way"))?;
    let w = Arc::clone(&whole);
    let lsn = wal(&c).await?;
    let t = Instant::now();
    let done = w
        .rebuild_all(WholeWay::Diff, &[])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let diff = t.elapsed();
    let diff_wal = wal_since(&c, &lsn).await?;
    let lsn = wal(&c).await?;
    let t = Instant::now();
    c.batch_execute("REFRESH MATERIALIZED VIEW mv").await?;
    let refresh = t.elapsed();
    let refresh_wal = wal_since(&c, &lsn).await?;
    c.batch_execute("CHECKPOINT").await?;
    let lsn = wal(&c).await?;
    let t = Instant::now();
    c.batch_execute("REFRESH MATERIALIZED VIEW CONCURRENTLY mv")
        .await?;
    let concurrently = t.elapsed();
    let concurrently_wal = wal_since(&c, &lsn).await?;
    Ok(Round {
        freshen,
        ctas,
        diff,
        diff_wal,
        diff_written: done.written,
        refresh,
        refresh_wal,
        concurrently,
        concurrently_wal,
        equal: equal == 0,
    })
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rows, keys): (i64, i64) = if opts.quick {
        (20_000, 2_000)
    } else {
        (10_000_000, 1_000_000)
    };
    let rt = runtime()?;
    let mut build = Table::new(&[
        "source rows",
        "keys",
        "round",
        "freshen's first build",
        "CREATE TABLE AS + PRIMARY KEY",
        "freshen / by hand",
        "keys / s (freshen)",
        "equal",
    ]);
    let mut again = Table::new(&[
        "round",
        "whole-table diff (nothing changed)",
        "its WAL",
        "rows written",
        "REFRESH",
        "its WAL",
        "REFRESH CONCURRENTLY",
        "its WAL",
    ]);
    for r in 0..2 {
        let x = rt.block_on(round(rows, keys, r % 2 == 0))?;
        build.row(vec![
            rows.to_string(),
            keys.to_string(),
            (r + 1).to_string(),
            dur(x.freshen),
            dur(x.ctas),
            format!(
                "{:.2}",
                x.freshen.as_secs_f64() / x.ctas.as_secs_f64().max(1e-9)
            ),
            rate(keys as f64, x.freshen),
            if x.equal { "yes" } else { "NO" }.to_string(),
        ]);
        again.row(vec![
            (r + 1).to_string(),
            dur(x.diff),
            mib(x.diff_wal),
            x.diff_written.to_string(),
            dur(x.refresh),
            mib(x.refresh_wal),
            dur(x.concurrently),
            mib(x.concurrently_wal),
        ]);
    }
    build.print();
    println!();
    again.print();
    Ok(())
}
