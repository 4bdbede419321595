//! Write tax: what keeping a per-device rollup costs the writers.
//!
//! Eight pgbench clients run an OLTP mix on `readings` as fast as they can for a fixed
//! time — 40 % inserts, 30 % value updates, 20 % updates that move a reading to another
//! device (a scope move: two rollup rows change), 10 % deletes — under each variant, each
//! on a fresh server so that none inherits another's bloat, WAL or slot:
//!
//! - (a) no derived table: the baseline;
//! - (a′) a reference, not a contender: what (d) asks of the database (`REPLICA IDENTITY
//!   FULL`, the index on `readings(device)`, a publication and a slot) with the slot read
//!   by `pg_recvlogical` to /dev/null — the cost of logical decoding itself, which any
//!   CDC consumer pays, so that (d) − (a′) is what freshen adds;
//! - (a″) the same without the index on `readings(device)`, which only the rebuild needs:
//!   decoding alone;
//! - (b) row triggers keeping `device_totals` by upsert-deltas (the usual hand-written
//!   kind, correct for INSERT, UPDATE within and across devices, DELETE, and removing a
//!   device whose last reading went); deadlocks between them are retried (pgbench
//!   `--max-tries`) and counted;
//! - (c) a materialized view refreshed every second with `REFRESH MATERIALIZED VIEW
//!   CONCURRENTLY` (start to start; back to back when a refresh takes longer);
//! - (d) freshen keeping the same `device_totals`, in this process, from a TOML
//!   configuration with the defaults (coalesce 100 ms, 4 workers, after-rebuild acks);
//! - (d′) the same hand-written DELETE + INSERT written over arrays
//!   (`rebuild_batch = 64`): what batching alone changes;
//! - (e) query mode: `into` + `query`, the view's default batches of 64, written by one
//!   set-based statement that updates only rows whose values differ — against (d′), what
//!   writing only the difference changes;
//! - (g1)–(g3) decoding alone (`pg_recvlogical`) under the replica identity `check`
//!   recommends — `USING INDEX` on a unique index over (device, id), which also serves the
//!   rebuild's lookups by device — then with a publication column list (id, device), then
//!   with pgoutput's `binary` option: what each cuts from decoding;
//! - (e1) query mode under that identity (no FULL, no separate `readings(device)` index)
//!   and (e2) with the column-listed publication as well;
//! - (s) query mode decoding on a hot standby (PostgreSQL 16+): freshen's `[source]` is
//!   a streaming standby of the primary (`publication_mode = "existing"`, the publication
//!   made on the primary, `primary_url` set), its `[target]` the primary, where the
//!   rebuilds run — what moving the slot and its walsender off the primary leaves the
//!   primary to pay: the writers, the physical walsender feeding the standby, freshen's
//!   rebuild backends. The standby's CPU (its decoding walsender apart) is reported on
//!   its own;
//! - (f) pg_ivm 1.15's incrementally maintained view (IMMV) of the same rollup — run when
//!   pg_ivm is installed for the server binaries (it is not packaged for Debian 12 and
//!   builds from its public source against `postgresql-server-dev-15`; otherwise the run
//!   says it was left out).
//!
//! `FRESHEN_BENCH_WRITE_TAX=a,a2,e,e1` runs only the variants named by code (a, a1, a2,
//! g1, g2, g3, b, c, d, d1, e, e1, e2, s, f), to iterate; "vs (a)" is then against the
//! first.
//!
//! Every server of a run is one major version: the default one, or — when (s) is among
//! the variants — the run's version if it is 16 or later, else 16 (the version matrix's
//! build, `scripts/test-deps-postgres`; missing, the run fails naming it), so that (s)
//! is compared with row triggers and the rest on the same server build.
//!
//! What each variant needs is charged to it: only (a′) and (d) get the replica identity,
//! the index, the publication and the slot; `wal_level = logical` is the same for all.
//! Rounds alternate the variants; the median TPS counts. Next to TPS: the CPU time of
//! every process of the run (server, pgbench, freshen, pg_recvlogical, the refresher) per
//! committed transaction, until the derived table caught up — the tax itself, and a
//! figure that barely moves when other work shares the machine, where TPS does — and
//! where it went: the walsender's, freshen's backends' and the slot reader's own share
//! (`cpu_split`), the rest being the writers' backends, pgbench and the server's
//! background work. Beside it, the primary server's own CPU per transaction (its
//! postmaster and every backend, live or gone; not pgbench, freshen or pg_recvlogical,
//! nor the measurement's backends): for (s) all the primary pays, against the same
//! figure of row triggers — and the standby's, for (s).
//!
//! `write-tax-hot` runs the same mix with device popularity ~ Zipf(1.1) (the readings to
//! start with, inserts and moves; updates and deletes pick a reading at random, so their
//! devices follow the skew): the workload where row triggers serialize writers on the
//! hottest devices' rollup rows. Its rows: (a), (a″), (b), (d), (d′), (e), (f). Every run logs
//! each transaction's latency (`pgbench -l`), reported as p50 / p99, and samples what the
//! writers' backends are doing (`writer_waits`): where TPS falls while the cores have room,
//! that says what the writers waited for.
//!
//! Two settings of the server, each its own table: durable commits (PostgreSQL's
//! defaults: each commit waits for its WAL flush, as in production) and CPU-bound (fsync
//! off: the 2 cores are the only limit, so every cycle the walsender, freshen or a
//! trigger spends is taken from the writers — the harshest case for anything that is
//! not free).
//!
//! Next to them, what the derived table costs the database: WAL bytes per committed
//! transaction (`pg_current_wal_lsn()` from the start of the load until caught up — the
//! walsender decodes all of it), and the row versions written to `device_totals`
//! (`pg_stat_user_tables`: inserted, updated (of which HOT), deleted, from before the
//! freshen variants' start-up sweep) with its dead tuples at the end.
//!
//! Staleness at the end: how long after the last write committed (pgbench exited) the
//! derived table first equals a fresh `GROUP BY` of `readings` — polled, the time taken
//! where the matching check started. "equals truth" says whether it got there at all.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen_testenv::PgServer;
use tokio::sync::watch;

