//! The SELECT a user already has: views given as a plain query — exactly what they
//! would write for `CREATE MATERIALIZED VIEW`, no `$1`, no `watch`, no `key`, no
//! `reconcile` — in the shapes people write, against a real PostgreSQL. Each is either
//! kept equal to a fresh computation of its query through a randomized workload, or
//! refused by `check` and `run` with what to write instead.

use crate::support::*;

use std::time::Duration;

use freshen_testenv::refresher::eventually;

const SCHEMA: &str = "
CREATE TABLE customers (id int PRIMARY KEY, region text NOT NULL, name text);
CREATE TABLE orders (id int PRIMARY KEY, cid int NOT NULL REFERENCES customers ON DELETE CASCADE,
                     amount int NOT NULL, status text NOT NULL);
CREATE INDEX ON orders (cid);
-- Updates that move a row between keys (a new cid, a new region) need the old row.
ALTER TABLE customers REPLICA IDENTITY FULL;
ALTER TABLE orders REPLICA IDENTITY FULL;
";

/// (view, target table's DDL (its columns in the query's order), the query as written).
const SHAPES: &[(&str, &str, &str)] = &[
    (
        "rollup",
        "CREATE TABLE rollup (cid int PRIMARY KEY, n bigint NOT NULL, total bigint)",
        "SELECT cid, count(*) AS n, sum(amount) AS total FROM orders GROUP BY cid",
    ),
    (
        "big_spenders",
        "CREATE TABLE big_spenders (cid int PRIMARY KEY, total bigint)",
        "SELECT cid, sum(amount) AS total FROM orders GROUP BY cid HAVING sum(amount) > 300;",
    ),
    (
        "statuses",
        "CREATE TABLE statuses (cid int, status text, PRIMARY KEY (cid, status))",
        "SELECT DISTINCT cid, status FROM orders",
    ),
    (
        "customer_orders",
        "CREATE TABLE customer_orders (id int PRIMARY KEY, region text, n bigint, total bigint)",
        "SELECT c.id, c.region, count(o.id) AS n, coalesce(sum(o.amount), 0) AS total
           FROM customers c LEFT JOIN orders o ON o.cid = c.id GROUP BY c.id, c.region",
    ),
    (
        "top_amount",
        "CREATE TABLE top_amount (id int PRIMARY KEY, top int)",
        "SELECT c.id, (SELECT max(o.amount) FROM orders o WHERE o.cid = c.id) AS top FROM customers c",
    ),
    (
        "paid",
        "CREATE TABLE paid (cid int PRIMARY KEY, total bigint)",
        "WITH p AS (SELECT cid, amount FROM orders WHERE status = 'paid')
         SELECT cid, sum(amount) AS total FROM p GROUP BY cid",
    ),
    (
        "mentions",
        "CREATE TABLE mentions (cid int PRIMARY KEY, n bigint)",
        "SELECT cid, count(*) AS n FROM (SELECT cid FROM orders UNION ALL SELECT id FROM customers) u GROUP BY cid",
    ),
    (
        "smaller_pairs",
        "CREATE TABLE smaller_pairs (cid int PRIMARY KEY, pairs bigint)",
        "SELECT a.cid, count(*) AS pairs FROM orders a JOIN orders b ON b.cid = a.cid AND b.id < a.id GROUP BY a.cid",
    ),
    (
        "region_totals",
        "CREATE TABLE region_totals (region text PRIMARY KEY, n bigint, total bigint)",
        "SELECT c.region, count(o.id) AS n, coalesce(sum(o.amount), 0) AS total
           FROM customers c LEFT JOIN orders o ON o.cid = c.id GROUP BY c.region",
    ),
    (
        "largest_order",
        "CREATE TABLE largest_order (cid int PRIMARY KEY, id int, amount int)",
        "SELECT DISTINCT ON (cid) cid, id, amount FROM orders ORDER BY cid, amount DESC, id",
    ),
];

