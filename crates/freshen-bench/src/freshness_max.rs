//! Freshness at rising rates: the highest write rate this machine sustains with freshen's
//! freshness p99 within 10 % of the debounce floor, beside the rates at which row
//! triggers and pg_ivm fall over.
//!
//! The workload and the measurement are the `freshness` scenario's (one reading inserted
//! per transaction, pgbench Poisson-paced with 8 clients over 1000 uniform devices;
//! latency from `track_commit_timestamp` and the snapshot each rebuild logs; the floor
//! from the same run's commits through the debounce alone), run at a ladder of target
//! rates. The keepers: freshen's query mode with the defaults (coalesce 100 ms, max_wait
//! 5 s: the `freshness` goal's keeper) and with `max_wait = "200ms"` (a floor that stays
//! at 200 ms however often a key changes, where the defaults' floor climbs towards 5 s as
//! keys are rarely quiet for 100 ms), row triggers (upsert deltas) and pg_ivm 1.15 (when
//! installed for the server binaries). Triggers and pg_ivm keep the derived table inside
//! the writing transaction, so their freshness is zero: what gives way is the writers.
//!
//! A keeper **holds** a rate when, on the medians over the rounds ([`verdict`]):
//!
//! - the writers reach it: pgbench's achieved tx/s ≥ [`REACHED`] of the target;
//! - the writers do not queue: their p99 latency, from each transaction's *scheduled*
//!   start (pgbench's schedule lag included) to its commit, ≤ [`WRITER_P99`] — a writer
//!   waiting longer than freshen's whole coalesce period has fallen behind the rate;
//! - freshen: freshness p99 ≤ [`SLACK`] × the same runs' floor p99;
//! - the derived table equals a fresh `GROUP BY` once the writes stop, and (freshen) every
//!   reading was reflected.
//!
//! Otherwise it **falls over** at that rate and is not run at higher ones; the sweep ends
//! when every keeper has fallen over or the ladder ends. Rounds alternate the keepers
//! within a rate, a fresh server per run.
//!
//! Where the cores went, per run, during the load: the run's own processes (server,
//! pgbench, this process: `tree_cpu` over the wall time), of which the walsender,
//! freshen's backends and freshen's own process (`cpu_split`), and the whole machine's
//! busy cores (other work sharing it included) — to tell whether a miss is the two cores
//! saturated, and by whom.

use std::time::{Duration, Instant};

use freshen_testenv::PgServer;

use crate::Opts;
use crate::cpu_split::Sample;
use crate::freshness::{
    Latency, QUERY, QUERY_TABLE, SCHEMA, UNSEEN_FRESHEN, latencies, measure, measure_floor, script,
    settle,
};
use crate::report::Table;
use crate::workload::{
    Bench, DEVICES, Freshen, Load, LoadResult, connect, converge, load_average, machine_cpu,
    median, ms, process_cpu, query_config_of, runtime, server, tree_cpu,
};
use crate::write_tax::{PG_IVM, TRIGGERS, pg_ivm_installed};

/// The target rates of a full run, tx/s.
const RATES: [u32; 10] = [
    1000, 2500, 5000, 10_000, 15_000, 20_000, 25_000, 30_000, 40_000, 50_000,
];

/// The share of the target rate the writers must reach.
const REACHED: f64 = 0.95;

/// The writers' p99 latency (scheduled start to commit) beyond which they are queueing.
const WRITER_P99: Duration = Duration::from_millis(100);

/// How far over the debounce floor freshen's freshness p99 may be.
const SLACK: f64 = 1.10;

/// Who keeps `device_totals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keeper {
    Query,
    QueryMaxWait,
    Triggers,
    PgIvm,
}

impl Keeper {
    const ALL: [Keeper; 4] = [
        Keeper::Query,
        Keeper::QueryMaxWait,
        Keeper::Triggers,
        Keeper::PgIvm,
    ];

    fn label(self) -> &'static str {
        match self {
            Keeper::Query => "freshen, query mode (coalesce 100 ms, max_wait 5 s)",
            Keeper::QueryMaxWait => "freshen, query mode, max_wait = 200ms",
            Keeper::Triggers => "row triggers (upsert deltas, in the writing transaction)",
            Keeper::PgIvm => "pg_ivm 1.15 IMMV (in the writing transaction)",
        }
    }

    /// freshen's `max_wait`; `None` for the keepers inside the writing transaction.
    fn max_wait(self) -> Option<Duration> {
        match self {
            Keeper::Query => Some(Duration::from_secs(5)),
            Keeper::QueryMaxWait => Some(Duration::from_millis(200)),
            Keeper::Triggers | Keeper::PgIvm => None,
        }
    }
}

