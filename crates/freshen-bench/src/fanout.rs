//! Fan-out: one dimension row changes and a share of the derived table depends on it.
//!
//! A plan's price changes; N accounts subscribe to it, and `account_mrr` (seats × price
//! per account) must follow. On the same data:
//!
//! - a full set-based recompute, what a user writes instead of an incremental view:
//!   `REFRESH MATERIALIZED VIEW` of a matview with the same query, and `BEGIN; TRUNCATE;
//!   INSERT … SELECT; COMMIT` of the derived table (both recompute every account);
//! - freshen with the view as its owner writes it — `into = "account_mrr"` and the
//!   matview's plain SELECT, nothing else (`rebuild_by = "auto"`, the default): the
//!   watch entries, the plan's fan-out and the key are inferred; freshen chooses between
//!   expanding the fan-out into set calls and recomputing the whole table (when the
//!   fan-out's plan estimate reaches the measured threshold, a share of the table);
//! - for fan-outs of up to 1M keys, the two ways before set work: a fan-out watch entry
//!   (`keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1"`) in SQL mode
//!   (hand-written DELETE + INSERT over `= ANY($1)`) and in query mode with `= ANY($1)`
//!   (one merge statement per batch), `rebuild_batch = 1000`, calls growing to 10 000
//!   keys while a backlog waits, expanded key by key whatever the share;
//! - a row trigger on `plans` recomputing every dependent account's row inside the
//!   writer's transaction (first round only, up to 1M keys): the writer waits for all N
//!   and holds their row locks, but the table is fresh at commit.
//!
//! Each round is one fresh server; freshen and the recompute take turns going first
//! (the machine is shared: side by side, alternating, the ratio is what to read). The
//! other accounts are on plan 2, which the fan-out must not reach. By default the
//! derived table holds 10M accounts and plan 1 has a hundredth, a tenth, a seventh,
//! half and all of them (`FRESHEN_BENCH_FANOUT` names other sizes). Plan 1's accounts
//! are spread evenly through the ids, and the derived table is in key order at the start
//! of every round.
//!
//! Reported: the writer's statement latency, time from commit until the derived table is
//! settled (freshen: every fanned key rebuilt or the whole-table run committed, then
//! checked equal to a fresh computation; the recompute: its statement's end), fanned
//! keys per second, which way freshen went (set calls, whole-table runs), and freshen's
//! peak heap growth over idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::report::{Table, dur, rate};
use crate::workload::{Freshen, connect, runtime, server};
use crate::{Opts, alloc};
use freshen_testenv::PgServer;

const SCHEMA: &str = "
CREATE TABLE plans (id bigint PRIMARY KEY, price bigint NOT NULL);
CREATE TABLE subscriptions (account_id bigint PRIMARY KEY, plan_id bigint NOT NULL REFERENCES plans, seats int NOT NULL);
CREATE INDEX ON subscriptions (plan_id);
CREATE TABLE account_mrr (account_id bigint PRIMARY KEY, mrr bigint NOT NULL);
";

const TRUTH: &str = "SELECT s.account_id, sum(s.seats * p.price)::bigint FROM subscriptions s JOIN plans p ON p.id = s.plan_id GROUP BY s.account_id";

const TRIGGER: &str = "
CREATE FUNCTION plans_mrr() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE account_mrr m SET mrr = x.mrr
    FROM (SELECT s.account_id, sum(s.seats * p.price)::bigint AS mrr
          FROM subscriptions s JOIN plans p ON p.id = s.plan_id
          WHERE s.account_id IN (SELECT account_id FROM subscriptions WHERE plan_id = NEW.id)
          GROUP BY s.account_id) x
    WHERE m.account_id = x.account_id;
    RETURN NULL;
END $$;
CREATE TRIGGER plans_mrr AFTER UPDATE OF price ON plans FOR EACH ROW EXECUTE FUNCTION plans_mrr();
";

