//! Scheduler micro-benchmarks: `DirtySet` against the FIFO scan of the Go original: our
//! `scan.rs`, written to its design, and — when `FRESHEN_BENCH_GO_SCHED` names it — the
//! Go original's own `dirtySet` in a child process, alternated with freshen's runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use freshen::{DirtyConfig, DirtySet, Key};

use anyhow::Context;

use crate::report::{Table, dur, rate, ratio};
use crate::scan::ScanSet;
use crate::{Opts, alloc, rival};

const CO: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(5);
/// Above this many keys the quadratic scan would run for minutes to hours.
const SCAN_LIMIT: usize = 100_000;

fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::from(format!("device-{i:08}")))
        .collect()
}

fn config() -> DirtyConfig {
    DirtyConfig {
        coalesce: CO,
        max_wait: MAX_WAIT,
        ..DirtyConfig::default()
    }
}

/// How a drain completes a popped key.
#[derive(Clone, Copy)]
enum Completing {
    /// By the ticket `pop_ready` gave: straight to the key's slot.
    Ticket,
    /// By the key: hashed and looked up in the index a second time.
    Key,
}

fn complete(set: &mut DirtySet, r: &freshen::Ready, by: Completing, now: Instant) {
    match by {
        Completing::Ticket => set.complete_ticket(r.ticket, freshen::Outcome::Rebuilt, now),
        Completing::Key => set.complete(&r.key, freshen::Outcome::Rebuilt, now),
    };
}

/// How the keys are marked.
#[derive(Clone, Copy)]
enum Marking {
    /// `mark_many` over batches of [`MARK_BATCH`], as the run loop marks a batch of
    /// changes (or of fanned keys).
    Batched,
    /// `mark` on each key in turn.
    OneByOne,
}

/// Keys per `mark_many`: a batch of the PostgreSQL source at its default `batch_size`
/// (one key per change), and what one fan-out receive hands the run loop.
const MARK_BATCH: usize = 1024;

fn mark(set: &mut DirtySet, keys: &[Key], now: Instant, how: Marking) {
    match how {
        Marking::Batched => {
            for batch in keys.chunks(MARK_BATCH) {
                set.mark_many(batch, now);
            }
        }
        Marking::OneByOne => {
            for k in keys {
                set.mark(k, now);
            }
        }
    }
}

/// A timed drain of the set over the given keys.
type Drain = fn(&[Key], Completing, Marking) -> Duration;

/// Marks every key once, then pops and completes them all.
fn drain_heap(keys: &[Key], by: Completing, how: Marking) -> Duration {
    let t0 = Instant::now();
    let start = Instant::now();
    let mut set = DirtySet::new(config(), t0);
    mark(&mut set, keys, t0, how);
    let due = t0 + CO;
    while let Some(r) = set.pop_ready(due) {
        complete(&mut set, &r, by, due);
    }
    assert!(set.is_idle());
    start.elapsed()
}

fn drain_scan(keys: &[Key]) -> Duration {
    let t0 = Instant::now();
    let start = Instant::now();
    let mut set = ScanSet::new(CO, MAX_WAIT);
    for k in keys {
        set.mark(k, t0);
    }
    let due = t0 + CO;
    let mut n = 0;
    while let Some(k) = set.pop_ready(due) {
        black_box(k);
        n += 1;
    }
    assert_eq!(n, keys.len());
    start.elapsed()
}

/// Half the keys are queued first but not ready (re-marked), half behind them are ready:
/// drain the ready half. A FIFO scan walks the not-ready half on every pop.
fn staggered_heap(keys: &[Key], by: Completing, how: Marking) -> Duration {
    let (late, _) = keys.split_at(keys.len() / 2);
    let ready = keys.len() - late.len();
    let t0 = Instant::now();
    let mut set = DirtySet::new(config(), t0);
    let start = Instant::now();
    mark(&mut set, keys, t0, how);
    mark(&mut set, late, t0 + CO / 2, how);
    let mut n = 0;
    while let Some(r) = set.pop_ready(t0 + CO) {
        complete(&mut set, &r, by, t0 + CO);
        n += 1;
    }
    assert_eq!(n, ready);
    start.elapsed()
}