use crate::Opts;
use crate::cpu_split::{Sample, Split};
use crate::report::Table;
use crate::workload::{
    Bench, DEVICES, Freshen, Load, LoadResult, READINGS, REBUILD, REBUILD_ARRAYS, Script, config,
    connect, converge, median, ms, process_cpu, query_config, runtime, server_at, server_cpu,
    standby_query_config, tree_cpu,
};
use crate::writer_waits::{Sampled, Sampler, Seen, Waits};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Bare,
    Decode,
    DecodeOnly,
    /// Decoding alone under the identity `check` recommends (USING INDEX (device, id)).
    DecodeIdentity,
    /// The same with a publication column list (id, device).
    DecodeColumns,
    /// The same with pgoutput's `binary` option.
    DecodeBinary,
    Triggers,
    MatView,
    Freshen,
    FreshenArrays,
    FreshenQuery,
    /// Query mode under the recommended identity, whose index is the rebuild's too.
    QueryIdentity,
    /// The same with a publication column list (id, device).
    QueryColumns,
    /// Query mode decoding on a hot standby, rebuilding on the primary (16+).
    Standby,
    PgIvm,
}

impl Variant {
    const ALL: [Variant; 15] = [
        Variant::Bare,
        Variant::Decode,
        Variant::DecodeOnly,
        Variant::DecodeIdentity,
        Variant::DecodeColumns,
        Variant::DecodeBinary,
        Variant::Triggers,
        Variant::MatView,
        Variant::Freshen,
        Variant::FreshenArrays,
        Variant::FreshenQuery,
        Variant::QueryIdentity,
        Variant::QueryColumns,
        Variant::Standby,
        Variant::PgIvm,
    ];

    /// The short name [`VARIANTS_ENV`] picks the variant by.
    fn code(self) -> &'static str {
        match self {
            Variant::Bare => "a",
            Variant::Decode => "a1",
            Variant::DecodeOnly => "a2",
            Variant::DecodeIdentity => "g1",
            Variant::DecodeColumns => "g2",
            Variant::DecodeBinary => "g3",
            Variant::Triggers => "b",
            Variant::MatView => "c",
            Variant::Freshen => "d",
            Variant::FreshenArrays => "d1",
            Variant::FreshenQuery => "e",
            Variant::QueryIdentity => "e1",
            Variant::QueryColumns => "e2",
            Variant::Standby => "s",
            Variant::PgIvm => "f",
        }
    }

    /// Whether pg_recvlogical reads a slot (the decoding-alone references).
    fn is_decode(self) -> bool {
        matches!(
            self,
            Variant::Decode
                | Variant::DecodeOnly
                | Variant::DecodeIdentity
                | Variant::DecodeColumns
                | Variant::DecodeBinary
        )
    }

    /// Whether the variant keeps no derived table (nothing to converge or compare).
    fn no_derived(self) -> bool {
        self == Variant::Bare || self.is_decode()
    }

    fn is_freshen(self) -> bool {
        matches!(
            self,
            Variant::Freshen
                | Variant::FreshenArrays
                | Variant::FreshenQuery
                | Variant::QueryIdentity
                | Variant::QueryColumns
                | Variant::Standby
        )
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Bare => "(a) no derived table",
            Variant::Decode => "(a′) reference: what (d) needs, slot read by pg_recvlogical",
            Variant::DecodeOnly => {
                "(a″) reference: decoding alone (FULL, slot read by pg_recvlogical), without the rebuild's index"
            }
            Variant::DecodeIdentity => {
                "(g1) decoding alone, the identity check recommends: USING INDEX on unique (device, id)"
            }
            Variant::DecodeColumns => {
                "(g2) decoding alone, (g1) + publication column list (id, device)"
            }
            Variant::DecodeBinary => "(g3) decoding alone, (g2) + pgoutput binary = true",
            Variant::Triggers => "(b) row triggers (upsert deltas)",
            Variant::MatView => "(c) matview, REFRESH CONCURRENTLY every 1 s",
            Variant::Freshen => "(d) freshen (coalesce 100 ms)",
            Variant::FreshenArrays => {
                "(d′) freshen, the same DELETE + INSERT over arrays (rebuild_batch = 64)"
            }
            Variant::FreshenQuery => "(e) freshen query mode (into + query, batches of 64)",
            Variant::QueryIdentity => {
                "(e1) query mode, identity USING INDEX on unique (device, id), no (device) index"
            }
            Variant::QueryColumns => "(e2) query mode, (e1) + publication column list (id, device)",
            Variant::Standby => {
                "(s) query mode decoding on a standby (slot and walsender there), rebuilds on the primary"
            }
            Variant::PgIvm => "(f) pg_ivm 1.15 IMMV (maintained inside every writing transaction)",
        }
    }
}