/// How freshen rebuilds an account in the fan-out bench: hand-written statements (SQL
/// mode), a query with `= ANY($1)` whose rows are merged into `account_mrr` (query
/// mode), or the matview's plain SELECT with everything else inferred and chosen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Sql,
    Query,
    Plain,
}

/// The plain SELECT, as a matview's.
const PLAIN: &str = "SELECT s.account_id, sum(s.seats * p.price)::bigint AS mrr FROM subscriptions s JOIN plans p ON p.id = s.plan_id GROUP BY s.account_id";

/// The query-mode query: an account's row for a batch of accounts.
const QUERY: &str = "SELECT s.account_id, sum(s.seats * p.price)::bigint AS mrr FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = ANY($1) GROUP BY s.account_id";

fn config(url: &str, mode: Mode) -> String {
    if mode == Mode::Plain {
        return format!(
            r#"
[source]
kind = "postgres"
url = "{url}"

[http]
listen = "off"

[defaults]
coalesce = "10ms"

[[views]]
name = "account_mrr"
into = "account_mrr"
query = {PLAIN:?}
"#
        );
    }
    let how = match mode {
        Mode::Sql => r#"rebuild = [
  "DELETE FROM account_mrr WHERE account_id = ANY($1)",
  "INSERT INTO account_mrr SELECT s.account_id, sum(s.seats * p.price) FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = ANY($1) GROUP BY s.account_id",
]"#
        .to_string(),
        Mode::Query => format!("into = \"account_mrr\"\nquery = {QUERY:?}"),
        Mode::Plain => unreachable!("written above"),
    };
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"

[http]
listen = "off"

[defaults]
coalesce = "10ms"

[[views]]
name = "account_mrr"
watch = [
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
rebuild_batch = 1000
{how}
"#
    )
}

/// N accounts on plan 1, `others` on plan 2 (untouched: fan-out must not reach them).
///
/// A plan's accounts are spread through the id space as real ones are (every
/// `stride`-th account), not one block of ids; and `account_mrr` is written in key
/// order, as a recompute leaves it, in every round. Both matter: with plan 1 a block of
/// ids, and the table in hash order after loading but in key order after the first
/// `TRUNCATE` + `INSERT`, freshen's batches touched a few contiguous pages in one round
/// and pages all over the table in the other (1.5–2× apart).
fn data(n: u64, others: u64) -> String {
    let stride = (n + others) / n;
    format!(
        "INSERT INTO plans VALUES (1, 10), (2, 20);
         INSERT INTO subscriptions SELECT g, CASE WHEN (g - 1) % {stride} = 0 AND (g - 1) / {stride} < {n} THEN 1 ELSE 2 END, 1 + g % 5 FROM generate_series(1, {}) g;
         ANALYZE subscriptions, plans;
         INSERT INTO account_mrr SELECT * FROM ({TRUTH}) t ORDER BY account_id;
         CREATE MATERIALIZED VIEW account_mrr_mv (account_id, mrr) AS {TRUTH};",
        n + others
    )
}

struct Row {
    writer: Duration,
    settle: Duration,
    fanned: u64,
    rebuilds: u64,
    calls: u64,
    rebuild_calls: u64,
    /// Of `rebuild_calls`, set calls; and whole-table runs.
    set_calls: u64,
    whole_runs: u64,
    heap: u64,
    equal: bool,
}

/// Rows of `derived` that differ from a fresh computation.
async fn differs(c: &tokio_postgres::Client, derived: &str) -> anyhow::Result<i64> {
    let derived = format!("SELECT account_id, mrr FROM {derived}");
    Ok(c.query_one(
        &format!("SELECT count(*) FROM (({derived} EXCEPT {TRUTH}) UNION ALL ({TRUTH} EXCEPT {derived})) d"),
        &[],
    )
    .await?
    .get(0))
}

