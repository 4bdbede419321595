//! Fan-out: one dimension row changes and N derived rows depend on it.
//!
//! A plan's price changes; N accounts subscribe to it, and `account_mrr` (seats × price
//! per account) must follow. Two ways, each on a fresh server with the same data:
//!
//! - a row trigger on `plans` recomputing every dependent account's row inside the
//!   writer's transaction: the writer waits for all N (and holds their row locks), but
//!   the table is fresh at commit;
//! - freshen with a fan-out watch entry (`keys = "SELECT account_id FROM subscriptions
//!   WHERE plan_id = $1"`), `rebuild_batch = 1000`: the writer commits at once; the plan
//!   is debounced, mapped to its N accounts page by page off the receive path, and the
//!   accounts are rebuilt in batches.
//!
//! Reported: the writer's statement latency, time from commit until the derived table is
//! settled (freshen: every fanned key rebuilt, then checked equal to a fresh computation),
//! rebuilds per fanned key, and freshen's peak heap growth over idle while it fans out:
//! the fan-out buffers a page per parent, and pauses while 65 536 keys wait for a
//! rebuild, so 1M fanned keys should cost about what 100k do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::report::{Table, dur};
use crate::workload::{Freshen, connect, runtime, server};
use crate::{Opts, alloc};

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

fn config(url: &str) -> String {
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
rebuild = [
  "DELETE FROM account_mrr WHERE account_id = ANY($1)",
  "INSERT INTO account_mrr SELECT s.account_id, sum(s.seats * p.price) FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = ANY($1) GROUP BY s.account_id",
]
"#
    )
}

/// N accounts on plan 1, as many again on plan 2 (untouched: fan-out must not reach them).
fn data(n: u64) -> String {
    format!(
        "INSERT INTO plans VALUES (1, 10), (2, 20);
         INSERT INTO subscriptions SELECT g, CASE WHEN g <= {n} THEN 1 ELSE 2 END, 1 + g % 5 FROM generate_series(1, {}) g;
         INSERT INTO account_mrr {TRUTH};
         ANALYZE;",
        2 * n
    )
}

struct Row {
    writer: Duration,
    settle: Duration,
    fanned: u64,
    rebuilds: u64,
    calls: u64,
    rebuild_calls: u64,
    heap: u64,
    equal: bool,
}

async fn differs(c: &tokio_postgres::Client) -> anyhow::Result<i64> {
    let derived = "SELECT account_id, mrr FROM account_mrr";
    Ok(c.query_one(
        &format!("SELECT count(*) FROM (({derived} EXCEPT {TRUTH}) UNION ALL ({TRUTH} EXCEPT {derived})) d"),
        &[],
    )
    .await?
    .get(0))
}

async fn trigger(n: u64) -> anyhow::Result<Row> {
    let pg = server(&[])?;
    let c = connect(&pg.url()).await?;
    c.batch_execute(SCHEMA).await?;
    c.batch_execute(&data(n)).await?;
    c.batch_execute(TRIGGER).await?;
    let t0 = Instant::now();
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 1")
        .await?;
    let writer = t0.elapsed();
    Ok(Row {
        writer,
        settle: writer,
        fanned: n,
        rebuilds: n,
        calls: 0,
        rebuild_calls: 1,
        heap: 0,
        equal: differs(&c).await? == 0,
    })
}

async fn freshen(n: u64) -> anyhow::Result<Row> {
    let pg = server(&[])?;
    let c = connect(&pg.url()).await?;
    c.batch_execute(SCHEMA).await?;
    c.batch_execute("ALTER TABLE subscriptions REPLICA IDENTITY FULL")
        .await?;
    c.batch_execute(&data(n)).await?;
    let f = Freshen::start(&config(&pg.url())).await?;
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
            s.fanout_calls > before.fanout_calls
                && s.rebuilds_ok >= before.rebuilds_ok + n
                && s.dirty == 0
                && s.in_flight == 0
        })
        .await?
        + writer;
    sampling.store(false, Relaxed);
    let _ = sampler.await;
    let s = f.stats();
    let equal = differs(&c).await? == 0;
    f.stop().await?;
    Ok(Row {
        writer,
        settle,
        fanned: s.fanout_keys - before.fanout_keys,
        rebuilds: s.rebuilds_ok - before.rebuilds_ok,
        calls: s.fanout_calls - before.fanout_calls,
        rebuild_calls: s.rebuild_calls - before.rebuild_calls,
        heap: peak.load(Relaxed).saturating_sub(idle),
        equal,
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let sizes: &[u64] = if opts.quick {
        &[100, 1_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    let rt = runtime()?;
    let mut t = Table::new(&[
        "fan-out",
        "variant",
        "writer latency",
        "settled after",
        "fanned keys",
        "rebuilds / fanned key",
        "fan-out calls",
        "rebuild calls",
        "peak heap growth",
        "equals truth",
    ]);
    for &n in sizes {
        for (label, row) in [
            ("row trigger on plans", rt.block_on(trigger(n))?),
            (
                "freshen fan-out (rebuild_batch 1000)",
                rt.block_on(freshen(n))?,
            ),
        ] {
            t.row(vec![
                n.to_string(),
                label.to_string(),
                dur(row.writer),
                dur(row.settle),
                row.fanned.to_string(),
                format!("{:.2}", row.rebuilds as f64 / row.fanned.max(1) as f64),
                row.calls.to_string(),
                row.rebuild_calls.to_string(),
                format!("{:.1} MiB", row.heap as f64 / (1024.0 * 1024.0)),
                if row.equal { "yes" } else { "NO" }.to_string(),
            ]);
        }
    }
    t.print();
    Ok(())
}