/// freshen's figures of one run.
struct Fresh {
    lat: Latency,
    floor: Latency,
    /// freshen's own histogram's p99 (from receipt, capture left out).
    own: Option<Duration>,
    /// Keys per rebuild call: how full the batches were.
    keys_per_call: f64,
}

/// Cores busy during the load (CPU time over wall time).
#[derive(Debug, Clone, Copy, Default)]
struct Cores {
    /// Every process of the run: server, pgbench, this process.
    run: f64,
    walsender: f64,
    rebuilds: f64,
    /// freshen's own process (this one).
    reader: f64,
    /// The whole machine, other work included.
    machine: f64,
}

struct Run {
    load: LoadResult,
    fresh: Option<Fresh>,
    /// The derived table equalled truth once the writes stopped.
    truth: bool,
    cores: Cores,
    /// CPU of every process of the run per committed transaction, from the start of the
    /// load until the derived table had caught up (freshen's catch-up included, the
    /// checks' own backend not): barely moved by other work sharing the machine.
    cpu_per_tx: Duration,
}

fn run_one(keeper: Keeper, load: &Load) -> anyhow::Result<Run> {
    let mut settings = vec![("track_commit_timestamp", "on")];
    if keeper == Keeper::PgIvm {
        settings.push(("shared_preload_libraries", "pg_ivm"));
    }
    let pg = server(&settings)?;
    pg.psql(SCHEMA)?;
    pg.psql(match keeper {
        Keeper::Query | Keeper::QueryMaxWait => QUERY_TABLE,
        Keeper::Triggers => TRIGGERS,
        Keeper::PgIvm => PG_IVM,
    })?;
    let bench = Bench::of(&pg);
    let url = pg.url();
    let rt = runtime()?;
    let out = rt.block_on(async {
        let admin = connect(&url).await?;
        let freshen = match keeper.max_wait() {
            Some(mw) => {
                let mw = format!("{}ms", mw.as_millis());
                let toml = query_config_of(&url, QUERY, None, "100ms", &mw, false);
                Some(Freshen::start(&toml).await?)
            }
            None => None,
        };
        let reader = freshen.is_some().then(std::process::id);
        // The catch-up checks run in the admin connection's backend: measurement, not
        // the keeper's cost, so its CPU is taken out.
        let checker: i32 = admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let checker = checker as u32;
        let check0 = process_cpu(checker);
        let roles0 = Sample::take(&admin, reader).await?;
        let (tree0, machine0, t0) = (tree_cpu(), machine_cpu(), Instant::now());
        let (b, l) = (bench.clone(), load.clone());
        let result = tokio::task::spawn_blocking(move || b.run_logged(&[script()], &l)).await??;
        let wall = t0.elapsed().as_secs_f64().max(1e-9);
        let (tree, machine) = (
            tree_cpu().saturating_sub(tree0),
            machine_cpu().saturating_sub(machine0),
        );
        let split = Sample::take(&admin, reader).await?.since(&roles0);
        let cores = Cores {
            run: tree.as_secs_f64() / wall,
            walsender: split.walsender.as_secs_f64() / wall,
            rebuilds: split.rebuilds.as_secs_f64() / wall,
            reader: split.reader.as_secs_f64() / wall,
            machine: machine.as_secs_f64() / wall,
        };
        let fresh = match (freshen, keeper.max_wait()) {
            (Some(f), Some(mw)) => {
                settle(&admin, UNSEEN_FRESHEN).await?;
                f.drain(result.transactions).await?;
                let s = f.stats();
                f.stop().await?;
                Some(Fresh {
                    lat: measure(&admin, &latencies(false)).await?,
                    floor: measure_floor(&admin, mw).await?,
                    own: s.freshness.p99(),
                    keys_per_call: s.rebuilds_ok as f64 / s.rebuild_calls.max(1) as f64,
                })
            }
            _ => None,
        };
        let cpu = tree_cpu()
            .saturating_sub(tree0)
            .saturating_sub(process_cpu(checker).saturating_sub(check0));
        let cpu_per_tx = cpu / u32::try_from(result.transactions.max(1)).unwrap_or(u32::MAX);
        let truth = converge(&admin, Instant::now(), Duration::from_secs(30))
            .await?
            .is_some();
        anyhow::Ok(Run {
            load: result,
            fresh,
            truth,
            cores,
            cpu_per_tx,
        })
    })?;
    drop(rt);
    Ok(out)
}

