//! Column redaction against a real PostgreSQL, through the real source, the changefeed's
//! HTTP API and its store: a redacted column's clear value is in no page, no
//! snapshot row, no before image and not in the store file's bytes; hashes are the
//! keyed HMAC of the value (stable, and another key gives another hash).

use crate::support;

use freshen_changefeed::{ChangefeedConfig, SnapshotMode, SnapshotSource, SnapshotState};
use freshen_codec::{HashKey, Mask, RedactAction, RedactRule, Redactor, hmac_hex};
use freshen_postgres::{ConnectionConfig, TableName};
use freshen_testenv::PgServer;
use freshen_testenv::refresher::eventually;
use support::*;
use tokio::sync::oneshot;

const KEY: &[u8] = b"test-key-one";

/// Each row's clear values: none may leave freshen.
const SECRETS: [(i32, &str, &str, &str, &str); 3] = [
    (
        1,
        "ann.secret@example.com",
        "4111222233331111",
        "987-65-4301",
        "confidential-one",
    ),
    (
        2,
        "bob.secret@example.com",
        "4111222233332222",
        "987-65-4302",
        "confidential-two",
    ),
    (
        3,
        "cyd.secret@example.com",
        "4111222233333333",
        "987-65-4303",
        "confidential-three",
    ),
];
/// Written live after the snapshot, into row 1 (its before image holds the old ones).
const LIVE: (&str, &str, &str) = (
    "ann.changed@example.com",
    "987-65-4399",
    "confidential-live",
);

fn redactor(key: &[u8]) -> Redactor {
    Redactor::new(vec![
        RedactRule::new(
            "public.users",
            "email",
            RedactAction::Hash(HashKey::new(key.to_vec())),
        ),
        RedactRule::new("users", "card", RedactAction::Mask(Mask::KeepLast(4))),
        RedactRule::new("users", "ssn", RedactAction::Drop),
        RedactRule::new("users", "note", RedactAction::Truncate(4)),
    ])
}

fn clear_values() -> Vec<&'static str> {
    let mut v: Vec<&str> = SECRETS
        .iter()
        .flat_map(|(_, e, c, s, n)| [*e, *c, *s, *n])
        .collect();
    v.extend([LIVE.0, LIVE.1, LIVE.2]);
    // Parts that would show a partial leak as well.
    v.extend([
        "secret@example",
        "changed@example",
        "987-65",
        "confidential",
    ]);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_columns_leave_no_trace_in_pages_snapshots_or_the_store() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE users (id int PRIMARY KEY, email text, card text, ssn text, note text, city text);
         ALTER TABLE users REPLICA IDENTITY FULL;",
    )
    .await
    .unwrap();
    for (id, email, card, ssn, note) in SECRETS {
        c.execute(
            "INSERT INTO users VALUES ($1, $2, $3, $4, $5, 'Oslo')",
            &[&id, &email, &card, &ssn, &note],
        )
        .await
        .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let mut cfg: ChangefeedConfig = config(dir.path());
    cfg.snapshot = SnapshotMode::Initial;
    let server = Server::start_redacted(&cfg, "127.0.0.1:0".parse().unwrap(), redactor(KEY)).await;
    let cf = server.cf.clone();
    let feed = Feed::start(&pg, &cf, "public.users").await;
    eventually(60, "the initial snapshot done", || async {
        cf.snapshot_status()
            .into_iter()
            .any(|p| p.table == "users" && p.state == SnapshotState::Done)
            .then_some(())
    })
    .await;
    let snapshot_end = cf.latest_sequence();
    c.execute(
        "UPDATE users SET email = $1, ssn = $2, note = $3 WHERE id = 1",
        &[&LIVE.0, &LIVE.1, &LIVE.2],
    )
    .await
    .unwrap();
    c.execute("DELETE FROM users WHERE id = 2", &[])
        .await
        .unwrap();
    eventually(30, "the update and the delete in the log", || async {
        (cf.latest_sequence() >= snapshot_end + 2).then_some(())
    })
    .await;

    // Every page the API serves: plain, with transaction markers, one table's filter.
    let mut pages = String::new();
    for q in [
        "/changefeed?from_seq=0&limit=1000&long_poll_ms=0",
        "/changefeed?from_seq=0&limit=1000&long_poll_ms=0&tx=1",
    ] {
        let (status, body) = get(&server.url(q)).await;
        assert!(status.is_success(), "{q}: {status} {body}");
        pages.push_str(&body);
    }
    let page: serde_json::Value = serde_json::from_str(
        &get(&server.url("/changefeed?from_seq=0&limit=1000&long_poll_ms=0"))
            .await
            .1,
    )
    .unwrap();
    let events = page["events"].as_array().expect("a page of events");
    let reads: Vec<&serde_json::Value> = events.iter().filter(|e| e["op"] == "read").collect();
    assert_eq!(reads.len(), SECRETS.len(), "the snapshot's rows: {page}");
    for leaked in clear_values() {
        assert!(!pages.contains(leaked), "{leaked:?} in a page: {pages}");
    }

    // The values are there, redacted: the hash is the keyed HMAC, the rest as configured.
    let row = |e: &serde_json::Value, field: &str| -> serde_json::Value {
        serde_json::from_str(e[field].as_str().unwrap_or("null")).unwrap()
    };
    let read1 = reads
        .iter()
        .find(|e| row(e, "value")["id"] == 1)
        .expect("row 1 read");
    let v = row(read1, "value");
    assert_eq!(
        v["email"],
        hmac_hex(&HashKey::new(KEY.to_vec()), SECRETS[0].1)
    );
    assert_ne!(
        v["email"],
        hmac_hex(&HashKey::new(b"another key".to_vec()), SECRETS[0].1),
        "the hash depends on the key"
    );
    assert_eq!(v["card"], "************1111");
    assert_eq!(v["note"], "conf");
    assert_eq!(v["city"], "Oslo", "other columns pass as they are");
    assert!(v.get("ssn").is_none(), "dropped: {v}");
    let update = events
        .iter()
        .find(|e| e["op"] == "update")
        .expect("the update");
    let before = row(update, "before_snapshot");
    let after = row(update, "after_snapshot");
    assert_eq!(
        before["email"], v["email"],
        "equal values hash equally: {before}"
    );
    assert_eq!(
        after["email"],
        hmac_hex(&HashKey::new(KEY.to_vec()), LIVE.0)
    );
    assert!(before.get("ssn").is_none() && after.get("ssn").is_none());
    let delete = events
        .iter()
        .find(|e| e["op"] == "delete")
        .expect("the delete");
    assert_eq!(
        row(delete, "before_snapshot")["email"],
        hmac_hex(&HashKey::new(KEY.to_vec()), SECRETS[1].1)
    );

    feed.stop().await;
    drop(cf);
    server.stop().await;
    // The store file itself: the bytes a backup or a stolen disk would show.
    let bytes = std::fs::read(dir.path().join("feed.redb")).unwrap();
    let hashed = hmac_hex(&HashKey::new(KEY.to_vec()), SECRETS[0].1);
    assert!(
        bytes.windows(hashed.len()).any(|w| w == hashed.as_bytes()),
        "the store holds the redacted values (so the search below can find text)"
    );
    for leaked in clear_values() {
        assert!(
            !bytes.windows(leaked.len()).any(|w| w == leaked.as_bytes()),
            "{leaked:?} in the store file"
        );
    }
}

