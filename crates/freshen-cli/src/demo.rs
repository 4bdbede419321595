//! `freshen demo`: a throwaway PostgreSQL, a live write workload, three derived tables —
//! each the SELECT a person would write for a materialized view — built whole at start
//! and kept fresh by the same pipeline `freshen run` uses, the status page served, and a
//! check against truth at the end.

use std::io::{IsTerminal, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use freshen_testenv::PgServer;
use tokio_postgres::{Client, NoTls};

use crate::config;
use crate::pipeline::{Observer, Pipeline};
use crate::readout::{Readout, status};
use crate::status::lsn;

/// Options of the demo.
#[derive(Debug, Clone)]
pub(crate) struct DemoOptions {
    /// How long the writers run.
    pub duration: Duration,
    /// Concurrent writers.
    pub writers: usize,
    /// Keep running at the end until Ctrl-C, and leave the database running.
    pub keep: bool,
    /// Where the status page listens: this address, or where it is taken, any free
    /// port of its host.
    pub listen: std::net::SocketAddr,
}

const DEVICES: u64 = 200;
const SITES: u64 = 20;
const REGIONS: [&str; 4] = ["eu", "us", "ap", "sa"];

const SCHEMA: &str = "
CREATE TABLE sites (id text PRIMARY KEY, region text NOT NULL);
CREATE TABLE readings (
    id bigserial PRIMARY KEY,
    device text NOT NULL,
    site text NOT NULL,
    value bigint NOT NULL
);
-- FULL identity: an UPDATE that moves a reading to another device or site carries the
-- old values, so both the old and the new scope are rebuilt.
ALTER TABLE readings REPLICA IDENTITY FULL;
CREATE INDEX ON readings (device);
CREATE INDEX ON readings (site);
ALTER TABLE sites REPLICA IDENTITY FULL;
CREATE TABLE device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE site_totals (
    site text PRIMARY KEY, region text NOT NULL, total bigint NOT NULL, n bigint NOT NULL
);
CREATE TABLE readings_and_devices_per_region (
    region text PRIMARY KEY, devices bigint NOT NULL, readings bigint NOT NULL
);
";

/// The views: the SELECTs a person would write for materialized views.
const VIEWS: [(&str, &str); 3] = [
    (
        "device_totals",
        "SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings GROUP BY device",
    ),
    (
        "site_totals",
        "SELECT s.id AS site, s.region, coalesce(sum(r.value), 0)::bigint AS total, count(r.id) AS n FROM sites s LEFT JOIN readings r ON r.site = s.id GROUP BY s.id, s.region",
    ),
    (
        "readings_and_devices_per_region",
        "SELECT s.region, count(DISTINCT r.device) AS devices, count(*) AS readings FROM readings r JOIN sites s ON s.id = r.site GROUP BY s.region",
    ),
];

/// The demo's configuration: exactly what a user would write — the views' SELECTs, and
/// nothing else (what they watch and their keys are inferred, the tables built whole at
/// the first start).
pub(crate) fn demo_config(url: &str, listen: &str) -> String {
    let mut out = format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
slot = "freshen_demo"
publication = "freshen_demo"

[http]
listen = "{listen}"

[defaults]
coalesce = "50ms"
max_wait = "1s"
workers = 4
"#
    );
    for (name, query) in VIEWS {
        out.push_str(&format!(
            "\n[[views]]\nname = \"{name}\"\ninto = \"{name}\"\nquery = \"{query}\"\n"
        ));
    }
    out
}

/// The demo needs variety, not cryptography: the workspace's one generator.
use freshen::Jitter as Rng;

fn device(r: &mut Rng) -> String {
    format!("dev-{:03}", r.below(DEVICES))
}