/// What the verdict reads of a keeper's runs at one rate (medians over the rounds).
#[derive(Debug, Clone, Copy)]
struct Figures {
    target: f64,
    achieved: f64,
    writer_p99: Duration,
    /// freshen: freshness p99 and the floor p99.
    freshness: Option<(Duration, Duration)>,
    /// Every run's derived table equalled truth and reflected every reading.
    truth: bool,
}

/// Why a keeper falls over at a rate: empty when it holds.
fn verdict(f: &Figures) -> Vec<String> {
    let mut why = Vec::new();
    if f.achieved < REACHED * f.target {
        why.push(format!(
            "writers reached {:.0} % of the rate",
            f.achieved / f.target.max(1e-9) * 1e2
        ));
    }
    if f.writer_p99 > WRITER_P99 {
        why.push(format!(
            "writer p99 {} > {}",
            ms(Some(f.writer_p99)),
            ms(Some(WRITER_P99))
        ));
    }
    if let Some((p99, floor)) = f.freshness
        && p99.as_secs_f64() > SLACK * floor.as_secs_f64()
    {
        why.push(format!(
            "freshness p99 {} > {:.2} × floor {}",
            ms(Some(p99)),
            SLACK,
            ms(Some(floor))
        ));
    }
    if !f.truth {
        why.push("derived ≠ truth".into());
    }
    why
}

fn median_dur(v: impl Iterator<Item = Option<Duration>>) -> Option<Duration> {
    let v: Vec<f64> = v.flatten().map(|d| d.as_secs_f64()).collect();
    (!v.is_empty()).then(|| Duration::from_secs_f64(median(v)))
}

fn figures(rate: u32, runs: &[Run]) -> Figures {
    let writer = |i: fn(&(Duration, Duration)) -> Duration| {
        median_dur(runs.iter().map(|r| r.load.latency.as_ref().map(i)))
    };
    let fresh = runs.iter().all(|r| r.fresh.is_some()) && !runs.is_empty();
    let p99 = median_dur(runs.iter().map(|r| r.fresh.as_ref()?.lat.p99));
    let floor = median_dur(runs.iter().map(|r| r.fresh.as_ref()?.floor.p99));
    Figures {
        target: f64::from(rate),
        achieved: median(runs.iter().map(|r| r.load.tps).collect()),
        // No latency log counts as queueing without end: it cannot hold.
        writer_p99: writer(|l| l.1).unwrap_or(Duration::MAX),
        freshness: if fresh {
            Some((
                p99.unwrap_or(Duration::MAX),
                floor.unwrap_or(Duration::ZERO),
            ))
        } else {
            None
        },
        truth: runs
            .iter()
            .all(|r| r.truth && r.fresh.as_ref().is_none_or(|f| f.lat.never == 0)),
    }
}