/// The capture and snapshot driver of one changefeed, stopped together.
struct Feed {
    stop: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Feed {
    async fn start(pg: &PgServer, cf: &freshen_changefeed::Changefeed, table: &str) -> Feed {
        let source = pg_source(pg, "redact", &[table], |_| {}).await;
        let pool =
            freshen_postgres::connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 2)
                .unwrap();
        let (stop_c, stopped_c) = oneshot::channel::<()>();
        let (stop_s, stopped_s) = oneshot::channel::<()>();
        let c1 = cf.clone();
        let capture = tokio::spawn(async move {
            c1.capture(source, async {
                let _ = stopped_c.await;
            })
            .await
            .expect("capture runs");
        });
        let c2 = cf.clone();
        let tables = vec![pair(&table.parse::<TableName>().unwrap())];
        let snapshots = tokio::spawn(async move {
            c2.run_snapshots(SnapshotSource::new(reader(pool), tables), async {
                let _ = stopped_s.await;
            })
            .await
            .expect("snapshots run");
        });
        Feed {
            stop: vec![stop_s, stop_c],
            tasks: vec![snapshots, capture],
        }
    }

    async fn stop(self) {
        for s in self.stop {
            let _ = s.send(());
        }
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

/// The `n` of every snapshot `read` in the log after sequence `after`.
async fn reads_after(server: &Server, after: u64) -> Vec<i64> {
    let page: serde_json::Value = serde_json::from_str(
        &get(&server.url(&format!(
            "/changefeed?from_seq={after}&limit=100000&long_poll_ms=0"
        )))
        .await
        .1,
    )
    .unwrap();
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["op"] == "read")
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
            v["n"].as_i64().unwrap()
        })
        .collect()
}

