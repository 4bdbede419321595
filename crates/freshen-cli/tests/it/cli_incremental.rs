//! `freshen run` and `freshen check` with `[source] kind = "postgres-incremental"` on a
//! real PostgreSQL: derived == truth under random inserts and updates (with a
//! transaction held open across polls), a SIGKILLed run resuming from its stored cursor
//! without re-reading everything, and the capability table demonstrated — a delete is
//! really missed, and a reconcile sweep really heals it.

use crate::support;

use std::time::{Duration, Instant};

use support::*;
use tokio_postgres::Client;

const SCHEMA: &str = "
CREATE TABLE readings (id bigserial PRIMARY KEY, device text NOT NULL, value bigint NOT NULL,
                       updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON readings (updated_at);
CREATE TABLE plain_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE swept_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
";

const TRUTH: &str = "SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device";

fn view(name: &str, reconcile: &str) -> String {
    format!(
        r#"
[[views]]
name = "{name}"
watch = [{{ table = "public.readings", key = ["device"] }}]
{reconcile}
rebuild = [
  "DELETE FROM {name}_totals WHERE device = $1",
  "INSERT INTO {name}_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
]
"#
    )
}

fn config(url: &str, http: &str, views: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres-incremental"
url = "{url}"
cursor = "updated_at"
poll_interval = "50ms"
page_size = 100
lookback = "1s"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "500ms"
{views}
"#
    )
}