/// What a keeper did over the whole ladder.
struct Outcome {
    keeper: Keeper,
    held: Option<u32>,
    fell: Option<(u32, String)>,
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rates, secs, rounds): (&[u32], u64, usize) = if opts.quick {
        (&[500, 1000], 2, 1)
    } else {
        (&RATES, 10, 2)
    };
    let mut keepers = Keeper::ALL.to_vec();
    if !pg_ivm_installed(&PgServer::find_bin_dir()?) {
        keepers.retain(|k| *k != Keeper::PgIvm);
        println!(
            "pg_ivm not run: it is not installed for these server binaries (not packaged for \
             Debian 12: build and install it from its public source against \
             postgresql-server-dev-15, BENCHMARKS.md says how)\n"
        );
    }
    let mut outcomes: Vec<Outcome> = keepers
        .iter()
        .map(|k| Outcome {
            keeper: *k,
            held: None,
            fell: None,
        })
        .collect();
    let (load_start, t_start) = (load_average(), Instant::now());
    let mut t = Table::new(&[
        "target rate",
        "kept by",
        "achieved (median)",
        "writer p50 / p99 (scheduled → commit)",
        "freshness p99 (min–max)",
        "floor p99",
        "p99 / floor",
        "freshen's histogram p99",
        "keys per rebuild call",
        "equals truth",
        "CPU per tx (median)",
        "CPU bound: the cores / CPU per tx",
        "cores: run (walsender / freshen's backends / freshen) · machine",
        "load avg at start",
        "verdict",
    ]);
    for &rate in rates {
        let standing: Vec<Keeper> = outcomes
            .iter()
            .filter(|o| o.fell.is_none())
            .map(|o| o.keeper)
            .collect();
        if standing.is_empty() {
            break;
        }
        let load = Load {
            clients: 8,
            duration: Duration::from_secs(secs),
            rate: Some(rate),
            vars: Vec::new(),
        };
        let load_avg = load_average();
        let mut runs: Vec<(Keeper, Vec<Run>)> = standing.iter().map(|k| (*k, Vec::new())).collect();
        for round in 0..rounds {
            for (keeper, done) in &mut runs {
                let r = run_one(*keeper, &load)?;
                eprintln!(
                    "  freshness-max {rate} tx/s, round {}/{rounds}, {}: {:.0} tx/s, writer p99 {}, \
                     freshness p99 {} (floor {}), cores {:.2} of machine {:.2}",
                    round + 1,
                    keeper.label(),
                    r.load.tps,
                    ms(r.load.latency.map(|l| l.1)),
                    ms(r.fresh.as_ref().and_then(|f| f.lat.p99)),
                    ms(r.fresh.as_ref().and_then(|f| f.floor.p99)),
                    r.cores.run,
                    r.cores.machine
                );
                done.push(r);
            }
        }
        for (keeper, done) in &runs {
            let f = figures(rate, done);
            let why = verdict(&f);
            t.row(row(rate, *keeper, done, &f, load_avg, &why));
            let o = outcomes
                .iter_mut()
                .find(|o| o.keeper == *keeper)
                .expect("every standing keeper has an outcome");
            if why.is_empty() {
                o.held = Some(rate);
            } else {
                o.fell = Some((rate, why.join("; ")));
            }
        }
    }
    t.print();
    println!(
        "\nOne reading inserted per transaction ({secs} s per run, 8 pgbench clients, Poisson-paced, \
         {DEVICES} devices, uniform; CPU-bound server: fsync off, track_commit_timestamp on); ×N: runs, \
         a fresh server each, rounds alternating the keepers within a rate; medians over the runs. \
         Freshness: commit of the first derived state whose snapshot saw the reading − the reading's \
         commit (zero for the keepers inside the transaction). Floor: the same runs' commits through \
         the debounce alone. Writer latency: pgbench's per-transaction log, from the scheduled start \
         (schedule lag included) to commit. Cores: CPU time during the load over its wall time. \
         CPU per tx: every process of the run, from the start of the load until caught up, per committed \
         transaction; the CPU bound is the rate at which that alone would fill every core. \
         Holds: achieved ≥ {:.0} % of the target, writer p99 ≤ {}, freshness p99 ≤ {SLACK:.2} × floor \
         (freshen), derived = truth; a keeper that falls over is not run at higher rates. \
         Load average (1 min): {load_start:.2} at the start, {:.2} at the end ({:.0} s).\n",
        REACHED * 1e2,
        ms(Some(WRITER_P99)),
        load_average(),
        t_start.elapsed().as_secs_f64()
    );
    let mut s = Table::new(&["kept by", "highest rate held", "fell over at", "why"]);
    for o in &outcomes {
        s.row(vec![
            o.keeper.label().into(),
            o.held.map_or("none".into(), |r| format!("{r} tx/s")),
            o.fell
                .as_ref()
                .map_or("not within the ladder".into(), |(r, _)| format!("{r} tx/s")),
            o.fell.as_ref().map_or(String::new(), |(_, w)| w.clone()),
        ]);
    }
    s.print();
    Ok(())
}

/// The machine's cores, for the rate a keeper's CPU per transaction allows.
fn machine_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