fn config(url: &str, http: &str, views: &[(&str, &str, &str)]) -> String {
    let mut out = format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_shapes"
publication = "freshen_shapes"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "300ms"
"#
    );
    for (name, _, query) in views {
        out.push_str(&format!(
            "\n[[views]]\nname = \"{name}\"\ninto = \"{name}\"\nquery = \"\"\"{query}\"\"\"\n"
        ));
    }
    out
}

/// Rows of `view` that differ from a fresh computation of its query.
async fn differs(c: &tokio_postgres::Client, view: &str, query: &str) -> i64 {
    let query = query.trim_end().trim_end_matches(';');
    c.query_one(
        &format!(
            "SELECT count(*) FROM ((SELECT * FROM {view} EXCEPT ({query})) UNION ALL (({query}) EXCEPT SELECT * FROM {view})) d"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// One transaction of one to four changes over 30 customers and 300 orders: inserts,
/// amounts and statuses changed, orders moved between customers, customers moved
/// between regions, orders and customers (with their orders) deleted.
async fn transaction(c: &mut tokio_postgres::Client, r: &mut Rng) {
    let tx = c.transaction().await.unwrap();
    for _ in 0..=r.below(4) {
        let (cust, order) = (1 + r.below(30) as i32, 1 + r.below(300) as i32);
        let other = 1 + r.below(30) as i32;
        let amount = 1 + r.below(100) as i32;
        let status = ["open", "paid", "void"][r.below(3) as usize];
        let region = ["eu", "us", "ap"][r.below(3) as usize];
        let (sql, params): (&str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>) = match r
            .below(12)
        {
            0 | 1 => (
                "INSERT INTO customers VALUES ($1::int, $2, 'c' || $1::int) ON CONFLICT DO NOTHING",
                vec![&cust, &region],
            ),
            2..=4 => (
                "INSERT INTO orders SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT FROM customers WHERE id = $2) ON CONFLICT DO NOTHING",
                vec![&order, &cust, &amount, &status],
            ),
            5 => (
                "UPDATE orders SET amount = $2 WHERE id = $1",
                vec![&order, &amount],
            ),
            6 => (
                "UPDATE orders SET status = $2 WHERE id = $1",
                vec![&order, &status],
            ),
            7 => (
                "UPDATE orders SET cid = $2 WHERE id = $1 AND EXISTS (SELECT FROM customers WHERE id = $2)",
                vec![&order, &other],
            ),
            8 => (
                "UPDATE customers SET region = $2 WHERE id = $1",
                vec![&cust, &region],
            ),
            9 | 10 => ("DELETE FROM orders WHERE id = $1", vec![&order]),
            _ => ("DELETE FROM customers WHERE id = $1", vec![&cust]),
        };
        tx.execute(sql, &params).await.expect("workload statement");
    }
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_queries_of_every_shape_stay_equal_to_truth_under_changes() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    for (_, ddl, _) in SHAPES {
        c.batch_execute(ddl).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = config(&pg.url(), &format!("127.0.0.1:{port}"), SHAPES);
    // `check` takes every view: its key from the target's primary key, its watch
    // entries inferred, its batch filter reaching the tables.
    let (code, f) = check_json(dir.path(), &text);
    assert!(messages(&f, "error", "infer").is_empty(), "{f:#?}");
    assert_eq!(code, Some(0), "{f:#?}");
    let keys = messages(&f, "ok", "key");
    for (name, _, _) in SHAPES {
        assert!(
            keys.iter()
                .any(|m| m.contains(&format!("public.{name}'s primary key"))),
            "view {name}: its key from its target's primary key: {keys:#?}"
        );
    }
    let cfg = write_config(dir.path(), &text);
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, Duration::from_secs(60)).await;
    let mut r = Rng::new(0x5ba9e5);
    for _ in 0..600 {
        transaction(&mut c, &mut r).await;
    }
    // Last, changes to orders alone: a view reaches them only through its own watch of
    // orders (region_totals through the fan-out by customer), never through a change
    // to customers that happens to dirty the same keys.
    c.batch_execute(
        "UPDATE orders SET amount = amount + 7 WHERE id % 5 = 0;
         UPDATE orders SET status = 'paid' WHERE id % 7 = 0;
         DELETE FROM orders WHERE id % 11 = 0;",
    )
    .await
    .unwrap();
    eventually(90, "every view to equal a fresh computation", || {
        let c = &c;
        async move {
            let mut off = Vec::new();
            for (name, _, query) in SHAPES {
                let n = differs(c, name, query).await;
                if n != 0 {
                    off.push((*name, n));
                }
            }
            off.is_empty().then_some(())
        }
    })
    .await;
    // The workload reached every view: none is equal to truth by being empty.
    for (name, _, _) in SHAPES {
        let n: i64 = c
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .await
            .unwrap()
            .get(0);
        assert!(n > 0, "view {name} is empty");
    }
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM customers c WHERE NOT EXISTS (SELECT FROM orders WHERE cid = c.id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        left > 0,
        "customers without orders (the LEFT JOIN's NULL side)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_that_cannot_be_keyed_are_refused_with_what_to_write() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // (view, target, query, what the refusal must say)
    let refused: &[(&str, &str, &str, &[&str])] = &[
        (
            "ranks",
            "CREATE TABLE ranks (id int PRIMARY KEY, rank bigint)",
            "SELECT id, rank() OVER (ORDER BY amount) AS rank FROM orders",
            &["cannot reach the tables", "window", "= ANY($1)"],
        ),
        (
            "top5",
            "CREATE TABLE top5 (cid int PRIMARY KEY, total bigint)",
            "SELECT cid, sum(amount) AS total FROM orders GROUP BY cid ORDER BY total DESC LIMIT 5",
            &["cannot reach the tables", "LIMIT"],
        ),
        (
            "buckets",
            "CREATE TABLE buckets (bucket int PRIMARY KEY, n bigint)",
            "SELECT amount / 10 AS bucket, count(*) AS n FROM orders GROUP BY 1",
            &["computed by an expression", "watch"],
        ),
        (
            "region_status",
            "CREATE TABLE region_status (region text, status text, total bigint, PRIMARY KEY (region, status))",
            "SELECT c.region, o.status, sum(o.amount) AS total FROM orders o JOIN customers c ON c.id = o.cid GROUP BY c.region, o.status",
            &[
                "no table the query reads carries every part of the key",
                "watch",
            ],
        ),
        (
            "keyless",
            "CREATE TABLE keyless (cid int, n bigint)",
            "SELECT cid, count(*) AS n FROM orders GROUP BY cid",
            &["has no primary key", "key = [\"cid\"]"],
        ),
    ];
    for (name, ddl, query, says) in refused {
        c.batch_execute(ddl).await.unwrap();
        let text = config(&pg.url(), "127.0.0.1:0", &[(name, ddl, query)]);
        let (code, f) = check_json(dir.path(), &text);
        assert_eq!(code, Some(1), "view {name}: {f:#?}");
        let errors = messages(&f, "error", "infer");
        assert_eq!(errors.len(), 1, "view {name}: {f:#?}");
        for s in *says {
            assert!(
                errors[0].contains(s),
                "view {name}: says {s:?}: {}",
                errors[0]
            );
        }
    }
    // `run` refuses alike, before it creates anything.
    let (name, _, query, _) = refused[0];
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), "127.0.0.1:0", &[(name, "", query)]),
    );
    let out = freshen().args(["run", "-c"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach the tables"), "{stderr}");
    let slots: i64 = c
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "a refused configuration creates no slot");
    // A keyless target takes the view's `key`.
    let text = config(
        &pg.url(),
        "127.0.0.1:0",
        &[(
            "keyless",
            "",
            "SELECT cid, count(*) AS n FROM orders GROUP BY cid",
        )],
    )
    .replace("into = \"keyless\"", "into = \"keyless\"\nkey = [\"cid\"]");
    c.batch_execute("CREATE UNIQUE INDEX ON keyless (cid)")
        .await
        .unwrap();
    let (code, f) = check_json(dir.path(), &text);
    assert_eq!(code, Some(0), "{f:#?}");
    assert!(
        messages(&f, "ok", "key")
            .iter()
            .any(|m| m.contains("(cid), the view's `key`")),
        "{f:#?}"
    );
}
