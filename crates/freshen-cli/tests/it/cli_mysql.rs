//! `freshen check` and `freshen run` with `[source] kind = "mysql"` on a real MariaDB:
//! the binlog source, rebuilds and a reconcile sweep run on MariaDB from one TOML file;
//! a SIGKILLed run resumes from its stored position and loses nothing.

use crate::support;

use std::time::Duration;

use freshen_testenv::MariaDbServer;
use mysql_async::prelude::Queryable;
use support::*;

const SCHEMA: &str = "
    CREATE TABLE app.readings (id INT AUTO_INCREMENT PRIMARY KEY, device VARCHAR(20) NOT NULL, value INT NOT NULL);
    CREATE TABLE app.rollup (device VARCHAR(20) PRIMARY KEY, n BIGINT NOT NULL, total BIGINT NOT NULL);
    CREATE TABLE app.peaks (device VARCHAR(20) PRIMARY KEY, top INT NOT NULL)";

/// The rollup of devices the workload writes (`d*`) and of witness devices (`w*`,
/// written once before a fault and never again): no reconcile sweep keeps it, so only
/// captured changes can make it right.
const ROLLUP_TRUTH: &str = "SELECT device, count(*), CAST(sum(value) AS SIGNED) FROM app.readings \
     WHERE device LIKE 'd%' OR device LIKE 'w%' GROUP BY device ORDER BY device";
const ROLLUP: &str = "SELECT device, n, total FROM app.rollup ORDER BY device";
/// Every device's peak, including the rows written before freshen first started: only
/// the start-up sweep can find those.
const PEAKS_TRUTH: &str =
    "SELECT device, max(value), 0 FROM app.readings GROUP BY device ORDER BY device";
const PEAKS: &str = "SELECT device, top, 0 FROM app.peaks ORDER BY device";

fn server() -> MariaDbServer {
    let db = MariaDbServer::start()
        .unwrap_or_else(|e| panic!("MariaDB for this test (apt-get install mariadb-server): {e}"));
    db.sql("CREATE DATABASE app").unwrap();
    db
}

