//! Freshness: how long after a commit the derived table reflects it, at a steady write rate.
//!
//! pgbench inserts readings at a Poisson-paced rate (`--rate`) over 1000 devices, one row
//! per transaction, for a fixed time; freshen keeps `device_totals` with the default
//! timing (coalesce 100 ms, max_wait 5 s), and the rival is a materialized view refreshed
//! every second (`REFRESH MATERIALIZED VIEW CONCURRENTLY`, start to start). Each on a
//! fresh server.
//!
//! How a per-change latency is measured, from the database alone and without sampling:
//!
//! - `track_commit_timestamp` is on, so every transaction's commit time is recorded by the
//!   server; each reading also stores its own transaction id (`tx xid8 DEFAULT
//!   pg_current_xact_id()`). A reading's commit time is `pg_xact_commit_timestamp(xmin)`.
//! - freshen's rebuild stamps each derived row with the snapshot it was computed from
//!   (`pg_current_snapshot()`, in the same statement that aggregates — freshen rebuilds
//!   in REPEATABLE READ, so every statement of a rebuild sees that one snapshot) and, in
//!   the same statement, appends `(device, snapshot)` to a log, `applied`. The log row
//!   commits with the rebuild, so its `xmin`'s commit time is when that state of the
//!   derived row became visible. The matview's refresh does the same once per refresh:
//!   `BEGIN ISOLATION LEVEL REPEATABLE READ; INSERT INTO applied … pg_current_snapshot();
//!   REFRESH …; COMMIT` (a refresh in a REPEATABLE READ transaction computes from the
//!   transaction's snapshot).
//! - A reading `r` is reflected from the commit of the first rebuild of its device (for
//!   the matview: the first refresh) whose snapshot sees it —
//!   `pg_visible_in_snapshot(r.tx, snap)` — and not before: rebuilds of one key never
//!   overlap (single flight), so their snapshots only grow, and an earlier one that did
//!   not see `r` left a row without it. Latency = that commit time − `r`'s commit time:
//!   exact for every change, both ends on the server's clock, capture, queueing, coalesce,
//!   the rebuild and its commit all included.
//!
//! After the writers stop, the run waits until the derived rows' own snapshots see every
//! reading (a reading never seen would be counted as "never"), then computes the
//! percentiles over every reading in SQL. freshen's own freshness histogram is shown next
//! to it: it starts when freshen *receives* the change (so it leaves out capture) and
//! ends when the rebuild returns.
//!
//! freshen runs twice: with the defaults (up to 16 keys per pipelined transaction) and with
//! `rebuild_batch = 64` (the statements over arrays, up to 64 keys per transaction), the
//! documented remedy when rebuild round trips are the limit. A third row, "coalesce
//! alone", is the floor the debounce itself sets — computed from the default run's own
//! commit times: a change is rebuilt at the earliest when its key has then been quiet for
//! `coalesce` (the end of its burst + 100 ms), as if rebuilds were instant and free.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::Client;

use crate::Opts;
use crate::report::Table;
use crate::workload::{
    Bench, DEVICES, Freshen, Load, LoadResult, Script, config, connect, ms, runtime, server,
};

pub(crate) const SCHEMA: &str = "
CREATE TABLE readings (
    id bigserial PRIMARY KEY,
    device int NOT NULL,
    value bigint NOT NULL,
    tx xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX ON readings (device);
CREATE TABLE applied (id bigserial PRIMARY KEY, device int, snap pg_snapshot NOT NULL);
CREATE INDEX ON applied (device, id);
";

pub(crate) const FRESHEN: &str = "CREATE TABLE device_totals (
    device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL, snap pg_snapshot NOT NULL
)";

/// The README's rebuild, with the snapshot stamped on the row and logged in one statement
/// (so the round trips are the same as without the measurement).
pub(crate) const REBUILD: [&str; 2] = [
    "DELETE FROM device_totals WHERE device = $1",
    "WITH t AS (INSERT INTO device_totals (device, total, n, snap) SELECT device, sum(value), count(*), pg_current_snapshot() FROM readings WHERE device = $1 GROUP BY device RETURNING device, snap) INSERT INTO applied (device, snap) SELECT device, snap FROM t",
];

/// The same over arrays, for `rebuild_batch`.
const REBUILD_BATCH: [&str; 2] = [
    "DELETE FROM device_totals WHERE device = ANY($1)",
    "WITH t AS (INSERT INTO device_totals (device, total, n, snap) SELECT device, sum(value), count(*), pg_current_snapshot() FROM readings WHERE device = ANY($1) GROUP BY device RETURNING device, snap) INSERT INTO applied (device, snap) SELECT device, snap FROM t",
];

