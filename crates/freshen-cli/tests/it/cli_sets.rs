//! Set work against a real PostgreSQL: views given as plain queries, built whole at
//! their first start (writes racing the build), a backlog past the threshold
//! recomputed as the whole table, a fan-out to most of the table never expanded, a
//! failing key inside a large set, a whole run past its timeout or behind a lock, and
//! SIGKILLs during a first build and during a whole run — with witness rows and no
//! reconcile sweep, so a change lost at the fault stays lost.

use crate::support::*;

use std::time::Duration;

use freshen_testenv::refresher::eventually;
use serde_json::Value;
use tokio_postgres::Client;

const SCHEMA: &str = "
CREATE TABLE items (id int PRIMARY KEY, cid int NOT NULL, v int NOT NULL);
CREATE INDEX ON items (cid);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE totals (cid int PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL);
";

const TOTALS: &str = "SELECT cid, count(*) AS n, sum(v) AS total FROM items GROUP BY cid";

/// `items` rows `1..=n`, spread over `keys` keys.
async fn seed(c: &Client, n: i32, keys: i32) {
    c.execute(
        "INSERT INTO items SELECT g, g % $2, 1 + g % 7 FROM generate_series(1, $1) g",
        &[&n, &keys],
    )
    .await
    .unwrap();
    c.batch_execute("ANALYZE items").await.unwrap();
}

fn config(url: &str, http: &str, slot: &str, views: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "{slot}"
publication = "{slot}"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "300ms"
statement_timeout = "5s"

{views}
"#
    )
}

fn totals_view(extra: &str) -> String {
    format!("[[views]]\nname = \"totals\"\ninto = \"totals\"\nquery = \"{TOTALS}\"\n{extra}\n")
}

