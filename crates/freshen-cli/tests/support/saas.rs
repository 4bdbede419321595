//! A SaaS schema whose read models join dimension tables: accounts, plans,
//! subscriptions, invoices, invoice_lines, products; three views over it (one a
//! three-table join, two with a dimension fan-out), none with a reconcile sweep; and a
//! randomized workload that changes dimensions, moves children between parents and
//! cascades deletes.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::Rng;

/// The source tables and the derived ones. Children carry FULL replica identity (their
/// old parent id is a key); dimensions keep the default (their key is the primary key).
pub const SCHEMA: &str = "
CREATE TABLE accounts (id bigserial PRIMARY KEY, name text NOT NULL, region text NOT NULL);
CREATE TABLE plans (id bigserial PRIMARY KEY, name text NOT NULL, price bigint NOT NULL);
CREATE TABLE products (id bigserial PRIMARY KEY, name text NOT NULL);
CREATE TABLE subscriptions (
  id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES accounts ON DELETE CASCADE,
  plan_id bigint NOT NULL REFERENCES plans,
  seats int NOT NULL);
CREATE TABLE invoices (
  id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES accounts ON DELETE CASCADE,
  voided boolean NOT NULL DEFAULT false);
CREATE TABLE invoice_lines (
  id bigserial PRIMARY KEY,
  invoice_id bigint NOT NULL REFERENCES invoices ON DELETE CASCADE,
  product_id bigint NOT NULL REFERENCES products,
  amount bigint NOT NULL);
CREATE INDEX ON subscriptions (plan_id);
CREATE INDEX ON subscriptions (account_id);
CREATE INDEX ON invoices (account_id);
CREATE INDEX ON invoice_lines (invoice_id);
CREATE INDEX ON invoice_lines (product_id);
ALTER TABLE subscriptions REPLICA IDENTITY FULL;
ALTER TABLE invoices REPLICA IDENTITY FULL;
ALTER TABLE invoice_lines REPLICA IDENTITY FULL;
CREATE TABLE account_mrr (account_id bigint PRIMARY KEY, mrr bigint NOT NULL);
CREATE TABLE product_sales (product_id bigint PRIMARY KEY, name text NOT NULL, total bigint NOT NULL, lines bigint NOT NULL);
CREATE TABLE account_search (account_id bigint PRIMARY KEY, name text NOT NULL, region text NOT NULL, plans text NOT NULL, open_invoices bigint NOT NULL);
";

const MRR: &str = "SELECT a.id, coalesce(sum(s.seats * p.price), 0)::bigint FROM accounts a LEFT JOIN subscriptions s ON s.account_id = a.id LEFT JOIN plans p ON p.id = s.plan_id";
const SALES: &str = "SELECT p.id, p.name, coalesce(sum(l.amount) FILTER (WHERE NOT i.voided), 0)::bigint, count(l.id) FILTER (WHERE NOT i.voided) FROM products p LEFT JOIN invoice_lines l ON l.product_id = p.id LEFT JOIN invoices i ON i.id = l.invoice_id";
const SEARCH: &str = "SELECT a.id, a.name, a.region, coalesce((SELECT string_agg(p.name, ',' ORDER BY p.name, s.id) FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = a.id), ''), (SELECT count(*) FROM invoices i WHERE i.account_id = a.id AND NOT i.voided) FROM accounts a";

