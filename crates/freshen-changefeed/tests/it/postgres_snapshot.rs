//! Snapshots against a real PostgreSQL while writers change the table (updates,
//! deletes, primary-key changes, inserts): the log replayed by key ends equal to the
//! table, no `read` event shows a row older than a change already in the log, and a
//! snapshot killed mid-way resumes after its last committed chunk.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use freshen_changefeed::{
    Changefeed, ChangefeedConfig, SnapshotMode, SnapshotProgress, SnapshotSource, SnapshotState,
};
use freshen_postgres::{ConnectionConfig, TableName};
use freshen_testenv::PgServer;
use freshen_testenv::refresher::eventually;
use hyper::StatusCode;
use serde_json::json;
use support::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

const ROWS: i32 = 3000;

/// Rows no writer touches (see [`writers`]), present before the snapshot starts.
const WITNESSES: &str =
    "INSERT INTO items SELECT g, 0, 'witness' FROM generate_series(500000, 500004) g";
/// Each witness changed once; one more inserted and one deleted.
const WITNESSES_CHANGED: &str = "BEGIN; UPDATE items SET v = 'witness-changed', grp = 1 WHERE id BETWEEN 500000 AND 500002;
     INSERT INTO items VALUES (500005, 2, 'witness-new'); DELETE FROM items WHERE id = 500004; COMMIT;";

async fn setup(pg: &PgServer) -> Client {
    let c = sql(pg).await;
    c.batch_execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, v text NOT NULL);
         CREATE SEQUENCE new_ids START 1000000;
         INSERT INTO items SELECT g, g % 7, 'v' || g FROM generate_series(1, {ROWS}) g;"
    ))
    .await
    .unwrap();
    c
}

fn items() -> TableName {
    TableName::new("public", "items")
}

/// Capture and the snapshot driver, running on one changefeed.
struct Run {
    capture: JoinHandle<()>,
    snapshots: JoinHandle<()>,
    stop: Vec<oneshot::Sender<()>>,
}

async fn run(pg: &PgServer, cf: &Changefeed) -> Run {
    let source = pg_source(pg, "snap", &["public.items"], |c| {
        c.reconnect = freshen::Backoff::new(Duration::from_millis(50), Duration::from_millis(500))
    })
    .await;
    let pool =
        freshen_postgres::connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 2).unwrap();
    let (stop_c, stopped_c) = oneshot::channel::<()>();
    let (stop_s, stopped_s) = oneshot::channel::<()>();
    let c = cf.clone();
    let capture = tokio::spawn(async move {
        c.capture(source, async {
            let _ = stopped_c.await;
        })
        .await
        .expect("capture runs");
    });
    let c = cf.clone();
    let snapshots = tokio::spawn(async move {
        c.run_snapshots(
            SnapshotSource::new(reader(pool), vec![pair(&items())]),
            async {
                let _ = stopped_s.await;
            },
        )
        .await
        .expect("snapshots run");
    });
    Run {
        capture,
        snapshots,
        stop: vec![stop_c, stop_s],
    }
}

impl Run {
    async fn stop(self) {
        for s in self.stop {
            let _ = s.send(());
        }
        self.snapshots.await.unwrap();
        self.capture.await.unwrap();
    }

    /// A crash: both tasks die where they are; nothing more is acknowledged.
    async fn kill(self) {
        self.snapshots.abort();
        self.capture.abort();
        let _ = self.snapshots.await;
        let _ = self.capture.await;
    }
}

