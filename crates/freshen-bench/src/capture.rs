//! PostgreSQL capture: `PgSource` against `pg_recvlogical` (and supabase/etl, when built)
//! on copies of one unread slot, and memory while a 1M-row transaction streams through.
//!
//! One slot is created before a single transaction inserts the rows; every run reads
//! its own copy (`pg_copy_logical_replication_slot`), so every reader decodes exactly the
//! same WAL from the same starting point. `pg_recvlogical` writes the pgoutput stream to
//! /dev/null (no decoding of rows at all, protocol 1); freshen decodes every row into a
//! `RowEvent`, hands it over in batches and acknowledges them (by default asking for
//! large transactions streamed while they run, protocol 2; a row beside it with
//! protocol 1); etl's `Pipeline` decodes every row
//! into its `Event`s and hands batches to a destination that counts them (a reader built
//! outside this repository, named by `FRESHEN_BENCH_ETL`). Runs alternate; the median
//! counts.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::Source;
use freshen_postgres::{
    ConnectionConfig, DEFAULT_READ_GAP, PgSource, PgSourceConfig, PublicationMode, SlotMode,
};
use freshen_testenv::PgServer;

use crate::report::{Table, dur, rate};
use crate::workload::{server_cpu, tree_cpu};
use crate::{Opts, alloc, rival};

struct Setup {
    pg: PgServer,
    end_lsn: String,
    copies: usize,
}

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// A server with `rows` inserted in one transaction after slot `origin` was created.
fn setup(rows: usize) -> anyhow::Result<Setup> {
    setup_with(rows, 1)
}

/// The same with the rows inserted by `transactions` transactions of equal size (an
/// OLTP stream: a Begin and a Commit message around every few rows).
fn setup_with(rows: usize, transactions: usize) -> anyhow::Result<Setup> {
    let pg = PgServer::start().context("PostgreSQL for the capture benchmark")?;
    pg.psql(
        "CREATE TABLE bench (id int PRIMARY KEY, dev text NOT NULL, v int NOT NULL);
         CREATE PUBLICATION bench_pub FOR TABLE bench;",
    )?;
    // Its own statement: a slot cannot be created in a transaction that wrote.
    pg.psql("SELECT pg_create_logical_replication_slot('origin', 'pgoutput')")?;
    if transactions <= 1 {
        pg.psql(&format!(
            "INSERT INTO bench SELECT g, 'dev-' || (g % 1000), g FROM generate_series(1, {rows}) g"
        ))?;
    } else {
        // A procedure may COMMIT between statements: one transaction per step.
        let per = rows.div_ceil(transactions);
        pg.psql(&format!(
            "CREATE PROCEDURE fill() LANGUAGE plpgsql AS $$
             BEGIN
               FOR t IN 0..{last} LOOP
                 INSERT INTO bench SELECT g, 'dev-' || (g % 1000), g
                   FROM generate_series(t * {per} + 1, least((t + 1) * {per}, {rows})) g;
                 COMMIT;
               END LOOP;
             END $$",
            last = transactions - 1
        ))?;
        pg.psql("CALL fill()")?;
    }
    let end_lsn = pg.psql("SELECT pg_current_wal_lsn()")?;
    Ok(Setup {
        pg,
        end_lsn,
        copies: 0,
    })
}

fn copy_slot(s: &mut Setup) -> anyhow::Result<String> {
    s.copies += 1;
    let name = format!("copy_{}", s.copies);
    copy_slot_as(s, &name)?;
    Ok(name)
}

fn copy_slot_as(s: &Setup, name: &str) -> anyhow::Result<()> {
    s.pg.psql(&format!(
        "SELECT pg_copy_logical_replication_slot('origin', '{name}')"
    ))?;
    Ok(())
}

fn drop_slot(s: &Setup, name: &str) {
    let _ =
        s.pg.psql(&format!("SELECT pg_drop_replication_slot('{name}')"));
}

/// What one reader's run took: wall time, and the CPU the server spent serving it (the
/// walsender decoding and sending; measured on the whole server, whose other processes
/// are idle meanwhile).
#[derive(Clone, Copy)]
struct Cost {
    took: Duration,
    server: Duration,
    /// The server's and the reader's CPU together (every process of the run).
    total: Duration,
}

