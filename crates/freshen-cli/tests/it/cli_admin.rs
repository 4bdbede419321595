//! `/admin` against a real PostgreSQL: a key quarantined by its data is listed with its
//! error and re-admitted once the data is fixed (a fix the view never sees as a change);
//! a key rebuilt on request; a sweep started on request heals what no change would.

use crate::support;

use std::time::Duration;

use support::*;

const PATIENCE: Duration = Duration::from_secs(30);

/// `device_totals` fails (22012) for a device listed in `blocked`, a table no view
/// watches; `site_totals` has no reconcile.
fn config(url: &str, http: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_admin"
publication = "freshen_admin"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
poison_after = 1
backoff = {{ base = "50ms", max = "200ms" }}

[[views]]
name = "device_totals"
watch = [{{ table = "public.readings", key = ["device"] }}]
reconcile = {{ every = "1h", keys = "SELECT device FROM readings UNION SELECT device FROM device_totals" }}
rebuild = [
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) / (CASE WHEN EXISTS (SELECT 1 FROM blocked b WHERE b.device = $1) THEN 0 ELSE 1 END) FROM readings WHERE device = $1 GROUP BY device",
]

[[views]]
name = "site_totals"
watch = [{{ table = "readings", key = ["site"] }}, {{ table = "sites", key = ["id"] }}]
rebuild = [
  "DELETE FROM site_totals WHERE site = $1",
  "INSERT INTO site_totals SELECT s.id, s.region, coalesce(sum(r.value), 0), count(r.id) FROM sites s LEFT JOIN readings r ON r.site = s.id WHERE s.id = $1 GROUP BY s.id, s.region",
]
"#
    )
}

async fn admin(base: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    freshen_cli::status::request(base, method, path, None, body)
        .await
        .unwrap()
}

async fn device_total(c: &tokio_postgres::Client, device: &str) -> Option<i64> {
    c.query_opt(
        "SELECT total FROM device_totals WHERE device = $1",
        &[&device],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

async fn poll<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + PATIENCE;
    while !cond().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lists_and_readmits_quarantined_keys_rebuilds_keys_and_starts_sweeps() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(
        "CREATE TABLE blocked (device text PRIMARY KEY);
         INSERT INTO blocked VALUES ('d3');
         INSERT INTO readings (device, site, value) VALUES ('d1', 's1', 5), ('d2', 's2', 7);",
    )
    .await
    .unwrap();
    let started = run_healthy(|http| config(&pg.url(), http), None).await;
    let base = &started.base;

    // d3's rebuild fails by its data: quarantined after one failure, listed with its error.
    c.execute(
        "INSERT INTO readings (device, site, value) VALUES ('d3', 's3', 11)",
        &[],
    )
    .await
    .unwrap();
    poll("d3 quarantined", || async {
        let (_, body) = admin(base, "GET", "/admin/views/device_totals/quarantined", None).await;
        body.contains("\"d3\"")
    })
    .await;
    let (code, listed) = admin(base, "GET", "/admin/views/device_totals/quarantined", None).await;
    assert_eq!(code, 200, "{listed}");
    let q: Vec<freshen_cli::admin::QuarantinedKey> = serde_json::from_str(&listed).unwrap();
    assert_eq!(q.len(), 1, "{listed}");
    assert_eq!(q[0].key, serde_json::json!("d3"));
    assert!(q[0].error.contains("22012"), "{listed}");
    assert_eq!(device_total(&c, "d3").await, None);

    // Fixed where no view looks: only a re-admission rebuilds it.
    c.execute("DELETE FROM blocked", &[]).await.unwrap();
    let (code, body) = admin(
        base,
        "POST",
        "/admin/views/device_totals/readmit",
        Some(r#"{"key": "d3"}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""readmitted":["d3"]"#), "{body}");
    poll("d3 rebuilt", || async {
        device_total(&c, "d3").await == Some(11)
    })
    .await;
    let (_, body) = admin(base, "GET", "/admin/views/device_totals/quarantined", None).await;
    assert_eq!(body, "[]");

    // A derived row damaged by hand: a rebuild on request repairs it.
    c.execute(
        "UPDATE device_totals SET total = -1 WHERE device = 'd1'",
        &[],
    )
    .await
    .unwrap();
    let (code, body) = admin(
        base,
        "POST",
        "/admin/views/device_totals/rebuild",
        Some(r#"{"keys": ["d1"]}"#),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    poll("d1 repaired", || async {
        device_total(&c, "d1").await == Some(5)
    })
    .await;

    // Every derived row damaged: a sweep on request repairs them all.
    c.execute("UPDATE device_totals SET total = -1", &[])
        .await
        .unwrap();
    let (code, body) = admin(base, "POST", "/admin/views/device_totals/sweep", None).await;
    assert_eq!(code, 202, "{body}");
    poll("every device repaired", || async {
        let bad: i64 = c
            .query_one("SELECT count(*) FROM device_totals WHERE total < 0", &[])
            .await
            .unwrap()
            .get(0);
        bad == 0
    })
    .await;
    let log = log_of(started.dir.path(), 1);
    assert!(log.contains("sweep requested over /admin"), "{log}");

    // What cannot be done says why.
    for (method, path, body, want) in [
        ("POST", "/admin/views/nope/sweep", None, 404),
        ("POST", "/admin/views/site_totals/sweep", None, 409),
        (
            "POST",
            "/admin/views/device_totals/rebuild",
            Some(r#"{"key": "d1"}"#),
            400,
        ),
        (
            "POST",
            "/admin/views/device_totals/rebuild",
            Some(r#"{"keys": [[]]}"#),
            400,
        ),
        (
            "POST",
            "/admin/views/device_totals/readmit",
            Some("{}"),
            400,
        ),
    ] {
        let (code, text) = admin(base, method, path, body).await;
        assert_eq!(code, want, "{method} {path} {body:?}: {text}");
        assert!(text.contains("\"error\""), "{text}");
    }
    // site_totals has no sweep: only the sites that changed are there, and right.
    let d = differences(&c).await;
    assert_eq!(d[0], ("device_totals", 0), "{d:?}");
}