/// Writers changing the table until stopped: updates, deletes, primary-key changes
/// (`id` to `-id`: never a collision), inserts. One statement per transaction.
struct Writers {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

fn writers(pg: &PgServer, n: u64) -> Writers {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks = (0..n)
        .map(|w| {
            let url = pg.url();
            let (stop, done) = (stop.clone(), done.clone());
            tokio::spawn(async move {
                let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                let mut rng = freshen::Jitter::new(w + 1);
                let mut next = || rng.next_u64();
                while !stop.load(Ordering::Relaxed) {
                    let id = (next() % ROWS as u64) as i32 + 1;
                    let id = if next() % 4 == 0 { -id } else { id };
                    let r = match next() % 8 {
                        0..=3 => {
                            c.execute(
                                "UPDATE items SET v = v || '+', grp = grp + 1 WHERE id = $1",
                                &[&id],
                            )
                            .await
                        }
                        4 => {
                            c.execute("UPDATE items SET id = -id WHERE id = $1", &[&id])
                                .await
                        }
                        5 => c.execute("DELETE FROM items WHERE id = $1", &[&id]).await,
                        _ => {
                            c.execute("INSERT INTO items SELECT nextval('new_ids'), 1, 'new'", &[])
                                .await
                        }
                    };
                    r.expect("a writer's statement");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    Writers { stop, done, tasks }
}

impl Writers {
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.done.load(Ordering::Relaxed)
    }
}

async fn table(c: &Client) -> BTreeMap<String, serde_json::Value> {
    c.query("SELECT id, grp, v FROM items", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let (id, grp, v): (i32, i32, String) = (r.get(0), r.get(1), r.get(2));
            (format!("items:{id}"), json!({"id": id, "grp": grp, "v": v}))
        })
        .collect()
}

/// Waits until replaying the log by key gives the table.
async fn replays_to(cf: &Changefeed, want: &BTreeMap<String, serde_json::Value>) {
    let got = eventually(30, "the log replayed by key equals the table", || async {
        let (got, _) = replay_by_key(cf);
        (&got == want).then_some(got)
    })
    .await;
    assert_eq!(got.len(), want.len());
}

/// No `read` event shows a row older than a change already in the log: the event
/// before it for the same key, if any, is a PUT of the same row. Returns the `read`
/// events' count and how many live events came between the first and the last one.
fn reads_are_never_stale(events: &[serde_json::Value]) -> (usize, usize) {
    let mut last: BTreeMap<&str, &serde_json::Value> = BTreeMap::new();
    let mut reads = 0;
    let (mut first, mut latest) = (None, 0);
    for (i, e) in events.iter().enumerate() {
        let key = e["key"].as_str().unwrap();
        if e["op"] == "read" {
            reads += 1;
            first.get_or_insert(i);
            latest = i;
            if let Some(prev) = last.get(key) {
                assert_eq!(
                    (prev["type"].as_str(), prev["value"].as_str()),
                    (Some("PUT"), e["value"].as_str()),
                    "a read event after a change of its row shows another row: {prev} then {e}"
                );
            }
        }
        last.insert(key, e);
    }
    let interleaved = first.map_or(0, |f| {
        events[f..=latest]
            .iter()
            .filter(|e| e["op"] != "read")
            .count()
    });
    (reads, interleaved)
}

fn progress(cf: &Changefeed) -> Option<SnapshotProgress> {
    cf.snapshot_status()
        .into_iter()
        .find(|p| p.schema == "public" && p.table == "items")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_asked_for_mid_workload_replays_to_the_table() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = setup(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: ChangefeedConfig = config(dir.path());
    cfg.snapshot_chunk_rows = 100;
    let server = Server::start(&cfg).await;
    let cf = server.cf.clone();
    let run = run(&pg, &cf).await;
    let w = writers(&pg, 2);
    // The writers are under way before the snapshot starts.
    eventually(30, "the writers' changes in the log", || async {
        (cf.latest_sequence() > 50).then_some(())
    })
    .await;

    let (status, body) = post(
        &server.url("/changefeed/snapshot"),
        json!({"tables": ["nope", "public.items"]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("nope"), "{body}");
    let (status, body) = post(
        &server.url("/changefeed/snapshot"),
        json!({"tables": ["items"]}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["snapshots"][0]["table"], "items");

    let done = eventually(120, "the snapshot done", || async {
        let s = get_json(&server.url("/changefeed/snapshot")).await;
        (s["snapshots"][0]["state"] == "done").then_some(s)
    })
    .await;
    let writes = w.stop().await;
    assert!(
        writes > 100,
        "the writers ran during the snapshot ({writes})"
    );
    let want = table(&c).await;
    replays_to(&cf, &want).await;
    let (_, events) = replay_by_key(&cf);
    let (reads, interleaved) = reads_are_never_stale(&events);
    let p = progress(&cf).unwrap();
    assert_eq!(p.state, SnapshotState::Done);
    assert_eq!(reads as u64, p.rows, "{done}");
    assert!(
        reads > (ROWS as usize) / 2,
        "most rows were read ({reads}, dropped {})",
        p.dropped
    );
    assert!(interleaved > 0, "live changes interleaved with the chunks");
    assert!(p.chunks >= u64::from(ROWS as u32 / 100), "{p:?}");
    eprintln!(
        "snapshot: {p:?}; {reads} reads, {interleaved} live events among them, {writes} writes"
    );
    run.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_snapshot_resumes_after_its_last_chunk() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = setup(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: ChangefeedConfig = config(dir.path());
    cfg.snapshot = SnapshotMode::Initial;
    cfg.snapshot_chunk_rows = 100;
    cfg.snapshot_pause_ms = 20;
    c.batch_execute(WITNESSES).await.unwrap();
    let w = writers(&pg, 2);

    let cf = open(&cfg).await;
    let first = run(&pg, &cf).await;
    let at_kill = eventually(60, "a few chunks committed", || async {
        progress(&cf).filter(|p| p.chunks >= 5)
    })
    .await;
    // Witness rows changed live just before the crash and never again (the writers keep
    // to ids up to ROWS, their negations and the sequence's): a change lost at the
    // crash leaves the replay unequal to the table.
    c.batch_execute(WITNESSES_CHANGED).await.unwrap();
    first.kill().await;
    cf.close().await;
    drop(cf);
    // What the store holds is what a restart starts from. (The killed capture's
    // acknowledger lets go of the store once it notices the capture is gone.)
    let cf = eventually(10, "the store reopens", || async {
        Changefeed::open(&cfg).await.ok()
    })
    .await;
    let stored = progress(&cf).expect("the progress is stored");
    assert_eq!(stored.state, SnapshotState::Running, "{stored:?}");
    assert!(stored.chunks >= at_kill.chunks, "{stored:?} {at_kill:?}");
    let resume_after: i32 = stored.after.as_ref().unwrap()[0].parse().unwrap();
    let before_restart = cf.latest_sequence();

    let second = run(&pg, &cf).await;
    eventually(120, "the resumed snapshot done", || async {
        progress(&cf).filter(|p| p.state == SnapshotState::Done)
    })
    .await;
    w.stop().await;
    let want = table(&c).await;
    replays_to(&cf, &want).await;
    let (_, events) = replay_by_key(&cf);
    reads_are_never_stale(&events);
    // Resumed, not restarted: the restarted run read only keys after the stored one.
    let reread: Vec<i32> = events
        .iter()
        .filter(|e| e["op"] == "read" && e["sequence"].as_u64().unwrap() > before_restart)
        .map(|e| {
            let row: serde_json::Value =
                serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
            row["id"].as_i64().unwrap() as i32
        })
        .collect();
    assert!(!reread.is_empty(), "the second run read rows");
    assert!(
        reread.iter().all(|&id| id > resume_after),
        "the second run started after key {resume_after}: {:?}",
        &reread[..reread.len().min(10)]
    );
    // The table's original rows that still exist were all read or changed live.
    let p = progress(&cf).unwrap();
    assert!(p.chunks > stored.chunks, "{p:?}");
    second.stop().await;
    cf.close().await;
}