fn staggered_scan(keys: &[Key]) -> Duration {
    let (late, ready) = keys.split_at(keys.len() / 2);
    let t0 = Instant::now();
    let mut set = ScanSet::new(CO, MAX_WAIT);
    let start = Instant::now();
    for k in late.iter().chain(ready) {
        set.mark(k, t0);
    }
    for k in late {
        set.mark(k, t0 + CO / 2);
    }
    let mut n = 0;
    while let Some(k) = set.pop_ready(t0 + CO) {
        black_box(k);
        n += 1;
    }
    assert_eq!(n, ready.len());
    start.elapsed()
}

fn best_of(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().unwrap_or_default()
}

/// The environment variable naming the Go original's driver.
const GO_ENV: &str = "FRESHEN_BENCH_GO_SCHED";

/// What `FRESHEN_BENCH_GO_SCHED` must name.
const GO_DRIVER: &str = "a program built outside this repository around the Go original's \
    `dirtySet` (cdcfresh's coalesce.go) that runs `drain N` or `staggered N` as this \
    scenario does and prints `CASE N NANOSECONDS`: BENCHMARKS.md, scheduler";

/// One run of the Go original in a child process: the time it measured itself, keys
/// made before its clock starts, as ours are.
fn go_run(bin: &std::path::Path, case: &str, n: usize) -> anyhow::Result<Duration> {
    let out = std::process::Command::new(bin)
        .args([case, &n.to_string()])
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {case} {n}: {}: {}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields[..] {
        [c, k, ns] if c == case && k == n.to_string() => Ok(Duration::from_nanos(
            ns.parse()
                .with_context(|| format!("{GO_ENV} printed {text:?}"))?,
        )),
        _ => anyhow::bail!("{GO_ENV} printed {text:?}, not `{case} {n} NANOSECONDS`"),
    }
}

/// Best of `runs` for freshen and the Go original alike, their runs alternated.
fn best_of_pair(
    runs: usize,
    ours: impl Fn() -> Duration,
    go: Option<impl Fn() -> anyhow::Result<Duration>>,
) -> anyhow::Result<(Duration, Option<Duration>)> {
    let (mut a, mut b) = (Duration::MAX, None::<Duration>);
    for _ in 0..runs {
        a = a.min(ours());
        if let Some(go) = &go {
            let t = go()?;
            b = Some(b.map_or(t, |b| b.min(t)));
        }
    }
    Ok((a, b))
}

/// Heap bytes the set holds per dirty key, measured by the counting allocator (the keys
/// themselves are allocated beforehand and only reference-counted by the set).
fn bytes_per_key(keys: &[Key]) -> (f64, f64) {
    let t0 = Instant::now();
    let before = alloc::live_bytes();
    let mut set = DirtySet::new(config(), t0);
    for k in keys {
        set.mark(k, t0);
    }
    let measured = (alloc::live_bytes() - before) as f64 / keys.len() as f64;
    let reported = set.heap_bytes() as f64 / keys.len() as f64;
    drop(set);
    (measured, reported)
}

/// `FRESHEN_BENCH_SCHEDULER=drain` runs only the 1M mark + drain, freshen's side, for a
/// profiler (`perf record` / `perf stat` on the bench binary): nothing else in the
/// profile. `drain-one` marks one key at a time instead of in batches.
const ONLY_ENV: &str = "FRESHEN_BENCH_SCHEDULER";

