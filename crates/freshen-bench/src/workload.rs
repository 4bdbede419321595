//! What the PostgreSQL scenarios share: throwaway servers, the `readings` schema and its
//! per-device rollup, `pgbench` as the load generator, freshen run in-process exactly as
//! `freshen run` runs it (a TOML configuration through `Pipeline`), and the check of a
//! derived table against truth.
//!
//! Why `pgbench`: it is PostgreSQL's own load generator, written in C, so the client side
//! costs the same (and little) under every variant; `--rate` gives a Poisson-paced steady
//! load, `random_zipfian` hot keys, `--max-tries` retries deadlocks the way an application
//! would. Our own tokio-postgres clients would share the process (and the counting
//! allocator) with freshen and tax it unevenly.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::Stats;
use freshen_cli::Readout;
use freshen_cli::{Observer, Pipeline};
use freshen_testenv::PgServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

/// Scope keys of the rollup: `readings.device` takes values 1..=DEVICES.
pub(crate) const DEVICES: u32 = 1000;

/// The source table every scenario writes.
pub(crate) const READINGS: &str = "
CREATE TABLE readings (
    id bigserial PRIMARY KEY,
    device int NOT NULL,
    value bigint NOT NULL
);";

/// The rollup, computed from scratch: what every derived table must equal.
pub(crate) const TRUTH: &str =
    "SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings GROUP BY device";

/// freshen's rebuild of one device: the tour's example (docs/views.md), unchanged.
pub(crate) const REBUILD: [&str; 2] = [
    "DELETE FROM device_totals WHERE device = $1",
    "INSERT INTO device_totals (device, total, n) SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
];

/// A throwaway server with the test environment's settings (durability off: the workload
/// is CPU-bound, the harshest case for anything that costs CPU) plus autovacuum on, as in
/// production, and `extra`.
pub(crate) fn server(extra: &[(&str, &str)]) -> anyhow::Result<PgServer> {
    server_at(None, extra)
}

/// [`server`] of major version `version` (the version matrix's build when Debian has
/// none: `scripts/test-deps-postgres` installs them), or the default one.
pub(crate) fn server_at(version: Option<u32>, extra: &[(&str, &str)]) -> anyhow::Result<PgServer> {
    let mut b = PgServer::builder().setting("autovacuum", "on");
    if let Some(v) = version {
        b = b.version(v);
    }
    for (k, v) in extra {
        b = b.setting(*k, *v);
    }
    b.start()
        .context("cannot start a throwaway PostgreSQL (needs the server binaries and pgbench: apt-get install postgresql-15; other versions: scripts/test-deps-postgres)")
}

/// A runtime like the `freshen` binary's (multi-thread, one worker per core).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

pub(crate) async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .context("cannot connect to the benchmark database")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Rows of `device_totals` that differ from [`TRUTH`], counted both ways.
pub(crate) async fn diff(c: &Client) -> anyhow::Result<i64> {
    let derived = "SELECT device, total, n FROM device_totals";
    let sql = format!(
        "SELECT count(*) FROM (({derived} EXCEPT {TRUTH}) UNION ALL ({TRUTH} EXCEPT {derived})) d"
    );
    Ok(c.query_one(&sql, &[]).await?.get(0))
}

/// Polls [`diff`] until the derived table equals truth; returns how long after `since`
/// the first matching check *started* (its snapshot is at most that old), or `None`
/// after `deadline`.
pub(crate) async fn converge(
    c: &Client,
    since: Instant,
    deadline: Duration,
) -> anyhow::Result<Option<Duration>> {
    loop {
        let at = Instant::now();
        if diff(c).await? == 0 {
            return Ok(Some(at.saturating_duration_since(since)));
        }
        if since.elapsed() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One pgbench script and its weight in the mix.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) body: String,
    pub(crate) weight: u32,
}

/// How pgbench drives the server.
#[derive(Clone)]
pub(crate) struct Load {
    pub(crate) clients: u32,
    pub(crate) duration: Duration,
    /// Target transactions per second (Poisson-paced), or as fast as possible.
    pub(crate) rate: Option<u32>,
    /// `-D name=value` variables.
    pub(crate) vars: Vec<(String, String)>,
}

/// What pgbench reported.
#[derive(Debug, Clone)]
pub(crate) struct LoadResult {
    pub(crate) transactions: u64,
    pub(crate) failed: u64,
    pub(crate) retries: u64,
    /// Transactions per second, connection set-up excluded.
    pub(crate) tps: f64,
    /// When pgbench exited: every one of its transactions had committed by then.
    pub(crate) ended: Instant,
    /// Per-transaction latency p50 and p99 from pgbench's transaction log
    /// ([`Bench::run_logged`] only).
    pub(crate) latency: Option<(Duration, Duration)>,
}

