//! `freshen health`, the container's health check: exit 0 while a real `freshen run`
//! says healthy, 1 with the reasons once its source is gone, 1 when nothing listens.

use crate::support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_healthz_of_a_running_instance() {
    let mut pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let url = pg.url();
    let started = run_healthy(|listen| config(&url, listen), None).await;

    let ok = freshen()
        .args(["health", "--url", &started.base])
        .output()
        .unwrap();
    assert!(ok.status.success(), "healthy instance: {ok:?}");

    // The source's server goes away: /healthz turns 503, and so does the health check.
    drop(c);
    pg.stop().expect("stop PostgreSQL");
    wait_http(&started.base, "/healthz", 503, Duration::from_secs(60)).await;
    let bad = freshen()
        .args(["health", "--url", &started.base])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "unhealthy instance: {bad:?}");
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(
        why.contains("/healthz answered 503")
            && why.contains("unavailable:")
            && why.contains("source: "),
        "{why}"
    );
}

#[test]
fn health_fails_when_nothing_listens() {
    let base = format!("http://127.0.0.1:{}", free_port());
    let out = freshen().args(["health", "--url", &base]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{out:?}"
    );
}
