//! Scaling out: one capture instance and several workers sharing the rebuilds through a
//! key stream on a real Kafka-protocol broker, under a write load, with SIGKILLs of
//! workers and of the capture instance and a worker joining mid-load. The derived
//! tables end equal to truth, and a rebuild log kept by the rebuild SQL itself shows
//! that no key was ever rebuilt by two instances at overlapping times.

use crate::support;

use std::time::{Duration, Instant};

use freshen_testenv::{KafkaFlavor, KafkaServer};
use support::*;

const PARTITIONS: i32 = 6;

/// One file for every instance: the instance's name and listener come from the
/// environment. Each rebuild logs itself (worker, key, start, end) in its transaction.
fn config(url: &str, bootstrap: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_scale"
publication = "freshen_scale"

[http]
listen = "${{FRESHEN_LISTEN}}"

[key_stream]
brokers = "{bootstrap}"
topic = "keys"
group = "workers"
session_timeout_ms = 2000

[defaults]
coalesce = "20ms"
max_wait = "500ms"
statement_timeout = "5s"

[[views]]
name = "device_totals"
watch = [{{ table = "public.readings", key = ["device"] }}]
keys_per_transaction = 1
reconcile = {{ every = "1h", keys = "SELECT device FROM readings UNION SELECT device FROM device_totals" }}
# The first statement takes a lock on the key for the rebuild's transaction; finding it
# taken means another rebuild of the key is running (two instances rebuilding one key
# at once), and that is counted in a sequence of this instance: a sequence's count
# survives the transaction's rollback (one of two overlapping REPEATABLE READ rebuilds
# fails), where a row logged inside it would not.
rebuild = [
  "SELECT CASE WHEN pg_try_advisory_xact_lock(hashtext('device_totals:' || $1)) THEN 0 ELSE nextval('overlaps_${{FRESHEN_INSTANCE}}') END",
  "INSERT INTO rebuild_log (view, key, worker, started) VALUES ('device_totals', $1, '${{FRESHEN_INSTANCE}}', clock_timestamp())",
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
  "UPDATE rebuild_log SET finished = clock_timestamp() FROM pg_sleep(0.02) WHERE id = currval('rebuild_log_id_seq') AND key = $1",
]

# No reconcile: only keys that reach a worker through the key stream rebuild it, so
# its witness rows (changed once before each SIGKILL, never again) show a lost key.
[[views]]
name = "device_counts"
watch = [{{ table = "public.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM device_counts WHERE device = $1",
  "INSERT INTO device_counts SELECT device, count(*), sum(value) FROM readings WHERE device = $1 GROUP BY device",
]

[[views]]
name = "site_totals"
watch = [{{ table = "readings", key = ["site"] }}, {{ table = "sites", key = ["id"] }}]
rebuild_batch = 16
reconcile = {{ every = "1h", keys = "SELECT id FROM sites" }}
rebuild = [
  "DELETE FROM site_totals WHERE site = ANY($1)",
  "INSERT INTO site_totals SELECT s.id, s.region, coalesce(sum(r.value), 0), count(r.id) FROM sites s LEFT JOIN readings r ON r.site = s.id WHERE s.id = ANY($1) GROUP BY s.id, s.region",
]
"#
    )
}

/// Every instance the test starts, as `start` names them (`FRESHEN_INSTANCE`).
const INSTANCES: [&str; 6] = [
    "capture0", "worker1", "worker2", "worker3", "worker4", "capture5",
];

struct Instance {
    run: Running,
    base: String,
}

fn start(dir: &std::path::Path, cfg: &std::path::Path, n: u32, role: &str) -> Instance {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let name = format!("{role}{n}");
    let run = spawn_role(
        dir,
        cfg,
        n,
        role,
        &[("FRESHEN_INSTANCE", &name), ("FRESHEN_LISTEN", &listen)],
    );
    Instance {
        run,
        base: format!("http://{listen}"),
    }
}

/// The partitions a worker's /status says it owns.
async fn owned(base: &str) -> Option<Vec<i64>> {
    let (code, body) = freshen_cli::status::get(base, "/status").await.ok()?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["source"]["partitions"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_i64()).collect())
}