/// `pg_recvlogical` from a fresh copy to the end of the transaction.
fn recvlogical(s: &mut Setup) -> anyhow::Result<Cost> {
    let slot = copy_slot(s)?;
    let mut cmd = Command::new(s.pg.tool("pg_recvlogical"));
    cmd.args(["-d", &s.pg.url(), "--slot", &slot, "--start", "--no-loop"])
        .args(["-o", "proto_version=1", "-o", "publication_names=bench_pub"])
        .args(["--endpos", &s.end_lsn, "-f", "/dev/null"]);
    run_reader(s, &slot, cmd)
}

/// Runs a reader process on `slot` to its exit, timed and with the server's and the whole
/// tree's CPU over the run, then drops the slot.
fn run_reader(s: &Setup, slot: &str, mut cmd: Command) -> anyhow::Result<Cost> {
    let what = cmd.get_program().to_string_lossy().into_owned();
    let (server0, total0) = (server_cpu(&s.pg.data_dir()), tree_cpu());
    let t0 = Instant::now();
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    let took = t0.elapsed();
    let server = server_cpu(&s.pg.data_dir()).saturating_sub(server0);
    let total = tree_cpu().saturating_sub(total0);
    anyhow::ensure!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop_slot(s, slot);
    Ok(Cost {
        took,
        server,
        total,
    })
}

/// The environment variable naming etl's counting reader.
const ETL_ENV: &str = "FRESHEN_BENCH_ETL";

/// What `FRESHEN_BENCH_ETL` must name.
const ETL_READER: &str = "a reader built outside this repository on supabase/etl's `Pipeline`, \
    taking `HOST PORT DATABASE USER PIPELINE_ID PUBLICATION TABLE ROWS` and exiting once \
    ROWS inserts reached its destination: BENCHMARKS.md, capture";

/// etl's `Pipeline` (the reader `FRESHEN_BENCH_ETL` names) from a fresh copy, named as the apply
/// slot of a pipeline of its own, until `rows` inserts reached its destination.
fn etl(s: &mut Setup, bin: &Path, rows: usize) -> anyhow::Result<Cost> {
    s.copies += 1;
    let pipeline = s.copies.to_string();
    let slot = format!("supabase_etl_apply_{pipeline}");
    copy_slot_as(s, &slot)?;
    let mut cmd = Command::new(bin);
    cmd.args([
        s.pg.host(),
        &s.pg.port().to_string(),
        "postgres",
        s.pg.user(),
    ])
    .args([&pipeline, "bench_pub", "public.bench", &rows.to_string()]);
    run_reader(s, &slot, cmd)
}

struct FreshenRun {
    cost: Cost,
    batches: usize,
    peak_queued: u64,
    rss_base: usize,
    rss_peak: usize,
    heap_base: usize,
    heap_peak: usize,
}

