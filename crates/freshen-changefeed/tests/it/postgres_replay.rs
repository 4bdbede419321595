//! Replay by key against a real PostgreSQL: a client that applies the changefeed by key
//! ends equal to the source table after a randomized workload with primary-key updates,
//! large TOASTed columns left unchanged under the default replica identity, deletes,
//! and capture restarts (clean and killed) — and so does the compacted log.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use freshen_changefeed::{Changefeed, ChangefeedConfig, Keep, RetentionConfig};
use freshen_postgres::{ConnectionConfig, TableName};
use freshen_testenv::PgServer;
use serde_json::json;
use support::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

/// A capture run: the changefeed and the task appending the source to it.
struct Capture {
    cf: Changefeed,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

async fn capture(pg: &PgServer, config: &ChangefeedConfig) -> Capture {
    let cf = open(config).await;
    let source = pg_source(pg, "feed", &["public.docs"], |c| {
        c.reconnect = freshen::Backoff::new(Duration::from_millis(50), Duration::from_millis(500))
    })
    .await;
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = cf.clone();
    let task = tokio::spawn(async move {
        runner
            .capture(source, async {
                let _ = stopped.await;
            })
            .await
            .expect("capture runs");
    });
    Capture { cf, stop, task }
}

impl Capture {
    /// A clean stop: what was appended is acknowledged.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
        self.cf.close().await;
    }

    /// A crash: the capture dies without acknowledging what it appended last; the
    /// source replays it on the next start.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        self.cf.close().await;
    }
}

/// A deterministic random workload over a few keys.
struct Workload {
    rng: freshen::Jitter,
    next_id: u64,
    live: Vec<String>,
}

impl Workload {
    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// A body large enough to be stored out of line (storage EXTERNAL: uncompressed).
    fn body(&mut self) -> String {
        let seed = self.below(u64::MAX);
        (0..600)
            .map(|i| format!("{:x}", seed.wrapping_mul(i + 1) % 16))
            .collect::<String>()
            .repeat(8)
    }

    async fn run(&mut self, c: &Client, txs: usize) {
        for _ in 0..txs {
            let tx = c.simple_query("BEGIN").await.map(drop);
            tx.unwrap();
            for _ in 0..=self.below(3) {
                let choice = if self.live.is_empty() {
                    0
                } else {
                    self.below(6)
                };
                match choice {
                    0 => {
                        self.next_id += 1;
                        let id = format!("doc-{}", self.next_id);
                        let body = self.body();
                        c.execute(
                            "INSERT INTO docs (id, n, title, body) VALUES ($1, 0, 'new', $2)",
                            &[&id, &body],
                        )
                        .await
                        .unwrap();
                        self.live.push(id);
                    }
                    // The body is left unchanged: PostgreSQL does not send it.
                    1 | 2 => {
                        let id = self.pick();
                        c.execute(
                            "UPDATE docs SET n = n + 1, title = 't' || n WHERE id = $1",
                            &[&id],
                        )
                        .await
                        .unwrap();
                    }
                    3 => {
                        let id = self.pick();
                        let body = self.body();
                        c.execute("UPDATE docs SET body = $2 WHERE id = $1", &[&id, &body])
                            .await
                            .unwrap();
                    }
                    // A primary-key change, the body unchanged.
                    4 => {
                        let i = self.below(self.live.len() as u64) as usize;
                        let new = format!("{}-r", self.live[i]);
                        c.execute(
                            "UPDATE docs SET id = $2, n = n + 1 WHERE id = $1",
                            &[&self.live[i], &new],
                        )
                        .await
                        .unwrap();
                        self.live[i] = new;
                    }
                    _ => {
                        let i = self.below(self.live.len() as u64) as usize;
                        let id = self.live.swap_remove(i);
                        c.execute("DELETE FROM docs WHERE id = $1", &[&id])
                            .await
                            .unwrap();
                    }
                }
            }
            c.simple_query("COMMIT").await.unwrap();
        }
    }

    fn pick(&mut self) -> String {
        let i = self.below(self.live.len() as u64) as usize;
        self.live[i].clone()
    }
}

