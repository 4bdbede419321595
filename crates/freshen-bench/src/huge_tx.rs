//! Huge transaction: freshen's memory while one transaction of a million rows streams
//! through the whole pipeline (capture, scope, dirty set, acks, rebuilds).
//!
//! The measurement runs in a fresh process (this binary, re-executed) so that nothing
//! the other scenarios left on the heap hides or inflates the figures. freshen starts,
//! settles, and its idle RSS is read; then one `INSERT … SELECT generate_series` of N rows
//! over 1000 devices commits, and the run waits until every event was received and every
//! key rebuilt. Peak RSS is the kernel's high-water mark (`VmHWM`, reset through
//! `/proc/self/clear_refs` before each transaction); the peak live heap comes from the
//! counting allocator, sampled every 2 ms. A transaction ten times smaller runs first:
//! flat means the big one costs about what the small one does, and neither comes near the
//! size of the transaction itself (shown as the WAL it wrote).
//!
//! The reference is that size: a consumer that buffers a transaction until its commit
//! (as a naive one does) needs memory in proportion to it.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::report::{Table, dur};
use crate::workload::{
    DEVICES, Freshen, READINGS, REBUILD, config, connect, diff, runtime, server,
};
use crate::{Opts, alloc};

/// Set in the re-executed child that does the measurement.
const CHILD: &str = "FRESHEN_BENCH_HUGE_TX_CHILD";

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

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

struct Sample {
    rows: u64,
    wal: u64,
    idle_rss: u64,
    peak_rss: u64,
    idle_heap: u64,
    peak_heap: u64,
    peak_dirty: u64,
    peak_unacked: u64,
    took: Duration,
    diff: i64,
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    if std::env::var_os(CHILD).is_some() {
        return measure(opts);
    }
    // /proc/self/exe, not the path: a rebuild of the binary during a long run replaces
    // the file, while the running image stays executable through this link.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("huge-tx").env(CHILD, "1");
    if opts.quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().context("re-executing the benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "the huge-tx measurement failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The child prints the run header and its scenario heading too: keep only its body.
    let body = text
        .split_once("\n## huge-tx")
        .and_then(|(_, rest)| rest.split_once('\n'))
        .map_or(text.as_ref(), |(_, body)| body);
    print!("{}", body.trim_start_matches('\n'));
    Ok(())
}

fn measure(opts: &Opts) -> anyhow::Result<()> {
    let big: u64 = if opts.quick { 100_000 } else { 1_000_000 };
    let pg = server(&[])?;
    pg.psql(READINGS)?;
    pg.psql(
        "CREATE INDEX ON readings (device);
         CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);",
    )?;
    let url = pg.url();
    let rt = runtime()?;
    let samples = rt.block_on(async {
        let admin = connect(&url).await?;
        let f = Arc::new(Freshen::start(&config(&url, &REBUILD, None, "100ms", "5s", false)).await?);
        // Let start-up allocations settle before reading the idle figures.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut out = Vec::new();
        let mut total = 0;
        for rows in [big / 10, big] {
            let idle_rss = status_kib("VmRSS:") * 1024;
            let idle_heap = alloc::live_bytes() as u64;
            std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM")?;
            let done = Arc::new(AtomicBool::new(false));
            let (heap, dirty, unacked) = (
                Arc::new(AtomicU64::new(0)),
                Arc::new(AtomicU64::new(0)),
                Arc::new(AtomicU64::new(0)),
            );
            let sampler = {
                let (done, heap, dirty, unacked, f) = (
                    done.clone(),
                    heap.clone(),
                    dirty.clone(),
                    unacked.clone(),
                    f.clone(),
                );
                tokio::spawn(async move {
                    while !done.load(Relaxed) {
                        heap.fetch_max(alloc::live_bytes() as u64, Relaxed);
                        let s = f.stats();
                        dirty.fetch_max(s.dirty + s.in_flight, Relaxed);
                        unacked.fetch_max(s.unacked_batches, Relaxed);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            };
            let lsn = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint";
            let before: i64 = admin.query_one(lsn, &[]).await?.get(0);
            let t0 = Instant::now();
            admin
                .execute(
                    &format!(
                        "INSERT INTO readings (device, value) SELECT 1 + g % {DEVICES}, g FROM generate_series(1, {rows}) g"
                    ),
                    &[],
                )
                .await?;
            let after: i64 = admin.query_one(lsn, &[]).await?.get(0);
            total += rows;
            f.drain(total).await?;
            let took = t0.elapsed();
            done.store(true, Relaxed);
            sampler.await?;
            out.push(Sample {
                rows,
                wal: (after - before).max(0) as u64,
                idle_rss,
                peak_rss: status_kib("VmHWM:") * 1024,
                idle_heap,
                peak_heap: heap.load(Relaxed).max(idle_heap),
                peak_dirty: dirty.load(Relaxed),
                peak_unacked: unacked.load(Relaxed),
                took,
                diff: diff(&admin).await?,
            });
        }
        match Arc::try_unwrap(f) {
            Ok(f) => f.stop().await?,
            Err(_) => anyhow::bail!("the sampler still holds the pipeline"),
        }
        anyhow::Ok(out)
    })?;
    drop(rt);
    let mut t = Table::new(&[
        "one transaction of",
        "its WAL",
        "idle RSS",
        "peak RSS",
        "RSS growth",
        "peak heap growth",
        "peak dirty keys",
        "peak unacked batches",
        "INSERT start → all rebuilt",
        "equals truth",
    ]);
    for s in &samples {
        t.row(vec![
            format!("{} rows", s.rows),
            mib(s.wal),
            mib(s.idle_rss),
            mib(s.peak_rss),
            mib(s.peak_rss.saturating_sub(s.idle_rss)),
            mib(s.peak_heap.saturating_sub(s.idle_heap)),
            s.peak_dirty.to_string(),
            s.peak_unacked.to_string(),
            dur(s.took),
            if s.diff == 0 { "yes" } else { "NO" }.into(),
        ]);
    }
    t.print();
    println!(
        "\nfreshen in a fresh process (the whole pipeline: PgSource, scope, dirty set, after-rebuild acks, \
         SQL rebuilds; defaults), {DEVICES} devices. Goal: flat — the {big}-row transaction grows memory \
         about as much as the {}-row one, far below its WAL.",
        big / 10
    );
    Ok(())
}