/// Where pgbench runs: the binary and the server's URL.
#[derive(Clone)]
pub(crate) struct Bench {
    bin: PathBuf,
    url: String,
}

impl Bench {
    pub(crate) fn of(pg: &PgServer) -> Bench {
        Bench {
            bin: pg.tool("pgbench"),
            url: pg.url(),
        }
    }

    /// Runs the scripts for `load.duration` (blocking) and parses pgbench's summary.
    pub(crate) fn run(&self, scripts: &[Script], load: &Load) -> anyhow::Result<LoadResult> {
        self.run_with(scripts, load, false)
    }

    /// [`run`](Self::run), with every transaction's latency logged (`pgbench -l`) and
    /// summed up as p50 and p99.
    pub(crate) fn run_logged(&self, scripts: &[Script], load: &Load) -> anyhow::Result<LoadResult> {
        self.run_with(scripts, load, true)
    }

    fn run_with(&self, scripts: &[Script], load: &Load, log: bool) -> anyhow::Result<LoadResult> {
        let dir = tempfile::tempdir().context("a directory for the pgbench scripts")?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(["-n", "-M", "prepared", "--random-seed", "20240601"])
            .args(["-c", &load.clients.to_string()])
            .args(["-j", &load.clients.min(2).to_string()])
            .args(["-T", &load.duration.as_secs().max(1).to_string()])
            // Deadlocks between concurrent row triggers are retried as an application
            // would; what still fails after ten tries is reported.
            .args(["--max-tries", "10"]);
        if let Some(r) = load.rate {
            cmd.args(["--rate", &r.to_string()]);
        }
        for (k, v) in &load.vars {
            cmd.args(["-D", &format!("{k}={v}")]);
        }
        if log {
            cmd.arg("-l").arg("--log-prefix").arg(dir.path().join("tx"));
        }
        for s in scripts {
            let path = dir.path().join(format!("{}.sql", s.name));
            std::fs::write(&path, &s.body).context("writing a pgbench script")?;
            cmd.arg("-f")
                .arg(format!("{}@{}", path.display(), s.weight));
        }
        cmd.arg(&self.url);
        let out = cmd
            .output()
            .with_context(|| format!("running {}", self.bin.display()))?;
        let ended = Instant::now();
        let text = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.success(),
            "pgbench failed ({}):\n{}\n{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |prefix: &str| -> Option<f64> {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(prefix))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.split('/').next()?.parse().ok())
        };
        Ok(LoadResult {
            transactions: field("number of transactions actually processed:")
                .context("pgbench printed no transaction count")? as u64,
            failed: field("number of failed transactions:").unwrap_or(0.0) as u64,
            retries: field("total number of retries:").unwrap_or(0.0) as u64,
            tps: field("tps =").context("pgbench printed no tps")?,
            ended,
            latency: if log {
                Some(latency_percentiles(dir.path())?)
            } else {
                None
            },
        })
    }
}

/// p50 and p99 of the latencies in pgbench's transaction logs (`tx.*` in `dir`): each
/// line is `client transaction latency_us script epoch epoch_us …`; failed transactions
/// (no number in the latency field) are left out.
fn latency_percentiles(dir: &std::path::Path) -> anyhow::Result<(Duration, Duration)> {
    let mut us: Vec<u64> = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        if !e.file_name().to_string_lossy().starts_with("tx.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path())?;
        us.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
        );
    }
    anyhow::ensure!(!us.is_empty(), "pgbench logged no transaction");
    us.sort_unstable();
    let at = |q: f64| Duration::from_micros(us[((us.len() - 1) as f64 * q).round() as usize]);
    Ok((at(0.5), at(0.99)))
}

/// The same rollup in query mode: freshen writes what it returns for a batch of devices.
pub(crate) const QUERY: &str = "SELECT device, sum(value) AS total, count(*) AS n FROM readings WHERE device = ANY($1) GROUP BY device";

/// The hand-written rebuild over arrays of devices (`rebuild_batch`).
pub(crate) const REBUILD_ARRAYS: [&str; 2] = [
    "DELETE FROM device_totals WHERE device = ANY($1)",
    "INSERT INTO device_totals (device, total, n) SELECT device, sum(value), count(*) FROM readings WHERE device = ANY($1) GROUP BY device",
];

