//! Shared helpers for the binary's end-to-end tests: a throwaway PostgreSQL with the
//! readings schema, a config file, the `freshen` process.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod saas;

use freshen_testenv::PgServer;
use tokio_postgres::{Client, NoTls};

macro_rules! tables {
    () => {
        "
CREATE TABLE sites (id text PRIMARY KEY, region text NOT NULL);
CREATE TABLE readings (id bigserial PRIMARY KEY, device text NOT NULL, site text NOT NULL, value bigint NOT NULL);
ALTER TABLE readings REPLICA IDENTITY FULL;
ALTER TABLE sites REPLICA IDENTITY FULL;
CREATE INDEX ON readings (device);
CREATE INDEX ON readings (site);
CREATE TABLE device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE site_totals (site text PRIMARY KEY, region text NOT NULL, total bigint NOT NULL, n bigint NOT NULL);
"
    };
}

macro_rules! sites {
    () => {
        "INSERT INTO sites SELECT 's' || g, (ARRAY['eu','us','ap'])[1 + g % 3] FROM generate_series(0, 9) g;\n"
    };
}

/// The readings schema: its tables, then its sites.
pub const SCHEMA: &str = concat!(tables!(), sites!());
/// The schema's tables alone, empty: for a run with no sweep, which then learns every
/// row, the [`SITES`] included, from the stream.
pub const TABLES: &str = tables!();
/// The schema's sites.
pub const SITES: &str = sites!();