fn site(r: &mut Rng) -> String {
    format!("s{:02}", r.below(SITES))
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .context("cannot connect to the demo database")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// One small transaction: inserts, updates (some moving a reading to another device or
/// site), deletes, the odd site re-assignment.
async fn transaction(c: &mut Client, r: &mut Rng) -> Result<(), tokio_postgres::Error> {
    let tx = c.transaction().await?;
    for _ in 0..=r.below(3) {
        let (d, s, v) = (device(r), site(r), r.below(1000) as i64);
        let pick = "(SELECT id FROM readings WHERE device = $2 LIMIT 1)";
        match r.below(100) {
            0..=54 => {
                tx.execute(
                    "INSERT INTO readings (device, site, value) VALUES ($1, $2, $3)",
                    &[&d, &s, &v],
                )
                .await?;
            }
            55..=69 => {
                tx.execute(
                    &format!("UPDATE readings SET value = $1 WHERE id = {pick}"),
                    &[&v, &d],
                )
                .await?;
            }
            70..=79 => {
                // Moves a reading to another device: both devices' totals change.
                let from = device(r);
                tx.execute(
                    &format!("UPDATE readings SET device = $1 WHERE id = {pick}"),
                    &[&d, &from],
                )
                .await?;
            }
            80..=86 => {
                let from = device(r);
                tx.execute(
                    &format!("UPDATE readings SET site = $1 WHERE id = {pick}"),
                    &[&s, &from],
                )
                .await?;
            }
            87..=97 => {
                tx.execute(
                    "DELETE FROM readings WHERE id = (SELECT id FROM readings WHERE device = $1 LIMIT 1)",
                    &[&d],
                )
                .await?;
            }
            _ => {
                let region = REGIONS[r.below(REGIONS.len() as u64) as usize];
                tx.execute("UPDATE sites SET region = $1 WHERE id = $2", &[&region, &s])
                    .await?;
            }
        }
    }
    tx.commit().await
}

/// Writes until `stop`. Concurrent writers touch the same rows, so an occasional
/// deadlock or serialization failure is expected: the transaction is dropped (rolled
/// back) and the writer goes on.
async fn writer(
    url: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    txns: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut c = connect(&url).await?;
    let mut r = Rng::new(seed);
    while !stop.load(Relaxed) {
        match transaction(&mut c, &mut r).await {
            Ok(()) => {
                txns.fetch_add(1, Relaxed);
            }
            Err(e) if matches!(e.code().map(|c| c.code()), Some("40P01" | "40001")) => {}
            Err(e) => {
                // The server's words (and hint), not the driver's "db error".
                let why = match e.as_db_error() {
                    Some(db) => match db.hint() {
                        Some(hint) => format!("{} (hint: {hint})", db.message()),
                        None => db.message().to_owned(),
                    },
                    None => e.to_string(),
                };
                return Err(anyhow::anyhow!("a writer failed: {why}"));
            }
        }
    }
    Ok(())
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "–".into(),
        |d| format!("{:.0}ms", d.as_secs_f64() * 1000.0),
    )
}

struct Totals {
    events: u64,
    rebuilds: u64,
}

fn totals(o: &Observer) -> Totals {
    let views = o.views();
    Totals {
        events: o.source().events,
        rebuilds: views.iter().map(|v| v.stats.rebuilds_ok).sum(),
    }
}

fn progress(o: &Observer, t: Duration, txns: u64, prev: &Totals, dt: Duration) -> (String, Totals) {
    let now = totals(o);
    let views = o.views();
    let dirty: u64 = views.iter().map(|v| v.stats.dirty).sum();
    let worst = |f: fn(&freshen::HistogramSnapshot) -> Option<Duration>| {
        views.iter().filter_map(|v| f(&v.stats.freshness)).max()
    };
    let src = o.source();
    let per_s = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / dt.as_secs_f64().max(1e-3);
    let line = format!(
        "t={:>3.0}s  txns {:>7}  events/s {:>7.0}  dirty {:>4}  rebuilds/s {:>6.0}  freshness p50 {:>6} p99 {:>6}  slot lag {}",
        t.as_secs_f64(),
        txns,
        per_s(now.events, prev.events),
        dirty,
        per_s(now.rebuilds, prev.rebuilds),
        ms(worst(|h| h.p50())),
        ms(worst(|h| h.p99())),
        src.lag_bytes
            .map_or_else(|| "–".into(), |b| format!("{} KiB", b / 1024)),
    );
    (line, now)
}