pub(crate) const TRIGGERS: &str = "
CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
CREATE FUNCTION readings_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    left_n bigint;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.device = OLD.device THEN
        UPDATE device_totals SET total = total + NEW.value - OLD.value WHERE device = NEW.device;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE device_totals SET total = total - OLD.value, n = n - 1
            WHERE device = OLD.device RETURNING n INTO left_n;
        IF left_n = 0 THEN
            DELETE FROM device_totals WHERE device = OLD.device AND n = 0;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO device_totals (device, total, n) VALUES (NEW.device, NEW.value, 1)
        ON CONFLICT (device) DO UPDATE
            SET total = device_totals.total + EXCLUDED.total, n = device_totals.n + 1;
    END IF;
    RETURN NULL;
END $$;
INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings GROUP BY device;
CREATE TRIGGER readings_rollup AFTER INSERT OR UPDATE OF device, value OR DELETE ON readings
    FOR EACH ROW EXECUTE FUNCTION readings_rollup();
";

const MATVIEW: &str = "
CREATE MATERIALIZED VIEW device_totals AS
    SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings GROUP BY device;
CREATE UNIQUE INDEX ON device_totals (device);
";

/// pg_ivm's incrementally maintained view of the same rollup: its triggers apply each
/// statement's delta to `device_totals` inside the writing transaction, under an
/// exclusive lock on the view.
pub(crate) const PG_IVM: &str = "
CREATE EXTENSION pg_ivm;
SELECT pgivm.create_immv('device_totals',
    'SELECT device, sum(value) AS total, count(*) AS n FROM readings GROUP BY device');
";

/// Whether pg_ivm is installed for the server binaries in `bin_dir` (it is not packaged
/// for Debian 12; it builds from its public source against `postgresql-server-dev-15`).
pub(crate) fn pg_ivm_installed(bin_dir: &std::path::Path) -> bool {
    bin_dir.join("../lib/pg_ivm.so").exists()
}

const FRESHEN: &str = "
ALTER TABLE readings REPLICA IDENTITY FULL;
CREATE INDEX ON readings (device);
CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings GROUP BY device;
";

/// The replica identity `check` recommends for `readings` → `device_totals`: the old
/// device is needed (moves, deletes) and is not in the primary key, so a unique index over
/// (device, id) — leading with the view's key, so it is also the index the rebuild finds a
/// device's rows through, and the writers maintain one extra index, not two.
const IDENTITY: &str = "
CREATE UNIQUE INDEX readings_device_id_identity ON readings (device, id);
ALTER TABLE readings REPLICA IDENTITY USING INDEX readings_device_id_identity;
";

/// [`FRESHEN`]'s derived table under [`IDENTITY`] instead of FULL + `readings(device)`.
const FRESHEN_IDENTITY: &str = "
CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings GROUP BY device;
";

/// A publication of only the columns the view's keys need (PostgreSQL 15; the list must
/// cover the replica identity's columns): pgoutput converts and sends only these.
fn column_list_publication(name: &str) -> String {
    format!("CREATE PUBLICATION {name} FOR TABLE readings (id, device)")
}

/// The environment variable naming the variants to run, by code (`a,a2,b,e,e1`): to
/// iterate on a few rows; the published run sets none and runs them all.
const VARIANTS_ENV: &str = "FRESHEN_BENCH_WRITE_TAX";

/// `variants` narrowed to those [`VARIANTS_ENV`] names, in their own order.
fn chosen(variants: &[Variant]) -> anyhow::Result<Vec<Variant>> {
    let Some(list) = std::env::var_os(VARIANTS_ENV) else {
        return Ok(variants.to_vec());
    };
    let list = list.to_string_lossy();
    let codes: Vec<&str> = list.split(',').map(str::trim).collect();
    let unknown: Vec<&str> = codes
        .iter()
        .copied()
        .filter(|c| !Variant::ALL.iter().any(|v| v.code() == *c))
        .collect();
    anyhow::ensure!(
        unknown.is_empty(),
        "{VARIANTS_ENV}={list}: unknown variant(s) {unknown:?}; the codes are {}",
        Variant::ALL.map(Variant::code).join(", ")
    );
    Ok(variants
        .iter()
        .copied()
        .filter(|v| codes.contains(&v.code()))
        .collect())
}

/// How the writes pick devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Every device alike.
    Uniform,
    /// Device popularity ~ Zipf(s = [`ZIPF_S`]): the readings to start with, the inserts
    /// and the moves' new devices; updates and deletes pick a reading at random, so their
    /// devices follow the same skew.
    Hot,
}

/// The skew of the hot-key workload (the `amplification` scenario's): the hottest of the
/// 1000 devices takes about 18 % of the writes, the top 25 about 60 %.
const ZIPF_S: f64 = 1.1;

impl Keys {
    /// A pgbench expression drawing a device.
    fn device(self) -> String {
        match self {
            Keys::Uniform => format!("random(1, {DEVICES})"),
            Keys::Hot => format!("random_zipfian(1, {DEVICES}, {ZIPF_S})"),
        }
    }

    /// The readings to start with.
    fn seed(self, rows: u64) -> String {
        match self {
            Keys::Uniform => format!(
                "INSERT INTO readings (device, value) SELECT 1 + g % {DEVICES}, g % 1000 FROM generate_series(1, {rows}) g"
            ),
            // Inverse CDF over the devices' cumulative Zipf weights, seeded.
            Keys::Hot => format!(
                "SELECT setseed(0.42);
                 CREATE TEMP TABLE zipf AS
                     SELECT k AS device, (sum(power(k, -{ZIPF_S})) OVER (ORDER BY k)
                                          / sum(power(k, -{ZIPF_S})) OVER ())::float8 AS upto
                     FROM generate_series(1, {DEVICES}) k;
                 CREATE INDEX ON zipf (upto);
                 INSERT INTO readings (device, value)
                     SELECT (SELECT z.device FROM zipf z WHERE z.upto >= r.u ORDER BY z.upto LIMIT 1), r.g % 1000
                     FROM (SELECT g, random() AS u FROM generate_series(1, {rows}) g) r;"
            ),
        }
    }
}

