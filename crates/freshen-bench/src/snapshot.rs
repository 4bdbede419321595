//! Changefeed snapshots (DBLog): rows/s of a snapshot into a durable changefeed against
//! `COPY (SELECT …) TO STDOUT` of the same table in the same run (the fastest way
//! PostgreSQL hands a table out: what a snapshot could at best approach), peak RSS for
//! two table sizes (flat: one chunk in memory at a time), and the writers' TPS (pgbench
//! updating the table) with and without a snapshot running.
//!
//! The same table is also snapshotted into a Kafka sink (`freshen_postgres::SinkSnapshots`
//! spliced into a `KafkaSink`, READ events delivered to a broker with `acks=all`, the
//! progress stored in the source per chunk), side by side with COPY and the changefeed.
//!
//! The capture runs throughout (the snapshot needs it, and the TPS baseline has it
//! too), so the TPS difference is the snapshot's own cost on the source.

use std::time::{Duration, Instant};

use anyhow::Context;
use freshen_changefeed::{
    Changefeed, ChangefeedConfig, SnapshotProgress, SnapshotSource, SnapshotState,
};
use freshen_postgres::{
    ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SinkSnapshotConfig, SinkSnapshots,
    SlotMode, TableName,
};
use futures_util::StreamExt;
use tokio_postgres::Client;

use crate::Opts;
use crate::report::{Table, dur, rate};
use crate::workload::{Bench, Load, Script, connect, runtime, server};

const CHUNK_ROWS: usize = 10_000;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Resets the kernel's RSS high-water mark (`VmHWM`) to the current RSS.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(opts))
}

async fn fill(c: &Client, table: &str, rows: u64) -> anyhow::Result<()> {
    c.batch_execute(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, n int NOT NULL, note text NOT NULL);
         INSERT INTO {table} SELECT g, g % 1000, md5(g::text) || md5((g * 7)::text)
           FROM generate_series(1, {rows}) g;"
    ))
    .await
    .context("filling the table")?;
    // On its own: VACUUM cannot run in the implicit transaction of a multi-statement query.
    c.batch_execute(&format!("VACUUM ANALYZE {table}"))
        .await
        .context("vacuuming the table")
}

