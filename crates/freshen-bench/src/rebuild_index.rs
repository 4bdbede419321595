//! Rebuild index: what a query-mode rebuild costs for each way the source table can be
//! indexed on the key, and for each batch size — the measurement behind `check`'s index
//! advice and query mode's default batch.
//!
//! `readings` holds 200 rows per device for 1000 devices, in arrival order (consecutive
//! rows belong to different devices, so a device's rows are scattered over as many heap
//! pages as it has rows: the usual shape of an append-mostly table). The rollup starts
//! equal to truth, so every statement is the steady-state read that finds nothing to
//! change (query mode writes nothing then): the part of the rebuild an index serves.
//! Each setup: no index; a btree on `device`; a covering btree `(device) INCLUDE
//! (value)` after VACUUM (index-only scans); a btree on `device` with the table
//! CLUSTERed on it (a device's rows on a few pages). Batches of 64 random devices, the
//! statement query mode writes, run on one connection; per key: the median time of a
//! batch, and the buffers `readings` and its indexes were read from
//! (`pg_statio_user_tables`, flushed after the run).

use std::time::{Duration, Instant};

use freshen_postgres::{QueryRebuild, TableName};

use crate::Opts;
use crate::report::Table;
use crate::workload::{DEVICES, QUERY, READINGS, connect, median, runtime, server};

const SETUPS: [(&str, &str); 4] = [
    ("no index on readings(device)", ""),
    ("btree (device)", "CREATE INDEX ON readings (device)"),
    (
        "covering btree (device) INCLUDE (value), vacuumed",
        "CREATE INDEX ON readings (device) INCLUDE (value)",
    ),
    (
        "btree (device), table CLUSTERed on it",
        "CREATE INDEX readings_device ON readings (device); CLUSTER readings USING readings_device",
    ),
];

struct Row {
    label: String,
    per_key: Duration,
    blocks_per_key: f64,
    plan: String,
}

async fn measure(
    url: &str,
    label: &str,
    batch: usize,
    batches: usize,
    seed: u64,
) -> anyhow::Result<Row> {
    let c = connect(url).await?;
    let pool =
        freshen_postgres::connect_pool(&freshen_postgres::ConnectionConfig::from_url(url)?, 1)?;
    let rebuild = QueryRebuild::builder(
        pool,
        TableName::new("public", "device_totals"),
        vec!["device".into()],
        QUERY,
    )
    .batch(batch)
    .build()
    .await?;
    let stmt = c.prepare(rebuild.statement()).await?;
    // xorshift64*: the same devices for every setup with the same seed.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut pick = || -> Vec<i32> {
        (0..batch)
            .map(|_| {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
                1 + (r % u64::from(DEVICES)) as i32
            })
            .collect()
    };
    for _ in 0..3 {
        c.execute(&stmt, &[&pick()]).await?;
    }
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN {}", QUERY.replace("$1", "'{1,2,3}'::int[]")),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let plan = plan
        .iter()
        .find(|l| l.contains(" on readings"))
        .map(|l| {
            l.trim_start_matches([' ', '-', '>'])
                .split("  (")
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let blocks = "SELECT coalesce(heap_blks_hit + heap_blks_read, 0) + coalesce(idx_blks_hit + idx_blks_read, 0) \
                  FROM pg_statio_user_tables WHERE relname = 'readings'";
    c.batch_execute("SELECT pg_stat_force_next_flush()").await?;
    c.batch_execute("SELECT 1").await?;
    c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let b0: i64 = c.query_one(blocks, &[]).await?.get(0);
    let mut times = Vec::with_capacity(batches);
    for _ in 0..batches {
        let keys = pick();
        let t0 = Instant::now();
        c.execute(&stmt, &[&keys]).await?;
        times.push(t0.elapsed().as_secs_f64());
    }
    c.batch_execute("SELECT pg_stat_force_next_flush()").await?;
    c.batch_execute("SELECT 1").await?;
    c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let b1: i64 = c.query_one(blocks, &[]).await?.get(0);
    let keys = (batch * batches) as f64;
    Ok(Row {
        label: label.to_string(),
        per_key: Duration::from_secs_f64(median(times) / batch as f64),
        blocks_per_key: (b1 - b0) as f64 / keys,
        plan,
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (per_device, batches) = if opts.quick { (20u64, 5) } else { (200, 60) };
    let rows = per_device * u64::from(DEVICES);
    let rt = runtime()?;
    let mut by_index = Vec::new();
    let mut by_batch = Vec::new();
    for (i, (label, ddl)) in SETUPS.iter().enumerate() {
        let pg = server(&[])?;
        pg.psql(READINGS)?;
        pg.psql(&format!(
            "INSERT INTO readings (device, value) SELECT 1 + g % {DEVICES}, g % 1000 FROM generate_series(1, {rows}) g"
        ))?;
        pg.psql("CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL)")?;
        pg.psql("INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings GROUP BY device")?;
        if !ddl.is_empty() {
            pg.psql(ddl)?;
        }
        pg.psql("VACUUM ANALYZE")?;
        let url = pg.url();
        by_index.push(rt.block_on(measure(&url, label, 64, batches, 7))?);
        if i == 1 {
            for b in [1usize, 8, 64, 256] {
                let mut row = rt.block_on(measure(&url, label, b, batches, 99 + b as u64))?;
                row.label = format!("{b}");
                by_batch.push(row);
            }
        }
        eprintln!("  rebuild-index: {label} done");
    }
    let mut t = Table::new(&[
        "readings indexed by",
        "plan on readings",
        "µs per key",
        "buffers per key",
    ]);
    for r in &by_index {
        t.row(vec![
            r.label.clone(),
            r.plan.clone(),
            format!("{:.1}", r.per_key.as_secs_f64() * 1e6),
            format!("{:.1}", r.blocks_per_key),
        ]);
    }
    t.print();
    println!();
    let mut t = Table::new(&[
        "keys per statement (btree on device)",
        "µs per key",
        "buffers per key",
    ]);
    for r in &by_batch {
        t.row(vec![
            r.label.clone(),
            format!("{:.1}", r.per_key.as_secs_f64() * 1e6),
            format!("{:.1}", r.blocks_per_key),
        ]);
    }
    t.print();
    println!(
        "\n{rows} readings over {DEVICES} devices in arrival order; the rollup already equal to truth \
         (the statement reads, compares and writes nothing). Median of {batches} batches of random devices \
         after 3 warm-up batches, one connection, CPU-bound server settings; buffers: heap and index \
         blocks of readings read (hit or read), per key.\n"
    );
    Ok(())
}