/// Keys per rebuild transaction in the batched run.
const BATCH: usize = 64;

/// Per reading: the end of its key's burst (the first change at or after it that is
/// followed by `coalesce` of quiet, or by nothing) + `coalesce`, minus its commit.
const FLOOR: &str = "
WITH g AS (
    SELECT device, t, CASE WHEN lead(t) OVER w IS NULL OR lead(t) OVER w - t >= interval '100 ms'
                           THEN t END AS burst_end
    FROM (SELECT device, pg_xact_commit_timestamp(xmin) AS t FROM readings) r
    WINDOW w AS (PARTITION BY device ORDER BY t)
), f AS (
    SELECT t, min(burst_end) OVER (PARTITION BY device ORDER BY t DESC ROWS UNBOUNDED PRECEDING)
              + interval '100 ms' AS fire
    FROM g
)
SELECT count(*), count(l), percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
FROM (SELECT extract(epoch FROM fire - t)::float8 AS l FROM f) s";

/// Who keeps the derived table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keeper {
    Freshen,
    FreshenBatched,
    MatView,
}

impl Keeper {
    fn label(self) -> &'static str {
        match self {
            Keeper::Freshen => "freshen (defaults: coalesce 100 ms, 16 keys per transaction)",
            Keeper::FreshenBatched => "freshen, rebuild_batch = 64",
            Keeper::MatView => "matview, REFRESH CONCURRENTLY every 1 s",
        }
    }
}

const MATVIEW: &str = "
CREATE MATERIALIZED VIEW device_totals AS
    SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings GROUP BY device;
CREATE UNIQUE INDEX ON device_totals (device);
";

const REFRESH: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ;
INSERT INTO applied (snap) VALUES (pg_current_snapshot());
REFRESH MATERIALIZED VIEW CONCURRENTLY device_totals;
COMMIT;";

/// Readings no derived state has seen yet.
pub(crate) const UNSEEN_FRESHEN: &str = "SELECT count(*) FROM readings r WHERE NOT EXISTS (
    SELECT 1 FROM device_totals d WHERE d.device = r.device AND pg_visible_in_snapshot(r.tx, d.snap))";
const UNSEEN_MATVIEW: &str = "SELECT count(*) FROM readings r WHERE NOT coalesce(
    pg_visible_in_snapshot(r.tx, (SELECT snap FROM applied ORDER BY id DESC LIMIT 1)), false)";

/// Per reading: the commit of the first derived state that saw it, minus its own commit.
pub(crate) fn latencies(matview: bool) -> String {
    let which = if matview {
        "a.device IS NULL"
    } else {
        "a.device = r.device"
    };
    format!(
        "SELECT count(*), count(l), percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
         FROM (SELECT extract(epoch FROM (
                   SELECT pg_xact_commit_timestamp(a.xmin) FROM applied a
                   WHERE {which} AND pg_visible_in_snapshot(r.tx, a.snap)
                   ORDER BY a.id LIMIT 1) - pg_xact_commit_timestamp(r.xmin))::float8 AS l
               FROM readings r) s"
    )
}

pub(crate) struct Latency {
    pub(crate) changes: i64,
    pub(crate) never: i64,
    pub(crate) p50: Option<Duration>,
    pub(crate) p99: Option<Duration>,
    pub(crate) max: Option<Duration>,
}

pub(crate) async fn measure(c: &Client, sql: &str) -> anyhow::Result<Latency> {
    let row = c.query_one(sql, &[]).await?;
    let secs = |i: usize| {
        row.get::<_, Option<f64>>(i)
            .map(|s| Duration::from_secs_f64(s.max(0.0)))
    };
    let changes: i64 = row.get(0);
    let seen: i64 = row.get(1);
    Ok(Latency {
        changes,
        never: changes - seen,
        p50: secs(2),
        p99: secs(3),
        max: secs(4),
    })
}

/// Polls until `unseen` counts nothing (two minutes at most).
pub(crate) async fn settle(c: &Client, unseen: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let n: i64 = c.query_one(unseen, &[]).await?.get(0);
        if n == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "{n} readings still not reflected two minutes after the writes stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Run {
    load: LoadResult,
    lat: Latency,
    /// The debounce's own floor, from the same commits.
    floor: Latency,
    /// freshen's own histogram: p50, p99, max.
    own: Option<(Option<Duration>, Option<Duration>, Duration)>,
}