fn scripts(keys: Keys) -> Vec<Script> {
    let s = |name, weight, body: &str| Script {
        name,
        weight,
        body: body.to_string(),
    };
    let dev = keys.device();
    vec![
        s(
            "insert",
            4,
            &format!(
                "\\set dev {dev}\n\\set v random(0, 999)\n\
                 INSERT INTO readings (device, value) VALUES (:dev, :v);\n"
            ),
        ),
        s(
            "update",
            3,
            "\\set id random(1, :rows)\n\\set v random(0, 999)\n\
             UPDATE readings SET value = :v WHERE id = :id;\n",
        ),
        s(
            "move",
            2,
            &format!(
                "\\set id random(1, :rows)\n\\set dev {dev}\n\
                 UPDATE readings SET device = :dev WHERE id = :id;\n"
            ),
        ),
        s(
            "delete",
            1,
            "\\set id random(1, :rows)\nDELETE FROM readings WHERE id = :id;\n",
        ),
    ]
}

struct Outcome {
    load: LoadResult,
    /// CPU of every process of the run (server, pgbench, freshen, …) per committed
    /// transaction, until the derived table had caught up.
    cpu_per_tx: Duration,
    /// The part of it spent by the walsender, freshen's backends and the slot's reader.
    split: Split,
    /// Time from the end of the writes until the derived table equalled truth.
    stale: Option<Duration>,
    /// WAL bytes written from the start of the load until the derived table caught up,
    /// per committed transaction.
    wal_per_tx: f64,
    /// Row versions written to `device_totals` over the same time (none without it).
    derived: Option<Writes>,
    /// What the writers' and freshen's backends were doing during the load.
    waits: Seen,
    /// The primary server's own CPU per committed transaction: its postmaster and every
    /// backend, live or gone (the writers', the walsenders, freshen's pool), not the
    /// measurement's (truth checks, wait sampler), nor the clients (pgbench, freshen's
    /// process, pg_recvlogical).
    primary_per_tx: Duration,
    /// (s): the standby server's CPU per committed transaction, the same way, and the
    /// part of it its decoding walsender spent.
    standby: Option<StandbyCpu>,
    /// The server's major version.
    major: u32,
    note: String,
}

/// What the standby spent per committed transaction.
#[derive(Debug, Clone, Copy)]
struct StandbyCpu {
    /// All its processes: the WAL receiver, the startup process replaying the primary's
    /// WAL, the decoding walsender, the rest.
    total: Duration,
    /// Its walsender decoding for freshen.
    walsender: Duration,
}

/// `pg_stat_user_tables` counters of `device_totals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Writes {
    ins: i64,
    upd: i64,
    hot: i64,
    del: i64,
    /// Dead tuples now (what autovacuum has not yet removed).
    dead: i64,
}

impl Writes {
    fn since(&self, before: &Writes) -> Writes {
        Writes {
            ins: self.ins - before.ins,
            upd: self.upd - before.upd,
            hot: self.hot - before.hot,
            del: self.del - before.del,
            dead: self.dead,
        }
    }
}

async fn writes(c: &tokio_postgres::Client) -> anyhow::Result<Option<Writes>> {
    let row = c
        .query_opt(
            "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup \
             FROM pg_stat_user_tables WHERE relid = to_regclass('device_totals')",
            &[],
        )
        .await?;
    Ok(row.map(|r| Writes {
        ins: r.get(0),
        upd: r.get(1),
        hot: r.get(2),
        del: r.get(3),
        dead: r.get(4),
    }))
}

/// The counters once they stop moving (backends that just exited report theirs a moment
/// later): polled until two reads 200 ms apart agree, for at most 5 s.
async fn settled_writes(c: &tokio_postgres::Client) -> anyhow::Result<Option<Writes>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut last = writes(c).await?;
    loop {
        c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = writes(c).await?;
        if now == last || tokio::time::Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

async fn wal_lsn(c: &tokio_postgres::Client) -> anyhow::Result<String> {
    Ok(c.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0))
}

async fn wal_since(c: &tokio_postgres::Client, from: &str) -> anyhow::Result<i64> {
    Ok(c.query_one(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::int8",
        &[&from],
    )
    .await?
    .get(0))
}

/// Refreshes the materialized view every `every` (start to start) until told to stop.
async fn refresher(
    url: String,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    done: Arc<AtomicU64>,
    busy_us: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let c = connect(&url).await?;
    loop {
        let t0 = tokio::time::Instant::now();
        c.batch_execute("REFRESH MATERIALIZED VIEW CONCURRENTLY device_totals")
            .await?;
        done.fetch_add(1, Relaxed);
        busy_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
        tokio::select! {
            _ = tokio::time::sleep_until(t0 + every) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
}

/// How commits reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// PostgreSQL's defaults: every commit waits for its WAL flush.
    Durable,
    /// The test environment's settings (fsync off): the workload is bound by CPU alone.
    CpuBound,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Durable => {
                "durable commits (fsync = on, synchronous_commit = on: PostgreSQL's defaults)"
            }
            Mode::CpuBound => {
                "CPU-bound (fsync = off: every cycle anything else spends is a cycle the writers lose)"
            }
        }
    }

    fn settings(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Mode::Durable => &[("fsync", "on"), ("full_page_writes", "on")],
            Mode::CpuBound => &[],
        }
    }
}

/// `pg_recvlogical` draining the slot to /dev/null until killed.
struct Drain(std::process::Child);