async fn mismatches(c: &Client) -> anyhow::Result<Vec<(&'static str, i64)>> {
    let mut out = Vec::new();
    for (name, truth) in VIEWS {
        let derived = format!("SELECT * FROM {name}");
        let sql = format!(
            "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
        );
        let n: i64 = c.query_one(&sql, &[]).await?.get(0);
        out.push((name, n));
    }
    Ok(out)
}

/// The status page's listener: `addr` when it is free, else any port of its host.
fn listener(addr: std::net::SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr)
        .or_else(|_| std::net::TcpListener::bind((addr.ip(), 0)))
        .with_context(|| format!("cannot listen for the status page on {}", addr.ip()))
}

/// Runs the demo; `Ok(true)` when every derived table equals truth.
pub(crate) async fn run(opts: DemoOptions) -> anyhow::Result<bool> {
    let started = Instant::now();
    println!("freshen demo: starting a throwaway PostgreSQL…");
    let keep = opts.keep;
    // Kept, the server is in a group of its own: a Ctrl-C in the terminal stops freshen
    // and leaves the database up, as promised.
    let pg = tokio::task::spawn_blocking(move || PgServer::builder().detached(keep).start())
        .await?
        .context("cannot start a throwaway PostgreSQL (the demo needs the server binaries: apt-get install postgresql-15)")?;
    let url = pg.url();
    let admin = connect(&url).await?;
    admin
        .batch_execute(SCHEMA)
        .await
        .context("creating the demo schema")?;
    let sites: Vec<String> = (0..SITES).map(|i| format!("s{i:02}")).collect();
    for (i, s) in sites.iter().enumerate() {
        admin
            .execute(
                "INSERT INTO sites VALUES ($1, $2)",
                &[s, &REGIONS[i % REGIONS.len()]],
            )
            .await?;
    }
    admin
        .batch_execute(
            "INSERT INTO readings (device, site, value)
             SELECT 'dev-' || lpad((g % 200)::text, 3, '0'), 's' || lpad((g % 20)::text, 2, '0'), g % 1000
             FROM generate_series(1, 5000) g",
        )
        .await?;
    println!(
        "  schema: readings(device, site, value), sites(id, region)\n  \
         views, each a plain SELECT: {}\n  \
         5000 readings start out un-aggregated: each table is built whole at the first start",
        VIEWS.map(|(n, _)| n).join(", ")
    );

    // The status page first, on the pipeline's own numbers (the observer reads them).
    let std_listener = listener(opts.listen)?;
    let addr = std_listener.local_addr()?;
    std_listener.set_nonblocking(true)?;
    let cfg = config::parse(
        &demo_config(&url, "off"),
        "demo.toml",
        &|_| None,
        crate::kinds::builtin(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let pipeline = Pipeline::start(&cfg).await?;
    let observer = pipeline.observer();
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let page = tokio::spawn(crate::http::serve(
        tokio::net::TcpListener::from_std(std_listener)?,
        observer.clone(),
        freshen_http::ListenerConfig::new("metrics"),
        crate::admin::Access::Off,
        async {
            let _ = http_stopped.await;
        },
    ));
    println!("  status page: http://{addr}/  (the views' freshness and backlog, live)");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(pipeline.run(async {
        let _ = stop_rx.await;
    }));

    println!(
        "  workload: {} writers for {}: inserts, updates moving readings between devices and sites, deletes, site re-assignments\n",
        opts.writers,
        humantime::format_duration(opts.duration)
    );
    let stop = Arc::new(AtomicBool::new(false));
    let txns = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..opts.writers)
        .map(|i| {
            tokio::spawn(writer(
                url.clone(),
                i as u64 + 1,
                stop.clone(),
                txns.clone(),
            ))
        })
        .collect();
    let tty = std::io::stdout().is_terminal();
    let t0 = Instant::now();
    let mut prev = totals(&observer);
    let mut last = Instant::now();
    while t0.elapsed() < opts.duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (line, now) = progress(
            &observer,
            t0.elapsed(),
            txns.load(Relaxed),
            &prev,
            last.elapsed(),
        );
        (prev, last) = (now, Instant::now());
        if tty {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        } else {
            println!("{line}");
        }
    }
    stop.store(true, Relaxed);
    for w in writers {
        w.await?.context("a writer failed")?;
    }
    if tty {
        println!();
    }
    let writes = txns.load(Relaxed);

    // Settle: every change up to here must be rebuilt and acknowledged. After-rebuild acks
    // mean the source's confirmed position passes a commit only once its keys are rebuilt.
    let fence: i64 = admin
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await?
        .get(0);
    admin
        .execute("UPDATE sites SET region = region WHERE id = 's00'", &[])
        .await?;
    print!("writers stopped after {writes} transactions; waiting for the views to settle… ");
    let _ = std::io::stdout().flush();
    let settle_start = Instant::now();
    let settled = loop {
        let src = observer.source();
        let idle = observer
            .views()
            .iter()
            .all(|v| v.stats.dirty == 0 && v.stats.in_flight == 0 && v.stats.unacked_batches == 0);
        if idle && src.confirmed_lsn.unwrap_or(0) >= fence as u64 {
            break true;
        }
        if settle_start.elapsed() > Duration::from_secs(120) {
            break false;
        }
        if running.is_finished() {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "{}",
        if settled {
            format!("settled in {:.1}s", settle_start.elapsed().as_secs_f64())
        } else {
            "did NOT settle".into()
        }
    );

    let found = mismatches(&admin).await?;
    let doc = status(&*observer);
    let mut ok = settled;
    println!("\nsummary");
    println!(
        "  source: {} events, confirmed {}",
        doc.source.events,
        doc.source.confirmed_lsn.map_or("–".into(), lsn)
    );
    for v in &doc.views {
        println!(
            "  {:<32} {:>8} events  {:>7} rebuilds ({:.3} per event)  freshness p50 {} p99 {}  built whole: {}",
            v.name,
            v.events,
            v.rebuilds_ok,
            v.rebuilds_ok as f64 / v.events.max(1) as f64,
            v.freshness_p50_ms
                .map_or("–".into(), |m| format!("{m:.0}ms")),
            v.freshness_p99_ms
                .map_or("–".into(), |m| format!("{m:.0}ms")),
            if v.paths.whole_runs > 0 { "yes" } else { "no" },
        );
    }
    for (name, n) in &found {
        if *n == 0 {
            println!("  {name}: equals a fresh computation of its SELECT ✓");
        } else {
            ok = false;
            println!("  {name}: {n} row(s) differ from truth ✗");
        }
    }
    println!("  total time {:.1}s", started.elapsed().as_secs_f64());
    if opts.keep {
        println!(
            "\nstill running — the tables kept fresh, the status page at http://{addr}/, the database:\n  psql '{url}'\nCtrl-C stops freshen; the database stays up (stop it with: pg_ctl -D {} stop, as the OS user owning that directory)",
            pg.data_dir().display()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = stop_tx.send(());
    let run_result = running.await?;
    let _ = stop_http.send(());
    let _ = page.await;
    if let Err(e) = &run_result {
        ok = false;
        println!("  the pipeline failed: {e:#}");
    }
    // Let the replication reader and the pools go before the server does.
    let source = observer.source_probe();
    drop(observer);
    drop(admin);
    let deadline = Instant::now() + Duration::from_secs(5);
    while source.health().streaming && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(source);
    if opts.keep {
        // The server outlives this process on purpose: no drop, no stop.
        std::mem::forget(pg);
    }
    if !ok && found.iter().all(|(_, n)| *n == 0) && !settled {
        bail!("the views did not settle within two minutes");
    }
    Ok(ok)
}