/// A snapshot of a table whose primary key is hashed: its progress — in the store,
/// `GET /changefeed/snapshot` and the log lines — holds the resume key sealed, never
/// in clear; a restart with the same hash key opens it and resumes after the last
/// chunk, and a restart under another key cannot, so it reads the table again from
/// its first row (at least once, never a clear key at rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hashed_primary_key_resumes_from_a_sealed_position() {
    const ROWS: i64 = 600;
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(&format!(
        "CREATE TABLE people (id text PRIMARY KEY, n int NOT NULL);
         INSERT INTO people SELECT 'SSN-' || lpad(g::text, 6, '0'), g FROM generate_series(1, {ROWS}) g;"
    ))
    .await
    .unwrap();
    let hashed = |key: &[u8]| {
        Redactor::new(vec![RedactRule::new(
            "public.people",
            "id",
            RedactAction::Hash(HashKey::new(key.to_vec())),
        )])
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: ChangefeedConfig = config(dir.path());
    cfg.snapshot = SnapshotMode::Initial;
    cfg.snapshot_chunk_rows = 50;
    cfg.snapshot_pause_ms = 50;
    let addr = "127.0.0.1:0".parse().unwrap();
    let no_clear_key = |what: &str, text: &[u8]| {
        assert!(
            !text.windows(4).any(|w| w == b"SSN-"),
            "a clear key in {what}: {}",
            String::from_utf8_lossy(text)
        );
    };

    // 1. Stopped part-way: the stored and served position is sealed.
    let server = Server::start_redacted(&cfg, addr, hashed(KEY)).await;
    let feed = Feed::start(&pg, &server.cf, "public.people").await;
    let cf = server.cf.clone();
    eventually(60, "a few chunks", || async {
        cf.snapshot_status().into_iter().find(|p| p.chunks >= 3)
    })
    .await;
    feed.stop().await;
    let served = get(&server.url("/changefeed/snapshot")).await.1;
    no_clear_key("GET /changefeed/snapshot", served.as_bytes());
    let p = cf.snapshot_status().pop().unwrap();
    assert_eq!(p.state, SnapshotState::Running, "{p:?}");
    assert!(p.after.is_none(), "{p:?}");
    let token = p.after_sealed.clone().expect("a sealed position");
    assert!(served.contains(&token), "{served}");
    let first_run = reads_after(&server, 0).await;
    let end = cf.latest_sequence();
    drop(cf);
    server.stop().await;
    no_clear_key(
        "the store file",
        &std::fs::read(dir.path().join("feed.redb")).unwrap(),
    );

    // 2. The same key: resumed after the stored chunk, not from the first row.
    let server = Server::start_redacted(&cfg, addr, hashed(KEY)).await;
    let feed = Feed::start(&pg, &server.cf, "public.people").await;
    let cf = server.cf.clone();
    eventually(60, "two more chunks", || async {
        cf.snapshot_status()
            .into_iter()
            .find(|q| q.chunks >= p.chunks + 2)
    })
    .await;
    feed.stop().await;
    drop(cf);
    let resumed = reads_after(&server, end).await;
    let last = *first_run.iter().max().unwrap();
    assert!(
        !resumed.is_empty() && resumed.iter().all(|&n| n > last - 50),
        "resumed after the stored chunk (at most the chunk in flight again): first run to {last}, then {:?}",
        &resumed[..resumed.len().min(5)]
    );
    let end = server.cf.latest_sequence();
    server.stop().await;
    no_clear_key(
        "the store file",
        &std::fs::read(dir.path().join("feed.redb")).unwrap(),
    );

    // 3. Another key cannot open it: the table is read again from its first row, to
    //    its end; the finished record keeps no position at all.
    let server = Server::start_redacted(&cfg, addr, hashed(b"a rotated key, sixteen+")).await;
    let feed = Feed::start(&pg, &server.cf, "public.people").await;
    let cf = server.cf.clone();
    let done = eventually(120, "the snapshot done", || async {
        cf.snapshot_status()
            .into_iter()
            .find(|q| q.state == SnapshotState::Done)
    })
    .await;
    feed.stop().await;
    drop(cf);
    assert_eq!(
        (done.after.clone(), done.after_sealed.clone()),
        (None, None),
        "{done:?}"
    );
    let again = reads_after(&server, end).await;
    assert_eq!(
        again.iter().min(),
        Some(&1),
        "read again from the first row"
    );
    let mut all: Vec<i64> = again.clone();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() as i64, ROWS, "every row read to the end");
    no_clear_key(
        "GET /changefeed/snapshot",
        get(&server.url("/changefeed/snapshot")).await.1.as_bytes(),
    );
    no_clear_key(
        "a page",
        get(&server.url("/changefeed?from_seq=0&limit=100000&long_poll_ms=0"))
            .await
            .1
            .as_bytes(),
    );
    server.stop().await;
    no_clear_key(
        "the store file",
        &std::fs::read(dir.path().join("feed.redb")).unwrap(),
    );
}