/// [`config`] in query mode: `into = "device_totals"`, `query = QUERY`; `batch` sets
/// `rebuild_batch` (default: query mode's own).
pub(crate) fn query_config(
    url: &str,
    batch: Option<usize>,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    query_config_of(url, QUERY, batch, coalesce, max_wait, reconcile)
}

/// [`query_config`] with another `query` into `device_totals`.
pub(crate) fn query_config_of(
    url: &str,
    query: &str,
    batch: Option<usize>,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    let how = format!("into = \"device_totals\"\nquery = {query:?}");
    view_config(url, &how, batch, coalesce, max_wait, reconcile)
}

/// [`query_config`] decoding on a standby (PostgreSQL 16): the slot and its walsender on
/// `standby`, the publication made beforehand on the primary (`freshen`, freshen's
/// default name), the rebuilds written to the primary — as docs/operating.md says to run
/// it, `primary_url` included (freshen asks the primary for a standby snapshot while it
/// creates the slot, and reads its WAL position before confirming).
pub(crate) fn standby_query_config(
    standby: &str,
    primary: &str,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    let source = format!(
        "kind = \"postgres\"\nurl = \"{standby}\"\nprimary_url = \"{primary}\"\n\
         publication_mode = \"existing\"\n\n[target]\nurl = \"{primary}\""
    );
    let how = format!("into = \"device_totals\"\nquery = {QUERY:?}");
    config_of(&source, &how, None, coalesce, max_wait, reconcile)
}

/// A configuration for one view `device_totals` over `readings`, as a user would write it;
/// `batch` sets `rebuild_batch` (the statements then take arrays).
pub(crate) fn config(
    url: &str,
    rebuild: &[&str],
    batch: Option<usize>,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    let rebuild: Vec<String> = rebuild.iter().map(|s| format!("  {s:?},")).collect();
    let how = format!("rebuild = [\n{}\n]", rebuild.join("\n"));
    view_config(url, &how, batch, coalesce, max_wait, reconcile)
}

fn view_config(
    url: &str,
    how: &str,
    batch: Option<usize>,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    let source = format!("kind = \"postgres\"\nurl = \"{url}\"");
    config_of(&source, how, batch, coalesce, max_wait, reconcile)
}

/// The configuration of the one view with `source` as the `[source]` section's body
/// (followed by any `[target]`).
fn config_of(
    source: &str,
    how: &str,
    batch: Option<usize>,
    coalesce: &str,
    max_wait: &str,
    reconcile: bool,
) -> String {
    let batch = batch.map_or(String::new(), |n| format!("rebuild_batch = {n}"));
    let reconcile = if reconcile {
        "reconcile = { every = \"1h\", keys = \"SELECT device FROM readings UNION SELECT device FROM device_totals\" }"
    } else {
        ""
    };
    format!(
        r#"
[source]
{source}

[http]
listen = "off"

[defaults]
coalesce = "{coalesce}"
max_wait = "{max_wait}"

[[views]]
name = "device_totals"
watch = [{{ table = "readings", key = ["device"] }}]
{batch}
{how}
{reconcile}
"#
    )
}

/// freshen running in this process, as `freshen run` runs a configuration.
pub(crate) struct Freshen {
    observer: Arc<Observer>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Freshen {
    /// Starts the pipeline (creates slot and publication) and waits until it streams and
    /// any start-up reconcile sweep has been rebuilt.
    pub(crate) async fn start(toml: &str) -> anyhow::Result<Freshen> {
        let cfg = freshen_cli::config::parse(toml, "bench.toml", &|_| None, freshen_cli::kinds())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let sweep = cfg.views.iter().any(|v| v.reconcile.is_some());
        let pipeline = Pipeline::start(&cfg).await?;
        let observer = pipeline.observer();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(pipeline.run(async {
            let _ = stopped.await;
        }));
        let f = Freshen {
            observer,
            stop: Some(stop),
            task: Some(task),
        };
        f.wait(
            "the pipeline to stream and finish its start-up sweep",
            |f| {
                let s = f.stats();
                f.observer.source().streaming
                    && (!sweep || s.reconciles > 0)
                    && s.dirty == 0
                    && s.in_flight == 0
            },
        )
        .await?;
        Ok(f)
    }

    /// The (single) view's stats.
    pub(crate) fn stats(&self) -> Stats {
        self.observer
            .views()
            .into_iter()
            .next()
            .map(|v| v.stats)
            .unwrap_or_default()
    }

    /// Waits until `done` holds (checked every millisecond, two minutes at most).
    pub(crate) async fn wait(
        &self,
        what: &str,
        done: impl Fn(&Freshen) -> bool,
    ) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        loop {
            if done(self) {
                return Ok(t0.elapsed());
            }
            if let Some(t) = &self.task
                && t.is_finished()
            {
                anyhow::bail!(
                    "freshen stopped while waiting for {what}: {:?}",
                    self.observer.source().last_error
                );
            }
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(120),
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits until the view has received `events` row events and rebuilt every key.
    pub(crate) async fn drain(&self, events: u64) -> anyhow::Result<Duration> {
        self.wait("every event to be received and rebuilt", |f| {
            let s = f.stats();
            s.events_received >= events && s.dirty == 0 && s.in_flight == 0
        })
        .await
    }

    /// Stops the pipeline gracefully and lets the replication connection go before the
    /// server does.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.context("the pipeline task panicked")??;
        }
        let source = self.observer.source_probe();
        let deadline = Instant::now() + Duration::from_secs(5);
        while source.health().streaming && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// `Some(d)` as milliseconds, `None` as a dash.
pub(crate) fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "–".into(),
        |d| {
            let ms = d.as_secs_f64() * 1e3;
            if ms >= 100.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{ms:.1} ms")
            }
        },
    )
}

