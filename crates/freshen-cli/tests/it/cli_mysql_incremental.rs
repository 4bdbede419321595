//! `freshen check` and `freshen run` with `[source] kind = "mysql-incremental"` on a
//! real MariaDB: check says late commits are covered by the lookback only; a run keeps
//! a rollup equal to the truth by polling, and a SIGKILLed run resumes from its stored
//! cursors.

use crate::support;

use std::time::Duration;

use freshen_testenv::MariaDbServer;
use mysql_async::prelude::Queryable;
use serde_json::Value;
use support::*;

const SCHEMA: &str = "
    CREATE TABLE app.readings (id INT AUTO_INCREMENT PRIMARY KEY, device VARCHAR(20) NOT NULL,
      value INT NOT NULL,
      updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
      KEY (updated_at));
    CREATE TABLE app.rollup (device VARCHAR(20) PRIMARY KEY, n BIGINT NOT NULL, total BIGINT NOT NULL)";

const TRUTH: &str = "SELECT device, count(*), CAST(sum(value) AS SIGNED) FROM app.readings \
     GROUP BY device ORDER BY device";
const ROLLUP: &str = "SELECT device, n, total FROM app.rollup ORDER BY device";

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
kind = "mysql-incremental"
url = "{url}"
cursor = "updated_at"
poll_interval = "50ms"
lookback = "2s"

[http]
listen = "{http}"

[[views]]
name = "rollup"
watch = [{{ table = "app.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM app.rollup WHERE device = $1",
  "INSERT INTO app.rollup SELECT device, count(*), sum(value) FROM app.readings WHERE device = $1 GROUP BY device",
]
reconcile = {{ every = "1h", keys = "SELECT device FROM app.readings UNION SELECT device FROM app.rollup" }}
coalesce = "10ms"
max_wait = "100ms"
"#
    )
}

async fn rows(c: &mut mysql_async::Conn, sql: &str) -> Vec<(String, i64, i64)> {
    c.query(sql).await.unwrap()
}

/// Inserts and value updates over devices `d0..d5` (no deletes: polling cannot see
/// them).
async fn workload(c: &mut mysql_async::Conn, seed: &mut freshen::Jitter, n: usize) {
    let mut below = |m: u64| seed.below(m);
    for _ in 0..n {
        let sql = match below(3) {
            0 | 1 => format!(
                "INSERT INTO app.readings (device, value) VALUES ('d{}', {})",
                below(6),
                below(100)
            ),
            // Values only: a row moved to another device would leave the old device's
            // total stale (no former row), which only a sweep heals.
            // Witness rows (`w*`) are never touched.
            _ => format!(
                "UPDATE app.readings SET value = value + 1 WHERE device LIKE 'd%' AND id % 7 = {}",
                below(7)
            ),
        };
        c.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Polls until the rollup equals the truth.
async fn converge(c: &mut mysql_async::Conn) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (truth, rollup) = (rows(c, TRUTH).await, rows(c, ROLLUP).await);
        if truth == rollup {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rollup never equalled the truth:\ntruth  {truth:?}\nrollup {rollup:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_late_commits_are_covered_by_the_lookback_only() {
    let db = server();
    db.sql(SCHEMA).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&db.url("app"), "127.0.0.1:0"));
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    let f = doc["findings"].as_array().unwrap();
    let has = |level: &str, check: &str, needle: &str| {
        f.iter().any(|x| {
            x["level"] == level
                && x["check"] == check
                && x["message"].as_str().is_some_and(|m| m.contains(needle))
        })
    };
    assert_eq!(out.status.code(), Some(0), "{f:#?}");
    assert!(has("ok", "cursor", "pages by (updated_at, id)"), "{f:#?}");
    assert!(
        has("warning", "lookback", "within lookback = \"2s\" only"),
        "{f:#?}"
    );
    assert!(has("warning", "contract", "late commits"), "{f:#?}");
    assert!(
        has("warning", "contract", "deletes are not given"),
        "{f:#?}"
    );
    assert!(has("ok", "cursor_store", "will be created"), "{f:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_rollup_equals_the_truth_across_a_sigkill() {
    let db = server();
    db.sql(SCHEMA).unwrap();
    let mut c = mysql_async::Conn::from_url(db.url("app")).await.unwrap();
    let mut seed = freshen::Jitter::new(0x9e37_79b9_7f4a_7c15);
    workload(&mut c, &mut seed, 40).await;
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    // No reconcile sweep (not even at start): only polled rows, and after the restart
    // the stored cursor, can make the rollup right.
    let text = config(&db.url("app"), &format!("127.0.0.1:{http}"))
        .lines()
        .filter(|l| !l.starts_with("reconcile"))
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = write_config(dir.path(), &text);
    let base = format!("http://127.0.0.1:{http}");
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    workload(&mut c, &mut seed, 60).await;
    converge(&mut c).await;
    // Stored once the lookback has passed and the rebuilds are done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stored: Option<i64> = c
            .query_first(
                "SELECT count(*) FROM app.freshen_cursors WHERE source_table = 'app.readings'",
            )
            .await
            .unwrap();
        if stored == Some(1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cursor is never stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Witnesses just before the SIGKILL, never changed again: the cursor may or may not
    // have passed them, and only the stored cursor brings them after the restart.
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
    workload(&mut c, &mut seed, 60).await;
    let _run = spawn_run(dir.path(), &cfg, 2);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    converge(&mut c).await;
    assert_eq!(
        rows(
            &mut c,
            "SELECT device, n, total FROM app.rollup WHERE device LIKE 'w-kill-%' ORDER BY device"
        )
        .await,
        (0..5)
            .map(|i| (format!("w-kill-{i}"), 1, 10 + i))
            .collect::<Vec<_>>(),
        "the witnesses written just before the SIGKILL"
    );
    let log = log_of(dir.path(), 2);
    assert!(log.contains("resume=true"), "{log}");
}