fn row(
    rate: u32,
    keeper: Keeper,
    done: &[Run],
    f: &Figures,
    load_avg: f64,
    why: &[String],
) -> Vec<String> {
    let writer_p50 = median_dur(done.iter().map(|r| r.load.latency.map(|l| l.0)));
    let fresh =
        |g: fn(&Fresh) -> Option<Duration>| median_dur(done.iter().map(|r| g(r.fresh.as_ref()?)));
    let p99s: Vec<f64> = done
        .iter()
        .filter_map(|r| r.fresh.as_ref()?.lat.p99)
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    let spread = if p99s.len() > 1 {
        let lo = p99s.iter().copied().fold(f64::MAX, f64::min);
        let hi = p99s.iter().copied().fold(f64::MIN, f64::max);
        format!(" ({lo:.0}–{hi:.0})")
    } else {
        String::new()
    };
    let cores = |g: fn(&Cores) -> f64| median(done.iter().map(|r| g(&r.cores)).collect());
    let cpu_us = median(
        done.iter()
            .map(|r| r.cpu_per_tx.as_secs_f64() * 1e6)
            .collect(),
    );
    let in_tx = keeper.max_wait().is_none();
    let dash = || "–".to_string();
    vec![
        format!("{rate} tx/s"),
        format!("{} ×{}", keeper.label(), done.len()),
        format!("{:.0} tx/s", f.achieved),
        format!("{} / {}", ms(writer_p50), ms(Some(f.writer_p99))),
        if in_tx {
            "0 (in the transaction)".into()
        } else {
            format!("{}{spread}", ms(fresh(|f| f.lat.p99)))
        },
        if in_tx {
            dash()
        } else {
            ms(fresh(|f| f.floor.p99))
        },
        match f.freshness {
            Some((p, fl)) if !fl.is_zero() => format!("{:.2}", p.as_secs_f64() / fl.as_secs_f64()),
            _ => dash(),
        },
        if in_tx { dash() } else { ms(fresh(|f| f.own)) },
        if in_tx {
            dash()
        } else {
            format!(
                "{:.1}",
                median(
                    done.iter()
                        .filter_map(|r| Some(r.fresh.as_ref()?.keys_per_call))
                        .collect()
                )
            )
        },
        if f.truth { "yes" } else { "NO" }.into(),
        format!("{:.0} µs", cpu_us),
        format!("{:.0} tx/s", machine_cores() / (cpu_us / 1e6).max(1e-12)),
        if in_tx {
            format!("{:.2} · {:.2}", cores(|c| c.run), cores(|c| c.machine))
        } else {
            format!(
                "{:.2} ({:.2} / {:.2} / {:.2}) · {:.2}",
                cores(|c| c.run),
                cores(|c| c.walsender),
                cores(|c| c.rebuilds),
                cores(|c| c.reader),
                cores(|c| c.machine)
            )
        },
        format!("{load_avg:.2}"),
        if why.is_empty() {
            "holds".into()
        } else {
            format!("falls over: {}", why.join("; "))
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding() -> Figures {
        Figures {
            target: 10_000.0,
            achieved: 9_990.0,
            writer_p99: Duration::from_millis(3),
            freshness: Some((Duration::from_millis(330), Duration::from_millis(333))),
            truth: true,
        }
    }

    #[test]
    fn a_keeper_within_every_bound_holds() {
        assert!(verdict(&holding()).is_empty(), "{:?}", verdict(&holding()));
        // Exactly at the bounds still holds.
        let edge = Figures {
            achieved: 9_500.0,
            writer_p99: WRITER_P99,
            freshness: Some((Duration::from_millis(220), Duration::from_millis(200))),
            ..holding()
        };
        assert!(verdict(&edge).is_empty(), "{:?}", verdict(&edge));
    }

    #[test]
    fn each_bound_alone_makes_it_fall_over() {
        let cases = [
            (
                Figures {
                    achieved: 9_400.0,
                    ..holding()
                },
                "writers reached 94 %",
            ),
            (
                Figures {
                    writer_p99: Duration::from_millis(101),
                    ..holding()
                },
                "writer p99",
            ),
            (
                Figures {
                    freshness: Some((Duration::from_millis(221), Duration::from_millis(200))),
                    ..holding()
                },
                "freshness p99",
            ),
            (
                Figures {
                    truth: false,
                    ..holding()
                },
                "derived ≠ truth",
            ),
        ];
        for (f, want) in cases {
            let why = verdict(&f);
            assert_eq!(why.len(), 1, "{f:?}: {why:?}");
            assert!(why[0].contains(want), "{f:?}: {why:?}");
        }
    }

    #[test]
    fn keepers_inside_the_transaction_are_judged_by_their_writers_alone() {
        let f = Figures {
            freshness: None,
            ..holding()
        };
        assert!(verdict(&f).is_empty());
        let why = verdict(&Figures {
            achieved: 4_000.0,
            writer_p99: Duration::from_secs(2),
            freshness: None,
            ..holding()
        });
        assert_eq!(why.len(), 2, "every reason is given: {why:?}");
    }
}