/// A fresh server with N accounts on plan 1 and `others` on plan 2, `account_mrr` and
/// the matview computed.
async fn setup(n: u64, others: u64) -> anyhow::Result<(PgServer, tokio_postgres::Client)> {
    let pg = server(&[])?;
    let c = connect(&pg.url()).await?;
    c.batch_execute(SCHEMA).await?;
    c.batch_execute("ALTER TABLE subscriptions REPLICA IDENTITY FULL")
        .await?;
    c.batch_execute(&data(n, others)).await?;
    // Settle the freshly loaded tables as a live database's are: without this, whichever
    // variant runs first sets the hint bits of millions of new rows and races
    // autovacuum's first pass over them (freshen went 1.5–2× slower going first).
    c.batch_execute("VACUUM (ANALYZE)").await?;
    c.batch_execute("CHECKPOINT").await?;
    Ok((pg, c))
}

/// The price changes, then a full recompute: `REFRESH MATERIALIZED VIEW`, then
/// `TRUNCATE` + `INSERT … SELECT` of `account_mrr`, each timed on its own; both write
/// every account's row (`total`).
async fn recompute(c: &tokio_postgres::Client, n: u64, total: u64) -> anyhow::Result<[Row; 2]> {
    let t0 = Instant::now();
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 1")
        .await?;
    let writer = t0.elapsed();
    let row = |settle: Duration, equal: bool| Row {
        writer,
        settle: writer + settle,
        fanned: n,
        rebuilds: total,
        calls: 0,
        rebuild_calls: 1,
        set_calls: 0,
        whole_runs: 0,
        heap: 0,
        equal,
    };
    let t = Instant::now();
    c.batch_execute("REFRESH MATERIALIZED VIEW account_mrr_mv")
        .await?;
    let refresh = row(t.elapsed(), differs(c, "account_mrr_mv").await? == 0);
    let t = Instant::now();
    c.batch_execute(&format!(
        "BEGIN; TRUNCATE account_mrr; INSERT INTO account_mrr {TRUTH}; COMMIT"
    ))
    .await?;
    let truncate = row(t.elapsed(), differs(c, "account_mrr").await? == 0);
    Ok([refresh, truncate])
}

async fn trigger(c: &tokio_postgres::Client, n: u64) -> anyhow::Result<Row> {
    c.batch_execute(TRIGGER).await?;
    let t0 = Instant::now();
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 1")
        .await?;
    let writer = t0.elapsed();
    let equal = differs(c, "account_mrr").await? == 0;
    c.batch_execute("DROP TRIGGER plans_mrr ON plans").await?;
    Ok(Row {
        writer,
        settle: writer,
        fanned: n,
        rebuilds: n,
        calls: 0,
        rebuild_calls: 1,
        set_calls: 0,
        whole_runs: 0,
        heap: 0,
        equal,
    })
}

