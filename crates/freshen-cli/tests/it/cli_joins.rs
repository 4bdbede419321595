//! `freshen run` on views over joined tables, against real PostgreSQL: a SaaS schema,
//! three views (a three-table join, two with a dimension fan-out), no reconcile sweep,
//! a randomized workload that changes dimensions, moves children between parents and
//! cascades deletes, SIGKILL mid-run and a restart. Nothing but the stream heals the
//! derived tables, so every change (and every fan-out) must survive the crash.

use crate::support;

use std::time::Duration;

use support::saas;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_views_equal_a_fresh_computation_across_a_sigkill() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    // A debounce long enough that changes are pending (debounced or fanning out) when
    // the process dies.
    let timing = "coalesce = \"200ms\"\nmax_wait = \"1s\"";
    let (_dir, base, mut second) = saas::across_a_sigkill(
        &mut c,
        |http| saas::config(&pg.url(), http, timing),
        0x5aa5,
        [150, 150, 100, 100],
    )
    .await;

    let rows: i64 = c
        .query_one("SELECT count(*) FROM account_mrr WHERE mrr > 0", &[])
        .await
        .unwrap()
        .get(0);
    assert!(rows > 0, "the workload produced revenue to check");
    let fanned = saas::fanned_keys(&base).await;
    assert!(fanned > 0, "plan changes fanned out after the restart");
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_is_watched_through_its_parent() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint NOT NULL, region text NOT NULL, account text NOT NULL, amount bigint NOT NULL,
                              PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu');
         CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us');
         ALTER TABLE orders REPLICA IDENTITY FULL;
         ALTER TABLE orders_eu REPLICA IDENTITY FULL;
         ALTER TABLE orders_us REPLICA IDENTITY FULL;
         CREATE TABLE account_orders (account text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);",
    )
    .await
    .unwrap();
    let view = |url: &str, http: &str| {
        format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_parts"
publication = "freshen_parts"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"

[[views]]
name = "account_orders"
watch = [{{ table = "public.orders", key = ["account"] }}]
rebuild = [
  "DELETE FROM account_orders WHERE account = $1",
  "INSERT INTO account_orders SELECT account, sum(amount), count(*) FROM orders WHERE account = $1 GROUP BY account",
]
"#
        )
    };
    let Started { run, .. } = run_healthy(|http| view(&pg.url(), http), None).await;
    let via_root: bool = c
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'freshen_parts'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        via_root,
        "the publication names the parent, not its partitions"
    );
    c.batch_execute(
        "INSERT INTO orders SELECT g, (ARRAY['eu','us'])[1 + g % 2], 'a' || (g % 7), g FROM generate_series(1, 200) g;
         UPDATE orders SET region = 'us' WHERE region = 'eu' AND id % 3 = 0;
         UPDATE orders SET account = 'moved' WHERE id % 5 = 0;
         DELETE FROM orders WHERE id % 11 = 0;",
    )
    .await
    .unwrap();
    let truth = "SELECT account, sum(amount)::bigint, count(*) FROM orders GROUP BY account";
    let derived = "SELECT account, total, n FROM account_orders";
    let diff = format!(
        "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = c.query_one(&diff, &[]).await.unwrap().get(0);
        let rows: i64 = c
            .query_one("SELECT count(*) FROM account_orders", &[])
            .await
            .unwrap()
            .get(0);
        if n == 0 && rows == 8 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "account_orders never matched: {n} rows differ, {rows} rows"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(run);
}
