//! A real browser: headless Chromium opens a page whose `EventSource` reads the
//! changefeed (cross-origin, through CORS), reports each event back to the test, and
//! resumes — with `Last-Event-ID`, by itself — after the changefeed server restarts.
//!
//! Needs Chromium: `scripts/test-deps-browser` installs Debian's `chromium`; set
//! `FRESHEN_CHROMIUM` to use another binary. A missing browser fails the test.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::get;
use support::*;

const PAGE: &str = r#"<!doctype html>
<html><body><ul id="log"></ul><script>
const report = (m) => fetch('/report?m=' + encodeURIComponent(m));
let last = 0;
const es = new EventSource(FEED);
es.onopen = () => report('open');
es.onerror = () => report('error ' + es.readyState);
es.onmessage = (e) => {
  const id = Number(e.lastEventId);
  const ev = JSON.parse(e.data);
  if (id !== last + 1 || ev.sequence !== id) report('gap ' + id + ' after ' + last);
  last = id;
  report('event ' + id + ' ' + ev.key);
};
</script></body></html>"#;

type Reports = Arc<Mutex<Vec<String>>>;

async fn page_server(feed: String) -> (std::net::SocketAddr, Reports, tokio::task::JoinHandle<()>) {
    let reports: Reports = Arc::default();
    let html = PAGE.replace("FEED", &format!("{feed:?}"));
    let app = axum::Router::new()
        .route("/", get(move || async move { Html(html) }))
        .route(
            "/report",
            get(
                |State(r): State<Reports>, Query(q): Query<BTreeMap<String, String>>| async move {
                    r.lock()
                        .unwrap()
                        .push(q.get("m").cloned().unwrap_or_default());
                    ""
                },
            ),
        )
        .with_state(reports.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, reports, task)
}

/// Event ids the page reported, with how often each.
fn events(reports: &Reports) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for r in reports.lock().unwrap().iter() {
        if let Some(rest) = r.strip_prefix("event ") {
            let id: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            *out.entry(id).or_default() += 1;
        }
    }
    out
}

async fn wait_for_events(reports: &Reports, upto: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !(1..=upto).all(|id| events(reports).contains_key(&id)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the browser did not report events 1..={upto}: {:?}",
            reports.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_source_in_chromium_receives_events_and_resumes_after_a_restart() {
    let browser = freshen_testenv::browser::chromium().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.cors_allow_origins = vec!["*".into()];
    let mut server = Server::start(&cfg).await;
    let feed = server.url("/changefeed/stream?retry_ms=200&heartbeat_ms=1000");
    let (page, reports, page_task) = page_server(feed).await;

    let profile = tempfile::tempdir().unwrap();
    let mut chrome = tokio::process::Command::new(&browser)
        .args(freshen_testenv::browser::HEADLESS_FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://{page}/"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", browser.display()));

    server.cf.append(&orders(1, 5)).await.unwrap();
    wait_for_events(&reports, 5).await;

    // The server goes away and comes back on the same port; the browser reconnects on
    // its own and resumes after the last id it saw.
    server = server.restart(&cfg).await;
    server.cf.append(&orders(6, 5)).await.unwrap();
    wait_for_events(&reports, 10).await;

    let seen = events(&reports);
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    assert!(seen.values().all(|n| *n == 1), "every event once: {seen:?}");
    let log = reports.lock().unwrap().clone();
    assert!(
        !log.iter().any(|r| r.starts_with("gap")),
        "in order, resumed exactly: {log:?}"
    );
    assert!(
        log.iter().filter(|r| *r == "open").count() >= 2,
        "reconnected: {log:?}"
    );

    // Stop the browser (its helper processes follow it), then the servers.
    let _ = chrome.start_kill();
    let _ = chrome.wait().await;
    page_task.abort();
    server.stop().await;
}