/// Rows in which `derived` and the truth differ.
async fn differences(c: &Client, derived: &str) -> i64 {
    let derived = format!("SELECT device, total, n FROM {derived}");
    c.query_one(
        &format!(
            "SELECT count(*) FROM (({derived} EXCEPT {TRUTH}) UNION ALL ({TRUTH} EXCEPT {derived})) d"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_equal(c: &Client, derived: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let d = differences(c, derived).await;
        if d == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{derived} never equalled the truth ({d} rows differ)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` transactions of inserts and value updates (each update moves `updated_at`);
/// every tenth runs while another transaction holds a write open, committed after the
/// others (its `updated_at` is earlier than theirs).
async fn workload(c: &mut Client, held: &Client, r: &mut Rng, n: usize) {
    for i in 0..n {
        if i % 10 == 0 {
            held.batch_execute(&format!(
                "BEGIN; INSERT INTO readings (device, value) VALUES ('d{}', {})",
                r.below(20),
                r.below(100)
            ))
            .await
            .unwrap();
        }
        let tx = c.transaction().await.unwrap();
        for _ in 0..=r.below(3) {
            let d = format!("d{}", r.below(20));
            let v = r.below(100) as i64;
            if r.below(3) == 0 {
                tx.execute(
                    "UPDATE readings SET value = $1, updated_at = now() \
                      WHERE id = (SELECT id FROM readings WHERE device = $2 ORDER BY id LIMIT 1)",
                    &[&v, &d],
                )
                .await
                .unwrap();
            } else {
                tx.execute(
                    "INSERT INTO readings (device, value) VALUES ($1, $2)",
                    &[&d, &v],
                )
                .await
                .unwrap();
            }
        }
        tx.commit().await.unwrap();
        if i % 10 == 9 {
            held.batch_execute("COMMIT").await.unwrap();
        }
    }
}

/// Waits until the stored cursor reaches the newest row.
async fn wait_stored(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let newest: String = c
            .query_one(
                "SELECT id::text FROM readings ORDER BY updated_at DESC, id DESC LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let stored: Option<Vec<String>> = c
            .query_opt(
                "SELECT position FROM freshen_cursors WHERE source_table = 'public.readings'",
                &[],
            )
            .await
            .ok()
            .flatten()
            .map(|r| r.get(0));
        if stored.as_ref().and_then(|p| p.get(1)) == Some(&newest) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cursor never reached row {newest}: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_equals_truth_and_a_sigkilled_run_resumes_from_its_stored_cursor() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    let held = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // Rows from before freshen: read once, from the table's start.
    c.batch_execute(
        "INSERT INTO readings (device, value) SELECT 'd' || (g % 20), g % 100 FROM generate_series(1, 3000) g",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), &format!("127.0.0.1:{port}"), &view("plain", "")),
    );
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    let mut r = Rng::new(7);
    workload(&mut c, &held, &mut r, 100).await;
    wait_equal(&c, "plain_totals", Duration::from_secs(60)).await;
    wait_stored(&c).await;
    let before: i64 = c
        .query_one("SELECT count(*) FROM readings", &[])
        .await
        .unwrap()
        .get(0);
    // Witnesses just before the SIGKILL, never changed again (the workload writes `d*`):
    // the cursor may or may not have passed them; no sweep can find them.
    for i in 0..5i64 {
        c.execute(
            "INSERT INTO readings (device, value) VALUES ($1, $2)",
            &[&format!("w-kill-{i}"), &(10 + i)],
        )
        .await
        .unwrap();
    }
    run.kill().unwrap();
    run.wait().unwrap();

    // Written while nothing polls, then after the restart.
    workload(&mut c, &held, &mut r, 50).await;
    let mut run = spawn_run(dir.path(), &cfg, 2);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    workload(&mut c, &held, &mut r, 50).await;
    wait_equal(&c, "plain_totals", Duration::from_secs(60)).await;
    let witnesses: i64 = c
        .query_one(
            "SELECT count(*) FROM plain_totals WHERE device LIKE 'w-kill-%' AND n = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        witnesses, 5,
        "the witnesses written just before the SIGKILL"
    );

    let status = freshen_cli::status::fetch(&base).await.expect("/status");
    assert_eq!(status.source.kind, "postgres-incremental");
    // Resumed from the stored cursor: the rows from before the kill are not read again.
    assert!(
        status.source.events > 0 && (status.source.events as i64) < before / 4,
        "the restarted run read {} rows; {before} existed at the kill",
        status.source.events
    );
    for v in &status.views {
        assert_eq!(v.rebuilds_failed, 0, "{v:?}");
    }
    run.kill().unwrap();
    let _ = run.wait();
    let log = log_of(dir.path(), 2);
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_is_missed_without_a_sweep_and_healed_by_one() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let views = view("plain", "")
        + &view(
            "swept",
            r#"reconcile = { every = "1s", keys = "SELECT device FROM readings UNION SELECT device FROM swept_totals" }"#,
        );
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), &format!("127.0.0.1:{port}"), &views),
    );

    // check: the capability table, per view.
    let out = freshen().args(["check", "-c"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a view without a sweep is an error: {text}"
    );
    let line = |level: &str, view: &str| {
        text.lines().any(|l| {
            l.starts_with(level)
                && l.contains(&format!("view {view}"))
                && l.contains("deletes")
                && l.contains("postgres-incremental")
        })
    };
    assert!(line("error", "plain"), "{text}");
    assert!(
        line("warning", "swept") && !line("error", "swept"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok cursor") && l.contains("updated_at")),
        "{text}"
    );

    c.batch_execute(
        "INSERT INTO readings (device, value) VALUES ('d1', 10), ('d1', 20), ('d2', 5)",
    )
    .await
    .unwrap();
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    wait_equal(&c, "plain_totals", Duration::from_secs(30)).await;
    wait_equal(&c, "swept_totals", Duration::from_secs(30)).await;

    c.batch_execute("DELETE FROM readings WHERE device = 'd1' AND value = 20")
        .await
        .unwrap();
    // A later row: once it shows, the source has polled past the delete.
    c.batch_execute("INSERT INTO readings (device, value) VALUES ('d3', 1)")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c
        .query_opt("SELECT 1 FROM plain_totals WHERE device = 'd3'", &[])
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "d3 never reached plain_totals");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The sweep heals its view ...
    wait_equal(&c, "swept_totals", Duration::from_secs(30)).await;
    let status = freshen_cli::status::fetch(&base).await.expect("/status");
    let swept = status.views.iter().find(|v| v.name == "swept").unwrap();
    assert!(swept.reconciles >= 1, "{swept:?}");
    // ... and the view without one still counts the deleted row: nothing told it.
    let plain: (i64, i64) = c
        .query_one("SELECT total, n FROM plain_totals WHERE device = 'd1'", &[])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(plain, (30, 2), "the delete is not seen by a cursor source");
    run.kill().unwrap();
    let _ = run.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_changefeed_replayed_by_key_equals_the_polled_table() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL,
                              updated_at timestamptz NOT NULL DEFAULT now());
         CREATE INDEX ON orders (updated_at);
         INSERT INTO orders (id, amount) SELECT g, g FROM generate_series(1, 50) g;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (free_port(), free_port());
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "postgres-incremental"
url = "{}"
cursor = "updated_at"
poll_interval = "50ms"
page_size = 16
lookback = "1s"

[source.tables."public.orders"]

[http]
listen = "127.0.0.1:{http}"

[changefeed]
path = "{}"

[changefeed.http]
listen = "127.0.0.1:{feed}"
"#,
            pg.url(),
            dir.path().join("feed.redb").display()
        ),
    );
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{http}"),
        "/healthz",
        200,
        Duration::from_secs(30),
    )
    .await;
    let mut r = Rng::new(11);
    for i in 0..60i64 {
        if i % 2 == 0 {
            c.execute(
                "INSERT INTO orders (id, amount) VALUES ($1, $2)",
                &[&(100 + i), &(r.below(1000) as i32)],
            )
            .await
            .unwrap();
        } else {
            c.execute(
                "UPDATE orders SET amount = $1, updated_at = now() WHERE id = $2",
                &[&(r.below(1000) as i32), &(1 + r.below(50) as i64)],
            )
            .await
            .unwrap();
        }
    }
    let truth: std::collections::BTreeMap<String, i64> = c
        .query("SELECT id::text, amount::int8 FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let base = format!("http://127.0.0.1:{feed}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = changefeed_events(&base).await;
        let mut replayed = std::collections::BTreeMap::new();
        for e in &events {
            assert_eq!(e["type"], "PUT", "a polled source only puts: {e}");
            let id = e["key"].as_str().unwrap().rsplit(':').next().unwrap();
            let doc: serde_json::Value =
                serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
            replayed.insert(id.to_owned(), doc["amount"].as_i64().unwrap());
        }
        if replayed == truth {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the log ({} events) replayed by key never equalled the table",
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_privileges_cursor_columns_indexes_and_primary_keys() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE good (id int PRIMARY KEY, device text NOT NULL, updated_at timestamptz NOT NULL);
         CREATE INDEX ON good (updated_at);
         CREATE TABLE loose (id int PRIMARY KEY, device text NOT NULL, updated_at timestamptz);
         CREATE TABLE nopk (id int, device text NOT NULL, updated_at timestamptz NOT NULL);
         CREATE TABLE other (id int PRIMARY KEY, device text NOT NULL, changed timestamptz NOT NULL);
         CREATE TABLE hidden (id int PRIMARY KEY, device text NOT NULL, updated_at timestamptz NOT NULL);
         CREATE TABLE totals (device text PRIMARY KEY, n bigint NOT NULL);
         CREATE ROLE reader LOGIN;
         GRANT SELECT ON good, loose, nopk, other, totals TO reader;
         GRANT INSERT, UPDATE, DELETE ON totals TO reader;
         CREATE SCHEMA cursors AUTHORIZATION reader;",
    )
    .await
    .unwrap();
    let url = pg.url().replacen("://postgres@", "://reader@", 1);
    assert_ne!(url, pg.url(), "the URL names its user: {}", pg.url());
    let views: String = ["good", "loose", "nopk", "other", "hidden"]
        .iter()
        .map(|t| {
            format!(
                r#"
[[views]]
name = "{t}_view"
watch = [{{ table = "public.{t}", key = ["device"] }}]
reconcile = {{ every = "10m", keys = "SELECT device FROM totals" }}
rebuild = ["DELETE FROM totals WHERE device = $1"]
"#
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let text = config(&url, "127.0.0.1:0", &views).replace(
        "lookback = \"1s\"",
        "lookback = \"0s\"\nstore_table = \"cursors.freshen_cursors\"",
    );
    let cfg = write_config(dir.path(), &text);
    let out = freshen().args(["check", "-c"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let has = |level: &str, check: &str, subject: &str, words: &str| {
        text.lines().any(|l| {
            l.starts_with(level)
                && l.split_whitespace().nth(1) == Some(check)
                && l.contains(subject)
                && l.contains(words)
        })
    };
    assert!(
        has("ok", "cursor", "public.good", "(updated_at, id)"),
        "{text}"
    );
    assert!(has("warning", "cursor", "public.loose", "NULL"), "{text}");
    assert!(
        has("warning", "cursor_index", "public.loose", "CREATE INDEX"),
        "{text}"
    );
    assert!(!has("warning", "cursor_index", "public.good", ""), "{text}");
    assert!(
        has("error", "cursor", "public.nopk", "primary key"),
        "{text}"
    );
    assert!(
        has("error", "cursor", "public.other", "\"updated_at\""),
        "{text}"
    );
    assert!(
        has("error", "privilege", "public.hidden", "GRANT SELECT"),
        "{text}"
    );
    assert!(
        has("ok", "cursor_store", "cursors.freshen_cursors", "created"),
        "{text}"
    );
    assert!(has("warning", "lookback", "", "0s"), "{text}");
    assert!(
        !text.contains("unwrap") && !text.contains("panicked"),
        "{text}"
    );

    // The cursor column per table fixes `other`; the privilege and the key stay errors.
    let fixed = std::fs::read_to_string(&cfg).unwrap().replace(
        "[http]",
        "[source.tables.\"public.other\"]\ncursor = \"changed\"\n\n[http]",
    );
    let cfg = write_config(dir.path(), &fixed);
    let out = freshen().args(["check", "-c"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(has_line(&text, "ok", "cursor", "public.other"), "{text}");
    assert!(
        !has_line(&text, "error", "cursor", "public.other"),
        "{text}"
    );
}

fn has_line(text: &str, level: &str, check: &str, subject: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with(level) && l.split_whitespace().nth(1) == Some(check) && l.contains(subject)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_waits_as_a_standby_and_takes_over() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    let held = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ports = [free_port(), free_port()];
    let bases = ports.map(|p| format!("http://127.0.0.1:{p}"));
    let cfgs = [0, 1].map(|i| {
        write_config(
            dirs[i].path(),
            &config(
                &pg.url(),
                &format!("127.0.0.1:{}", ports[i]),
                &view("plain", ""),
            ),
        )
    });
    let mut a = spawn_run(dirs[0].path(), &cfgs[0], 1);
    wait_http(&bases[0], "/healthz", 200, Duration::from_secs(30)).await;
    let _b = spawn_run(dirs[1].path(), &cfgs[1], 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = freshen_cli::status::fetch(&bases[1]).await
            && s.role == "standby"
        {
            let waits_for = s.standby_for.unwrap_or_default();
            assert!(
                waits_for.contains("postgres-incremental:freshen"),
                "{waits_for}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the second process never waited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut r = Rng::new(3);
    workload(&mut c, &held, &mut r, 40).await;
    // Never changed again: the standby finds them through the stored cursor or not at all.
    for i in 0..5i64 {
        c.execute(
            "INSERT INTO readings (device, value) VALUES ($1, $2)",
            &[&format!("w-takeover-{i}"), &(10 + i)],
        )
        .await
        .unwrap();
    }
    a.kill().unwrap();
    a.wait().unwrap();
    workload(&mut c, &held, &mut r, 40).await;
    wait_http(&bases[1], "/healthz", 200, Duration::from_secs(30)).await;
    wait_equal(&c, "plain_totals", Duration::from_secs(60)).await;
    let witnesses: i64 = c
        .query_one(
            "SELECT count(*) FROM plain_totals WHERE device LIKE 'w-takeover-%' AND n = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        witnesses, 5,
        "the witnesses written just before the SIGKILL"
    );
    let status = freshen_cli::status::fetch(&bases[1]).await.unwrap();
    assert_eq!(status.role, "active");
}