/// The median of `v` (the middle one, or the lower of the two middle ones).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

/// /proc reports times in USER_HZ, 100 on every mainstream Linux ABI.
const USER_HZ: u64 = 100;

/// `(ppid, own user + system ticks, reaped children's ticks)` of a process, from
/// `/proc/PID/stat`.
fn stat_of(pid: u32) -> Option<(u32, u64, u64)> {
    stat_at(&format!("/proc/{pid}/stat"))
}

fn stat_at(path: &str) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    // Then: state(3) ppid(4) … utime(14) stime(15) cutime(16) cstime(17).
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some((num(4) as u32, num(14) + num(15), num(16) + num(17)))
}

fn ticks(n: u64) -> Duration {
    Duration::from_millis(n * 1000 / USER_HZ)
}

/// CPU time (user + system) a live process has spent itself.
pub(crate) fn process_cpu(pid: u32) -> Duration {
    ticks(stat_of(pid).map_or(0, |(_, own, _)| own))
}

/// CPU time (user + system) the calling thread has spent.
pub(crate) fn thread_cpu() -> Duration {
    ticks(stat_at("/proc/thread-self/stat").map_or(0, |(_, own, _)| own))
}

/// CPU time (user + system) spent so far by the PostgreSQL server whose data directory is
/// `data_dir`: its postmaster and every backend, live or reaped (a walsender, a polling
/// connection, the writers' backends).
pub(crate) fn server_cpu(data_dir: &std::path::Path) -> Duration {
    let Some(root) = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
    else {
        return Duration::ZERO;
    };
    let mut total = stat_of(root).map_or(0, |(_, own, reaped)| own + reaped);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for pid in dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        {
            if let Some((ppid, own, reaped)) = stat_of(pid)
                && ppid == root
            {
                total += own + reaped;
            }
        }
    }
    ticks(total)
}

/// CPU time (user + system) spent so far by this process and every process below it:
/// the PostgreSQL server and its backends, pgbench, pg_recvlogical, freshen's threads.
///
/// Each live process counts its own time plus that of the children it has reaped
/// (`cutime`, `cstime`), so every process, live or gone, counts exactly once. Unlike a
/// throughput, this barely moves when other work shares the machine.
pub(crate) fn tree_cpu() -> Duration {
    let procs: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|pid| stat_of(pid).map(|(ppid, own, reaped)| (pid, ppid, own + reaped)))
                .collect()
        })
        .unwrap_or_default();
    let mut tree = vec![std::process::id()];
    let mut total = 0;
    while let Some(p) = tree.pop() {
        for &(pid, ppid, t) in &procs {
            if pid == p {
                total += t;
            }
            if ppid == p {
                tree.push(pid);
            }
        }
    }
    ticks(total)
}

/// CPU time (user + system, every core) the whole machine has spent so far, whoever spent
/// it — this run or other work sharing the machine — from `/proc/stat`'s first line
/// (`cpu user nice system idle iowait irq softirq steal …`, in USER_HZ): what is neither
/// idle nor waiting for I/O.
pub(crate) fn machine_cpu() -> Duration {
    let busy = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<u64> = s
                .lines()
                .next()?
                .split_whitespace()
                .skip(1)
                .map_while(|v| v.parse().ok())
                .collect();
            let at = |i: usize| f.get(i).copied().unwrap_or(0);
            Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
        })
        .unwrap_or(0);
    ticks(busy)
}

/// The machine's load average over the last minute (`/proc/loadavg`).
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
