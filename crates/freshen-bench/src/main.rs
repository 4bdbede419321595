//! freshen's benchmark harness.
//!
//! `cargo run --release -p freshen-bench -- all` runs every scenario; name scenarios to run
//! only those; `--quick` is a smoke run (small sizes) that CI may execute — it asserts
//! nothing about time. Each scenario measures freshen and its rival in the same run and
//! prints a table: ratios hold on a noisy machine, absolute times don't.

mod alloc;
mod amplification;
mod capture;
mod capture_mysql;
mod changefeed;
mod codec;
mod cpu_split;
mod fanout;
mod first_build;
mod freshness;
mod freshness_max;
mod huge_tx;
mod incremental;
mod kafka;
mod rebuild_index;
mod replica_identity;
mod report;
mod rival;
#[cfg(feature = "scale-out")]
mod scale_out;
mod scan;
mod scheduler;
mod snapshot;
mod workload;
mod write_tax;
mod writer_waits;

use clap::Parser;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// A scenario: a name, what it compares, and its entry point.
struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&Opts) -> anyhow::Result<()>,
}

/// Options every scenario receives.
#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "scheduler",
        about: "DirtySet mark/drain, staggered readiness, bytes per key vs a scan-based FIFO (the Go original's design) and the Go original itself",
        run: scheduler::run,
    },
    Scenario {
        name: "capture",
        about: "PostgreSQL capture: PgSource vs pg_recvlogical (and supabase/etl, with FRESHEN_BENCH_ETL) on copies of one unread slot, with the server's CPU per row; memory during a 1M-row transaction",
        run: capture::run,
    },
    Scenario {
        name: "capture-mysql",
        about: "MariaDB capture: MySqlSource vs mariadb-binlog --read-from-remote-server -v on one 1M-row transaction; memory; the row decoder alone",
        run: capture_mysql::run,
    },
    Scenario {
        name: "changefeed",
        about: "changefeed: durable append (group commit vs one commit per event); long-poll and SSE delivery to 1 and 100 clients; memory per connection",
        run: changefeed::run,
    },
    Scenario {
        name: "snapshot",
        about: "changefeed and Kafka sink snapshot rows/s vs COPY (SELECT …) TO STDOUT of the same table; peak RSS at two table sizes; writers' TPS with and without a snapshot",
        run: snapshot::run,
    },
    Scenario {
        name: "codec",
        about: "decode messages/s: canal-json and Debezium JSON (freshen-codec) vs a serde_json::Value tree walked into row events",
        run: codec::run,
    },
    Scenario {
        name: "kafka",
        about: "Kafka: TiCDC canal-json consumed into a refresher vs a bare librdkafka consumer; PostgreSQL -> Kafka sink vs capture alone",
        run: kafka::run,
    },
    Scenario {
        name: "write-tax",
        about: "OLTP TPS and CPU per tx with no derived table, row triggers, a matview refreshed every second, freshen (hand-written per key and over arrays, query mode, query mode decoding on a standby: the primary's CPU per tx and the standby's); WAL and derived-table writes; staleness and truth at the end",
        run: write_tax::run,
    },
    Scenario {
        name: "write-tax-hot",
        about: "write-tax on Zipf(1.1) hot keys (where row triggers serialize): CPU per tx, TPS, writer latency p50/p99 for no derived table, decoding alone, row triggers, freshen (hand-written, over arrays, query mode)",
        run: write_tax::run_hot,
    },
    Scenario {
        name: "rebuild-index",
        about: "a query-mode rebuild's cost per key with no index, a btree, a covering btree and a clustered table on the key; and per batch size",
        run: rebuild_index::run,
    },
    Scenario {
        name: "replica-identity",
        about: "REPLICA IDENTITY DEFAULT / USING INDEX (id, device) / FULL on one update workload: WAL per tx, the walsender's CPU per row, PgSource decode rate",
        run: replica_identity::run,
    },
    Scenario {
        name: "freshness",
        about: "commit → rebuilt latency p50/p99/max at 1k and 5k tx/s, from the derived table itself: freshen vs a matview refreshed every second",
        run: freshness::run,
    },
    Scenario {
        name: "freshness-max",
        about: "rising target rates (1k to 50k tx/s) until each keeper falls over: the highest rate with freshen's query-mode freshness p99 within 10 % of the debounce floor, beside where row triggers and pg_ivm stop reaching the rate; cores by role",
        run: freshness_max::run,
    },
    Scenario {
        name: "amplification",
        about: "rebuilds per event on Zipf hot keys for coalesce 0, 10 ms, 100 ms, 1 s vs one per event (triggers)",
        run: amplification::run,
    },
    Scenario {
        name: "fanout",
        about: "a plan's price change fanning out to a hundredth, a tenth, a seventh, half and all of 10M accounts: freshen given the matview's SELECT (auto: set calls or the whole table; up to 1M also the per-key ways before) vs a full recompute (REFRESH, TRUNCATE + INSERT; alternating rounds, ratio) and a row trigger (writer latency)",
        run: fanout::run,
    },
    Scenario {
        name: "first-build",
        about: "a plain query's empty derived table (1M keys from 10M rows) built by freshen at its first start vs CREATE TABLE AS + PRIMARY KEY; then a whole-table recompute that finds nothing changed: time and WAL vs REFRESH and REFRESH CONCURRENTLY",
        run: first_build::run,
    },
    Scenario {
        name: "incremental",
        about: "source cost on the server: cursor polling (postgres-incremental: 100 ms and 1 s, lookback 0 and 5 s) vs logical replication on the same writes; changes/s, server CPU per change, idle CPU per poll",
        run: incremental::run,
    },
    Scenario {
        name: "scale-out",
        about: "rebuilds/s of one view over key stream workers: 1, 2 and 4 on a CPU-bound rebuild (where the database becomes the limit), 1 to 8 on a latency-bound one (a remote round trip per rebuild); PostgreSQL's, freshen's and the broker's CPU; an idle worker's fetch cost on each test broker",
        run: scale_out_run,
    },
    Scenario {
        name: "huge-tx",
        about: "freshen's peak RSS and heap against idle while one 1M-row transaction streams through the pipeline",
        run: huge_tx::run,
    },
];