async fn until_owned(dir: &std::path::Path, what: &str, workers: &[&Instance], all: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut union = std::collections::BTreeSet::new();
        let mut each = true;
        for w in workers {
            let o = owned(&w.base).await.unwrap_or_default();
            each &= !o.is_empty();
            union.extend(o);
        }
        if each && (!all || union.len() == PARTITIONS as usize) {
            return;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = (0..6)
                .map(|n| format!("--- run-{n}\n{}", log_of(dir, n)))
                .collect();
            let mut statuses = Vec::new();
            for w in workers {
                statuses.push(
                    freshen_cli::status::get(&w.base, "/status")
                        .await
                        .map(|(_, b)| b)
                        .unwrap_or_default(),
                );
            }
            panic!(
                "{what}: never (union {union:?})\n{}\n{statuses:#?}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails unless `device_counts` holds every witness device of `tags` (5 each) as the
/// readings say. device_totals and site_totals sweep at each worker's start, which would
/// heal a lost key; device_counts has no sweep.
async fn assert_counted_witnesses(c: &tokio_postgres::Client, tags: &[&str]) {
    let mut lost = Vec::new();
    for tag in tags {
        for i in 0..5 {
            let key = format!("w-{tag}-{i}");
            let right: i64 = c
                .query_one(
                    "SELECT count(*) FROM device_counts d WHERE d.device = $1 AND (d.n, d.total) = (SELECT count(*), sum(value) FROM readings WHERE device = $1)",
                    &[&key],
                )
                .await
                .unwrap()
                .get(0);
            if right != 1 {
                lost.push(key);
            }
        }
    }
    assert!(
        lost.is_empty(),
        "witness keys lost in the key stream: {lost:?}"
    );
}

async fn rebuilt(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT count(*) FROM rebuild_log", &[])
        .await
        .unwrap()
        .get(0)
}

/// Waits for 50 more logged rebuilds than `from`.
async fn progress(c: &tokio_postgres::Client, what: &str, from: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while rebuilt(c).await < from + 50 {
        assert!(Instant::now() < deadline, "{what}: rebuilds stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_and_workers_under_load_and_sigkills_stay_equal_to_truth_without_overlaps() {
    let pg = start_pg();
    let url = pg.url();
    // tansu: noida-db 0.2.3 never expires a member's session, so a SIGKILLed worker
    // would keep its partitions there for good.
    let kafka = KafkaServer::start_flavor(KafkaFlavor::Tansu)
        .expect("a Kafka-protocol broker (run scripts/test-deps-brokers)");
    let bootstrap = kafka.bootstrap();
    create_topics(&bootstrap, &["keys"], PARTITIONS).await;
    let c = connect(&url).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(
        "CREATE TABLE device_counts (device text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL);
         CREATE TABLE rebuild_log (id bigserial PRIMARY KEY, view text NOT NULL, key text NOT NULL, worker text NOT NULL, started timestamptz NOT NULL, finished timestamptz)",
    )
    .await
    .unwrap();
    for instance in INSTANCES {
        c.batch_execute(&format!("CREATE SEQUENCE overlaps_{instance}"))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&url, &bootstrap));

    let mut capture = start(dir.path(), &cfg, 0, "capture");
    let mut w1 = start(dir.path(), &cfg, 1, "worker");
    let mut w2 = start(dir.path(), &cfg, 2, "worker");
    let w3 = start(dir.path(), &cfg, 3, "worker");
    wait_http(&capture.base, "/healthz", 200, Duration::from_secs(60)).await;
    until_owned(
        dir.path(),
        "three workers share the partitions",
        &[&w1, &w2, &w3],
        true,
    )
    .await;

    // The write load runs through everything below.
    let load_url = url.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let load = tokio::spawn(async move {
        let mut c = connect(&load_url).await;
        let mut r = Rng::new(19);
        let mut n = 0;
        while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
            workload(&mut c, &mut r, 10).await;
            n += 10;
        }
        n
    });
    progress(&c, "under load", 0).await;

    // A worker SIGKILLed mid-load: its partitions go to the others after its session.
    witness(&c, "worker", 5).await;
    w2.run.kill().unwrap();
    let _ = w2.run.wait();
    until_owned(
        dir.path(),
        "two workers take every partition",
        &[&w1, &w3],
        true,
    )
    .await;
    let n = rebuilt(&c).await;
    progress(&c, "after a worker's SIGKILL", n).await;

    // A worker joins mid-load: a rebalance moves partitions to it.
    let w4 = start(dir.path(), &cfg, 4, "worker");
    until_owned(
        dir.path(),
        "the new worker gets partitions",
        &[&w1, &w3, &w4],
        true,
    )
    .await;

    // A sweep on every worker at once: each lists every key, and rebuilds only the ones
    // whose partition it owns (unfenced, all three would rebuild every key together).
    let sweep = |w: &Instance| {
        let base = w.base.clone();
        async move {
            freshen_cli::status::request(
                &base,
                "POST",
                "/admin/views/device_totals/sweep",
                None,
                None,
            )
            .await
            .map(|(code, _)| code)
        }
    };
    let (a, b, d) = tokio::join!(sweep(&w1), sweep(&w3), sweep(&w4));
    for code in [a, b, d] {
        assert_eq!(code.ok(), Some(202), "a sweep on request");
    }
    let n = rebuilt(&c).await;
    progress(&c, "after the sweeps", n).await;

    // The capture instance SIGKILLed mid-load, and started again: it replays what it had
    // not confirmed.
    witness(&c, "capture", 5).await;
    capture.run.kill().unwrap();
    let _ = capture.run.wait();
    capture = start(dir.path(), &cfg, 5, "capture");
    wait_http(&capture.base, "/healthz", 200, Duration::from_secs(60)).await;
    let n = rebuilt(&c).await;
    progress(&c, "after the capture's restart", n).await;

    // One more SIGKILL of a worker, then the load stops.
    witness(&c, "last", 5).await;
    w1.run.kill().unwrap();
    let _ = w1.run.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let transactions = load.await.unwrap();
    assert!(transactions > 0);
    wait_equal(&c, Duration::from_secs(120)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stale: i64 = c
            .query_one(
                "SELECT count(*) FROM (SELECT device, count(*), sum(value) FROM readings GROUP BY device EXCEPT SELECT device, n, total FROM device_counts) d",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if stale == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_counted_witnesses(&c, &["worker", "capture", "last"]).await;

    // A TRUNCATE gives no key: the capture sends it to every partition as a gap, and
    // each worker's views sweep (with the dead worker's partitions, their new owner's).
    c.batch_execute("TRUNCATE readings").await.unwrap();
    wait_equal(&c, Duration::from_secs(120)).await;
    let left: i64 = c
        .query_one("SELECT count(*) FROM device_totals", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the truncated table's keys were swept away");

    // No rebuild of a key found another one of it running: counted outside the
    // rebuilds' transactions, so a rolled-back attempt counts too.
    let mut overlapped = Vec::new();
    for instance in INSTANCES {
        let n: i64 = c
            .query_one(
                &format!(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM overlaps_{instance}"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            overlapped.push((instance, n));
        }
    }
    assert!(
        overlapped.is_empty(),
        "rebuilds of a key that found another rebuild of it running, by instance: {overlapped:?}"
    );
    // Nor did two committed rebuilds of one key by different instances overlap in time.
    let overlaps: Vec<(String, String, String)> = c
        .query(
            "SELECT a.key, a.worker, b.worker FROM rebuild_log a JOIN rebuild_log b
               ON a.view = b.view AND a.key = b.key AND a.worker <> b.worker AND a.id < b.id
             WHERE a.started < b.finished AND b.started < a.finished",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(overlaps.is_empty(), "overlapping rebuilds: {overlaps:?}");
    let unfinished: i64 = c
        .query_one(
            "SELECT count(*) FROM rebuild_log WHERE finished IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unfinished, 0, "every logged rebuild committed whole");
    // The work was spread, and keys changed owners along the way.
    let workers: i64 = c
        .query_one("SELECT count(DISTINCT worker) FROM rebuild_log", &[])
        .await
        .unwrap()
        .get(0);
    assert!(workers >= 3, "rebuilds by {workers} workers");
    let moved: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT key FROM rebuild_log GROUP BY key HAVING count(DISTINCT worker) > 1) k",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(moved > 0, "no key changed owners");
    eprintln!(
        "{} logged rebuilds by {workers} workers, {moved} keys changed owners, {transactions} transactions",
        rebuilt(&c).await
    );
    // The capture instance rebuilt nothing.
    let by_capture: i64 = c
        .query_one(
            "SELECT count(*) FROM rebuild_log WHERE worker LIKE 'capture%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(by_capture, 0);
    // `freshen status` names a worker's partitions.
    let out = freshen().args(["status", &w3.base]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("key stream partitions owned:"),
        "{text}\n{}",
        log_of(dir.path(), 3)
    );
    drop(w4);
}
