//! MySQL-family capture: `MySqlSource` against `mariadb-binlog --read-from-remote-server
//! -v` reading the same 1M-row transaction from the same MariaDB in the same run, memory
//! while it streams, and the row decoder alone.
//!
//! One transaction inserts the rows; both readers start at the binlog position before it
//! and stop after it. `mariadb-binlog -v` decodes every row into its `### INSERT`
//! pseudo-SQL and writes it to /dev/null; freshen decodes every row into a `RowEvent`,
//! hands it over in batches and acknowledges them. Runs alternate; the median counts.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Op, RowEvent, Source};
use freshen_mysql::binlog::{Charsets, RowsKind, TableMap, decode_rows};
use freshen_mysql::{MySqlSource, MySqlSourceConfig, ResumeBy};
use freshen_testenv::MariaDbServer;

use crate::report::{Table, dur, rate};
use crate::{Opts, alloc};

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

/// A server holding one transaction of `rows` rows between `start` and `stop`.
struct Setup {
    db: MariaDbServer,
    file: String,
    start: u64,
    stop: u64,
    runs: usize,
}

fn position(db: &MariaDbServer) -> anyhow::Result<(String, u64)> {
    let out = db.sql("SHOW MASTER STATUS")?;
    let mut f = out.split('\t');
    let file = f.next().context("no binlog file")?.to_string();
    let pos = f.next().context("no binlog position")?.parse()?;
    Ok((file, pos))
}

fn setup(rows: usize) -> anyhow::Result<Setup> {
    let db = MariaDbServer::start().context("MariaDB for the capture benchmark")?;
    db.sql(
        "CREATE DATABASE app;
         CREATE TABLE app.bench (id INT PRIMARY KEY, dev VARCHAR(20) NOT NULL, v INT NOT NULL);
         CREATE TABLE app.freshen_positions (name VARCHAR(64) PRIMARY KEY, file VARCHAR(512) NOT NULL, \
           pos BIGINT UNSIGNED NOT NULL, gtid TEXT NULL, updated_at TIMESTAMP(6) NOT NULL \
           DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6));",
    )?;
    let (file, start) = position(&db)?;
    // MariaDB's sequence engine: one INSERT … SELECT, one transaction.
    db.sql(&format!(
        "INSERT INTO app.bench SELECT seq, CONCAT('dev-', seq % 1000), seq FROM app.seq_1_to_{rows}"
    ))?;
    let (file2, stop) = position(&db)?;
    anyhow::ensure!(file == file2, "the transaction crossed a binlog file");
    Ok(Setup {
        db,
        file,
        start,
        stop,
        runs: 0,
    })
}