/// Two views; the second watches two tables.
pub fn config(url: &str, http: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_test"
publication = "freshen_test"

[http]
listen = "{http}"

[defaults]
coalesce = "20ms"
max_wait = "500ms"

[[views]]
name = "device_totals"
watch = [{{ table = "public.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
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

pub const TRUTH: [(&str, &str, &str); 2] = [
    (
        "device_totals",
        "SELECT device, total, n FROM device_totals",
        "SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device",
    ),
    (
        "site_totals",
        "SELECT site, region, total, n FROM site_totals",
        "SELECT s.id, s.region, coalesce(sum(r.value), 0)::bigint, count(r.id) FROM sites s LEFT JOIN readings r ON r.site = s.id GROUP BY s.id, s.region",
    ),
];

pub fn start_pg() -> PgServer {
    PgServer::start().expect("a throwaway PostgreSQL (apt-get install postgresql-15)")
}

pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Rows that differ between each derived table and its truth, per table.
pub async fn differences(c: &Client) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    for (name, derived, truth) in TRUTH {
        let sql = format!(
            "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
        );
        out.push((
            name,
            c.query_one(&sql, &[])
                .await
                .expect("compare")
                .get::<_, i64>(0),
        ));
    }
    out
}

/// Polls until every derived table equals truth, or fails after `within`.
pub async fn wait_equal(c: &Client, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let d = differences(c).await;
        if d.iter().all(|(_, n)| *n == 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "derived tables never matched truth: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `text` with `from` replaced by `to`, failing when `from` is not there: a test's
/// meaning often rests on such an edit (a sweep taken out), and one that silently did
/// not take would test something else.
pub fn edited(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the edit did not take: {from:?} is not in\n{text}"
    );
    text.replace(from, to)
}

/// [`config`]'s views without any reconcile sweep: nothing but the stream heals them.
pub fn without_sweeps(text: &str) -> String {
    let out = edited(
        text,
        "reconcile = { every = \"1h\", keys = \"SELECT id FROM sites\" }\n",
        "",
    );
    assert!(!out.contains("reconcile"), "a sweep is left in\n{out}");
    out
}

/// Fails unless no view of the run serving `base` ran a reconcile sweep (at start or
/// since): what a fault test's witnesses show then came from the stream alone.
pub async fn assert_no_sweep_ran(base: &str) {
    let s = freshen_cli::status::fetch(base).await.expect("/status");
    assert!(!s.views.is_empty(), "views in /status: {s:?}");
    for v in &s.views {
        assert!(
            v.reconciles == 0 && v.sweep_rebuilds == 0 && v.sweep_listed == 0,
            "view {} ran a reconcile sweep, which may have healed what the test checks: {v:?}",
            v.name
        );
    }
}

pub fn free_port() -> u16 {
    freshen_testenv::support::free_port().expect("a free port")
}

pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("freshen.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// The `freshen` binary under test.
pub fn freshen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_freshen"))
}

/// The findings `freshen check --json` printed.
pub fn findings(out: &std::process::Output) -> Vec<serde_json::Value> {
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    doc["findings"].as_array().expect("findings").clone()
}

/// `freshen check --json` (with `--offline` if asked) on `text` written into `dir`: its
/// exit code and findings.
pub fn check_findings(
    dir: &Path,
    text: &str,
    offline: bool,
) -> (Option<i32>, Vec<serde_json::Value>) {
    let cfg = write_config(dir, text);
    let mut cmd = freshen();
    cmd.args(["check", "--json"]);
    if offline {
        cmd.arg("--offline");
    }
    let out = cmd.arg("-c").arg(&cfg).output().expect("freshen check");
    (out.status.code(), findings(&out))
}

/// [`check_findings`] against the databases the file names.
pub fn check_json(dir: &Path, text: &str) -> (Option<i32>, Vec<serde_json::Value>) {
    check_findings(dir, text, false)
}

/// Whether a finding of `level` by `check` says `needle`.
pub fn has(f: &[serde_json::Value], level: &str, check: &str, needle: &str) -> bool {
    messages(f, level, check).iter().any(|m| m.contains(needle))
}

/// The messages of the findings of `level` by `check`.
pub fn messages<'a>(f: &'a [serde_json::Value], level: &str, check: &str) -> Vec<&'a str> {
    f.iter()
        .filter(|x| x["level"] == level && x["check"] == check)
        .filter_map(|x| x["message"].as_str())
        .collect()
}

/// A `freshen run` process that is killed when dropped, so a failing test never leaves
/// one behind.
pub struct Running(Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A `freshen run` on a config of its own, healthy; see [`run_healthy`].
pub struct Started {
    /// Where the config and the log are.
    pub dir: tempfile::TempDir,
    /// `http://127.0.0.1:port` of its HTTP listener.
    pub base: String,
    /// The process (killed when dropped).
    pub run: Running,
}

/// Writes `text(listen)` (the config, given the `host:port` its HTTP listener should use)
/// to a new directory, runs freshen on it — with at most `nofile` descriptors, if given —
/// and waits for `/healthz` to say 200.
pub async fn run_healthy(text: impl FnOnce(&str) -> String, nofile: Option<u32>) -> Started {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(dir.path(), &text(&format!("127.0.0.1:{port}")));
    let run = match nofile {
        Some(n) => spawn_run_limited(dir.path(), &cfg, 1, n),
        None => spawn_run(dir.path(), &cfg, 1),
    };
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    Started { dir, base, run }
}

/// `freshen run -c path` with at most `nofile` open descriptors (`ulimit -n`), logging
/// to a file in `dir`.
pub fn spawn_run_limited(dir: &Path, config: &Path, n: u32, nofile: u32) -> Running {
    let log = std::fs::File::create(dir.join(format!("run-{n}.log"))).expect("log file");
    Running(
        Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" run -c \"$1\""))
            .arg(env!("CARGO_BIN_EXE_freshen"))
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn freshen run"),
    )
}

/// `freshen run -c path`, logging to a file in `dir`.
pub fn spawn_run(dir: &Path, config: &Path, n: u32) -> Running {
    spawn_run_env(dir, config, n, &[])
}

/// [`spawn_run`] with `env` set for the process.
pub fn spawn_run_env(dir: &Path, config: &Path, n: u32, env: &[(&str, &str)]) -> Running {
    let log = std::fs::File::create(dir.join(format!("run-{n}.log"))).expect("log file");
    Running(
        freshen()
            .args(["run", "-c"])
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn freshen run"),
    )
}

/// `freshen run -c path --role role` with `env` set, logging to `run-{n}.log` in `dir`.
pub fn spawn_role(dir: &Path, config: &Path, n: u32, role: &str, env: &[(&str, &str)]) -> Running {
    let log = std::fs::File::create(dir.join(format!("run-{n}.log"))).expect("log file");
    Running(
        freshen()
            .args(["run", "--role", role, "-c"])
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn freshen run"),
    )
}

pub fn log_of(dir: &Path, n: u32) -> String {
    std::fs::read_to_string(dir.join(format!("run-{n}.log"))).unwrap_or_default()
}

/// Polls `/healthz` of the run logging to `run-{n}.log` in `dir` until it answers 200;
/// fails after `within` with that run's log.
pub async fn wait_healthy(base: &str, dir: &Path, n: u32, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((200, _)) = freshen_cli::status::get(base, "/healthz").await {
            return;
        }
        if Instant::now() >= deadline {
            let body = freshen_cli::status::get(base, "/healthz").await;
            panic!(
                "{base}/healthz never answered 200 (last: {body:?}); the run's log:\n{}",
                log_of(dir, n)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `GET base+path` until it answers `code`, or fails after `within`.
pub async fn wait_http(base: &str, path: &str, code: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((c, body)) = freshen_cli::status::get(base, path).await
            && c == code
        {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{base}{path} never answered {code}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A small deterministic generator for workloads.
/// Deterministic workloads: the workspace's one generator.
pub use freshen::Jitter as Rng;

/// `n` transactions of inserts, scope-moving updates (device and site), value updates,
/// deletes and site re-assignments.
pub async fn workload(c: &mut Client, r: &mut Rng, n: usize) {
    for _ in 0..n {
        one_transaction(c, r).await.expect("workload statement");
    }
}

/// Like [`workload`], for writers that run side by side: a transaction the server
/// aborts to break a deadlock between them (SQLSTATE 40P01) is rolled back and counted
/// as not written, as an application would retry it; any other error fails the test.
pub async fn concurrent_workload(c: &mut Client, r: &mut Rng, n: usize) {
    for _ in 0..n {
        if let Err(e) = one_transaction(c, r).await {
            assert_eq!(
                e.code(),
                Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED),
                "workload statement: {e}"
            );
        }
    }
}

async fn one_transaction(c: &mut Client, r: &mut Rng) -> Result<(), tokio_postgres::Error> {
    let tx = c.transaction().await.expect("begin");
    for _ in 0..=r.below(3) {
        let d = format!("d{}", r.below(30));
        let s = format!("s{}", r.below(10));
        let v = r.below(100) as i64;
        let pick = "(SELECT id FROM readings WHERE device = $2 ORDER BY id LIMIT 1)";
        let result = match r.below(10) {
            0..=4 => tx.execute("INSERT INTO readings (device, site, value) VALUES ($1, $2, $3)", &[&d, &s, &v]).await,
            5 => tx.execute(&format!("UPDATE readings SET value = $1 WHERE id = {pick}"), &[&v, &d]).await,
            6 => {
                let from = format!("d{}", r.below(30));
                tx.execute(&format!("UPDATE readings SET device = $1 WHERE id = {pick}"), &[&d, &from]).await
            }
            7 => {
                let from = format!("d{}", r.below(30));
                tx.execute(&format!("UPDATE readings SET site = $1 WHERE id = {pick}"), &[&s, &from]).await
            }
            8 => tx.execute("DELETE FROM readings WHERE id = (SELECT id FROM readings WHERE device = $1 ORDER BY id LIMIT 1)", &[&d]).await,
            _ => {
                let region = ["eu", "us", "ap"][r.below(3) as usize];
                tx.execute("UPDATE sites SET region = $1 WHERE id = $2", &[&region, &s]).await
            }
        };
        result?;
    }
    tx.commit().await?;
    Ok(())
}

/// Writes witness rows: for each of `n` keys `w-{tag}-{i}`, a site of that name and a
/// reading of a device of that name at it, one transaction each. [`workload`] never
/// touches a `w-` device or site, so in a view without a reconcile sweep only the stream
/// can bring these changes: write them just before a fault, and a change lost at the
/// fault stays lost ([`wait_equal`] and [`assert_witnesses`] then fail). A second call
/// with the same tag changes each witness once more (its value, and its site's region).
pub async fn witness(c: &Client, tag: &str, n: usize) {
    for i in 0..n {
        let key = format!("w-{tag}-{i}");
        c.batch_execute("BEGIN").await.expect("begin");
        let stmts: [(&str, &[&(dyn tokio_postgres::types::ToSql + Sync)]); 3] = [
            (
                "INSERT INTO sites VALUES ($1, 'eu') ON CONFLICT (id) DO UPDATE SET region = 'us'",
                &[&key],
            ),
            (
                "UPDATE readings SET value = value + 1 WHERE device = $1",
                &[&key],
            ),
            (
                "INSERT INTO readings (device, site, value) SELECT $1, $1, 7 WHERE NOT EXISTS (SELECT FROM readings WHERE device = $1)",
                &[&key],
            ),
        ];
        for (sql, params) in stmts {
            c.execute(sql, params).await.expect("witness");
        }
        c.batch_execute("COMMIT").await.expect("commit");
    }
}

/// Fails unless the witness rows of every tag in `tags` (`n` each, see [`witness`]) are
/// in `device_totals` and `site_totals` exactly as the source tables say, naming the
/// ones that are not. Call it after [`wait_equal`]: it shows the witnesses took part.
pub async fn assert_witnesses(c: &Client, tags: &[&str], n: usize) {
    let mut missing = Vec::new();
    for tag in tags {
        for i in 0..n {
            let key = format!("w-{tag}-{i}");
            let device: i64 = c
                .query_one(
                    "SELECT count(*) FROM device_totals d JOIN (SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings WHERE device = $1 GROUP BY device) t USING (device) WHERE d.total = t.total AND d.n = t.n",
                    &[&key],
                )
                .await
                .expect("witness device")
                .get(0);
            let site: i64 = c
                .query_one(
                    "SELECT count(*) FROM site_totals d JOIN sites s ON s.id = d.site WHERE d.site = $1 AND d.region = s.region AND d.n = (SELECT count(*) FROM readings WHERE site = $1)",
                    &[&key],
                )
                .await
                .expect("witness site")
                .get(0);
            if device != 1 || site != 1 {
                missing.push(key);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "witness rows lost (changed once before a fault, never again): {missing:?}"
    );
}

/// A TiCDC canal-json message for one row of `demo.readings`.
pub fn canal(kind: &str, id: i64, device: &str, value: i64) -> Vec<u8> {
    serde_json::json!({
        "id": 0, "database": "demo", "table": "readings", "pkNames": ["id"], "isDdl": false,
        "type": kind, "es": 1786358942713u64, "ts": 1786358944991u64, "sql": "",
        "sqlType": {"id": 4, "device": 12, "value": 4},
        "mysqlType": {"id": "int", "device": "varchar", "value": "int"},
        "old": null,
        "data": [{"id": id.to_string(), "device": device, "value": value.to_string()}],
    })
    .to_string()
    .into_bytes()
}

/// The derived `demo.device_totals` and its truth in `demo.readings` (the TiDB-shaped
/// schema of the broker tests).
pub const DEMO_SCHEMA: &str = "
CREATE SCHEMA demo;
CREATE TABLE demo.readings (id bigint PRIMARY KEY, device text NOT NULL, value bigint NOT NULL);
CREATE TABLE demo.device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
";

/// A view over `demo.readings` for configs whose source is a broker.
pub const DEMO_VIEW: &str = r#"
[defaults]
coalesce = "20ms"

[[views]]
name = "device_totals"
watch = [{ table = "demo.readings", key = ["device"] }]
rebuild = [
  "DELETE FROM demo.device_totals WHERE device = $1",
  "INSERT INTO demo.device_totals SELECT device, sum(value), count(*) FROM demo.readings WHERE device = $1 GROUP BY device",
]
"#;

/// Polls until `demo.device_totals` equals its truth with `devices` rows.
pub async fn wait_demo_equal(c: &Client, devices: i64, within: Duration) -> bool {
    let truth = "SELECT device, sum(value)::bigint, count(*) FROM demo.readings GROUP BY device";
    let derived = "SELECT device, total, n FROM demo.device_totals";
    let deadline = Instant::now() + within;
    loop {
        let diff: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"),
                &[],
            )
            .await
            .expect("compare")
            .get(0);
        let rows: i64 = c
            .query_one("SELECT count(*) FROM demo.device_totals", &[])
            .await
            .expect("count")
            .get(0);
        if diff == 0 && rows == devices {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every event of the changefeed served at `base`, in sequence order.
pub async fn changefeed_events(base: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        let (code, body) =
            freshen_cli::status::get(base, &format!("/changefeed?from_seq={from}&limit=500"))
                .await
                .expect("the changefeed answers");
        assert_eq!(code, 200, "{body}");
        let doc: serde_json::Value = serde_json::from_str(&body).expect("a JSON page");
        let events = doc["events"].as_array().cloned().unwrap_or_default();
        let Some(last) = events.last() else {
            return out;
        };
        from = last["sequence"].as_u64().expect("a sequence");
        out.extend(events);
    }
}

/// Creates `topics` on the broker at `bootstrap`, each with `partitions` partitions.
pub async fn create_topics(bootstrap: &str, topics: &[&str], partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a Kafka admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let made = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(60))),
        )
        .await
        .expect("topics created");
    for r in made {
        r.expect("a topic created");
    }
}

/// Stops the run logging to `run-{n}.log` in `dir` with SIGTERM and asserts it exited
/// cleanly (its log on failure).
pub fn stop_run(run: &mut Running, dir: &Path, n: u32) {
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(
        run.wait().expect("the run ends").success(),
        "{}",
        log_of(dir, n)
    );
}

/// A reader of every partition of `topics` from their first records, assigned by hand:
/// it never joins group `group` (librdkafka needs a `group.id` to assign, not to join)
/// and commits nothing. A subscribed member's drop waits, without a bound, until the
/// broker has let it leave its group; a test that only reads a topic has no group to
/// leave. The topics must exist (their partitions are read from the broker).
pub fn reader(bootstrap: &str, group: &str, topics: &[&str]) -> rdkafka::consumer::BaseConsumer {
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a Kafka consumer");
    let mut assigned = rdkafka::TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the partitions of {topic}: {e}"));
        for t in metadata.topics() {
            assert!(!t.partitions().is_empty(), "{topic} has no partitions");
            for p in t.partitions() {
                assigned
                    .add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                    .expect("a partition to read");
            }
        }
    }
    consumer.assign(&assigned).expect("the partitions assigned");
    consumer
}