/// Rows of `table` that differ from `query`.
async fn differs(c: &Client, table: &str, query: &str) -> i64 {
    c.query_one(
        &format!(
            "SELECT count(*) FROM ((SELECT * FROM {table} EXCEPT ({query})) UNION ALL (({query}) EXCEPT SELECT * FROM {table})) d"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_table_equal(c: &Client, table: &str, query: &str, within: u64) {
    eventually(
        within,
        &format!("{table} to equal its query"),
        || async move { (differs(c, table, query).await == 0).then_some(()) },
    )
    .await;
}

/// The `paths` of view `name` in `/status`.
async fn paths(base: &str, name: &str) -> Value {
    let (_, body) = freshen_cli::status::get(base, "/status")
        .await
        .expect("/status");
    let doc: Value = serde_json::from_str(&body).expect("JSON");
    doc["views"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
        .cloned()
        .unwrap_or_default()
}

/// `paths` once view `name` has nothing waiting, running or recomputing.
async fn settled(base: &str, name: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..600 {
        last = paths(base, name).await;
        if n(&last, &["dirty"]) == 0
            && n(&last, &["in_flight"]) == 0
            && last["paths"]["running"].is_null()
        {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("view {name} never settled: {last}");
}

fn n(v: &Value, path: &[&str]) -> u64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_u64().unwrap_or(0)
}

/// A `freshen run` on `text`, healthy.
async fn start(dir: &std::path::Path, text: &str, n: u32, base: &str) -> Running {
    let cfg = write_config(dir, text);
    let run = spawn_run(dir, &cfg, n);
    wait_healthy(base, dir, n, Duration::from_secs(60)).await;
    run
}

/// A backend of view `view` waiting on a lock while it runs a statement starting with
/// `statement`.
async fn waits_on_lock(c: &Client, view: &str, statement: &str) -> bool {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
         AND wait_event_type = 'Lock' AND query LIKE $2",
        &[&format!("freshen {view}"), &format!("{statement}%")],
    )
    .await
    .unwrap()
    .get::<_, i64>(0)
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_table_is_built_whole_at_start_while_writes_race_the_build() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    seed(&c, 200_000, 20_000).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // Writers insert, move and delete rows before the build's snapshot and after it.
    let url = pg.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = connect(&url).await;
            let mut r = Rng::new(0x5e75);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (id, cid) = (1 + r.below(220_000) as i32, r.below(20_000) as i32);
                let sql = match r.below(3) {
                    0 => {
                        "INSERT INTO items VALUES ($1, $2, 3) ON CONFLICT (id) DO UPDATE SET v = items.v + 1"
                    }
                    1 => "UPDATE items SET cid = $2 WHERE id = $1",
                    _ => "DELETE FROM items WHERE id = $1 AND $2 >= 0",
                };
                c.execute(sql, &[&id, &cid]).await.unwrap();
                i += 1;
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_race",
        &totals_view(""),
    );
    let _run = start(dir.path(), &text, 1, &base).await;
    eventually(60, "the first build", || async {
        (n(&paths(&base, "totals").await, &["paths", "whole_runs"]) >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 50, "the writers raced the build ({writes} writes)");
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let v = paths(&base, "totals").await;
    assert_eq!(n(&v, &["reconciles"]), 0, "no sweep: {v}");
    assert!(
        n(&v, &["paths", "whole_written"]) >= 19_000,
        "built whole: {v}"
    );
    assert!(
        n(&v, &["paths", "per_key_calls"]) + n(&v, &["paths", "set_calls"]) > 0,
        "the racing writes rebuilt after the build: {v}"
    );
    let log = log_of(dir.path(), 1);
    assert!(log.contains("first build done"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_the_first_build_leaves_nothing_and_the_restart_builds_it() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    seed(&c, 50_000, 5_000).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_kill_build",
        &totals_view(""),
    );
    // The build is held at its INSERT, so it is surely running when killed: another
    // transaction inserted its first key and has not ended (its row is invisible to the
    // build, which waits on it at that key).
    // (The slot and the publication first: creating a slot waits for that transaction.)
    c.batch_execute(
        "SELECT pg_create_logical_replication_slot('sets_kill_build', 'pgoutput');
         CREATE PUBLICATION sets_kill_build FOR TABLE items;",
    )
    .await
    .unwrap();
    let mut locker = connect(&pg.url()).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("INSERT INTO totals VALUES (0, 0, 0)")
        .await
        .unwrap();
    let cfg = write_config(dir.path(), &text);
    let mut first = spawn_run(dir.path(), &cfg, 1);
    eventually(60, "the build waiting on the lock", || async {
        waits_on_lock(&c, "totals", "INSERT INTO")
            .await
            .then_some(())
    })
    .await;
    // Witness changes behind the build's snapshot, never changed again.
    c.batch_execute(
        "UPDATE items SET v = v + 100 WHERE id BETWEEN 1 AND 5;
         INSERT INTO items VALUES (900001, 99999, 5);",
    )
    .await
    .unwrap();
    first.kill().unwrap();
    first.wait().unwrap();
    lock.rollback().await.unwrap();
    eventually(60, "the killed run's backends gone", || async {
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'freshen totals'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (left == 0).then_some(())
    })
    .await;
    let rows: i64 = c
        .query_one("SELECT count(*) FROM totals", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing of the killed build committed");
    let _second = start(dir.path(), &text, 2, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let witness: i64 = c
        .query_one("SELECT count(*) FROM totals WHERE cid = 99999", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(witness, 1);
    let v = paths(&base, "totals").await;
    assert_eq!(n(&v, &["reconciles"]), 0, "no sweep: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_a_whole_run_replays_what_it_covered() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    seed(&c, 40_000, 4_000).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_kill_whole",
        &totals_view(""),
    );
    let mut first = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    // A reader holds the table: the whole run's TRUNCATE waits behind it.
    let mut reader = connect(&pg.url()).await;
    let read = reader.transaction().await.unwrap();
    read.query("SELECT 1 FROM totals LIMIT 1", &[])
        .await
        .unwrap();
    // Every key changes (past the threshold): only the whole run covers them, and
    // nothing changes them again after the kill.
    c.batch_execute("UPDATE items SET v = v + 1000")
        .await
        .unwrap();
    eventually(60, "the whole run waiting on the reader", || async {
        waits_on_lock(&c, "totals", "TRUNCATE").await.then_some(())
    })
    .await;
    let v = paths(&base, "totals").await;
    assert_eq!(v["paths"]["running"]["reason"], "backlog", "{v}");
    first.kill().unwrap();
    first.wait().unwrap();
    read.rollback().await.unwrap();
    let stale = differs(&c, "totals", TOTALS).await;
    assert!(stale > 0, "the killed run committed nothing");
    let _second = start(dir.path(), &text, 2, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 90).await;
    let v = paths(&base, "totals").await;
    assert_eq!(n(&v, &["reconciles"]), 0, "no sweep: {v}");
    let dupes: i64 = c
        .query_one("SELECT count(*) - count(DISTINCT cid) FROM totals", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(dupes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_backlog_stays_per_key_and_a_large_one_goes_whole() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    seed(&c, 40_000, 4_000).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_choice",
        &totals_view(""),
    );
    let _run = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let before = settled(&base, "totals").await;
    assert_eq!(
        n(&before, &["paths", "whole_runs"]),
        1,
        "the build: {before}"
    );
    assert_eq!(n(&before, &["paths", "table_rows"]), 4_000);
    let threshold = n(&before, &["paths", "whole_threshold"]);
    assert!((1000..=4000).contains(&threshold), "{before}");
    // Ten keys: per key.
    c.batch_execute("UPDATE items SET v = v + 1 WHERE cid < 10")
        .await
        .unwrap();
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let small = settled(&base, "totals").await;
    assert_eq!(n(&small, &["paths", "whole_runs"]), 1, "{small}");
    assert!(
        n(&small, &["paths", "per_key_calls"]) > n(&before, &["paths", "per_key_calls"]),
        "{small}"
    );
    // Every key: the whole table.
    c.batch_execute("UPDATE items SET v = v + 1").await.unwrap();
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let large = settled(&base, "totals").await;
    // The keys arrive batch by batch as the transaction is read: the first run starts
    // once the threshold's keys wait, and keys arriving during it may make another.
    let runs = n(&large, &["paths", "whole_runs"]);
    assert!(runs >= 2, "{large}");
    assert!(n(&large, &["paths", "whole_keys"]) >= threshold, "{large}");
    let (_, metrics) = freshen_cli::status::get(&base, "/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "freshen_rebuild_path_calls_total{{view=\"totals\",path=\"whole\"}} {runs}"
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_to_most_of_the_table_is_one_whole_run_never_expanded() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE plans (id int PRIMARY KEY, price int NOT NULL);
         CREATE TABLE subs (account int PRIMARY KEY, plan int NOT NULL REFERENCES plans, seats int NOT NULL);
         CREATE INDEX ON subs (plan);
         CREATE TABLE mrr (account int PRIMARY KEY, mrr bigint NOT NULL);
         INSERT INTO plans VALUES (1, 10), (2, 20);
         INSERT INTO subs SELECT g, CASE WHEN g % 10 = 0 THEN 2 ELSE 1 END, 1 + g % 3 FROM generate_series(1, 100000) g;
         ANALYZE subs, plans;",
    )
    .await
    .unwrap();
    let query = "SELECT s.account, sum(s.seats * p.price) AS mrr FROM subs s JOIN plans p ON p.id = s.plan GROUP BY s.account";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let view = format!("[[views]]\nname = \"mrr\"\ninto = \"mrr\"\nquery = \"{query}\"\n");
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_fanout",
        &view,
    );
    let _run = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "mrr", query, 60).await;
    // Plan 2 reaches a tenth of the accounts: expanded, set work.
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 2")
        .await
        .unwrap();
    wait_table_equal(&c, "mrr", query, 60).await;
    let small = settled(&base, "mrr").await;
    assert_eq!(
        n(&small, &["paths", "whole_runs"]),
        1,
        "the build alone: {small}"
    );
    // Plan 1 reaches nine tenths: one whole run, the fan-out never streams its keys.
    let fanned = |m: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with("freshen_fanout_keys_total{view=\"mrr\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0)
    };
    let (_, m) = freshen_cli::status::get(&base, "/metrics").await.unwrap();
    let keys_before = fanned(&m);
    assert!(
        keys_before >= 10_000,
        "plan 2's accounts were fanned: {keys_before}"
    );
    c.batch_execute("UPDATE plans SET price = price + 1 WHERE id = 1")
        .await
        .unwrap();
    wait_table_equal(&c, "mrr", query, 60).await;
    let large = settled(&base, "mrr").await;
    assert_eq!(n(&large, &["paths", "whole_runs"]), 2, "{large}");
    let (_, m) = freshen_cli::status::get(&base, "/metrics").await.unwrap();
    assert_eq!(fanned(&m), keys_before, "plan 1 was never expanded");
    assert!(log_of(dir.path(), 1).contains("for a fan-out covering"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_key_in_a_set_of_ten_thousand_is_the_only_one_quarantined() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, cid int NOT NULL, v int NOT NULL);
         CREATE INDEX ON items (cid);
         ALTER TABLE items REPLICA IDENTITY FULL;
         CREATE TABLE inverse (cid int PRIMARY KEY, inv int NOT NULL);",
    )
    .await
    .unwrap();
    seed(&c, 20_000, 10_000).await;
    let query = "SELECT cid, 1000 / min(v) AS inv FROM items GROUP BY cid";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let view = format!(
        "[[views]]\nname = \"inverse\"\ninto = \"inverse\"\nquery = \"{query}\"\npoison_after = 2\nrebuild_by = \"set\"\n"
    );
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_poison",
        &view,
    );
    let _run = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "inverse", query, 60).await;
    // Every key changes; one's data breaks the query (a division by zero).
    c.batch_execute("UPDATE items SET v = v + 1; UPDATE items SET v = 0 WHERE id = 4242;")
        .await
        .unwrap();
    let bad: i32 = c
        .query_one("SELECT cid FROM items WHERE id = 4242", &[])
        .await
        .unwrap()
        .get(0);
    eventually(120, "the one bad key quarantined", || async {
        let v = paths(&base, "inverse").await;
        (v["quarantined"].as_array().is_some_and(|q| !q.is_empty())).then_some(())
    })
    .await;
    let good = format!("SELECT * FROM ({query}) q WHERE cid <> {bad}");
    let rest = format!("SELECT * FROM inverse WHERE cid <> {bad}");
    wait_table_equal(&c, &format!("({rest}) r"), &good, 60).await;
    let v = settled(&base, "inverse").await;
    // The keys arrive as the transaction is read: a whole run when the threshold's keys
    // wait at once, set calls otherwise — either way the bad key fails a set first.
    let sets = n(&v, &["paths", "whole_failures"]) + n(&v, &["paths", "set_calls"]);
    assert!(sets > 0, "{v}");
    assert!(
        n(&v, &["paths", "whole_failures"]) <= 1,
        "no run tried again: {v}"
    );
    assert_eq!(v["quarantined"][0]["key"], bad.to_string(), "{v}");
    assert_eq!(v["quarantined"].as_array().map(Vec::len), Some(1), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_past_its_timeout_falls_back_and_a_locked_table_stalls_only_its_view() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute("CREATE TABLE counts (cid int PRIMARY KEY, n bigint NOT NULL);")
        .await
        .unwrap();
    seed(&c, 40_000, 4_000).await;
    let counts = "SELECT cid, count(*) AS n FROM items GROUP BY cid";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let views = format!(
        "{}[[views]]\nname = \"counts\"\ninto = \"counts\"\nquery = \"{counts}\"\n",
        totals_view("whole_timeout = \"1500ms\"\nstatement_timeout = \"1s\"")
    );
    let text = config(
        &pg.url(),
        &format!("127.0.0.1:{port}"),
        "sets_timeout",
        &views,
    );
    let _run = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    // A lock holds totals past the whole run's timeout: the run fails (its lock wait is
    // cut by the view's statement_timeout), set work takes over and stalls on the lock
    // in turn, reported; counts goes on.
    let mut reader = connect(&pg.url()).await;
    let read = reader.transaction().await.unwrap();
    read.batch_execute("LOCK TABLE totals IN SHARE MODE")
        .await
        .unwrap();
    c.batch_execute("UPDATE items SET v = v + 1, cid = (cid + 1) % 4000 WHERE id % 2 = 0")
        .await
        .unwrap();
    eventually(60, "the whole run to fail", || async {
        (n(&paths(&base, "totals").await, &["paths", "whole_failures"]) >= 1).then_some(())
    })
    .await;
    wait_table_equal(&c, "counts", counts, 60).await;
    let (code, health) = freshen_cli::status::get(&base, "/healthz").await.unwrap();
    assert_eq!(code, 503, "{health}");
    assert!(health.contains("view totals"), "{health}");
    assert!(!health.contains("view counts"), "{health}");
    read.rollback().await.unwrap();
    wait_table_equal(&c, "totals", TOTALS, 90).await;
    wait_http(&base, "/healthz", 200, Duration::from_secs(60)).await;
    let v = paths(&base, "totals").await;
    assert!(
        n(&v, &["paths", "set_calls"]) + n(&v, &["paths", "per_key_calls"]) > 0,
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_querys_sweep_is_one_whole_diff_at_start_and_after_a_truncate() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    seed(&c, 20_000, 2_000).await;
    // The table drifted while freshen was away: three rows wrong, one that should not
    // be there, the rest right.
    c.batch_execute(&format!(
        "INSERT INTO totals {TOTALS};
         UPDATE totals SET total = total + 1 WHERE cid IN (1, 2, 3);
         INSERT INTO totals VALUES (99999, 1, 1);"
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let view = totals_view("reconcile = { every = \"1h\" }");
    let text = config(&pg.url(), &format!("127.0.0.1:{port}"), "sets_sweep", &view);
    let _run = start(dir.path(), &text, 1, &base).await;
    wait_table_equal(&c, "totals", TOTALS, 60).await;
    let v = settled(&base, "totals").await;
    assert_eq!(n(&v, &["reconciles"]), 1, "the start-up sweep: {v}");
    assert_eq!(
        n(&v, &["paths", "whole_written"]),
        4,
        "only what differed: {v}"
    );
    // A TRUNCATE of the source: the sweep it asks for empties the table, as a diff.
    c.batch_execute("TRUNCATE items").await.unwrap();
    eventually(60, "the table emptied", || {
        let c = &c;
        async move {
            let n: i64 = c
                .query_one("SELECT count(*) FROM totals", &[])
                .await
                .unwrap()
                .get(0);
            (n == 0).then_some(())
        }
    })
    .await;
    let v = settled(&base, "totals").await;
    assert_eq!(n(&v, &["reconciles"]), 2, "{v}");
    assert_eq!(n(&v, &["sweep_rebuilds"]), 0, "no key was listed: {v}");
    let log = log_of(dir.path(), 1);
    assert_eq!(log.matches("for a sweep").count(), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_written_set_statements_serve_a_backlog_and_per_key_ones_a_trickle() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute("ALTER TABLE totals ADD COLUMN by text NOT NULL DEFAULT ''")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // Each way marks the rows it writes; the set statements write only what differs.
    let view = r#"
[[views]]
name = "totals"
watch = [ { table = "items", key = ["cid"] } ]
rebuild = [
  "DELETE FROM totals WHERE cid = $1",
  "INSERT INTO totals SELECT cid, count(*), sum(v), 'key' FROM items WHERE cid = $1 GROUP BY cid",
]
rebuild_set = [
  "DELETE FROM totals t WHERE t.cid = ANY($1) AND NOT EXISTS (SELECT 1 FROM items i WHERE i.cid = t.cid)",
  """INSERT INTO totals SELECT cid, count(*), sum(v), 'set' FROM items WHERE cid = ANY($1) GROUP BY cid
     ON CONFLICT (cid) DO UPDATE SET n = excluded.n, total = excluded.total, by = excluded.by
     WHERE (totals.n, totals.total) IS DISTINCT FROM (excluded.n, excluded.total)""",
]
"#;
    let text = config(&pg.url(), &format!("127.0.0.1:{port}"), "sets_sql", view);
    let _run = start(dir.path(), &text, 1, &base).await;
    let rows = "(SELECT cid, n, total FROM totals) AS t";
    // A backlog of 20 000 keys in one transaction (past a set call's 10 000): set calls.
    seed(&c, 60_000, 20_000).await;
    wait_table_equal(&c, rows, TOTALS, 60).await;
    let backlog = settled(&base, "totals").await;
    assert!(n(&backlog, &["paths", "set_calls"]) > 0, "{backlog}");
    let by_set: i64 = c
        .query_one("SELECT count(*) FROM totals WHERE by = 'set'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        by_set > 2_000,
        "most keys written by the set statements: {by_set}"
    );
    // Three keys: the per-key statements, the set statements untouched.
    c.batch_execute("UPDATE items SET v = v + 1 WHERE cid IN (1, 2, 3)")
        .await
        .unwrap();
    wait_table_equal(&c, rows, TOTALS, 60).await;
    let trickle = settled(&base, "totals").await;
    assert_eq!(
        n(&trickle, &["paths", "set_calls"]),
        n(&backlog, &["paths", "set_calls"]),
        "{trickle}"
    );
    let by_key: Vec<i32> = c
        .query(
            "SELECT cid FROM totals WHERE by = 'key' AND cid IN (1, 2, 3) ORDER BY cid",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(by_key, [1, 2, 3]);
    let (_, metrics) = freshen_cli::status::get(&base, "/metrics").await.unwrap();
    assert!(
        metrics.contains("freshen_rebuild_path_calls_total{view=\"totals\",path=\"set\"}"),
        "{metrics}"
    );
}