/// `mariadb-binlog -v` from the server, start to stop, to /dev/null.
fn mariadb_binlog(s: &Setup) -> anyhow::Result<Duration> {
    let tool =
        s.db.binlog_tool()
            .context("mariadb-binlog (package mariadb-client)")?;
    let t0 = Instant::now();
    let out = Command::new(tool)
        .args(["--no-defaults", "--read-from-remote-server", "-v"])
        .args([
            "--host=127.0.0.1",
            &format!("--port={}", s.db.port()),
            "--user=root",
        ])
        .arg(format!("--start-position={}", s.start))
        .arg(format!("--stop-position={}", s.stop))
        .arg(&s.file)
        .stdout(std::process::Stdio::null())
        .output()
        .context("running mariadb-binlog")?;
    let took = t0.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "mariadb-binlog failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

struct FreshenRun {
    took: Duration,
    batches: usize,
    peak_queued: u64,
    rss_base: usize,
    rss_peak: usize,
    heap_base: usize,
    heap_peak: usize,
}

/// `MySqlSource` from `start` until `rows` events were handed over and acknowledged.
fn freshen(s: &mut Setup, rows: usize) -> anyhow::Result<FreshenRun> {
    s.runs += 1;
    let mut cfg = MySqlSourceConfig::new(s.db.url("app"), format!("bench{}", s.runs));
    cfg.tables = vec!["app.bench".into()];
    cfg.start = format!("{}:{}", s.file, s.start);
    cfg.resume_by = ResumeBy::File;
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
    let (took, batches, peak_queued) = rt.block_on(async {
        let t0 = Instant::now();
        let mut src = MySqlSource::start(cfg).await?;
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
        let peak = src.health().peak_queued_events;
        src.shutdown().await;
        anyhow::Ok((took, batches, peak))
    })?;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    Ok(FreshenRun {
        took,
        batches,
        peak_queued,
        rss_base,
        rss_peak: rss_peak.load(Ordering::Relaxed).max(rss_base),
        heap_base,
        heap_peak: heap_peak.load(Ordering::Relaxed).max(heap_base),
    })
}

/// The row decoder alone: a rows event of `per_event` rows shaped like the benchmark's
/// table (INT, VARCHAR(20), INT, names in the table map), decoded over and over.
fn decoder_only(total: usize) -> anyhow::Result<Duration> {
    let mut tm = Vec::new();
    tm.extend_from_slice(&1u64.to_le_bytes()[..6]);
    tm.extend_from_slice(&[1, 0, 3]);
    tm.extend_from_slice(b"app\0");
    tm.push(5);
    tm.extend_from_slice(b"bench\0");
    tm.extend_from_slice(&[3, 3, 15, 3, 2, 20, 0, 0]);
    let names: &[&[u8]] = &[b"id", b"dev", b"v"];
    let mut meta = Vec::new();
    for n in names {
        meta.push(n.len() as u8);
        meta.extend_from_slice(n);
    }
    tm.push(4);
    tm.push(meta.len() as u8);
    tm.extend_from_slice(&meta);
    tm.extend_from_slice(&[1, 1, 0]); // SIGNEDNESS: all signed
    let map = TableMap::decode(&tm, &Charsets::builtin()).map_err(anyhow::Error::msg)?;
    let per_event = 256;
    let mut ev = Vec::new();
    ev.extend_from_slice(&1u64.to_le_bytes()[..6]);
    ev.extend_from_slice(&[0, 0, 2, 0, 3, 0b111]);
    for i in 0..per_event as i32 {
        ev.push(0);
        ev.extend_from_slice(&i.to_le_bytes());
        let dev = format!("dev-{}", i % 1000);
        ev.push(dev.len() as u8);
        ev.extend_from_slice(dev.as_bytes());
        ev.extend_from_slice(&i.to_le_bytes());
    }
    let template = RowEvent::new("app", "bench", Op::Insert);
    let mut out = Vec::with_capacity(per_event);
    let t0 = Instant::now();
    let mut n = 0;
    while n < total {
        out.clear();
        n += decode_rows(RowsKind::Write, true, &ev, &map, &template, &mut out)
            .map_err(anyhow::Error::msg)?;
    }
    Ok(t0.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rows, runs) = if opts.quick {
        (20_000, 1)
    } else {
        (1_000_000, 3)
    };
    let mut s = setup(rows)?;
    let mut theirs = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..runs {
        theirs.push(mariadb_binlog(&s)?);
        ours.push(freshen(&mut s, rows)?);
    }
    let t_theirs = median(theirs);
    let t_ours = median(ours.iter().map(|r| r.took).collect());
    let t_decode = decoder_only(rows)?;
    let mut t = Table::new(&[
        "reader",
        &format!("{rows} rows, 1 transaction"),
        "rows/s",
        "vs mariadb-binlog -v",
    ]);
    t.row(vec![
        "mariadb-binlog --read-from-remote-server -v (to /dev/null)".into(),
        dur(t_theirs),
        rate(rows as f64, t_theirs),
        "1.00×".into(),
    ]);
    t.row(vec![
        "freshen MySqlSource (decoded, batched, acked)".into(),
        dur(t_ours),
        rate(rows as f64, t_ours),
        format!("{:.2}×", t_theirs.as_secs_f64() / t_ours.as_secs_f64()),
    ]);
    t.row(vec![
        "freshen row decoder alone (in memory, 256-row events)".into(),
        dur(t_decode),
        rate(rows as f64, t_decode),
        format!("{:.2}×", t_theirs.as_secs_f64() / t_decode.as_secs_f64()),
    ]);
    t.print();
    println!("\nthroughput ratio (goal ≥ 1×): median of {runs} alternating runs each\n");

    let small_rows = rows / 10;
    let mut small = setup(small_rows)?;
    let small_run = freshen(&mut small, small_rows)?;
    let big_run = ours.into_iter().min_by_key(|r| r.took).expect("runs");
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
        "\nmemory is flat when the 10× larger transaction grows RSS and heap about as much as the small one"
    );
    Ok(())
}