async fn freshen(
    pg: &PgServer,
    c: &tokio_postgres::Client,
    n: u64,
    mode: Mode,
) -> anyhow::Result<Row> {
    let f = Freshen::start(&config(&pg.url(), mode)).await?;
    let idle = alloc::live_bytes() as u64;
    let peak = Arc::new(AtomicU64::new(idle));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Relaxed) {
                peak.fetch_max(alloc::live_bytes() as u64, Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let before = f.stats();
    let t0 = Instant::now();
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 1")
        .await?;
    let writer = t0.elapsed();
    let settle = f
        .wait("the fan-out and its rebuilds", |f| {
            let s = f.stats();
            let expanded =
                s.fanout_calls > before.fanout_calls && s.rebuilds_ok >= before.rebuilds_ok + n;
            let whole = s.whole_runs > before.whole_runs;
            (expanded || whole) && s.dirty == 0 && s.in_flight == 0
        })
        .await?
        + writer;
    sampling.store(false, Relaxed);
    let _ = sampler.await;
    let s = f.stats();
    let equal = differs(c, "account_mrr").await? == 0;
    f.stop().await?;
    Ok(Row {
        writer,
        settle,
        fanned: s.fanout_keys - before.fanout_keys,
        rebuilds: s.rebuilds_ok - before.rebuilds_ok,
        calls: s.fanout_calls - before.fanout_calls,
        rebuild_calls: s.rebuild_calls - before.rebuild_calls,
        set_calls: s.set_calls - before.set_calls,
        whole_runs: s.whole_runs - before.whole_runs,
        heap: peak.load(Relaxed).saturating_sub(idle),
        equal,
    })
}

const FRESHEN: &str = "freshen fan-out, SQL mode (rebuild_batch 1000, bulk 10 000)";
const FRESHEN_QUERY: &str = "freshen fan-out, query mode (rebuild_batch 1000, bulk 10 000)";
const FRESHEN_PLAIN: &str = "freshen, the matview's SELECT (auto: sets or the whole table)";
/// Fan-outs up to this many keys also run the two ways before set work.
const BEFORE_UP_TO: u64 = 1_000_000;
const REFRESH: &str = "REFRESH MATERIALIZED VIEW";
const TRUNCATE: &str = "TRUNCATE + INSERT … SELECT";
const TRIGGER_LABEL: &str = "row trigger on plans";

/// One round on one fresh server: freshen (SQL mode, then query mode) and the recompute
/// in the given order (freshen second: query mode, then SQL mode), then (first round
/// only) the trigger.
async fn round(
    (n, others): (u64, u64),
    freshen_first: bool,
    with_trigger: bool,
) -> anyhow::Result<Vec<(&'static str, Row)>> {
    let (pg, c) = setup(n, others).await?;
    let mut rows = Vec::new();
    let before = n <= BEFORE_UP_TO;
    if freshen_first {
        rows.push((FRESHEN_PLAIN, freshen(&pg, &c, n, Mode::Plain).await?));
        if before {
            rows.push((FRESHEN, freshen(&pg, &c, n, Mode::Sql).await?));
            rows.push((FRESHEN_QUERY, freshen(&pg, &c, n, Mode::Query).await?));
        }
    }
    let [refresh, truncate] = recompute(&c, n, n + others).await?;
    rows.push((REFRESH, refresh));
    rows.push((TRUNCATE, truncate));
    if !freshen_first {
        if before {
            rows.push((FRESHEN_QUERY, freshen(&pg, &c, n, Mode::Query).await?));
            rows.push((FRESHEN, freshen(&pg, &c, n, Mode::Sql).await?));
        }
        rows.push((FRESHEN_PLAIN, freshen(&pg, &c, n, Mode::Plain).await?));
    }
    if with_trigger && before {
        rows.push((TRIGGER_LABEL, trigger(&c, n).await?));
    }
    Ok(rows)
}

/// The load average over the last minute, as `uptime` shows it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The environment variable naming other sizes to run, as `fanned:accounts` pairs
/// (`FRESHEN_BENCH_FANOUT=1000000:4000000,1000000:6000000`): where the break-even
/// share between freshen and a full recompute lies.
const SIZES_ENV: &str = "FRESHEN_BENCH_FANOUT";

/// The sizes `SIZES_ENV` names, as (fanned accounts, accounts on the other plan).
fn sizes_from(list: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    list.split(',')
        .map(|pair| {
            let parsed = pair.trim().split_once(':').and_then(|(n, all)| {
                let (n, all) = (n.parse::<u64>().ok()?, all.parse::<u64>().ok()?);
                if n > 0 && all >= n {
                    Some((n, all - n))
                } else {
                    None
                }
            });
            parsed.with_context(|| {
                format!("{SIZES_ENV}={list}: {pair:?} is not `fanned:accounts` with 0 < fanned <= accounts")
            })
        })
        .collect()
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    // (fanned accounts, accounts on the other plan)
    let sizes: Vec<(u64, u64)> = if let Some(list) = std::env::var_os(SIZES_ENV) {
        sizes_from(&list.to_string_lossy())?
    } else if opts.quick {
        vec![(100, 100), (1_000, 1_000), (100, 900), (2_000, 0)]
    } else {
        // A hundredth, a tenth, a seventh, half and all of 10M accounts.
        let total = 10_000_000;
        [100, 10, 7, 2, 1]
            .iter()
            .map(|d| (total / d, total - total / d))
            .collect()
    };
    let rounds = 2;
    let rt = runtime()?;
    let mut t = Table::new(&[
        "fan-out",
        "accounts",
        "round",
        "variant",
        "writer latency",
        "settled after",
        "fanned keys / s",
        "fanned keys",
        "rows written / fanned key",
        "fan-out calls",
        "rebuild calls",
        "set calls",
        "whole-table runs",
        "peak heap growth",
        "equals truth",
    ]);
    let mut ratios = Table::new(&[
        "fan-out",
        "accounts",
        "round",
        "load at start",
        "freshen (matview's SELECT, auto)",
        "freshen SQL mode",
        "freshen query mode",
        "REFRESH",
        "TRUNCATE + INSERT",
        "auto / faster recompute",
        "SQL mode / faster recompute",
        "query mode / faster recompute",
    ]);
    for &(n, others) in &sizes {
        for r in 0..rounds {
            let started_at = load();
            let rows = rt.block_on(round((n, others), r % 2 == 1, r == 0))?;
            let settle = |label: &str| {
                rows.iter()
                    .find(|(l, _)| *l == label)
                    .map_or(Duration::ZERO, |(_, row)| row.settle)
            };
            let (a, f, q) = (
                settle(FRESHEN_PLAIN),
                settle(FRESHEN),
                settle(FRESHEN_QUERY),
            );
            let (rf, tr) = (settle(REFRESH), settle(TRUNCATE));
            let ratio = |d: Duration| {
                if d.is_zero() {
                    return "—".to_string();
                }
                format!(
                    "{:.2}",
                    d.as_secs_f64() / rf.min(tr).as_secs_f64().max(1e-9)
                )
            };
            let shown = |d: Duration| {
                if d.is_zero() {
                    "—".to_string()
                } else {
                    dur(d)
                }
            };
            ratios.row(vec![
                n.to_string(),
                (n + others).to_string(),
                (r + 1).to_string(),
                started_at,
                dur(a),
                shown(f),
                shown(q),
                dur(rf),
                dur(tr),
                ratio(a),
                ratio(f),
                ratio(q),
            ]);
            for (label, row) in rows {
                t.row(vec![
                    n.to_string(),
                    (n + others).to_string(),
                    (r + 1).to_string(),
                    label.to_string(),
                    dur(row.writer),
                    dur(row.settle),
                    rate(n as f64, row.settle),
                    row.fanned.to_string(),
                    format!("{:.2}", row.rebuilds as f64 / row.fanned.max(1) as f64),
                    row.calls.to_string(),
                    row.rebuild_calls.to_string(),
                    row.set_calls.to_string(),
                    row.whole_runs.to_string(),
                    format!("{:.1} MiB", row.heap as f64 / (1024.0 * 1024.0)),
                    if row.equal { "yes" } else { "NO" }.to_string(),
                ]);
            }
        }
    }
    t.print();
    println!();
    ratios.print();
    println!("load average at the end: {}", load());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sizes_from;

    #[test]
    fn sizes_are_fanned_and_table_pairs() {
        assert_eq!(
            sizes_from("1000000:4000000, 10:10").unwrap(),
            vec![(1_000_000, 3_000_000), (10, 0)]
        );
        for bad in ["", "5", "5:4", "0:10", "a:10", "5:b"] {
            let err = sizes_from(bad).unwrap_err().to_string();
            assert!(err.contains("fanned:accounts"), "{bad:?}: {err}");
        }
    }
}
