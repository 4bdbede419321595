//! Amplification: rebuilds per change event on a hot-key workload, for several coalesce
//! windows.
//!
//! pgbench inserts readings at a steady Poisson-paced rate, one row per transaction, with
//! the device drawn from a Zipf distribution over 1000 devices (`random_zipfian`, s = 1.1:
//! the hottest device takes about 18 % of the writes, the top 25 about 60 %). freshen keeps
//! `device_totals` with `coalesce` = 0, 10 ms, 100 ms, 1 s (max_wait 5 s, the default),
//! each on a fresh server; after the writers stop it drains (every event received, every
//! key rebuilt) and the table is checked against truth. Rebuilds per event =
//! `rebuilds_ok / events_received` from freshen's own counters.
//!
//! The rival is what a row trigger (or any per-event recomputation) does: one rebuild per
//! event, 1.00 by construction. The cost of the saving is staleness, so the freshness
//! p99 stands next to each ratio — measured per reading from the database as the
//! `freshness` scenario does (commit of the first rebuild whose snapshot saw the reading −
//! the reading's commit), not read off freshen's histogram, whose percentiles are bucket
//! edges.
//!
//! "coalesce alone" is what the debounce itself allows on this very run, from the
//! readings' commit times (`track_commit_timestamp`): the number of bursts — changes of a
//! key followed by at least `coalesce` of quiet on that key — per change, as if rebuilds
//! were instant. It ignores `max_wait` (which only adds rebuilds) and the extra
//! coalescing that waiting for a free worker brings, so freshen can beat it under load.

use std::time::Duration;

use crate::Opts;
use crate::freshness::{FRESHEN, REBUILD, SCHEMA, UNSEEN_FRESHEN, latencies, measure, settle};
use crate::report::Table;
use crate::workload::{
    Bench, DEVICES, Freshen, Load, Script, config, connect, diff, ms, runtime, server,
};

const ZIPF_S: f64 = 1.1;

/// Bursts per change on `readings` for a quiet period of `$1` milliseconds.
const BURSTS: &str =
    "SELECT (count(*) FILTER (WHERE next IS NULL OR next - t >= $1 * interval '1 ms'))::float8
        / greatest(count(*), 1)
    FROM (SELECT t, lead(t) OVER (PARTITION BY device ORDER BY t) AS next
          FROM (SELECT device, pg_xact_commit_timestamp(xmin) AS t FROM readings) r) s";

struct Run {
    events: u64,
    bursts: f64,
    rebuilds: u64,
    calls: u64,
    p50: Option<Duration>,
    p99: Option<Duration>,
    diff: i64,
    tps: f64,
}

fn run_one(coalesce: &str, coalesce_ms: f64, load: &Load) -> anyhow::Result<Run> {
    let pg = server(&[("track_commit_timestamp", "on")])?;
    pg.psql(SCHEMA)?;
    pg.psql(FRESHEN)?;
    let bench = Bench::of(&pg);
    let url = pg.url();
    let script = Script {
        name: "zipf",
        weight: 1,
        body: format!(
            "\\set dev random_zipfian(1, {DEVICES}, {ZIPF_S})\n\\set v random(0, 999)\n\
             INSERT INTO readings (device, value) VALUES (:dev, :v);\n"
        ),
    };
    let rt = runtime()?;
    let out = rt.block_on(async {
        let admin = connect(&url).await?;
        let f = Freshen::start(&config(&url, &REBUILD, None, coalesce, "5s", false)).await?;
        let (b, l) = (bench.clone(), load.clone());
        let result = tokio::task::spawn_blocking(move || b.run(&[script], &l)).await??;
        f.drain(result.transactions).await?;
        settle(&admin, UNSEEN_FRESHEN).await?;
        let s = f.stats();
        f.stop().await?;
        let lat = measure(&admin, &latencies(false)).await?;
        anyhow::Ok(Run {
            events: s.events_received,
            rebuilds: s.rebuilds_ok,
            calls: s.rebuild_calls,
            p50: lat.p50,
            p99: lat.p99,
            diff: diff(&admin).await?,
            bursts: admin.query_one(BURSTS, &[&coalesce_ms]).await?.get(0),
            tps: result.tps,
        })
    })?;
    drop(rt);
    Ok(out)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rate, secs) = if opts.quick { (500, 2) } else { (2000, 15) };
    let load = Load {
        clients: 4,
        duration: Duration::from_secs(secs),
        rate: Some(rate),
        vars: Vec::new(),
    };
    let mut t = Table::new(&[
        "kept by",
        "events",
        "rebuilds",
        "rebuilds per event",
        "coalesce alone (instant rebuilds)",
        "freshness p50 / p99 (commit → rebuilt)",
        "equals truth",
    ]);
    t.row(vec![
        "row trigger / per-event recompute".into(),
        "n".into(),
        "n".into(),
        "1.000 (by construction)".into(),
        "–".into(),
        "0 (in the writing transaction)".into(),
        "yes".into(),
    ]);
    let mut achieved = Vec::new();
    for (label, coalesce, coalesce_ms) in [
        ("0", "0s", 0.0),
        ("10 ms", "10ms", 10.0),
        ("100 ms", "100ms", 100.0),
        ("1 s", "1s", 1000.0),
    ] {
        let r = run_one(coalesce, coalesce_ms, &load)?;
        eprintln!(
            "  amplification coalesce {label}: {} events, {} rebuilds",
            r.events, r.rebuilds
        );
        achieved.push(r.tps);
        t.row(vec![
            format!("freshen, coalesce {label}"),
            r.events.to_string(),
            format!("{} ({} calls)", r.rebuilds, r.calls),
            format!("{:.3}", r.rebuilds as f64 / r.events.max(1) as f64),
            format!("{:.3}", r.bursts),
            format!("{} / {}", ms(r.p50), ms(r.p99)),
            if r.diff == 0 {
                "yes".into()
            } else {
                format!("NO ({} rows differ)", r.diff)
            },
        ]);
    }
    t.print();
    println!(
        "\n{rate} inserts/s target (achieved {}), {secs} s per run, 4 pgbench clients, device ~ Zipf(s = {ZIPF_S}) \
         over {DEVICES} devices, max_wait 5 s, a fresh server per run. Goal: ≤ 0.05 rebuilds per event at 100 ms.",
        achieved
            .iter()
            .map(|a| format!("{a:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    Ok(())
}
