//! A schema change that breaks a view's key (its key column dropped) pauses that view
//! only — reported in the log, `/status` and `/healthz` — while another view over the
//! same table goes on; adding the column back resumes it, and every derived table ends
//! equal to its truth.

use crate::support;

use std::time::{Duration, Instant};

use support::*;

/// The shared schema's two views; `device_totals` sweeps keys of both the source and
/// the derived table, so a key that vanished while it was paused is found too.
fn config(url: &str, http: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_schema"
publication = "freshen_schema"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "500ms"

[[views]]
name = "device_totals"
watch = [{{ table = "readings", key = ["device"] }}]
reconcile = {{ every = "1h", keys = "SELECT device FROM readings WHERE device IS NOT NULL UNION SELECT device FROM device_totals" }}
rebuild = [
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
]

[[views]]
name = "site_totals"
watch = [{{ table = "readings", key = ["site"] }}, {{ table = "sites", key = ["id"] }}]
reconcile = {{ every = "1h", keys = "SELECT id FROM sites" }}
rebuild = [
  "DELETE FROM site_totals WHERE site = $1",
  "INSERT INTO site_totals SELECT s.id, s.region, coalesce(sum(r.value), 0), count(r.id) FROM sites s LEFT JOIN readings r ON r.site = s.id WHERE s.id = $1 GROUP BY s.id, s.region",
]
"#
    )
}

/// Rows of `site_totals` that differ from its truth (the device view's truth cannot be
/// computed while its column is gone).
async fn site_differences(c: &tokio_postgres::Client) -> i64 {
    let (_, derived, truth) = TRUTH[1];
    let sql = format!(
        "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
    );
    c.query_one(&sql, &[]).await.expect("compare").get(0)
}

/// Polls `/status` until `cond` holds for the view named `view`, or fails after 30 s.
async fn until_view(
    started: &Started,
    view: &str,
    what: &str,
    cond: impl Fn(&freshen_cli::ViewStatus) -> bool,
) -> freshen_cli::ViewStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = freshen_cli::status::fetch(&started.base).await
            && let Some(v) = s.views.into_iter().find(|v| v.name == view)
            && cond(&v)
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for: {what}\n{}",
            log_of(started.dir.path(), 1)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_key_column_pauses_its_view_only_until_it_is_back() {
    let pg = start_pg();
    let url = pg.url();
    let c = connect(&url).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(
        "INSERT INTO readings (device, site, value) \
         SELECT 'd' || (g % 4), 's' || (g % 10), g FROM generate_series(1, 40) g",
    )
    .await
    .unwrap();
    let started = run_healthy(|http| config(&url, http), None).await;
    let base = &started.base;
    wait_equal(&c, Duration::from_secs(30)).await;

    // The device column goes; the next change to the table shows it to the source.
    c.batch_execute(
        "CREATE TABLE kept AS SELECT id, device FROM readings; \
         ALTER TABLE readings DROP COLUMN device; \
         INSERT INTO readings (site, value) VALUES ('s1', 1000);",
    )
    .await
    .unwrap();
    let paused = until_view(&started, "device_totals", "device_totals paused", |v| {
        !v.paused.is_empty()
    })
    .await;
    assert_eq!(paused.paused, ["public.readings: column device dropped"]);
    assert!(paused.schema_changes >= 1);

    // The other view over the same table goes on: s1 is rebuilt with the new reading.
    let deadline = Instant::now() + Duration::from_secs(30);
    while site_differences(&c).await != 0 {
        assert!(Instant::now() < deadline, "site_totals never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let site = until_view(&started, "site_totals", "site_totals saw the change", |v| {
        v.schema_changes >= 1
    })
    .await;
    assert!(site.paused.is_empty(), "{:?}", site.paused);
    // The pause is a problem a health check sees, and a log line says what broke.
    let body = wait_http(base, "/healthz", 503, Duration::from_secs(10)).await;
    assert!(body.contains("column device dropped"), "{body}");
    let log = log_of(started.dir.path(), 1);
    assert!(
        log.contains("paused") && log.contains("column device dropped"),
        "{log}"
    );
    // Paused, not failing: nothing was rebuilt with the broken key.
    let before = until_view(&started, "device_totals", "status", |_| true).await;
    assert_eq!(before.rebuilds_failed, 0);
    assert!(before.unacked_batches >= 1, "its changes stay unconfirmed");

    // The column is back with its type; its values are restored by changes to the rows.
    c.batch_execute(
        "ALTER TABLE readings ADD COLUMN device text; \
         UPDATE readings r SET device = coalesce((SELECT k.device FROM kept k WHERE k.id = r.id), 'd-new');",
    )
    .await
    .unwrap();
    until_view(&started, "device_totals", "device_totals resumed", |v| {
        v.paused.is_empty()
    })
    .await;
    wait_equal(&c, Duration::from_secs(30)).await;
    wait_http(base, "/healthz", 200, Duration::from_secs(10)).await;
    let log = log_of(started.dir.path(), 1);
    assert!(log.contains("resumed"), "{log}");
    let device_total: i64 = c
        .query_one(
            "SELECT total FROM device_totals WHERE device = 'd-new'",
            &[],
        )
        .await
        .expect("the reading made while paused is counted")
        .get(0);
    assert_eq!(device_total, 1000);
}