impl Drop for Drain {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first major version that decodes on a standby.
const STANDBY_MAJOR: u32 = 16;

/// Waits until `standby` has replayed everything `primary` has written so far (polled
/// every 10 ms, for at most a minute).
fn replayed(primary: &PgServer, standby: &PgServer) -> anyhow::Result<()> {
    let lsn = primary.psql("SELECT pg_current_wal_lsn()")?;
    let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
    let t0 = Instant::now();
    while standby.psql(&sql)? != "t" {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "the standby did not replay the primary's WAL up to {lsn} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn run_variant(
    mode: Mode,
    keys: Keys,
    v: Variant,
    rows: u64,
    load: &Load,
    version: Option<u32>,
) -> anyhow::Result<Outcome> {
    let mut settings = mode.settings().to_vec();
    if v == Variant::PgIvm {
        settings.push(("shared_preload_libraries", "pg_ivm"));
    }
    let mut pg: PgServer = server_at(version, &settings)?;
    // Before anything connects: starting a standby restarts its primary. Durable or not
    // as the primary is.
    let standby = if v == Variant::Standby {
        let options = mode
            .settings()
            .iter()
            .fold(PgServer::builder(), |b, (k, val)| b.setting(*k, *val));
        Some(
            pg.start_standby(options)
                .context("starting a hot standby of the primary")?,
        )
    } else {
        None
    };
    pg.psql(READINGS)?;
    pg.psql(&keys.seed(rows))?;
    match v {
        Variant::Bare => {}
        Variant::Triggers => {
            pg.psql(TRIGGERS)?;
        }
        Variant::MatView => {
            pg.psql(MATVIEW)?;
        }
        Variant::PgIvm => {
            pg.psql(PG_IVM)?;
        }
        Variant::Freshen | Variant::FreshenArrays | Variant::FreshenQuery => {
            pg.psql(FRESHEN)?;
        }
        Variant::Standby => {
            pg.psql(FRESHEN)?;
            // On the primary, under freshen's default name: a standby is read-only, so
            // freshen uses it as it is (`publication_mode = "existing"`).
            pg.psql(
                "CREATE PUBLICATION freshen FOR TABLE readings WITH (publish_via_partition_root = true)",
            )?;
        }
        Variant::QueryIdentity => {
            pg.psql(IDENTITY)?;
            pg.psql(FRESHEN_IDENTITY)?;
        }
        Variant::QueryColumns => {
            pg.psql(IDENTITY)?;
            pg.psql(FRESHEN_IDENTITY)?;
            // freshen's default publication name: it reuses the one it finds.
            pg.psql(&column_list_publication("freshen"))?;
        }
        Variant::Decode => {
            pg.psql(FRESHEN)?;
            pg.psql("CREATE PUBLICATION decode FOR TABLE readings")?;
            pg.psql("SELECT pg_create_logical_replication_slot('decode', 'pgoutput')")?;
        }
        Variant::DecodeOnly => {
            pg.psql("ALTER TABLE readings REPLICA IDENTITY FULL")?;
            pg.psql("CREATE PUBLICATION decode FOR TABLE readings")?;
            pg.psql("SELECT pg_create_logical_replication_slot('decode', 'pgoutput')")?;
        }
        Variant::DecodeIdentity => {
            pg.psql(IDENTITY)?;
            pg.psql("CREATE PUBLICATION decode FOR TABLE readings")?;
            pg.psql("SELECT pg_create_logical_replication_slot('decode', 'pgoutput')")?;
        }
        Variant::DecodeColumns | Variant::DecodeBinary => {
            pg.psql(IDENTITY)?;
            pg.psql(&column_list_publication("decode"))?;
            pg.psql("SELECT pg_create_logical_replication_slot('decode', 'pgoutput')")?;
        }
    }
    pg.psql("VACUUM ANALYZE")?;
    if let Some(sb) = &standby {
        replayed(&pg, sb)?;
    }
    // pgoutput's `binary` option (PostgreSQL 14+): values in their types' send format.
    let binary: &[&str] = if v == Variant::DecodeBinary {
        &["-o", "binary=true"]
    } else {
        &[]
    };
    let _drain = match v {
        v if v.is_decode() => Some(Drain(
            Command::new(pg.tool("pg_recvlogical"))
                .args([
                    "-d",
                    &pg.url(),
                    "--slot",
                    "decode",
                    "--start",
                    "-f",
                    "/dev/null",
                ])
                .args(["-o", "proto_version=1", "-o", "publication_names=decode"])
                .args(binary)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting pg_recvlogical")?,
        )),
        _ => None,
    };
    let bench = Bench::of(&pg);
    let url = pg.url();
    let standby_url = standby.as_ref().map(PgServer::url);
    let (data, standby_data) = (pg.data_dir(), standby.as_ref().map(PgServer::data_dir));
    let major = pg.major_version();
    let rt = runtime()?;
    let out = rt.block_on(async {
        let admin = connect(&url).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let refreshes = Arc::new(AtomicU64::new(0));
        let busy = Arc::new(AtomicU64::new(0));
        let mv = (v == Variant::MatView).then(|| {
            tokio::spawn(refresher(
                url.clone(),
                Duration::from_secs(1),
                stop_rx,
                refreshes.clone(),
                busy.clone(),
            ))
        });
        let toml = match v {
            Variant::Freshen => Some(config(&url, &REBUILD, None, "100ms", "5s", true)),
            Variant::FreshenArrays => {
                Some(config(&url, &REBUILD_ARRAYS, Some(64), "100ms", "5s", true))
            }
            Variant::FreshenQuery | Variant::QueryIdentity | Variant::QueryColumns => {
                Some(query_config(&url, None, "100ms", "5s", true))
            }
            Variant::Standby => standby_url
                .as_deref()
                .map(|s| standby_query_config(s, &url, "100ms", "5s", true)),
            _ => None,
        };
        // Before freshen starts, so that every variant's counts include its start-up
        // sweep (a backend reports its counters a moment after it wrote).
        let writes0 = writes(&admin).await?;
        let freshen = match toml {
            Some(toml) => Some(Freshen::start(&toml).await?),
            None => None,
        };
        let before = freshen.as_ref().map(|f| f.stats());
        // The truth checks below run in the admin connection's backend: measurement, not
        // tax, so its CPU is taken out.
        let checker: i32 = admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let checker = checker as u32;
        let lsn0 = wal_lsn(&admin).await?;
        let reader = match (&_drain, v.is_freshen()) {
            (Some(d), _) => Some(d.0.id()),
            (None, true) => Some(std::process::id()),
            (None, false) => None,
        };
        let sampler = Sampler::start(&url).await?;
        // (s): the standby's decoding walsender, read through a connection of its own
        // whose backend's CPU is taken out of the standby's.
        let on_standby = match &standby_url {
            Some(u) => {
                let c = connect(u).await?;
                let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
                let roles = Sample::take(&c, None).await?;
                Some((c, pid as u32, roles))
            }
            None => None,
        };
        let standby_cpu = || {
            on_standby
                .as_ref()
                .zip(standby_data.as_ref())
                .map(|((_, pid, _), d)| server_cpu(d).saturating_sub(process_cpu(*pid)))
        };
        let standby0 = standby_cpu();
        let roles0 = Sample::take(&admin, reader).await?;
        let primary0 = server_cpu(&data);
        let (cpu0, check0, sample0) = (tree_cpu(), process_cpu(checker), process_cpu(sampler.pid));
        let (b, l) = (bench.clone(), load.clone());
        let result =
            tokio::task::spawn_blocking(move || b.run_logged(&scripts(keys), &l)).await??;
        let sampled = process_cpu(sampler.pid).saturating_sub(sample0);
        let Sampled {
            seen: waits,
            own_cpu,
        } = sampler.finish().await?;
        let stale = if v.no_derived() {
            None
        } else {
            converge(&admin, result.ended, Duration::from_secs(60)).await?
        };
        let wal = wal_since(&admin, &lsn0).await?;
        let mut split = Sample::take(&admin, reader).await?.since(&roles0);
        // The sampler is measurement, not tax: its backend, and its thread in this
        // process, which is freshen's reader process in the freshen variants.
        if reader == Some(std::process::id()) {
            split.reader = split.reader.saturating_sub(own_cpu);
        }
        let checked = process_cpu(checker).saturating_sub(check0);
        let cpu = tree_cpu()
            .saturating_sub(cpu0)
            .saturating_sub(checked)
            .saturating_sub(sampled)
            .saturating_sub(own_cpu);
        let primary = server_cpu(&data)
            .saturating_sub(primary0)
            .saturating_sub(checked)
            .saturating_sub(sampled);
        let standby_spent = match (&on_standby, standby0, standby_cpu()) {
            (Some((c, _, roles0)), Some(a), Some(b)) => Some((
                b.saturating_sub(a),
                Sample::take(c, None).await?.since(roles0).walsender,
            )),
            _ => None,
        };
        let _ = stop_tx.send(true);
        if let Some(t) = mv {
            t.await??;
        }
        let note = match (v, freshen) {
            (Variant::MatView, _) => {
                let n = refreshes.load(Relaxed).max(1);
                format!(
                    "{} refreshes, {:.0} ms each",
                    refreshes.load(Relaxed),
                    busy.load(Relaxed) as f64 / n as f64 / 1e3
                )
            }
            (v, Some(f)) if v.is_freshen() => {
                let s = f.stats();
                let b = before.unwrap_or_default();
                let ev = s.events_received - b.events_received;
                let rb = s.rebuilds_ok - b.rebuilds_ok;
                let calls = s.rebuild_calls - b.rebuild_calls;
                f.stop().await?;
                format!(
                    "{ev} events, {rb} rebuilds ({:.2}/event) in {calls} calls ({:.1} keys each)",
                    rb as f64 / ev.max(1) as f64,
                    rb as f64 / calls.max(1) as f64
                )
            }
            _ => String::new(),
        };
        // Read once every writer of the derived table is gone (freshen stopped, pgbench
        // and the refresher done): a backend reports its table counters when it exits.
        let derived = match (writes0, settled_writes(&admin).await?) {
            (Some(a), Some(b)) => Some(b.since(&a)),
            _ => None,
        };
        let tx = result.transactions.max(1);
        let per_tx = |d: Duration| d / u32::try_from(tx).unwrap_or(u32::MAX);
        anyhow::Ok(Outcome {
            primary_per_tx: per_tx(primary),
            standby: standby_spent.map(|(total, walsender)| StandbyCpu {
                total: per_tx(total),
                walsender: per_tx(walsender),
            }),
            major,
            wal_per_tx: wal as f64 / tx as f64,
            derived,
            cpu_per_tx: cpu / u32::try_from(tx).unwrap_or(u32::MAX),
            split: split.per(tx),
            load: result,
            stale,
            waits,
            note,
        })
    })?;
    drop(rt);
    Ok(out)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    measure(opts, Keys::Uniform, &Variant::ALL)
}

/// The variants of the hot-key run: where row triggers serialize on the hottest
/// devices' rollup rows.
const HOT: [Variant; 7] = [
    Variant::Bare,
    Variant::DecodeOnly,
    Variant::Triggers,
    Variant::Freshen,
    Variant::FreshenArrays,
    Variant::FreshenQuery,
    Variant::PgIvm,
];

/// `write-tax-hot`: the same mix with devices drawn from Zipf(1.1).
pub(crate) fn run_hot(opts: &Opts) -> anyhow::Result<()> {
    measure(opts, Keys::Hot, &HOT)
}

fn measure(opts: &Opts, keys: Keys, variants: &[Variant]) -> anyhow::Result<()> {
    let (rows, secs, rounds) = if opts.quick {
        (10_000u64, 1, 1)
    } else {
        (100_000, 10, 3)
    };
    let load = Load {
        clients: 8,
        duration: Duration::from_secs(secs),
        rate: None,
        vars: vec![("rows".into(), rows.to_string())],
    };
    let mut variants = chosen(variants)?;
    // (s) needs 16 or later: then every row runs that version, to compare on one build.
    let version = variants
        .contains(&Variant::Standby)
        .then(|| PgServer::find_major_version().map_or(STANDBY_MAJOR, |m| m.max(STANDBY_MAJOR)));
    let builder = match version {
        Some(v) => PgServer::builder().version(v),
        None => PgServer::builder(),
    };
    let bin_dir = builder.bin_dir().with_context(|| {
        format!(
            "(s) decodes on a standby: PostgreSQL {STANDBY_MAJOR} or later, every row of the run \
             on it (leave s out of {VARIANTS_ENV} to run without)"
        )
    })?;
    let bin_dir = std::fs::canonicalize(&bin_dir).unwrap_or(bin_dir);
    if variants.contains(&Variant::PgIvm) && !pg_ivm_installed(&bin_dir) {
        variants.retain(|v| *v != Variant::PgIvm);
        let why = match version {
            Some(v) => format!(
                "; the run is on PostgreSQL {v} because (s) needs {STANDBY_MAJOR} or later: \
                 leave s out of {VARIANTS_ENV} for the default server"
            ),
            None => String::new(),
        };
        println!(
            "(f) pg_ivm not run: it is not installed for these server binaries ({}{why}; \
             not packaged for Debian 12: build and install it from its public source \
             against the server's headers)\n",
            bin_dir.display()
        );
    }
    let spread = match keys {
        Keys::Uniform => format!("{DEVICES} devices alike"),
        Keys::Hot => format!(
            "devices ~ Zipf(s = {ZIPF_S}) over {DEVICES} (the readings to start with, inserts and moves; \
             updates and deletes pick a reading at random, so their devices follow the same skew)"
        ),
    };
    for mode in [Mode::Durable, Mode::CpuBound] {
        let t0 = Instant::now();
        let mut results: Vec<(Variant, Vec<Outcome>)> =
            variants.iter().map(|v| (*v, Vec::new())).collect();
        for round in 0..rounds {
            for (v, outs) in &mut results {
                let o = run_variant(mode, keys, *v, rows, &load, version)?;
                eprintln!(
                    "  write-tax {keys:?} {mode:?} round {}/{rounds}: {:<62} {:>7.0} tps",
                    round + 1,
                    v.label(),
                    o.load.tps
                );
                outs.push(o);
            }
        }
        println!("### {}\n", mode.label());
        table(&results);
        let major = results
            .iter()
            .find_map(|(_, o)| o.first().map(|o| o.major))
            .unwrap_or_default();
        println!(
            "\nPostgreSQL {major} ({}). {} clients, {secs} s per run, {rows} readings to start, {spread}; mix: 40% insert, \
             30% update, 20% move to another device, 10% delete. Median TPS of {rounds} alternating rounds, \
             a fresh server per run ({:.0} s in all). CPU per tx: user + system time of every process of \
             the run (server, pgbench, freshen, pg_recvlogical, the matview refresher; not the truth \
             checks or the wait sampler) from the start of the load until the derived table had caught up, per committed \
             transaction — steadier than TPS when other work shares the machine. The primary server's CPU \
             per tx: the same for the primary's processes alone (postmaster and backends, live or gone: the \
             writers', the walsender — for (s) the physical one feeding the standby —, freshen's rebuild \
             backends; not pgbench, freshen's process, pg_recvlogical). (s): the standby's processes the \
             same way, of which its walsender decoding for freshen. Writer latency: \
             p50 / p99 of every transaction of the run (pgbench's log), median over the rounds. \
             Writers' backends: pgbench's backends sampled every 5 ms during the load (running: active \
             with no wait event, on a CPU or waiting for one; client: idle between statements, until \
             pgbench sends the next one and the backend gets a CPU to read it; else the wait event), the three most frequent states over all rounds; freshen's backends: the same for \
             freshen's pool (the rebuilds). \
             Staleness: worst round, from the last commit to the \
             first check that found the derived table equal to a fresh GROUP BY. \
             WAL per tx: bytes of WAL from the start of the load until caught up, per committed transaction. \
             device_totals writes: row versions inserted / updated (HOT) / deleted from before freshen's \
             start-up sweep of every device (which (e) finds unchanged and does not write) until the end; dead \
             tuples: what autovacuum had not removed by then. \
             Goal: (d) ≥ 0.95× of (a), ahead of (b) and (c); (s): the primary server's CPU per tx \
             ≤ 0.8× (b)'s, and TPS above (b)'s.\n",
            bin_dir.display(),
            load.clients,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn table(results: &[(Variant, Vec<Outcome>)]) {
    let base = median(results[0].1.iter().map(|o| o.load.tps).collect());
    let cpu_of =
        |outs: &[Outcome]| median(outs.iter().map(|o| o.cpu_per_tx.as_secs_f64()).collect());
    let base_cpu = cpu_of(&results[0].1);
    let primary_of = |outs: &[Outcome]| {
        median(
            outs.iter()
                .map(|o| o.primary_per_tx.as_secs_f64())
                .collect(),
        )
    };
    let triggers = results
        .iter()
        .find(|(v, _)| *v == Variant::Triggers)
        .map(|(_, outs)| primary_of(outs));
    let mut t = Table::new(&[
        "variant",
        "CPU per tx (median)",
        "vs (a)",
        "of which walsender ((s): the primary's physical one) / freshen's backends / reader process / rest",
        "the primary server's CPU per tx",
        "vs (b)",
        "(s) the standby's CPU per tx (of which its decoding walsender)",
        "TPS (median)",
        "vs (a)",
        "writer latency p50 / p99",
        "writers' backends: top states (all rounds)",
        "freshen's backends: top states (all rounds)",
        "WAL per tx (median)",
        "device_totals ins / upd (HOT) / del (last round)",
        "dead tuples at end",
        "retried / failed tx",
        "staleness at end",
        "equals truth",
        "notes (last round)",
    ]);
    for (v, outs) in results {
        let tps = median(outs.iter().map(|o| o.load.tps).collect());
        let retries: u64 = outs.iter().map(|o| o.load.retries).sum();
        let failed: u64 = outs.iter().map(|o| o.load.failed).sum();
        let (stale, equal) = if v.no_derived() {
            ("–".to_string(), "–".to_string())
        } else {
            let worst = outs
                .iter()
                .map(|o| o.stale)
                .max_by_key(|s| s.unwrap_or(Duration::MAX));
            let all_equal = outs.iter().all(|o| o.stale.is_some());
            (
                ms(worst.flatten()),
                if all_equal { "yes" } else { "NO" }.to_string(),
            )
        };
        t.row(vec![
            v.label().into(),
            format!("{:.0} µs", cpu_of(outs) * 1e6),
            format!("{:.2}×", cpu_of(outs) / base_cpu.max(1e-12)),
            split(outs),
            format!("{:.0} µs", primary_of(outs) * 1e6),
            triggers.map_or("–".into(), |b| {
                format!("{:.2}×", primary_of(outs) / b.max(1e-12))
            }),
            standby(outs),
            format!("{tps:.0}"),
            format!("{:.2}×", tps / base.max(1e-9)),
            latency(outs),
            states(outs, |s| &s.writers),
            states(outs, |s| &s.rebuilds),
            format!(
                "{:.0} B",
                median(outs.iter().map(|o| o.wal_per_tx).collect())
            ),
            outs.last().and_then(|o| o.derived).map_or("–".into(), |w| {
                format!("{} / {} ({}) / {}", w.ins, w.upd, w.hot, w.del)
            }),
            outs.last()
                .and_then(|o| o.derived)
                .map_or("–".into(), |w| w.dead.to_string()),
            format!("{retries} / {failed}"),
            stale,
            equal,
            outs.last().map(|o| o.note.clone()).unwrap_or_default(),
        ]);
    }
    t.print();
}

/// Median over the rounds of each role's CPU per transaction ("–" for a part the variant
/// does not have); the rest is everything else: the writers' backends, pgbench, the
/// server's background processes — (s)'s standby apart, which has a column of its own.
fn split(outs: &[Outcome]) -> String {
    let of = |f: fn(&Split) -> Duration| {
        let v = median(outs.iter().map(|o| f(&o.split).as_secs_f64()).collect());
        if v > 0.0 {
            format!("{:.0} µs", v * 1e6)
        } else {
            "–".into()
        }
    };
    let rest = median(
        outs.iter()
            .map(|o| {
                let standby = o.standby.map_or(Duration::ZERO, |s| s.total);
                o.cpu_per_tx
                    .saturating_sub(o.split.total())
                    .saturating_sub(standby)
                    .as_secs_f64()
            })
            .collect(),
    );
    format!(
        "{} / {} / {} / {:.0} µs",
        of(|s| s.walsender),
        of(|s| s.rebuilds),
        of(|s| s.reader),
        rest * 1e6
    )
}

/// (s): the median over the rounds of the standby's CPU per transaction and of its
/// decoding walsender's part ("–" for the other variants).
fn standby(outs: &[Outcome]) -> String {
    let of = |f: fn(&StandbyCpu) -> Duration| {
        let v: Vec<f64> = outs
            .iter()
            .filter_map(|o| o.standby.as_ref().map(|s| f(s).as_secs_f64()))
            .collect();
        (!v.is_empty()).then(|| median(v) * 1e6)
    };
    match (of(|s| s.total), of(|s| s.walsender)) {
        (Some(total), Some(walsender)) => format!("{total:.0} µs ({walsender:.0} µs)"),
        _ => "–".into(),
    }
}

/// One group's three most frequent states over all rounds.
fn states(outs: &[Outcome], group: fn(&Seen) -> &Waits) -> String {
    outs.iter()
        .fold(Waits::default(), |mut all, o| {
            all.merge(group(&o.waits));
            all
        })
        .top(3)
}

/// Median over the rounds of the writers' p50 and p99 latency.
fn latency(outs: &[Outcome]) -> String {
    let of = |f: fn(&(Duration, Duration)) -> Duration| {
        let v: Vec<f64> = outs
            .iter()
            .filter_map(|o| o.load.latency.as_ref().map(|l| f(l).as_secs_f64()))
            .collect();
        (!v.is_empty()).then(|| Duration::from_secs_f64(median(v)))
    };
    format!("{} / {}", ms(of(|l| l.0)), ms(of(|l| l.1)))
}