/// `PgSource` from a fresh copy until `rows` events were handed over and acknowledged,
/// with the defaults (`sslmode=prefer`: this server has no TLS, so a direct connection)
/// but for `read_gap` and whether large transactions stream (`stream_in_progress`).
fn freshen(
    s: &mut Setup,
    rows: usize,
    read_gap: Duration,
    stream_in_progress: bool,
) -> anyhow::Result<FreshenRun> {
    let slot = copy_slot(s)?;
    let cfg = PgSourceConfig {
        connection: ConnectionConfig::from_url(&s.pg.url())?,
        slot: slot.clone(),
        slot_mode: SlotMode::MustExist,
        publication: "bench_pub".into(),
        publication_mode: PublicationMode::MustExist,
        tables: vec!["bench".parse().map_err(anyhow::Error::msg)?],
        read_gap,
        stream_in_progress,
        ..PgSourceConfig::default()
    };
    // Sample memory while the stream runs.
    let done = Arc::new(AtomicBool::new(false));
    let rss_peak = Arc::new(AtomicUsize::new(0));
    let heap_peak = Arc::new(AtomicUsize::new(0));
    let rss_base = rss_bytes();
    let heap_base = alloc::live_bytes();
    let sampler = {
        let (done, rss_peak, heap_peak) = (done.clone(), rss_peak.clone(), heap_peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                rss_peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                heap_peak.fetch_max(alloc::live_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (server0, total0) = (server_cpu(&s.pg.data_dir()), tree_cpu());
    let (took, server, total, batches, peak_queued) = rt.block_on(async {
        let t0 = Instant::now();
        let mut src = PgSource::start(cfg).await?;
        let mut got = 0usize;
        let mut batches = 0usize;
        while got < rows {
            let b = tokio::time::timeout(Duration::from_secs(120), src.next_batch())
                .await
                .context("capture stalled")?
                .context("stream ended")??;
            got += b.events().len();
            batches += 1;
            b.into_parts().2.ack();
        }
        let took = t0.elapsed();
        let server = server_cpu(&s.pg.data_dir()).saturating_sub(server0);
        let total = tree_cpu().saturating_sub(total0);
        let peak = src.health().peak_queued_events;
        src.shutdown().await;
        anyhow::Ok((took, server, total, batches, peak))
    })?;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    drop_slot(s, &slot);
    Ok(FreshenRun {
        cost: Cost {
            took,
            server,
            total,
        },
        batches,
        peak_queued,
        rss_base,
        rss_peak: rss_peak.load(Ordering::Relaxed).max(rss_base),
        heap_base,
        heap_peak: heap_peak.load(Ordering::Relaxed).max(heap_base),
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn per_row(d: Duration, rows: usize) -> String {
    format!("{:.2} µs", d.as_secs_f64() * 1e6 / rows as f64)
}

/// The environment variable listing further `read_gap`s to run freshen with, in µs
/// (`FRESHEN_BENCH_READ_GAPS=500,1000`): a sweep, a row each.
const GAPS_ENV: &str = "FRESHEN_BENCH_READ_GAPS";

fn sweep_gaps() -> anyhow::Result<Vec<Duration>> {
    let Some(list) = std::env::var_os(GAPS_ENV) else {
        return Ok(Vec::new());
    };
    let list = list.to_string_lossy();
    list.split(',')
        .map(|us| {
            us.trim()
                .parse()
                .map(Duration::from_micros)
                .with_context(|| format!("{GAPS_ENV}={list}: {us:?} is not a number of µs"))
        })
        .collect()
}

/// Alternating runs of every reader over copies of `s`'s slot (etl's when `etl_bin` names
/// its binary); prints their table and returns freshen's runs.
fn compare(
    s: &mut Setup,
    rows: usize,
    runs: usize,
    shape: &str,
    etl_bin: Option<&Path>,
) -> anyhow::Result<Vec<FreshenRun>> {
    let mut theirs = Vec::new();
    let mut ours = Vec::new();
    let mut etls = Vec::new();
    // Reading each message as it arrives, then the sweep's gaps: a row each.
    let gaps: Vec<Duration> = std::iter::once(Duration::ZERO)
        .chain(sweep_gaps()?)
        .collect();
    let mut swept: Vec<Vec<Cost>> = vec![Vec::new(); gaps.len()];
    let mut protocol_1 = Vec::new();
    for _ in 0..runs {
        theirs.push(recvlogical(s)?);
        ours.push(freshen(s, rows, DEFAULT_READ_GAP, true)?);
        protocol_1.push(freshen(s, rows, DEFAULT_READ_GAP, false)?.cost);
        for (gap, costs) in gaps.iter().zip(&mut swept) {
            costs.push(freshen(s, rows, *gap, true)?.cost);
        }
        if let Some(bin) = etl_bin {
            etls.push(etl(s, bin, rows)?);
        }
    }
    // Each figure's median over the runs, per reader.
    let medians = |runs: &[Cost]| Cost {
        took: median(runs.iter().map(|c| c.took).collect()),
        server: median(runs.iter().map(|c| c.server).collect()),
        total: median(runs.iter().map(|c| c.total).collect()),
    };
    let base = medians(&theirs);
    let freshen: Vec<Cost> = ours.iter().map(|r| r.cost).collect();
    let mut t = Table::new(&[
        "reader",
        &format!("{rows} rows, {shape}"),
        "rows/s",
        "vs pg_recvlogical",
        "server CPU per row",
        "server + reader CPU per row",
    ]);
    let mut row = |reader: &str, c: Cost| {
        t.row(vec![
            reader.into(),
            dur(c.took),
            rate(rows as f64, c.took),
            format!("{:.2}×", base.took.as_secs_f64() / c.took.as_secs_f64()),
            per_row(c.server, rows),
            per_row(c.total, rows),
        ])
    };
    row("pg_recvlogical (to /dev/null)", base);
    row(
        "freshen PgSource, default: large transactions streamed (protocol 2; decoded, batched, acked)",
        medians(&freshen),
    );
    row(
        "freshen, stream_in_progress = false (protocol 1)",
        medians(&protocol_1),
    );
    for (gap, costs) in gaps.iter().zip(&swept) {
        let reader = if gap.is_zero() {
            "freshen, read_gap = 0 (reads each message)".to_string()
        } else {
            format!("freshen, read_gap = {gap:?}")
        };
        row(&reader, medians(costs));
    }
    if !etls.is_empty() {
        row(
            "supabase/etl Pipeline (decoded, batched, counted)",
            medians(&etls),
        );
    }
    t.print();
    println!(
        "\nthroughput ratio (goal ≥ 0.9×): median of {runs} alternating runs each; server CPU: \
         the whole server's user + system time during the run (the walsender decoding and \
         sending, and each reader's other connections; nothing else runs); server + reader: \
         every process of the run (the reader's own decoding, and on loopback the TCP \
         receive work that lands on whichever side wakes for it); freshen pauses \
         read_gap (default {gap:?}) before reading a busy stream again, the read_gap = 0 row \
         reads each message as it arrives; freshen asks PostgreSQL 14+ to stream a \
         transaction past logical_decoding_work_mem (64 MB here) while it runs and holds it \
         until its commit (4 MiB in memory, the rest in a temporary file), the protocol 1 \
         row as pg_recvlogical and etl do (the server spills it and decodes it again at \
         commit); pg_recvlogical and \
         etl are timed from process start to exit, freshen from start to its last batch\n",
        gap = DEFAULT_READ_GAP
    );
    Ok(ours)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rows, runs, oltp_rows) = if opts.quick {
        (20_000, 1, 20_000)
    } else {
        (1_000_000, 3, 200_000)
    };
    let etl_bin = rival::binary(ETL_ENV, "supabase/etl row", ETL_READER)?;
    let mut s = setup(rows)?;
    let ours = compare(&mut s, rows, runs, "1 transaction", etl_bin.as_deref())?;
    drop(s);
    // Steady OLTP: the same rows in two-row transactions (Begin, two Inserts, Commit).
    let mut oltp = setup_with(oltp_rows, oltp_rows / 2)?;
    compare(
        &mut oltp,
        oltp_rows,
        runs,
        &format!("{} transactions", oltp_rows / 2),
        etl_bin.as_deref(),
    )?;
    drop(oltp);

    // Memory: a transaction 10× larger must not need 10× the memory.
    let small_rows = rows / 10;
    let mut small = setup(small_rows)?;
    let small_run = freshen(&mut small, small_rows, DEFAULT_READ_GAP, true)?;
    let big_run = ours.into_iter().min_by_key(|r| r.cost.took).expect("runs");
    let mut m = Table::new(&[
        "transaction",
        "batches",
        "peak queued events",
        "RSS growth",
        "peak live heap growth",
    ]);
    for (n, r) in [(small_rows, &small_run), (rows, &big_run)] {
        m.row(vec![
            format!("{n} rows"),
            r.batches.to_string(),
            r.peak_queued.to_string(),
            mib(r.rss_peak.saturating_sub(r.rss_base)),
            mib(r.heap_peak.saturating_sub(r.heap_base)),
        ]);
    }
    m.print();
    println!(
        "\nmemory is flat when the 10× larger transaction grows RSS and heap about as much as the small one; \
         a streamed transaction (the 1M rows, past the server's 64 MB) is held up to \
         stream_memory_mb (4 MiB) in memory, the rest in a temporary file"
    );
    Ok(())
}
