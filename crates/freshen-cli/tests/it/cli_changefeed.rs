//! PostgreSQL → the changefeed through the binary: every committed change lands in the
//! log exactly once, in commit order, across a SIGKILL of the capture process.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

fn config(url: &str, http: u16, feed: u16, path: &std::path::Path) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_feed"
publication = "freshen_feed"
tables = ["public.orders"]

[http]
listen = "127.0.0.1:{http}"

[changefeed]
path = "{}"
durability = "fsync"

[changefeed.http]
listen = "127.0.0.1:{feed}"
"#,
        path.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_change_is_logged_once_in_order_across_a_sigkill() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL);
         ALTER TABLE orders REPLICA IDENTITY FULL;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (free_port(), free_port());
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), http, feed, &dir.path().join("feed.redb")),
    );
    let health = format!("http://127.0.0.1:{http}");
    let base = format!("http://127.0.0.1:{feed}");

    let mut capture = spawn_run(dir.path(), &cfg, 1);
    wait_http(&health, "/healthz", 200, Duration::from_secs(30)).await;

    // One writer, one change per transaction: commit order is the order written.
    let mut expected: Vec<(String, i64)> = Vec::new();
    for id in 0..300i64 {
        if id == 120 {
            // Killed mid-workload: some changes are captured, some only in WAL.
            capture.kill().unwrap();
            capture.wait().unwrap();
        }
        if id == 200 {
            capture = spawn_run(dir.path(), &cfg, 2);
        }
        if id % 10 == 9 {
            c.execute(
                "UPDATE orders SET amount = amount + 1 WHERE id = $1",
                &[&(id - 1)],
            )
            .await
            .unwrap();
            expected.push(("update".into(), id - 1));
        } else {
            c.execute("INSERT INTO orders VALUES ($1, $2)", &[&id, &(id as i32)])
                .await
                .unwrap();
            expected.push(("insert".into(), id));
        }
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let events = loop {
        wait_http(&base, "/changefeed/stats", 200, Duration::from_secs(30)).await;
        let events = changefeed_events(&base).await;
        if events.len() >= expected.len() || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let got: Vec<(String, i64)> = events
        .iter()
        .map(|e| {
            let key = e["key"].as_str().unwrap();
            let id = key
                .rsplit(':')
                .next()
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("key {key}"));
            (e["op"].as_str().unwrap().to_string(), id)
        })
        .collect();
    assert_eq!(got.len(), expected.len(), "each change exactly once");
    assert_eq!(got, expected, "in commit order");
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "sequences increase");
    assert_eq!(events[0]["type"], "PUT");
    assert!(events[0]["lsn"].as_str().is_some_and(|l| l.contains('/')));

    let status = std::process::Command::new("kill")
        .args(["-TERM", &capture.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        capture.wait().unwrap().success(),
        "{}",
        log_of(dir.path(), 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_snapshot_reads_the_existing_rows_through_the_binary() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, amount int NOT NULL);
         INSERT INTO orders SELECT g, g FROM generate_series(1, 450) g;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (free_port(), free_port());
    let text = config(&pg.url(), http, feed, &dir.path().join("feed.redb")).replace(
        "durability = \"fsync\"",
        "durability = \"fsync\"\nsnapshot = \"initial\"\nsnapshot_chunk_rows = 100",
    );
    let cfg = write_config(dir.path(), &text);
    let base = format!("http://127.0.0.1:{feed}");
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/changefeed/snapshot", 200, Duration::from_secs(30)).await;
    // A change while the snapshot may still run: it is logged live.
    c.execute("UPDATE orders SET amount = -1 WHERE id = 7", &[])
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = freshen_cli::status::get(&base, "/changefeed/snapshot")
            .await
            .expect("changefeed answers");
        let doc: Value = serde_json::from_str(&body).unwrap();
        if doc["snapshots"][0]["state"] == "done" {
            assert_eq!(doc["snapshots"][0]["table"], "orders", "{doc}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the snapshot did not finish: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = changefeed_events(&base).await;
        if events.iter().any(|e| e["op"] == "update") || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut state = std::collections::BTreeMap::new();
    for e in &events {
        let row: Value = serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
        state.insert(e["key"].as_str().unwrap().to_owned(), row["amount"].clone());
    }
    assert_eq!(state.len(), 450, "every existing row is in the log");
    assert_eq!(state["orders:7"], -1, "the live change wins");
    assert_eq!(state["orders:450"], 450);
    let reads = events.iter().filter(|e| e["op"] == "read").count();
    assert!(reads >= 449, "{reads} read events");
    // The binary's /status shows the progress too.
    let (_, body) = freshen_cli::status::get(&format!("http://127.0.0.1:{http}"), "/status")
        .await
        .expect("/status answers");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["snapshots"][0]["state"], "done", "{status}");
    assert_eq!(status["snapshots"][0]["rows"], reads, "{status}");
    assert!(events.iter().all(|e| e["type"] == "PUT"));

    // The command line: the progress, then a snapshot on demand.
    let shown = freshen()
        .args(["snapshot", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("\"done\""),
        "{shown:?}"
    );
    let started = freshen()
        .args(["snapshot", "-c"])
        .arg(&cfg)
        .arg("public.orders")
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reads = changefeed_events(&base)
            .await
            .iter()
            .filter(|e| e["op"] == "read")
            .count();
        if reads >= 2 * 449 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second snapshot read {reads}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.kill().unwrap();
    run.wait().unwrap();
}

/// `tables = "app.*"` captures a schema: a table created while freshen runs reaches the
/// changefeed with its first change, and the log says it was discovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_in_a_captured_schema_reaches_the_changefeed() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute("CREATE SCHEMA app; CREATE TABLE app.orders (id bigint PRIMARY KEY)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (free_port(), free_port());
    let text = config(&pg.url(), http, feed, &dir.path().join("feed.redb"))
        .replace(r#"tables = ["public.orders"]"#, r#"tables = "app.*""#);
    let cfg = write_config(dir.path(), &text);
    let base = format!("http://127.0.0.1:{feed}");
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{http}"),
        "/healthz",
        200,
        Duration::from_secs(30),
    )
    .await;

    c.batch_execute(
        "CREATE TABLE app.refunds (id bigint PRIMARY KEY, amount int); \
         INSERT INTO app.refunds VALUES (7, 70); \
         INSERT INTO app.orders VALUES (1);",
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = changefeed_events(&base).await;
        if events.len() >= 2 {
            break events;
        }
        assert!(Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tables: Vec<&str> = events
        .iter()
        .map(|e| e["table"].as_str().unwrap())
        .collect();
    assert_eq!(tables, ["refunds", "orders"]);
    let after = events[0]["after_snapshot"].as_str().unwrap();
    assert!(after.contains(r#""amount":70"#), "{after}");
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("discovered a table") && log.contains("refunds"),
        "{log}"
    );
    // And /status lists it (app.orders was there at start: not a discovery).
    let (_, body) = freshen_cli::status::get(&format!("http://127.0.0.1:{http}"), "/status")
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["source"]["discovered"],
        serde_json::json!(["app.refunds"]),
        "{doc}"
    );
}

/// `tables = "app.order_*"` with `snapshot = "initial"`: the matching tables' rows are
/// read at start, the schema's other tables stay out, and a table that joins later with
/// rows in it (`ALTER TABLE … SET SCHEMA app`) — which no change in the stream announces
/// — is discovered from the catalog, logged, snapshotted, and streamed from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_joining_a_pattern_with_rows_is_snapshotted() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE SCHEMA app; \
         CREATE TABLE app.order_a (id bigint PRIMARY KEY); INSERT INTO app.order_a VALUES (1), (2), (3); \
         CREATE TABLE app.other (id bigint PRIMARY KEY); INSERT INTO app.other VALUES (1); \
         CREATE TABLE public.order_moved (id bigint PRIMARY KEY); INSERT INTO public.order_moved VALUES (10), (11);",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (free_port(), free_port());
    let text = config(&pg.url(), http, feed, &dir.path().join("feed.redb"))
        .replace(
            r#"tables = ["public.orders"]"#,
            "tables = \"app.order_*\"\ndiscover_every = \"200ms\"",
        )
        .replace(
            "durability = \"fsync\"",
            "durability = \"fsync\"\nsnapshot = \"initial\"",
        );
    let cfg = write_config(dir.path(), &text);
    let base = format!("http://127.0.0.1:{feed}");
    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_http(
        &format!("http://127.0.0.1:{http}"),
        "/healthz",
        200,
        Duration::from_secs(30),
    )
    .await;
    let count = |events: &[Value], table: &str, op: &str| {
        events
            .iter()
            .filter(|e| e["table"] == table && e["op"] == op)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = changefeed_events(&base).await;
        if count(&events, "order_a", "read") == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    c.batch_execute("ALTER TABLE public.order_moved SET SCHEMA app")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = changefeed_events(&base).await;
        if count(&events, "order_moved", "read") == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.batch_execute("INSERT INTO app.order_moved VALUES (12); INSERT INTO app.other VALUES (2)")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = changefeed_events(&base).await;
        if count(&events, "order_moved", "insert") == 1 {
            break events;
        }
        assert!(Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        count(&events, "other", "read") + count(&events, "other", "insert"),
        0
    );
    assert_eq!(count(&events, "order_moved", "read"), 2, "read once");
    let (_, body) = freshen_cli::status::get(&base, "/changefeed/snapshot")
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&body).unwrap();
    let moved = doc["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["table"] == "order_moved")
        .unwrap_or_else(|| panic!("{doc}"));
    assert_eq!(
        (&moved["state"], &moved["rows"]),
        (&Value::from("done"), &Value::from(2)),
        "{doc}"
    );
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("discovered a table") && log.contains("order_moved"),
        "{log}"
    );
}

/// `freshen check` with pattern entries: what each selects now (a pattern that selects
/// nothing is a warning), a keyless table the publication would publish (an error, with
/// its fix), and — for a role that is not a superuser — that it cannot create the
/// publication, with what to do instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_what_patterns_select_and_what_they_cannot_publish() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(
        "CREATE SCHEMA app; CREATE SCHEMA sales; \
         CREATE TABLE app.order_a (id bigint PRIMARY KEY); \
         CREATE TABLE app.order_b (id bigint PRIMARY KEY); \
         CREATE TABLE app.freshen_cursors (id bigint PRIMARY KEY); \
         CREATE TABLE app.log (line text); \
         CREATE ROLE plain LOGIN REPLICATION; GRANT USAGE ON SCHEMA app, sales TO plain;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = |url: &str| {
        config(url, free_port(), free_port(), &dir.path().join("feed.redb")).replace(
            r#"tables = ["public.orders"]"#,
            r#"tables = ["app.order_*", "sales.*"]"#,
        )
    };
    let check = |text: String| {
        let cfg = write_config(dir.path(), &text);
        let out = freshen()
            .args(["check", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
        (
            out.status.code(),
            doc["findings"].as_array().unwrap().clone(),
        )
    };
    let has = |f: &[Value], level: &str, check: &str, needle: &str| {
        f.iter().any(|x| {
            x["level"] == level
                && x["check"] == check
                && x["message"].as_str().is_some_and(|m| m.contains(needle))
        })
    };

    let (code, f) = check(text(&pg.url()));
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        has(
            &f,
            "ok",
            "tables",
            "selects 2 table(s) now: app.order_a, app.order_b"
        ),
        "{f:#?}"
    );
    assert!(
        has(&f, "warning", "tables", "selects no table now"),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "error",
            "publication",
            r#"ALTER TABLE "app"."log" REPLICA IDENTITY FULL"#
        ),
        "the schema's keyless table would be published: {f:#?}"
    );

    c.batch_execute("ALTER TABLE app.log ADD PRIMARY KEY (line)")
        .await
        .unwrap();
    let (code, f) = check(text(&pg.url()));
    assert_eq!(code, Some(0), "{f:#?}");
    let (code, f) = check(text(&pg.url().replacen("://postgres@", "://plain@", 1)));
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        has(&f, "error", "privilege", "only a superuser may create"),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "error",
            "privilege",
            r#"TABLES IN SCHEMA "app", "sales""#
        ),
        "{f:#?}"
    );
}
