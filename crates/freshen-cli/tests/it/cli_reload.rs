//! Live reload against a real PostgreSQL, under load: SIGHUP adds a view (its table is
//! added to freshen's publication, its start-up sweep fills it), then removes one; a
//! view without a sweep stays equal to truth across both reloads, so nothing was
//! confirmed before it was rebuilt; an unchanged view skips the start-up sweep; a file
//! with problems is refused whole (SIGHUP and `POST /admin/reload`) and the running
//! configuration goes on.

use crate::support;

use std::time::Duration;

use support::*;

const PATIENCE: Duration = Duration::from_secs(60);

const DEVICE_TOTALS: &str = r#"
[[views]]
name = "device_totals"
watch = [{ table = "public.readings", key = ["device"] }]
rebuild = [
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
]
"#;

const SITE_TOTALS: &str = r#"
[[views]]
name = "site_totals"
watch = [{ table = "readings", key = ["site"] }, { table = "sites", key = ["id"] }]
reconcile = { every = "1h", keys = "SELECT id FROM sites" }
rebuild = [
  "DELETE FROM site_totals WHERE site = $1",
  "INSERT INTO site_totals SELECT s.id, s.region, coalesce(sum(r.value), 0), count(r.id) FROM sites s LEFT JOIN readings r ON r.site = s.id WHERE s.id = $1 GROUP BY s.id, s.region",
]
"#;

fn config(url: &str, http: &str, views: &[&str]) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_reload"
publication = "freshen_reload"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "500ms"
{}"#,
        views.concat()
    )
}

fn sighup(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

async fn differs(c: &tokio_postgres::Client, table: &str) -> i64 {
    let d = differences(c).await;
    d.iter().find(|(t, _)| *t == table).unwrap().1
}

async fn wait_view_equal(c: &tokio_postgres::Client, table: &str) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while differs(c, table).await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{table} never equal to truth"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_log(dir: &std::path::Path, needle: &str, count: usize) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let log = log_of(dir, 1);
        if log.matches(needle).count() >= count {
            return log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {needle:?} in:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn view_names(base: &str) -> Vec<String> {
    freshen_cli::status::fetch(base)
        .await
        .map(|s| s.views.into_iter().map(|v| v.name).collect())
        .unwrap_or_default()
}

/// Runs `n` workload transactions on a connection of its own.
fn load(url: String, seed: u64, n: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = connect(&url).await;
        let mut r = Rng::new(seed);
        for _ in 0..n / 10 {
            workload(&mut c, &mut r, 10).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_adds_and_removes_views_under_load_and_refuses_a_bad_file() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let base = format!("http://{http}");
    let cfg = write_config(dir.path(), &config(&pg.url(), &http, &[DEVICE_TOTALS]));
    let run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, PATIENCE).await;
    load(pg.url(), 1, 100).await.unwrap();
    wait_view_equal(&c, "device_totals").await;
    let published = "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'freshen_reload' AND tablename = 'sites'";
    assert_eq!(
        c.query_one(published, &[]).await.unwrap().get::<_, i64>(0),
        0
    );

    // Add a view while writers run.
    let writers = load(pg.url(), 2, 300);
    write_config(
        dir.path(),
        &config(&pg.url(), &http, &[DEVICE_TOTALS, SITE_TOTALS]),
    );
    sighup(run.id());
    let log = wait_log(dir.path(), "reload applied", 1).await;
    assert!(log.contains("added: site_totals"), "{log}");
    writers.await.unwrap();
    wait_http(&base, "/healthz", 200, PATIENCE).await;
    wait_view_equal(&c, "site_totals").await;
    wait_view_equal(&c, "device_totals").await;
    assert_eq!(
        c.query_one(published, &[]).await.unwrap().get::<_, i64>(0),
        1
    );
    assert_eq!(view_names(&base).await, ["device_totals", "site_totals"]);

    // A file with problems: refused whole, by SIGHUP and over /admin; nothing stops.
    std::fs::write(&cfg, "[source]\nkind = \"postgres\"\n[[views]]\nname = 1\n").unwrap();
    sighup(run.id());
    wait_log(dir.path(), "reload (SIGHUP) refused", 1).await;
    let (code, body) = freshen_cli::status::request(&base, "POST", "/admin/reload", None, None)
        .await
        .unwrap();
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("the running one goes on"), "{body}");
    assert!(body.contains("problem"), "{body}");
    assert_eq!(view_names(&base).await, ["device_totals", "site_totals"]);

    // Remove a view, again under load; the one left is unchanged, so no start-up sweep.
    let writers = load(pg.url(), 3, 200);
    write_config(dir.path(), &config(&pg.url(), &http, &[SITE_TOTALS]));
    let (code, body) = freshen_cli::status::request(&base, "POST", "/admin/reload", None, None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""removed":["device_totals"]"#), "{body}");
    assert!(body.contains(r#""unchanged":["site_totals"]"#), "{body}");
    wait_log(dir.path(), "reload applied", 2).await;
    writers.await.unwrap();
    wait_view_equal(&c, "site_totals").await;
    let deadline = std::time::Instant::now() + PATIENCE;
    while view_names(&base).await != ["site_totals"] {
        assert!(
            std::time::Instant::now() < deadline,
            "device_totals never left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = freshen_cli::status::fetch(&base).await.unwrap();
    assert_eq!(
        status.views[0].reconciles, 0,
        "an unchanged view skips the start-up sweep"
    );
    drop(run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_the_database_is_down_waits_for_it() {
    let mut pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{http}");
    let cfg = write_config(dir.path(), &config(&pg.url(), &http, &[DEVICE_TOTALS]));
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, PATIENCE).await;
    load(pg.url(), 11, 60).await.unwrap();
    wait_view_equal(&c, "device_totals").await;
    drop(c);

    // The database goes away, then a new file arrives: neither the new configuration
    // nor the one before can start. The process waits and tries again.
    pg.stop().unwrap();
    write_config(
        dir.path(),
        &config(&pg.url(), &http, &[DEVICE_TOTALS, SITE_TOTALS]),
    );
    sighup(run.id());
    wait_log(dir.path(), "cannot start the pipeline again", 1).await;
    assert!(
        matches!(run.try_wait(), Ok(None)),
        "an outage during a reload ended the process:\n{}",
        log_of(dir.path(), 1)
    );

    // Back: the newest configuration runs, and everything written is rebuilt.
    pg.start_again().unwrap();
    let c = connect(&pg.url()).await;
    load(pg.url(), 12, 60).await.unwrap();
    wait_http(&base, "/healthz", 200, PATIENCE).await;
    let deadline = std::time::Instant::now() + PATIENCE;
    while view_names(&base).await != ["device_totals", "site_totals"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the reloaded configuration never ran:\n{}",
            log_of(dir.path(), 1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_view_equal(&c, "device_totals").await;
    wait_view_equal(&c, "site_totals").await;
    assert!(matches!(run.try_wait(), Ok(None)));
}
