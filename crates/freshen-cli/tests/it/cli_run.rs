//! `freshen run` as a process against a real PostgreSQL: two views (one over two
//! tables), a randomized workload, SIGKILL and restart, metrics, graceful stop, drop.

use crate::support;

use std::time::Duration;

use support::*;

fn sigterm(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_equal_truth_across_a_sigkill_and_restart() {
    let pg = freshen_testenv::PgServer::builder()
        .password("s3cret-pw")
        .start()
        .expect("a throwaway PostgreSQL (apt-get install postgresql-15)");
    let mut c = connect(&pg.url()).await;
    // No view sweeps, not even at start: every row, the sites included, reaches the
    // views through the slot, and so must the witnesses after the kill.
    c.batch_execute(TABLES).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &without_sweeps(&config(&pg.url(), &format!("127.0.0.1:{port}"))),
    );

    let mut first = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    c.batch_execute(SITES).await.unwrap();
    let mut r = Rng::new(0x5eed);
    workload(&mut c, &mut r, 150).await;
    // Witnesses, never changed again: no view sweeps, so only the slot can bring them
    // back.
    witness(&c, "kill", 5).await;
    // No graceful shutdown, no final feedback: whatever was not rebuilt and acknowledged
    // must come again from the slot.
    first.kill().unwrap();
    first.wait().unwrap();
    workload(&mut c, &mut r, 100).await;

    let mut second = spawn_run(dir.path(), &cfg, 2);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    workload(&mut c, &mut r, 100).await;
    wait_equal(&c, Duration::from_secs(60)).await;
    assert_witnesses(&c, &["kill"], 5).await;
    assert_no_sweep_ran(&base).await;

    let metrics = wait_http(&base, "/metrics", 200, Duration::from_secs(5)).await;
    for needle in [
        "freshen_rebuilds_total{view=\"device_totals\",outcome=\"ok\"}",
        "freshen_rebuilds_total{view=\"site_totals\",outcome=\"ok\"}",
        "freshen_freshness_lag_seconds_count{view=\"device_totals\"}",
        "freshen_source_streaming{kind=\"postgres\"} 1",
        "freshen_dirty_keys{view=\"site_totals\"}",
    ] {
        assert!(
            metrics.contains(needle),
            "no {needle} in /metrics:\n{metrics}"
        );
    }
    let status = freshen_cli::status::fetch(&base).await.unwrap();
    assert!(status.source.streaming);
    assert_eq!(status.views.len(), 2);
    assert!(status.views.iter().all(|v| v.rebuilds_ok > 0), "{status:?}");
    // Every way to name the instance: a URL, host:port, the config's `[http] listen`,
    // and the `freshen.toml` of the working directory (the config is written as one).
    let cfg_path = cfg.to_str().unwrap();
    let hostport = base.trim_start_matches("http://");
    for args in [
        &["status", "--url", &base][..],
        &["status", hostport],
        &["status", &base],
        &["status", "-c", cfg_path],
        &["status"],
    ] {
        let shown = freshen()
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(shown.status.success(), "freshen {args:?}: {shown:?}");
        assert!(
            String::from_utf8_lossy(&shown.stdout).contains("site_totals"),
            "freshen {args:?}: {shown:?}"
        );
    }

    sigterm(&second);
    let code = second.wait().unwrap();
    assert!(
        code.success(),
        "graceful stop exits 0; log:\n{}",
        log_of(dir.path(), 2)
    );
    assert!(log_of(dir.path(), 2).contains("stopped cleanly"));
    for n in [1, 2] {
        assert!(
            !log_of(dir.path(), n).contains("s3cret-pw"),
            "a secret reached the log"
        );
    }

    let dropped = freshen().args(["drop", "-c"]).arg(&cfg).output().unwrap();
    assert!(
        dropped.status.success(),
        "{}",
        String::from_utf8_lossy(&dropped.stderr)
    );
    let out = String::from_utf8_lossy(&dropped.stdout);
    assert!(out.contains("slot freshen_test: dropped"), "{out}");
    assert!(out.contains("publication freshen_test: dropped"), "{out}");
    let slots: i64 = c
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "no slot retains WAL after drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_unavailable_until_the_source_streams() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = config(&pg.url(), &format!("127.0.0.1:{port}"));
    let cfg = write_config(dir.path(), &text);
    let mut child = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    // The server goes away: freshen stops streaming, says so, and reconnects.
    let mut pg = pg;
    pg.kill().unwrap();
    let body = wait_http(&base, "/healthz", 503, Duration::from_secs(30)).await;
    assert!(body.starts_with("unavailable"), "{body}");
    pg.start_again().unwrap();
    wait_http(&base, "/healthz", 200, Duration::from_secs(60)).await;
    let metrics = wait_http(&base, "/metrics", 200, Duration::from_secs(5)).await;
    let reconnects = metrics
        .lines()
        .find(|l| l.starts_with("freshen_source_reconnects_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap();
    assert!(reconnects >= 1, "{metrics}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_cannot_be_scoped_is_warned_about_and_counted() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // The default identity: a DELETE carries only the id, not the device.
    c.batch_execute("ALTER TABLE readings REPLICA IDENTITY DEFAULT")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(dir.path(), &config(&pg.url(), &format!("127.0.0.1:{port}")));
    let mut child = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    c.batch_execute("INSERT INTO readings (device, site, value) VALUES ('d1', 's1', 5)")
        .await
        .unwrap();
    c.batch_execute("DELETE FROM readings WHERE device = 'd1'")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = freshen_cli::status::fetch(&base).await.unwrap();
        let v = s.views.iter().find(|v| v.name == "device_totals").unwrap();
        if v.unscoped == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never counted: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = wait_http(&base, "/metrics", 200, Duration::from_secs(5)).await;
    assert!(
        metrics.contains("freshen_events_unscoped_total{view=\"device_totals\"} 1"),
        "{metrics}"
    );
    sigterm(&child);
    assert!(child.wait().unwrap().success());
    let log = log_of(dir.path(), 1);
    // Warned at start in `check`'s words: one advice, the cheapest fix's statements.
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let advice = findings(&out)
        .into_iter()
        .find(|f| f["check"] == "replica_identity" && f["subject"] == "public.readings")
        .expect("check's replica_identity finding");
    assert_eq!(advice["level"], "warning", "{advice}");
    let advice = advice["message"].as_str().unwrap();
    assert!(
        advice.contains("REPLICA IDENTITY USING INDEX"),
        "the cheapest fix: {advice}"
    );
    assert!(
        log.contains(advice),
        "run warned as check does:\n{advice}\n{log}"
    );
    assert!(
        log.contains("carried no value for the view's key columns"),
        "{log}"
    );
}
