//! The status page in a real browser: headless Chromium loads `GET /` of a running
//! `freshen run`, its script polls `/status` and `/healthz`, and the numbers it renders
//! are the instance's — and move when the workload does.
//!
//! Needs Chromium (`scripts/test-deps-browser` installs Debian's `chromium`).

use crate::support;

use std::time::Duration;

use support::*;

/// The text of the `<td data-field="{field}">` in the row of `view`.
fn view_field(dom: &str, view: &str, field: &str) -> String {
    let row = dom
        .split(&format!("<tr data-view=\"{view}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no row for {view} in:\n{dom}"));
    let row = &row[..row.find("</tr>").expect("the row ends")];
    let cell = row
        .split(&format!("data-field=\"{field}\">"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} for {view} in: {row}"));
    cell[..cell.find('<').expect("the cell ends")].to_owned()
}

fn element_text<'a>(dom: &'a str, id: &str) -> &'a str {
    let rest = dom
        .split(&format!("id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no #{id} in:\n{dom}"));
    let rest = &rest[rest.find('>').expect("tag ends") + 1..];
    &rest[..rest.find('<').expect("text ends")]
}

async fn page(base: &str) -> String {
    let url = format!("{base}/");
    tokio::task::spawn_blocking(move || freshen_testenv::browser::dump_dom(&url, 7000))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_the_instances_live_numbers_in_chromium() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let started = run_healthy(|http| config(&pg.url(), http), None).await;
    let base = &started.base;
    let mut r = Rng::new(7);
    workload(&mut c, &mut r, 60).await;
    wait_equal(&c, Duration::from_secs(60)).await;

    let dom = page(base).await;
    let status = freshen_cli::status::fetch(base).await.unwrap();
    assert_eq!(element_text(&dom, "health"), "healthy", "{dom}");
    assert_eq!(
        element_text(&dom, "version"),
        env!("CARGO_PKG_VERSION"),
        "{dom}"
    );
    let samples: u32 = element_text(&dom, "samples").parse().unwrap();
    assert!(samples >= 2, "the page polls: {samples} samples");
    for v in &status.views {
        let shown: u64 = view_field(&dom, &v.name, "rebuilds_ok").parse().unwrap();
        // Nothing changed since the page read it: the same figure.
        assert_eq!(shown, v.rebuilds_ok, "{}", v.name);
        assert_eq!(view_field(&dom, &v.name, "dirty"), v.dirty.to_string());
        assert!(shown > 0, "{}", v.name);
    }
    assert!(dom.contains("data-points=\""), "sparklines drawn: {dom}");
    let before: u64 = view_field(&dom, "device_totals", "rebuilds_ok")
        .parse()
        .unwrap();

    // The workload moves on; a fresh look shows it.
    workload(&mut c, &mut r, 60).await;
    wait_equal(&c, Duration::from_secs(60)).await;
    let dom = page(base).await;
    let after: u64 = view_field(&dom, "device_totals", "rebuilds_ok")
        .parse()
        .unwrap();
    assert!(after > before, "{before} then {after}");
    let streaming = dom.contains("<td data-field=\"state\">streaming</td>");
    assert!(streaming, "{dom}");

    // The page is self-contained: nothing it loads comes from elsewhere.
    let (code, html) = freshen_cli::status::get(base, "/").await.unwrap();
    assert_eq!(code, 200);
    for outside in ["src=", "href=", "url(", "@import", "https://", "cdn"] {
        assert!(!html.contains(outside), "the page references {outside}");
    }
}