/// The three views, with no reconcile sweep, and `extra` appended to `[defaults]`.
pub fn config(url: &str, http: &str, timing: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_saas"
publication = "freshen_saas"

[http]
listen = "{http}"

[defaults]
{timing}

[[views]]
name = "account_mrr"
watch = [
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.accounts", key = ["id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
rebuild = [
  "DELETE FROM account_mrr WHERE account_id = $1",
  "INSERT INTO account_mrr {MRR} WHERE a.id = $1 GROUP BY a.id",
]

[[views]]
name = "product_sales"
watch = [
  {{ table = "public.invoice_lines", key = ["product_id"] }},
  {{ table = "public.products", key = ["id"] }},
  {{ table = "public.invoices", key = ["id"], keys = "SELECT product_id FROM invoice_lines WHERE invoice_id = $1" }},
]
rebuild_batch = 32
rebuild = [
  "DELETE FROM product_sales WHERE product_id = ANY($1)",
  "INSERT INTO product_sales {SALES} WHERE p.id = ANY($1) GROUP BY p.id, p.name",
]

[[views]]
name = "account_search"
watch = [
  {{ table = "public.accounts", key = ["id"] }},
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.invoices", key = ["account_id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
rebuild = [
  "DELETE FROM account_search WHERE account_id = $1",
  "INSERT INTO account_search {SEARCH} WHERE a.id = $1",
]
"#
    )
}

/// (view, derived rows, truth).
pub fn truth() -> [(&'static str, String, String); 3] {
    [
        (
            "account_mrr",
            "SELECT account_id, mrr FROM account_mrr".into(),
            format!("{MRR} GROUP BY a.id"),
        ),
        (
            "product_sales",
            "SELECT product_id, name, total, lines FROM product_sales".into(),
            format!("{SALES} GROUP BY p.id, p.name"),
        ),
        (
            "account_search",
            "SELECT account_id, name, region, plans, open_invoices FROM account_search".into(),
            SEARCH.into(),
        ),
    ]
}

/// Rows that differ between each derived table and its truth.
pub async fn differences(c: &Client) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    for (name, derived, truth) in truth() {
        let sql = format!(
            "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
        );
        let n: i64 = c.query_one(&sql, &[]).await.expect("compare").get(0);
        out.push((name, n));
    }
    out
}

/// Polls until every derived table equals its truth, or fails after `within`.
pub async fn wait_equal(c: &Client, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let d = differences(c).await;
        if d.iter().all(|(_, n)| *n == 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "derived tables never matched a fresh computation: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Dimensions to start from: 5 plans, 8 products, 20 accounts.
pub async fn seed(c: &Client) {
    c.batch_execute(
        "INSERT INTO plans (name, price) SELECT 'plan' || g, 10 * g FROM generate_series(1, 5) g;
         INSERT INTO products (name) SELECT 'product' || g FROM generate_series(1, 8) g;
         INSERT INTO accounts (name, region) SELECT 'acct' || g, (ARRAY['eu','us','ap'])[1 + g % 3] FROM generate_series(1, 20) g;",
    )
    .await
    .expect("seed");
}

/// A row of `table` picked by `n` (deterministic, never fails on an empty table: the
/// statement then touches nothing). Witness rows ([`witness`]) have negative ids and are
/// never picked.
fn pick(table: &str, n: u64) -> String {
    format!("(SELECT id FROM {table} WHERE id > 0 ORDER BY (id * 7919 + {n}) % 1009, id LIMIT 1)")
}

/// Writes witness rows for `ids` (positive; the rows get their negation as ids): a plan,
/// an account subscribed to it, a product and an invoice line of that account's, one
/// transaction each, touching all three views. [`workload`] never picks them, nor a
/// parent of theirs, so in these views (no reconcile sweep) only the stream can bring
/// them: written just before a fault, a change lost at it stays lost. A second call with
/// the same ids changes each witness once more (the plan's price, the seats, the line's
/// amount, the account's name).
pub async fn witness(c: &Client, ids: std::ops::RangeInclusive<i64>) {
    for k in ids {
        let id = -k;
        c.batch_execute(&format!(
            "BEGIN;
             INSERT INTO plans VALUES ({id}, 'witness', 10) ON CONFLICT (id) DO UPDATE SET price = plans.price + 1;
             INSERT INTO accounts VALUES ({id}, 'witness', 'eu') ON CONFLICT (id) DO UPDATE SET name = 'witness-again';
             INSERT INTO subscriptions VALUES ({id}, {id}, {id}, 1) ON CONFLICT (id) DO UPDATE SET seats = subscriptions.seats + 1;
             INSERT INTO products VALUES ({id}, 'witness') ON CONFLICT (id) DO NOTHING;
             INSERT INTO invoices VALUES ({id}, {id}, false) ON CONFLICT (id) DO NOTHING;
             INSERT INTO invoice_lines VALUES ({id}, {id}, {id}, 3) ON CONFLICT (id) DO UPDATE SET amount = invoice_lines.amount + 1;
             COMMIT;"
        ))
        .await
        .expect("witness");
    }
}

/// Fails unless every witness of `ids` is in all three read models exactly as a fresh
/// computation says, naming the ones that are not. Call it after [`wait_equal`]: it shows
/// the witnesses took part.
pub async fn assert_witnesses(c: &Client, ids: std::ops::RangeInclusive<i64>) {
    let mut lost = Vec::new();
    for k in ids {
        let id = -k;
        for (name, derived, truth) in truth() {
            let key = if name == "product_sales" {
                "product_id"
            } else {
                "account_id"
            };
            let sql = format!(
                "SELECT count(*) FROM (({derived}) INTERSECT ({truth})) x WHERE x.{key} = {id}"
            );
            let n: i64 = c.query_one(&sql, &[]).await.expect("witness").get(0);
            if n != 1 {
                lost.push(format!("{name} {id}"));
            }
        }
    }
    assert!(
        lost.is_empty(),
        "witness rows lost (changed once before a fault, never again): {lost:?}"
    );
}

/// `n` transactions of one to four random changes each.
pub async fn workload(c: &mut Client, r: &mut Rng, n: usize) {
    for _ in 0..n {
        let tx = c.transaction().await.expect("begin");
        for _ in 0..=r.below(4) {
            let (a, b) = (r.below(1_000_000), r.below(1_000_000));
            let v = 1 + r.below(50) as i64;
            let sql = match r.below(16) {
                // Dimension changes: fan out to every account or product under them.
                0 | 1 => format!(
                    "UPDATE plans SET price = {v} WHERE id = {}",
                    pick("plans", a)
                ),
                2 => format!(
                    "UPDATE plans SET name = 'plan-{v}' WHERE id = {}",
                    pick("plans", a)
                ),
                3 => format!(
                    "UPDATE invoices SET voided = NOT voided WHERE id = {}",
                    pick("invoices", a)
                ),
                4 => format!(
                    "UPDATE products SET name = 'product-{v}' WHERE id = {}",
                    pick("products", a)
                ),
                5 => format!(
                    "UPDATE accounts SET region = 'r{}', name = 'acct-{v}' WHERE id = {}",
                    v % 4,
                    pick("accounts", a)
                ),
                // Children created, moved between parents, deleted.
                6 | 7 => format!(
                    "INSERT INTO subscriptions (account_id, plan_id, seats) SELECT {}, {}, {v} WHERE EXISTS (SELECT FROM accounts)",
                    pick("accounts", a),
                    pick("plans", b)
                ),
                8 => format!(
                    "UPDATE subscriptions SET plan_id = {} WHERE id = {}",
                    pick("plans", b),
                    pick("subscriptions", a)
                ),
                9 => format!(
                    "UPDATE subscriptions SET account_id = {} WHERE id = {}",
                    pick("accounts", b),
                    pick("subscriptions", a)
                ),
                10 => format!(
                    "INSERT INTO invoices (account_id) SELECT {} WHERE EXISTS (SELECT FROM accounts)",
                    pick("accounts", a)
                ),
                11 | 12 => format!(
                    "INSERT INTO invoice_lines (invoice_id, product_id, amount) SELECT {}, {}, {v} WHERE EXISTS (SELECT FROM invoices)",
                    pick("invoices", a),
                    pick("products", b)
                ),
                13 => format!(
                    "UPDATE invoice_lines SET invoice_id = {}, product_id = {} WHERE id = {}",
                    pick("invoices", b),
                    pick("products", a),
                    pick("invoice_lines", a)
                ),
                // Cascades: an account takes its subscriptions, invoices and their lines.
                14 => match r.below(3) {
                    0 => format!("DELETE FROM accounts WHERE id = {}", pick("accounts", a)),
                    1 => format!("DELETE FROM invoices WHERE id = {}", pick("invoices", a)),
                    _ => format!(
                        "DELETE FROM subscriptions WHERE id = {}",
                        pick("subscriptions", a)
                    ),
                },
                _ => format!("INSERT INTO accounts (name, region) VALUES ('acct-new-{v}', 'eu')"),
            };
            tx.batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        tx.commit().await.expect("commit");
    }
}

/// The three views in query mode: the same read models declared as queries (the key
/// column named as the target's), written by freshen set-based; `extra` is appended to
/// `[defaults]`. The fan-out entries stay: a plan or invoice change maps to view keys
/// that the query then rebuilds.
pub fn query_config(url: &str, http: &str, timing: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_saas"
publication = "freshen_saas"

[http]
listen = "{http}"

[defaults]
{timing}

[[views]]
name = "account_mrr"
watch = [
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.accounts", key = ["id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
into = "account_mrr"
query = "SELECT a.id AS account_id, coalesce(sum(s.seats * p.price), 0)::bigint AS mrr FROM accounts a LEFT JOIN subscriptions s ON s.account_id = a.id LEFT JOIN plans p ON p.id = s.plan_id WHERE a.id = ANY($1) GROUP BY a.id"

[[views]]
name = "product_sales"
watch = [
  {{ table = "public.invoice_lines", key = ["product_id"] }},
  {{ table = "public.products", key = ["id"] }},
  {{ table = "public.invoices", key = ["id"], keys = "SELECT product_id FROM invoice_lines WHERE invoice_id = $1" }},
]
rebuild_batch = 4
into = "product_sales"
query = "SELECT p.id AS product_id, p.name, coalesce(sum(l.amount) FILTER (WHERE NOT i.voided), 0)::bigint AS total, count(l.id) FILTER (WHERE NOT i.voided) AS lines FROM products p LEFT JOIN invoice_lines l ON l.product_id = p.id LEFT JOIN invoices i ON i.id = l.invoice_id WHERE p.id = ANY($1) GROUP BY p.id, p.name"

[[views]]
name = "account_search"
watch = [
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.accounts", key = ["id"] }},
  {{ table = "public.invoices", key = ["account_id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
into = "account_search"
query = "SELECT a.id AS account_id, a.name, a.region, coalesce((SELECT string_agg(p.name, ',' ORDER BY p.name, s.id) FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = a.id), '') AS plans, (SELECT count(*) FROM invoices i WHERE i.account_id = a.id AND NOT i.voided) AS open_invoices FROM accounts a WHERE a.id = ANY($1)"
"#
    )
}

/// Drives the workload through `freshen run` across a SIGKILL: the config is `text(listen)`,
/// the data is seeded after the start (no backfill: the stream is all), then `n[0]`
/// transactions, `n[1]` more still pending (debounced or fanning out) when the process is
/// killed, `n[2]` while nothing runs, and `n[3]` on the restarted process; returns once
/// the read models equal a fresh computation, with where the run's files are, its base
/// URL and the restarted process. Witness rows changed just before the kill and never
/// again must be in the read models too.
pub async fn across_a_sigkill(
    c: &mut Client,
    text: impl FnOnce(&str) -> String,
    seed: u64,
    n: [usize; 4],
) -> (tempfile::TempDir, String, super::Running) {
    let dir = tempfile::tempdir().unwrap();
    let port = super::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = super::write_config(dir.path(), &text(&format!("127.0.0.1:{port}")));
    let mut first = super::spawn_run(dir.path(), &cfg, 1);
    super::wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    self::seed(c).await;
    let mut r = Rng::new(seed);
    workload(c, &mut r, n[0]).await;
    witness(c, 1..=3).await;
    wait_equal(c, Duration::from_secs(60)).await;
    workload(c, &mut r, n[1]).await;
    // Witnesses changed once more, and new ones, just before the kill; never again.
    witness(c, 1..=6).await;
    first.kill().unwrap();
    first.wait().unwrap();
    workload(c, &mut r, n[2]).await;
    let second = super::spawn_run(dir.path(), &cfg, 2);
    super::wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    workload(c, &mut r, n[3]).await;
    wait_equal(c, Duration::from_secs(90)).await;
    assert_witnesses(c, 1..=6).await;
    super::assert_no_sweep_ran(&base).await;
    (dir, base, second)
}

/// The view keys fan-outs have sent to `account_mrr`, from `/metrics`.
pub async fn fanned_keys(base: &str) -> u64 {
    let metrics = super::wait_http(base, "/metrics", 200, Duration::from_secs(5)).await;
    metrics
        .lines()
        .find(|l| l.starts_with("freshen_fanout_keys_total{view=\"account_mrr\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("fan-out metric missing:\n{metrics}"))
}