#[derive(Parser, Debug)]
#[command(about = "freshen benchmarks: freshen and its rival side by side, one table per scenario")]
struct Args {
    /// Scenarios to run: `all` or names (see --list).
    #[arg(default_value = "all")]
    scenarios: Vec<String>,
    /// Small sizes: a smoke run that checks the harness works, not a measurement.
    #[arg(long)]
    quick: bool,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
}

#[cfg(feature = "scale-out")]
fn scale_out_run(opts: &Opts) -> anyhow::Result<()> {
    scale_out::run(opts)
}

/// Without the feature the worker pipeline is not built: say how to get it.
#[cfg(not(feature = "scale-out"))]
fn scale_out_run(_opts: &Opts) -> anyhow::Result<()> {
    println!("(not built: run with `--features scale-out`)");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.list {
        for s in SCENARIOS {
            println!("{:<12} {}", s.name, s.about);
        }
        return Ok(());
    }
    let all = args.scenarios.iter().any(|s| s == "all");
    let unknown: Vec<_> = args
        .scenarios
        .iter()
        .filter(|n| *n != "all" && !SCENARIOS.iter().any(|s| s.name == n.as_str()))
        .collect();
    anyhow::ensure!(
        unknown.is_empty(),
        "unknown scenario(s) {unknown:?}; try --list"
    );
    let opts = Opts { quick: args.quick };
    report::machine_header();
    for s in SCENARIOS {
        if all || args.scenarios.iter().any(|n| n == s.name) {
            println!("\n## {} — {}\n", s.name, s.about);
            (s.run)(&opts)?;
        }
    }
    Ok(())
}