/// `COPY (SELECT * FROM table) TO STDOUT`: rows and time.
async fn copy_out(c: &Client, table: &str) -> anyhow::Result<(u64, Duration)> {
    let started = Instant::now();
    let stream = c
        .copy_out(&format!("COPY (SELECT * FROM {table}) TO STDOUT") as &str)
        .await?;
    tokio::pin!(stream);
    let mut lines = 0u64;
    while let Some(chunk) = stream.next().await {
        lines += chunk?.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok((lines, started.elapsed()))
}

fn progress(cf: &Changefeed, table: &str) -> Option<SnapshotProgress> {
    cf.snapshot_status().into_iter().find(|p| p.table == table)
}

/// Asks for a snapshot of `table` and waits until it is done; returns it, the time and
/// the peak RSS over it (KiB).
async fn snapshot(
    cf: &Changefeed,
    table: &str,
) -> anyhow::Result<(SnapshotProgress, Duration, u64)> {
    reset_peak();
    let started = Instant::now();
    cf.request_snapshot(&[table.to_owned()]).await?;
    loop {
        // A request starts the table over: its counts are this snapshot's.
        if let Some(p) = progress(cf, table).filter(|p| p.state == SnapshotState::Done) {
            return Ok((p, started.elapsed(), status_kib("VmHWM:")));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the snapshot of {table} did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks the sink's snapshots for `table` and waits until done; returns it, the time and
/// the peak RSS over it (KiB).
async fn sink_snapshot(
    snaps: &SinkSnapshots,
    table: &str,
) -> anyhow::Result<(SnapshotProgress, Duration, u64)> {
    reset_peak();
    let started = Instant::now();
    snaps.request(&[table.to_owned()]).await?;
    loop {
        let done = snaps
            .status()
            .into_iter()
            .find(|p| p.table == table && p.state == SnapshotState::Done);
        if let Some(p) = done {
            return Ok((p, started.elapsed(), status_kib("VmHWM:")));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the sink snapshot of {table} did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Kafka sink on its own slot, with its snapshots: the sink's task and the driver's.
async fn kafka_sink(
    conn: &ConnectionConfig,
    bootstrap: &str,
    tables: Vec<TableName>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<(
    SinkSnapshots,
    Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
)> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let source = PgSource::start(PgSourceConfig {
        connection: conn.clone(),
        slot: "bench_sink_snap".into(),
        slot_mode: SlotMode::CreateIfMissing,
        publication: "bench_sink_snap".into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: tables.clone(),
        ..PgSourceConfig::default()
    })
    .await?;
    let snaps =
        SinkSnapshots::new(SinkSnapshotConfig::new("kafka:bench", false).chunk_rows(CHUNK_ROWS));
    let sink = freshen_kafka::KafkaSink::new(&freshen_kafka::KafkaSinkConfig::new(
        bootstrap,
        "bench",
        freshen_kafka::TopicMode::Single,
    ))?;
    let s = snaps.clone();
    let stop_sink = stopped(stop.clone());
    let sink = tokio::spawn(async move {
        let splice = move |b: &freshen::Batch| {
            s.splice(b)
                .into_iter()
                .map(|x| (x.at, x.rows, x.delivered))
                .collect()
        };
        sink.run_interleaved(source, splice, stop_sink).await?;
        anyhow::Ok(())
    });
    let s = snaps.clone();
    let pool = freshen_postgres::connect_pool(conn, 1)?;
    let stop_driver = stopped(stop);
    let driver = tokio::spawn(async move {
        s.run(pool, tables, stop_driver).await?;
        anyhow::Ok(())
    });
    Ok((snaps, vec![sink, driver]))
}

async fn run_async(opts: &Opts) -> anyhow::Result<()> {
    let rows: u64 = if opts.quick { 100_000 } else { 1_000_000 };
    let small = rows / 10;
    let pg = server(&[])?;
    let c = connect(&pg.url()).await?;
    fill(&c, "snap_small", small).await?;
    fill(&c, "snap", rows).await?;

    let dir = tempfile::tempdir()?;
    let mut cfg = ChangefeedConfig::new(dir.path().join("feed.redb"));
    cfg.snapshot_chunk_rows = CHUNK_ROWS;
    let cf = Changefeed::open(&cfg).await?;
    let conn = ConnectionConfig::from_url(&pg.url())?;
    let source = PgSource::start(PgSourceConfig {
        connection: conn.clone(),
        slot: "bench_snap".into(),
        slot_mode: SlotMode::CreateIfMissing,
        publication: "bench_snap".into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: vec![
            TableName::new("public", "snap"),
            TableName::new("public", "snap_small"),
        ],
        ..PgSourceConfig::default()
    })
    .await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let capture = {
        let cf = cf.clone();
        let stop = stopped(stop_rx.clone());
        tokio::spawn(async move { cf.capture(source, stop).await })
    };
    let pool = freshen_postgres::connect_pool(&conn, 1)?;
    let driver = {
        let cf = cf.clone();
        let stop = stopped(stop_rx.clone());
        let source = SnapshotSource::new(
            std::sync::Arc::new(freshen_postgres::PgChunkReader::new(pool)),
            vec![
                ("public".to_owned(), "snap".to_owned()),
                ("public".to_owned(), "snap_small".to_owned()),
            ],
        );
        tokio::spawn(async move { cf.run_snapshots(source, stop).await })
    };

    let kafka = freshen_testenv::KafkaServer::start()
        .context("a Kafka broker (scripts/test-deps-brokers)")?;
    let (sink_snaps, sink_tasks) = kafka_sink(
        &conn,
        &kafka.bootstrap(),
        vec![
            TableName::new("public", "snap"),
            TableName::new("public", "snap_small"),
        ],
        stop_rx.clone(),
    )
    .await?;

    // Side by side, no writers: COPY of each table, then a snapshot of it.
    let idle_rss = status_kib("VmRSS:");
    let mut t = Table::new(&[
        "reading the whole table",
        "rows",
        "time",
        "rows/s",
        "peak RSS (idle)",
    ]);
    for table in ["snap_small", "snap"] {
        let (n, took) = copy_out(&c, table).await?;
        t.row(vec![
            format!("`COPY (SELECT * FROM {table}) TO STDOUT`"),
            n.to_string(),
            dur(took),
            rate(n as f64, took),
            "–".into(),
        ]);
        let (p, took, peak) = snapshot(&cf, table).await?;
        t.row(vec![
            format!("changefeed snapshot of {table}, chunks of {CHUNK_ROWS}, fsync"),
            p.rows.to_string(),
            dur(took),
            rate(p.rows as f64, took),
            format!("{} ({})", mib(peak), mib(idle_rss)),
        ]);
        let (p, took, peak) = sink_snapshot(&sink_snaps, table).await?;
        t.row(vec![
            format!("Kafka sink snapshot of {table}, chunks of {CHUNK_ROWS}, READ events delivered (acks=all)"),
            p.rows.to_string(),
            dur(took),
            rate(p.rows as f64, took),
            format!("{} ({})", mib(peak), mib(idle_rss)),
        ]);
    }
    t.print();

    // Writers: pgbench updating random rows of `snap`, without and with a snapshot.
    let bench = Bench::of(&pg);
    let load = Load {
        clients: 4,
        duration: Duration::from_secs(if opts.quick { 3 } else { 10 }),
        rate: None,
        vars: vec![("rows".into(), rows.to_string())],
    };
    let script = || {
        vec![Script {
            name: "update",
            body: "\\set id random(1, :rows)\nUPDATE snap SET n = n + 1 WHERE id = :id;\n".into(),
            weight: 1,
        }]
    };
    let b = bench.clone();
    let l = load.clone();
    let quiet = tokio::task::spawn_blocking(move || b.run(&script(), &l)).await??;
    let started = Instant::now();
    cf.request_snapshot(&["snap".to_owned()]).await?;
    let b = bench.clone();
    let l = load.clone();
    let busy = tokio::task::spawn_blocking(move || b.run(&script(), &l)).await??;
    let during = started.elapsed();
    let done = loop {
        if let Some(p) = progress(&cf, "snap").filter(|p| p.state == SnapshotState::Done) {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    let mut w = Table::new(&[
        "writers (pgbench, 4 clients, UPDATE by primary key)",
        "TPS",
        "snapshot rows",
        "snapshot time",
        "snapshot rows/s",
    ]);
    w.row(vec![
        "capture running, no snapshot".into(),
        format!("{:.0}", quiet.tps),
        "–".into(),
        "–".into(),
        "–".into(),
    ]);
    let read = done.rows;
    w.row(vec![
        format!(
            "capture running, snapshot of snap under way (ran {} of the {} pgbench window)",
            dur(took.min(during)),
            dur(load.duration)
        ),
        format!("{:.0}", busy.tps),
        read.to_string(),
        dur(took),
        rate(read as f64, took),
    ]);
    w.print();
    println!(
        "rows dropped as changed while their chunk was in flight: {}; TPS during / without: {:.2}",
        done.dropped,
        busy.tps / quiet.tps.max(1e-9)
    );

    let _ = stop_tx.send(true);
    for t in sink_tasks {
        t.await??;
    }
    driver.await??;
    capture.await??;
    cf.close().await;
    Ok(())
}
