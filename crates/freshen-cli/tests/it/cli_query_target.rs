//! Query mode with a separate `[target]` database, against two real PostgreSQL clusters:
//! the query runs on the source, its rows are written into the target (inserted, updated
//! only where they differ, deleted when the query no longer returns their key), values
//! cast to the target's column types; `check` compares the query with the target table
//! in the target database.

use crate::support;

use serde_json::Value;
use support::*;
use tokio_postgres::Client;

const SOURCE: &str = "
CREATE TABLE readings (id bigserial PRIMARY KEY, device int NOT NULL, value bigint NOT NULL);
ALTER TABLE readings REPLICA IDENTITY FULL;
CREATE INDEX ON readings (device);
";

/// The target's types differ from the query's where an assignment cast exists (bigint →
/// numeric); `label` carries text that needs quoting in an array literal, or NULL.
const TARGET: &str = "
CREATE TABLE device_totals (
    device int PRIMARY KEY,
    total numeric(20, 0) NOT NULL,
    n bigint NOT NULL,
    label text
);
";

const QUERY: &str = "SELECT device, sum(value) AS total, count(*) AS n, \
     CASE WHEN device % 3 = 0 THEN NULL ELSE 'dev \"' || device || '\", {x}\\' END AS label \
     FROM readings WHERE device = ANY($1) GROUP BY device";

fn config(source: &str, target: &str, query: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{source}"
slot = "freshen_test"
publication = "freshen_test"

[target]
url = "{target}"

[http]
listen = "off"

[defaults]
coalesce = "20ms"
max_wait = "500ms"

[[views]]
name = "device_totals"
watch = [{{ table = "readings", key = ["device"] }}]
into = "device_totals"
query = {query:?}
"#
    )
}

/// The target's rows and the query's truth on the source, as text rows.
async fn rows(c: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let mut out: Vec<Vec<Option<String>>> = c
        .query(sql, &[])
        .await
        .expect("read rows")
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.get::<_, Option<String>>(i))
                .collect()
        })
        .collect();
    out.sort();
    out
}

const TRUTH: &str = "SELECT device::text, sum(value)::text, count(*)::text, \
     CASE WHEN device % 3 = 0 THEN NULL ELSE 'dev \"' || device || '\", {x}\\' END \
     FROM readings GROUP BY device";
const DERIVED: &str = "SELECT device::text, total::text, n::text, label FROM device_totals";

fn findings(out: &std::process::Output) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    doc["findings"].as_array().expect("findings").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reads_the_source_and_writes_another_database() {
    let src = start_pg();
    let dst = start_pg();
    let s = connect(&src.url()).await;
    let t = connect(&dst.url()).await;
    s.batch_execute(SOURCE).await.unwrap();
    t.batch_execute(TARGET).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&src.url(), &dst.url(), QUERY));

    // check: the query is compared with the table in the target database.
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let f = findings(&out);
    assert!(
        f.iter().any(|x| x["level"] == "ok"
            && x["check"] == "query"
            && x["message"].as_str().is_some_and(|m| m.contains(
                "reads the source and writes into public.device_totals in the target database"
            ))),
        "{f:#?}"
    );
    assert!(
        !f.iter()
            .any(|x| x["level"] == "error" && x["check"] != "reconcile"),
        "no errors: {f:#?}"
    );
    // A query column the target lacks is named, from the target's catalog.
    let bad = config(
        &src.url(),
        &dst.url(),
        &QUERY.replace("AS label", "AS lable"),
    );
    let bad_cfg = dir.path().join("bad.toml");
    std::fs::write(&bad_cfg, bad).unwrap();
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&bad_cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let f = findings(&out);
    assert!(
        f.iter().any(|x| x["level"] == "error"
            && x["message"].as_str().is_some_and(|m| m.contains(
                "the query returns `lable`, which the target table does not have (did you mean `label`?)"
            ))),
        "{f:#?}"
    );

    // A type the target column cannot take on assignment is named with both types.
    let wrong = config(
        &src.url(),
        &dst.url(),
        &QUERY.replace("count(*) AS n", "now() AS n"),
    );
    std::fs::write(&bad_cfg, wrong).unwrap();
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&bad_cfg)
        .output()
        .unwrap();
    let f = findings(&out);
    assert!(
        f.iter().any(|x| x["level"] == "error"
            && x["message"].as_str().is_some_and(|m| m.contains(
                "column `n`: the query returns timestamptz on the source, which the target's public.device_totals.n (bigint) does not take"
            ))),
        "{f:#?}"
    );

    // run: every change on the source reaches the target, in the target's types.
    let mut run = spawn_run(dir.path(), &cfg, 1);
    // Changes count from the slot on (the view has no sweep to backfill).
    freshen_testenv::refresher::eventually(60, "freshen to stream from its slot", || async {
        let active: i64 = s
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'freshen_test' AND active",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (active == 1).then_some(())
    })
    .await;
    s.batch_execute(
        "INSERT INTO readings (device, value) SELECT 1 + g % 12, g FROM generate_series(1, 600) g",
    )
    .await
    .unwrap();
    let truth = rows(&s, TRUTH).await;
    assert_eq!(truth.len(), 12);
    freshen_testenv::refresher::eventually(60, "the first rows in the target", || async {
        (rows(&t, DERIVED).await == rows(&s, TRUTH).await).then_some(())
    })
    .await;
    // Inserts (a new device), value updates, moves between devices, and a device emptied.
    s.batch_execute(
        "INSERT INTO readings (device, value) VALUES (13, 5), (13, 7), (2, 1000);
         UPDATE readings SET value = value + 1 WHERE device = 4;
         UPDATE readings SET device = 5 WHERE device = 6 AND id % 2 = 0;
         DELETE FROM readings WHERE device = 7;",
    )
    .await
    .unwrap();
    freshen_testenv::refresher::eventually(60, "the target to follow the source", || async {
        (rows(&t, DERIVED).await == rows(&s, TRUTH).await).then_some(())
    })
    .await;
    let derived = rows(&t, DERIVED).await;
    assert!(
        derived.iter().any(|r| r[0].as_deref() == Some("13")),
        "a new key was inserted: {derived:?}"
    );
    assert!(
        !derived.iter().any(|r| r[0].as_deref() == Some("7")),
        "an emptied key was deleted: {derived:?}"
    );
    assert!(
        derived
            .iter()
            .any(|r| r[3].as_deref() == Some("dev \"2\", {x}\\")),
        "quotes, commas, braces and backslashes survive the trip: {derived:?}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
    let log = log_of(dir.path(), 1);
    assert!(!log.contains("ERROR"), "{log}");
}