/// The mark + drain alone, `runs` times (see [`ONLY_ENV`]).
fn drain_only(all: &[Key], runs: usize, how: Marking) {
    for _ in 0..runs {
        let t = drain_heap(all, Completing::Ticket, how);
        println!("mark + drain {}: {}", all.len(), dur(t));
    }
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let runs = if opts.quick { 1 } else { 3 };
    let big = if opts.quick { 20_000 } else { 1_000_000 };
    let all = keys(big);
    if let Ok(only) = std::env::var(ONLY_ENV) {
        let how = match only.as_str() {
            "drain" => Marking::Batched,
            "drain-one" => Marking::OneByOne,
            _ => anyhow::bail!("{ONLY_ENV}={only}: the cases it names are `drain`, `drain-one`"),
        };
        drain_only(&all, runs, how);
        return Ok(());
    }

    let go_bin = rival::binary(GO_ENV, "Go original column", GO_DRIVER)?;
    let go = go_bin.as_deref();
    let mut header = vec![
        "case",
        "keys",
        "DirtySet (heap)",
        "FIFO scan (Go design)",
        "scan / heap",
    ];
    if go.is_some() {
        header.extend(["Go original (dirtySet)", "Go / heap"]);
    }
    let mut t = Table::new(&header);
    let go_cells = |heap: Duration, g: Option<Duration>| match g {
        Some(g) => vec![dur(g), ratio(g, heap)],
        None if go.is_some() => vec!["skipped (quadratic: hours)".into(), "–".into()],
        None => vec![],
    };
    // When every key is ready the FIFO pops from its front in O(1): a plain drain is the
    // scan's best case, run at full size.
    let (heap, g) = best_of_pair(
        runs,
        || drain_heap(&all, Completing::Ticket, Marking::Batched),
        go.map(|bin| move || go_run(bin, "drain", big)),
    )?;
    let scan = best_of(runs, || drain_scan(&all));
    let mut row = vec![
        "mark + drain".into(),
        big.to_string(),
        format!("{} ({})", dur(heap), rate(big as f64, heap)),
        format!("{} ({})", dur(scan), rate(big as f64, scan)),
        ratio(scan, heap),
    ];
    row.extend(go_cells(heap, g));
    t.row(row);
    let sizes: &[usize] = if opts.quick {
        &[2_000, 4_000]
    } else {
        &[10_000, 20_000, 40_000, 1_000_000]
    };
    for &n in sizes {
        let ks = &all[..n.min(all.len())];
        let quadratic_ok = ks.len() <= SCAN_LIMIT / 2;
        let (heap, g) = best_of_pair(
            runs,
            || staggered_heap(ks, Completing::Ticket, Marking::Batched),
            go.filter(|_| quadratic_ok)
                .map(|bin| move || go_run(bin, "staggered", ks.len())),
        )?;
        let (scan, r) = if quadratic_ok {
            let s = best_of(1, || staggered_scan(ks));
            (dur(s), ratio(s, heap))
        } else {
            ("skipped (quadratic: hours)".into(), "–".into())
        };
        let mut row = vec![
            "staggered".to_string(),
            ks.len().to_string(),
            dur(heap),
            scan,
            r,
        ];
        row.extend(go_cells(heap, g));
        t.row(row);
    }
    t.print();

    // Completing by ticket against completing by key, and marking in batches against
    // marking one key at a time, alternated so that all see the same machine; best of
    // the runs for each.
    let mut c = Table::new(&[
        "case",
        "keys",
        "mark_many, complete by ticket",
        "complete by key",
        "key / ticket",
        "mark one by one",
        "one by one / mark_many",
    ]);
    let pairs = if opts.quick { 1 } else { 5 };
    let cases: [(&str, Drain); 2] = [("mark + drain", drain_heap), ("staggered", staggered_heap)];
    for (name, f) in cases {
        let (mut ticket, mut key, mut one) = (Duration::MAX, Duration::MAX, Duration::MAX);
        for _ in 0..pairs {
            ticket = ticket.min(f(&all, Completing::Ticket, Marking::Batched));
            key = key.min(f(&all, Completing::Key, Marking::Batched));
            one = one.min(f(&all, Completing::Ticket, Marking::OneByOne));
        }
        c.row(vec![
            name.into(),
            big.to_string(),
            dur(ticket),
            dur(key),
            ratio(key, ticket),
            dur(one),
            ratio(one, ticket),
        ]);
    }
    println!();
    c.print();

    let (measured, reported) = bytes_per_key(&all);
    let key_bytes = all[0].heap_size();
    println!(
        "\nbytes per dirty key at {big} keys: {measured:.1} measured by the allocator ({reported:.1} by DirtySet::heap_bytes), \
         plus the key itself ({key_bytes} bytes for \"{}\")",
        all[0]
    );
    if go.is_none() {
        println!(
            "anchor (Go original, measured elsewhere): drain 1M = 2.29 s; staggered 10k = 1.75 s, 20k = 6.5 s, 40k = 50.7 s"
        );
    }
    Ok(())
}