fn config(url: &str, http: &str) -> String {
    format!(
        r#"
[source]
kind = "mysql"
url = "{url}"
name = "cli"
tables = ["app.readings"]
position_interval_ms = 20
heartbeat_ms = 100

[http]
listen = "{http}"

[[views]]
name = "rollup"
watch = [{{ table = "app.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM app.rollup WHERE device = $1",
  "INSERT INTO app.rollup SELECT device, count(*), sum(value) FROM app.readings WHERE device = $1 GROUP BY device",
]
coalesce = "10ms"
max_wait = "100ms"

[[views]]
name = "peaks"
watch = [{{ table = "app.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM app.peaks WHERE device = $1",
  "INSERT INTO app.peaks SELECT device, max(value) FROM app.readings WHERE device = $1 GROUP BY device",
]
reconcile = {{ every = "1h", keys = "SELECT device FROM app.readings UNION SELECT device FROM app.peaks" }}
coalesce = "10ms"
max_wait = "100ms"
"#
    )
}

async fn conn(db: &MariaDbServer) -> mysql_async::Conn {
    mysql_async::Conn::from_url(db.url("app"))
        .await
        .expect("connect for SQL")
}

async fn rows(c: &mut mysql_async::Conn, sql: &str) -> Vec<(String, i64, i64)> {
    c.query(sql).await.unwrap()
}

/// `txs` transactions over devices `d0..d7`: inserts, moves between devices, value
/// changes, deletes.
async fn workload(c: &mut mysql_async::Conn, seed: &mut freshen::Jitter, txs: usize) {
    let mut below = |n: u64| seed.below(n);
    for _ in 0..txs {
        let dev = below(8);
        let k = below(11);
        let sql = match below(10) {
            0..=4 => format!(
                "INSERT INTO app.readings (device, value) VALUES ('d{dev}', {}), ('d{}', {})",
                below(100),
                below(8),
                below(100)
            ),
            5..=6 => format!(
                "UPDATE app.readings SET device = 'd{dev}' WHERE device LIKE 'd%' AND id % 11 = {k}"
            ),
            7..=8 => format!(
                "UPDATE app.readings SET value = value + 1 WHERE device LIKE 'd%' AND id % 11 = {k}"
            ),
            _ => format!("DELETE FROM app.readings WHERE device LIKE 'd%' AND id % 13 = {k}"),
        };
        c.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Polls until both derived tables equal their truth three times in a row.
async fn converge(c: &mut mysql_async::Conn) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut stable = 0;
    while stable < 3 {
        let (rt, r) = (rows(c, ROLLUP_TRUTH).await, rows(c, ROLLUP).await);
        let (pt, p) = (rows(c, PEAKS_TRUTH).await, rows(c, PEAKS).await);
        if rt == r && pt == p {
            stable += 1;
        } else {
            stable = 0;
            assert!(
                tokio::time::Instant::now() < deadline,
                "derived tables never equalled the truth:\nrollup truth {rt:?}\nrollup       {r:?}\npeaks truth  {pt:?}\npeaks        {p:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_the_mysql_source_and_its_statements() {
    let db = server();
    let mut c = conn(&db).await;
    c.query_drop(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = write_config(dir.path(), &config(&db.url("app"), "127.0.0.1:0"));
    let out = freshen().args(["check", "-c"]).arg(&good).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("view rollup"), "{text}");

    let bad = config(&db.url("app"), "127.0.0.1:0").replace(
        "INSERT INTO app.peaks SELECT",
        "INSERT INTO app.peakz SELECT",
    );
    let bad = write_config(dir.path(), &bad);
    let out = freshen().args(["check", "-c"]).arg(&bad).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("error") && l.contains("view peaks") && l.contains("peakz")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_run_resumes_from_its_stored_position() {
    let db = server();
    let mut c = conn(&db).await;
    c.query_drop(SCHEMA).await.unwrap();
    // Written before freshen ever ran: only the peaks view's start-up sweep sees them.
    c.query_drop(
        "INSERT INTO app.readings (device, value) VALUES ('old1', 5), ('old1', 9), ('old2', 3)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &config(&db.url("app"), &format!("127.0.0.1:{port}")),
    );
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;

    let mut seed = freshen::Jitter::new(0x9e37_79b9_7f4a_7c15);
    workload(&mut c, &mut seed, 80).await;
    // Witnesses, one transaction each, never changed again (the workload writes `d*`).
    for i in 0..5 {
        c.query_drop(format!(
            "INSERT INTO app.readings (device, value) VALUES ('w-kill-{i}', {})",
            10 + i
        ))
        .await
        .unwrap();
    }
    run.kill().unwrap();
    run.wait().unwrap();
    // Changes while nothing captures: the stored position brings them back.
    workload(&mut c, &mut seed, 80).await;
    let mut run = spawn_run(dir.path(), &cfg, 2);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    workload(&mut c, &mut seed, 40).await;
    converge(&mut c).await;
    let witnesses = rows(
        &mut c,
        "SELECT device, n, total FROM app.rollup WHERE device LIKE 'w-kill-%' ORDER BY device",
    )
    .await;
    assert_eq!(
        witnesses,
        (0..5)
            .map(|i| (format!("w-kill-{i}"), 1, 10 + i))
            .collect::<Vec<_>>(),
        "the witnesses written just before the SIGKILL"
    );

    let status = freshen_cli::status::fetch(&base).await.expect("/status");
    assert_eq!(status.source.kind, "mysql");
    assert!(status.source.events > 0, "{:?}", status.source);
    for v in &status.views {
        assert_eq!(v.rebuilds_failed, 0, "{v:?}");
        assert!(v.rebuilds_ok > 0, "{v:?}");
    }
    let peaks = status.views.iter().find(|v| v.name == "peaks").unwrap();
    assert!(peaks.reconciles >= 1, "{peaks:?}");
    run.kill().unwrap();
    let _ = run.wait();
    let log = log_of(dir.path(), 2);
    assert!(!log.contains("panicked"), "{log}");
}

/// The log replayed by key (a PUT sets the row, a DELETE removes it), as `id → value`.
fn replay(events: &[serde_json::Value]) -> std::collections::BTreeMap<i64, i64> {
    let mut rows = std::collections::BTreeMap::new();
    for e in events {
        let key = e["key"].as_str().unwrap();
        let id: i64 = key.rsplit(':').next().unwrap().parse().unwrap();
        match e["type"].as_str().unwrap() {
            "PUT" => {
                let doc: serde_json::Value =
                    serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
                rows.insert(id, doc["value"].as_i64().unwrap());
            }
            "DELETE" => {
                rows.remove(&id);
            }
            other => panic!("unexpected event type {other}"),
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_changefeed_logs_mysql_changes_and_replays_to_the_table() {
    let db = server();
    let mut c = conn(&db).await;
    c.query_drop(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed_port) = (free_port(), free_port());
    let base = format!("http://127.0.0.1:{feed_port}");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "mysql"
url = "{}"
name = "feed"
tables = ["app.readings"]
position_interval_ms = 20

[http]
listen = "127.0.0.1:{http}"

[changefeed]
path = "{}"

[changefeed.http]
listen = "127.0.0.1:{feed_port}"
"#,
            db.url("app"),
            dir.path().join("feed.redb").display()
        ),
    );
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{http}"),
        "/healthz",
        200,
        Duration::from_secs(30),
    )
    .await;
    let mut seed = freshen::Jitter::new(0x2545_f491_4f6c_dd1d);
    workload(&mut c, &mut seed, 60).await;
    run.kill().unwrap();
    run.wait().unwrap();
    workload(&mut c, &mut seed, 60).await;
    let _run = spawn_run(dir.path(), &cfg, 2);
    wait_http(
        &format!("http://127.0.0.1:{http}"),
        "/healthz",
        200,
        Duration::from_secs(30),
    )
    .await;
    workload(&mut c, &mut seed, 30).await;

    let truth: std::collections::BTreeMap<i64, i64> = c
        .query::<(i64, i64), _>("SELECT id, value FROM app.readings")
        .await
        .unwrap()
        .into_iter()
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let events = changefeed_events(&base).await;
        let replayed = replay(&events);
        if replayed == truth {
            assert!(
                events
                    .iter()
                    .all(|e| e["key"].as_str().unwrap().starts_with("readings:")
                        || e["key"].as_str().unwrap().starts_with("app.readings:")),
                "{:?}",
                events.first()
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log replayed by key never equalled the table: {} events, {} rows replayed, {} in the table",
            events.len(),
            replayed.len(),
            truth.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A dimension table on MariaDB: a plan's price change fans out through
/// `subscriptions` to every account on the plan (no reconcile sweep: only the fan-out
/// can make the view right), across a SIGKILL and restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_change_fans_out_to_its_accounts_on_mariadb() {
    let db = server();
    let mut c = conn(&db).await;
    c.query_drop(
        "CREATE TABLE app.plans (id INT PRIMARY KEY, price INT NOT NULL);
         CREATE TABLE app.subs (id INT AUTO_INCREMENT PRIMARY KEY, account BIGINT NOT NULL, plan_id INT NOT NULL);
         CREATE TABLE app.mrr (account BIGINT PRIMARY KEY, total BIGINT NOT NULL);
         INSERT INTO app.plans VALUES (1, 10), (2, 20), (3, 30)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "mysql"
url = "{}"
name = "fanout"
position_interval_ms = 20

[http]
listen = "127.0.0.1:{port}"

[[views]]
name = "mrr"
watch = [
  {{ table = "app.subs", key = ["account"] }},
  {{ table = "app.plans", key = ["id"], keys = "SELECT account FROM app.subs WHERE plan_id = $1" }},
]
rebuild = [
  "DELETE FROM app.mrr WHERE account = $1",
  "INSERT INTO app.mrr SELECT s.account, sum(p.price) FROM app.subs s JOIN app.plans p ON p.id = s.plan_id WHERE s.account = $1 GROUP BY s.account",
]
coalesce = "10ms"
max_wait = "100ms"
"#,
            db.url("app")
        ),
    );
    const TRUTH: &str = "SELECT s.account, CAST(sum(p.price) AS SIGNED), 0 FROM app.subs s JOIN app.plans p ON p.id = s.plan_id GROUP BY s.account ORDER BY 1";
    const DERIVED: &str = "SELECT account, total, 0 FROM app.mrr ORDER BY 1";
    let out = freshen().args(["check", "-c"]).arg(&cfg).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(&base, dir.path(), 1, Duration::from_secs(30)).await;
    let mut seed = freshen::Jitter::new(0x5eed);
    let mut below = move |n: u64| seed.below(n);
    let step = |i: u64, below: &mut dyn FnMut(u64) -> u64| match below(4) {
        0 | 1 => format!(
            "INSERT INTO app.subs (account, plan_id) VALUES ({}, {})",
            below(40),
            1 + below(3)
        ),
        2 => format!(
            "UPDATE app.plans SET price = price + {} WHERE id = {}",
            1 + i % 5,
            1 + below(3)
        ),
        // Witness accounts (1000 and up, on plan 100) are never touched.
        _ => format!(
            "UPDATE app.subs SET plan_id = {} WHERE account < 1000 AND id % 7 = {}",
            1 + below(3),
            below(7)
        ),
    };
    // Witness accounts on a plan of their own, built before the fault.
    c.query_drop(
        "INSERT INTO app.plans VALUES (100, 50); INSERT INTO app.subs (account, plan_id) VALUES (1000, 100), (1001, 100), (1002, 100)",
    )
    .await
    .unwrap();
    for i in 0..120 {
        c.query_drop(step(i, &mut below)).await.unwrap();
    }
    // Just before the SIGKILL, and never again: the witness plan's price changes (only
    // the fan-out reaches its accounts) and two more witness accounts subscribe.
    c.query_drop("UPDATE app.plans SET price = 77 WHERE id = 100")
        .await
        .unwrap();
    c.query_drop("INSERT INTO app.subs (account, plan_id) VALUES (1003, 100), (1004, 100)")
        .await
        .unwrap();
    run.kill().unwrap();
    run.wait().unwrap();
    for i in 120..160 {
        c.query_drop(step(i, &mut below)).await.unwrap();
    }
    let _run = spawn_run(dir.path(), &cfg, 2);
    wait_healthy(&base, dir.path(), 2, Duration::from_secs(30)).await;
    for i in 160..200 {
        c.query_drop(step(i, &mut below)).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut stable = 0;
    while stable < 3 {
        let (t, d) = (rows(&mut c, TRUTH).await, rows(&mut c, DERIVED).await);
        if t == d {
            stable += 1;
        } else {
            stable = 0;
            assert!(
                tokio::time::Instant::now() < deadline,
                "mrr never equalled the truth:\ntruth   {t:?}\nderived {d:?}\n{}",
                log_of(dir.path(), 2)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rows(
            &mut c,
            "SELECT CAST(account AS CHAR), total, 0 FROM app.mrr WHERE account >= 1000 ORDER BY account"
        )
        .await,
        (1000..1005)
            .map(|a| (a.to_string(), 77, 0))
            .collect::<Vec<_>>(),
        "the witness accounts carry the price changed just before the SIGKILL"
    );
    let status = freshen_cli::status::fetch(&base).await.unwrap();
    let v = &status.views[0];
    assert_eq!(v.rebuilds_failed, 0, "{v:?}");
}

/// A derived table locked on MariaDB stalls only its own view: its rebuilds are cut off
/// by the view's `statement_timeout` (MariaDB's `max_statement_time`) and retried as
/// failures of the path, reported and never quarantined, while the other view keeps up;
/// once the lock goes, it catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_derived_table_on_mariadb_stalls_only_its_own_view() {
    let db = server();
    let mut c = conn(&db).await;
    c.query_drop(SCHEMA).await.unwrap();
    let text = |http: &str| {
        config(&db.url("app"), http).replace(
            "max_wait = \"100ms\"\n",
            "max_wait = \"100ms\"\nstatement_timeout = \"1s\"\nbackoff = { base = \"50ms\", max = \"300ms\" }\n",
        )
    };
    let Started {
        dir,
        base,
        run: _run,
    } = run_healthy(text, None).await;
    let mut seed = freshen::Jitter::new(0x10c4);
    workload(&mut c, &mut seed, 30).await;
    converge(&mut c).await;

    let mut locker = conn(&db).await;
    locker
        .query_drop("LOCK TABLES app.rollup WRITE")
        .await
        .unwrap();
    workload(&mut c, &mut seed, 60).await;
    // The other view keeps up (reading app.rollup would wait for the lock too).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while rows(&mut c, PEAKS).await != rows(&mut c, PEAKS_TRUTH).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "peaks waited for rollup's lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = wait_http(&base, "/healthz", 503, Duration::from_secs(30)).await;
    assert!(
        health.contains("rollup") && !health.contains("peaks"),
        "/healthz names only the stalled view: {health}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = freshen_cli::status::fetch(&base).await.expect("/status");
        let timed_out = s.views.iter().any(|v| {
            v.name == "rollup" && v.last_error.as_deref().is_some_and(|e| e.contains("1969"))
        });
        if timed_out {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no rebuild was cut off by max_statement_time: {s:?}\n{}",
            log_of(dir.path(), 1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for v in &s.views {
        assert_eq!(v.poisoned, 0, "a timeout never quarantines: {v:?}");
    }
    locker.query_drop("UNLOCK TABLES").await.unwrap();
    converge(&mut c).await;
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
}