fn script() -> Script {
    Script {
        name: "insert",
        weight: 1,
        body: format!(
            "\\set dev random(1, {DEVICES})\n\\set v random(0, 999)\n\
             INSERT INTO readings (device, value) VALUES (:dev, :v);\n"
        ),
    }
}

fn run_one(keeper: Keeper, load: &Load) -> anyhow::Result<Run> {
    let matview = keeper == Keeper::MatView;
    let pg = server(&[("track_commit_timestamp", "on")])?;
    pg.psql(SCHEMA)?;
    pg.psql(if matview { MATVIEW } else { FRESHEN })?;
    let bench = Bench::of(&pg);
    let url = pg.url();
    let rt = runtime()?;
    let out = rt.block_on(async {
        let admin = connect(&url).await?;
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let refresher = matview.then(|| {
            let url = url.clone();
            tokio::spawn(async move {
                let c = connect(&url).await?;
                loop {
                    let t0 = tokio::time::Instant::now();
                    c.batch_execute(REFRESH).await?;
                    tokio::select! {
                        _ = tokio::time::sleep_until(t0 + Duration::from_secs(1)) => {}
                        _ = stop_rx.wait_for(|s| *s) => return anyhow::Ok(()),
                    }
                }
            })
        });
        let freshen = if matview {
            None
        } else {
            let toml = match keeper {
                Keeper::FreshenBatched => {
                    config(&url, &REBUILD_BATCH, Some(BATCH), "100ms", "5s", false)
                }
                _ => config(&url, &REBUILD, None, "100ms", "5s", false),
            };
            Some(Freshen::start(&toml).await?)
        };
        let (b, l) = (bench.clone(), load.clone());
        let result = tokio::task::spawn_blocking(move || b.run(&[script()], &l)).await??;
        settle(
            &admin,
            if matview {
                UNSEEN_MATVIEW
            } else {
                UNSEEN_FRESHEN
            },
        )
        .await?;
        let _ = stop_tx.send(true);
        if let Some(t) = refresher {
            t.await??;
        }
        let own = match freshen {
            Some(f) => {
                f.drain(result.transactions).await?;
                let h = f.stats().freshness;
                f.stop().await?;
                Some((h.p50(), h.p99(), h.max()))
            }
            None => None,
        };
        let lat = measure(&admin, &latencies(matview)).await?;
        let floor = measure(&admin, FLOOR).await?;
        anyhow::Ok(Run {
            load: result,
            lat,
            floor,
            own,
        })
    })?;
    drop(rt);
    Ok(out)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (rates, secs) = if opts.quick {
        ([200, 1000], 2)
    } else {
        ([1000, 5000], 20)
    };
    let mut t = Table::new(&[
        "target rate",
        "achieved",
        "kept by",
        "changes",
        "p50",
        "p99",
        "max",
        "never reflected",
        "freshen's histogram p50 / p99 / max",
    ]);
    for rate in rates {
        let load = Load {
            clients: 8,
            duration: Duration::from_secs(secs),
            rate: Some(rate),
            vars: Vec::new(),
        };
        for keeper in [Keeper::Freshen, Keeper::FreshenBatched, Keeper::MatView] {
            let r = run_one(keeper, &load)?;
            eprintln!(
                "  freshness {rate} tx/s, {}: p99 {}",
                keeper.label(),
                ms(r.lat.p99)
            );
            let row = |who: &str, lat: &Latency, own: String| {
                vec![
                    format!("{rate} tx/s"),
                    format!("{:.0} tx/s", r.load.tps),
                    who.to_string(),
                    lat.changes.to_string(),
                    ms(lat.p50),
                    ms(lat.p99),
                    ms(lat.max),
                    lat.never.to_string(),
                    own,
                ]
            };
            t.row(row(
                keeper.label(),
                &r.lat,
                r.own.map_or_else(
                    || "–".into(),
                    |(a, b, c)| format!("{} / {} / {}", ms(a), ms(b), ms(Some(c))),
                ),
            ));
            if keeper == Keeper::Freshen {
                t.row(row(
                    "(floor: coalesce 100 ms alone, instant rebuilds)",
                    &r.floor,
                    "–".into(),
                ));
            }
        }
    }
    t.print();
    println!(
        "\nOne row per reading inserted ({secs} s per run, 8 pgbench clients, Poisson-paced, {DEVICES} devices, \
         uniform); latency = commit of the first derived state whose snapshot saw the reading − the reading's \
         commit, both from track_commit_timestamp. Goal: freshen p99 ≤ coalesce + 100 ms = 200 ms at 5000 tx/s."
    );
    Ok(())
}
