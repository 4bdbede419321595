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
    assert!(dom.contains("data-points=\""), "charts drawn: {dom}");
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

/// The `data-{attr}` of the element whose opening tag holds `marker`.
fn attr(dom: &str, marker: &str, attr: &str) -> String {
    let rest = dom
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no {marker} in:\n{dom}"));
    let tag = &rest[..rest.find('>').expect("the tag ends")];
    let value = tag
        .split(&format!("data-{attr}=\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no data-{attr} in {tag}"));
    value[..value.find('"').expect("the value ends")].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_fits_1280_pixels_with_three_long_named_views_and_charts_from_the_first_samples() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // Three views; two with names far longer than a column.
    let long = [
        "device_totals_for_every_device_in_every_region_recomputed_on_change",
        "site_totals_with_their_region_kept_fresh_from_readings_and_sites",
    ];
    let started = run_healthy(
        |http| {
            let mut text = config(&pg.url(), http);
            for (name, key) in long.iter().zip(["device", "site"]) {
                text.push_str(&format!(
                    "\n[[views]]\nname = \"{name}\"\nwatch = [{{ table = \"public.readings\", key = [\"{key}\"] }}]\nrebuild = [\"SELECT $1::text\"]\n"
                ));
            }
            text
        },
        None,
    )
    .await;
    let base = started.base.clone();
    let url = format!("{base}/");
    // About three samples: the charts must already draw lines across, not dots.
    let dom = tokio::task::spawn_blocking(move || {
        freshen_testenv::browser::dump_dom_at(&url, 5000, (1280, 900))
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(attr(&dom, "<body", "width"), "1280", "the window's width");
    assert_eq!(
        attr(&dom, "<body", "overflow"),
        "false",
        "wider than 1280 px"
    );
    for name in long {
        assert!(dom.contains(&format!("<tr data-view=\"{name}\"")), "{name}");
        let card = format!("<div class=\"card\" data-view=\"{name}\"");
        assert!(dom.contains(&card), "its charts: {name}");
    }
    let samples: u32 = element_text(&dom, "samples").parse().unwrap();
    assert!(samples >= 2, "{samples} samples");
    // Every chart spans most of its width from the second sample on.
    let spreads: Vec<f64> = dom
        .split("data-spread=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
        .collect();
    // The source's lag and every view's waiting keys (a view with nothing rebuilt in the
    // last minute has no freshness to draw).
    assert!(
        spreads.len() >= 5,
        "1 source + 1 per view at least: {spreads:?}"
    );
    assert!(
        spreads.iter().all(|s| *s >= 150.0),
        "lines, not dots: {spreads:?}"
    );
}