/// The table as the changefeed's keys and row JSON show it.
async fn table(c: &Client) -> BTreeMap<String, serde_json::Value> {
    c.query("SELECT id, n, title, body FROM docs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            let n: i32 = r.get(1);
            let title: String = r.get(2);
            let body: String = r.get(3);
            (
                format!("docs:{id}"),
                json!({"id": id, "n": n, "title": title, "body": body}),
            )
        })
        .collect()
}

/// Waits (bounded) until replaying `cf` by key gives `want`.
async fn replays_to(cf: &Changefeed, want: &BTreeMap<String, serde_json::Value>) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (got, _) = replay_by_key(cf);
        if &got == want {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let missing: Vec<_> = want
                .keys()
                .filter(|k| got.get(*k) != want.get(*k))
                .collect();
            let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
            panic!(
                "the log replayed by key differs from the table: {} rows differ or miss ({missing:?}), {} extra ({extra:?})",
                missing.len(),
                extra.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_replayed_by_key_equals_the_table() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE docs (id text PRIMARY KEY, n int NOT NULL, title text NOT NULL, body text NOT NULL);
         -- Out of line and uncompressed: every body is TOASTed.
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;",
    )
    .await
    .unwrap();

    // `check`'s question: this table can leave `title` and `body` out of an UPDATE.
    let admin = freshen_postgres::PgAdmin::connect(&ConnectionConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    let advice = admin
        .partial_updates(&[TableName::new("public", "docs")])
        .await
        .unwrap();
    assert_eq!(advice.len(), 1, "{advice:?}");
    assert_eq!(advice[0].columns, ["id", "title", "body"]);
    assert_eq!(
        advice[0].fix,
        r#"ALTER TABLE "public"."docs" REPLICA IDENTITY FULL;"#
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut w = Workload {
        rng: freshen::Jitter::new(1),
        next_id: 0,
        live: Vec::new(),
    };
    let run = capture(&pg, &cfg).await;
    w.run(&c, 60).await;
    replays_to(&run.cf, &table(&c).await).await;
    run.stop().await;

    // The workload goes on while nothing captures, then a capture is killed mid-way.
    w.run(&c, 30).await;
    let run = capture(&pg, &cfg).await;
    w.run(&c, 30).await;
    run.kill().await;
    w.run(&c, 30).await;
    let run = capture(&pg, &cfg).await;
    w.run(&c, 30).await;
    let want = table(&c).await;
    replays_to(&run.cf, &want).await;

    // PostgreSQL did leave values out, and the changefeed filled them in.
    let metrics = run.cf.metrics_text();
    let filled: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("freshen_changefeed_filled_events_total "))
        .and_then(|v| v.parse().ok())
        .expect("the filled counter");
    assert!(filled > 10, "{filled} events filled");
    let (_, events) = replay_by_key(&run.cf);
    let partial: Vec<_> = events
        .iter()
        .filter(|e| e.get("partial").is_some())
        .collect();
    assert!(partial.is_empty(), "every row image is whole: {partial:?}");
    let moves = events.iter().filter(|e| e.get("old_key").is_some()).count();
    assert!(moves > 5, "the workload moved keys ({moves})");
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    for (i, e) in events.iter().enumerate() {
        if let Some(to) = e.get("new_key") {
            let put = &events[i + 1];
            assert_eq!((put["key"].clone(), seqs[i + 1]), (to.clone(), seqs[i] + 1));
        }
    }

    // Compacted (tombstones expired at once), the log alone still builds the table.
    let policy = RetentionConfig {
        keep: Keep::LatestPerKey,
        tombstone_secs: 0,
        ..RetentionConfig::default()
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    run.cf.enforce_retention(&policy).await.unwrap();
    let (state, kept) = replay_by_key(&run.cf);
    assert_eq!(state, want, "the compacted log replays to the table");
    assert_eq!(kept.len(), want.len(), "one event per row");
    assert!(
        events.len() > 2 * kept.len(),
        "compaction removed superseded events"
    );
    run.stop().await;
}
