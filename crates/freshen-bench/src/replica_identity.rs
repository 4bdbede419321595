//! Replica identity: what DEFAULT, USING INDEX on (primary key, key column) and FULL cost
//! on the same update workload — WAL per transaction, the walsender's CPU per row it
//! decodes, and how fast freshen's `PgSource` reads the result.
//!
//! One server, three copies of one table (`id` primary key, `device` the scope key,
//! `value`, a 40-character `note`, and the index on `device` a rebuild by device reads),
//! differing only in their identity; the USING INDEX copy also carries the unique index
//! on `(id, device)` the identity needs, charged to it. Autovacuum is off on the three
//! tables and `full_page_writes` off on the server, so that the WAL measured is the
//! updates' own and not page images whose number depends on when a checkpoint fell.
//!
//! Per identity, in turn: a slot is created, pgbench runs one-row transactions for a
//! fixed time (80 % `value` updates, 20 % moves to another device), the WAL between
//! the two LSNs is divided by the transactions committed; then `PgSource` reads the slot
//! to the last change. The walsender serving it is found by the slot's `active_pid`
//! and its CPU read from /proc while it is still connected: it started with the session,
//! so its whole CPU time is this reading. "events carrying the old device" counts the
//! UPDATE events whose old image has the device: a view keyed by device needs it for the
//! moves (the device the row left), and nothing more.

use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Op, Source, Value};
use freshen_postgres::{ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SlotMode};

use crate::Opts;
use crate::report::{Table, rate};
use crate::workload::{Bench, DEVICES, Load, Script, connect, process_cpu, runtime, server};

/// Rows in each table.
const ROWS: u32 = 100_000;

#[derive(Debug, Clone, Copy)]
enum Identity {
    Default,
    Index,
    Full,
}

impl Identity {
    const ALL: [Identity; 3] = [Identity::Default, Identity::Index, Identity::Full];

    fn table(self) -> &'static str {
        match self {
            Identity::Default => "ri_default",
            Identity::Index => "ri_index",
            Identity::Full => "ri_full",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Identity::Default => "DEFAULT (primary key)",
            Identity::Index => "USING INDEX (id, device)",
            Identity::Full => "FULL",
        }
    }

    fn setup(self) -> String {
        let t = self.table();
        let identity = match self {
            Identity::Default => String::new(),
            Identity::Index => format!(
                "CREATE UNIQUE INDEX {t}_key ON {t} (id, device);
                 ALTER TABLE {t} REPLICA IDENTITY USING INDEX {t}_key;"
            ),
            Identity::Full => format!("ALTER TABLE {t} REPLICA IDENTITY FULL;"),
        };
        format!(
            "CREATE TABLE {t} (
                 id bigint PRIMARY KEY,
                 device int NOT NULL,
                 value bigint NOT NULL,
                 note text NOT NULL
             ) WITH (autovacuum_enabled = off);
             INSERT INTO {t} SELECT g, g % {DEVICES} + 1, g, 'reading ' || md5(g::text)
                 FROM generate_series(1, {ROWS}) g;
             CREATE INDEX ON {t} (device);
             {identity}
             CREATE PUBLICATION {t}_pub FOR TABLE {t};"
        )
    }

    fn scripts(self) -> Vec<Script> {
        let t = self.table();
        vec![
            Script {
                name: "value",
                body: format!(
                    "\\set id random(1, {ROWS})\nUPDATE {t} SET value = value + 1 WHERE id = :id;\n"
                ),
                weight: 80,
            },
            Script {
                name: "move",
                body: format!(
                    "\\set id random(1, {ROWS})\n\\set d random(1, {DEVICES})\nUPDATE {t} SET device = :d WHERE id = :id AND device <> :d;\n"
                ),
                weight: 20,
            },
        ]
    }
}

/// What one identity cost.
struct Outcome {
    transactions: u64,
    wal_bytes: i64,
    rows: u64,
    with_old_device: u64,
    decode: Duration,
    walsender_cpu: Duration,
}

async fn lsn(c: &tokio_postgres::Client) -> anyhow::Result<String> {
    Ok(c.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0))
}

fn device(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        Value::Text(t) => t.parse().ok(),
        _ => None,
    }
}

fn measure(
    pg: &freshen_testenv::PgServer,
    rt: &tokio::runtime::Runtime,
    id: Identity,
    load: &Load,
) -> anyhow::Result<Outcome> {
    let t = id.table();
    let slot = format!("{t}_slot");
    let c = rt.block_on(connect(&pg.url()))?;
    rt.block_on(c.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    ))
    .context("creating the slot")?;
    let before = rt.block_on(lsn(&c))?;
    let result = Bench::of(pg).run(&id.scripts(), load)?;
    let after = rt.block_on(lsn(&c))?;
    let wal_bytes: i64 = rt
        .block_on(c.query_one(
            "SELECT pg_wal_lsn_diff($2::text::pg_lsn, $1::text::pg_lsn)::bigint",
            &[&before, &after],
        ))?
        .get(0);
    // The end of the workload in the stream: one INSERT, after the WAL was measured.
    rt.block_on(c.execute(&format!("INSERT INTO {t} VALUES (0, 1, 0, 'end')"), &[]))?;
    let cfg = PgSourceConfig {
        connection: ConnectionConfig::from_url(&pg.url())?,
        slot: slot.clone(),
        slot_mode: SlotMode::MustExist,
        publication: format!("{t}_pub"),
        publication_mode: PublicationMode::MustExist,
        tables: vec![t.parse().map_err(anyhow::Error::msg)?],
        ..PgSourceConfig::default()
    };
    let (decode, walsender_cpu, rows, carried) = rt.block_on(async {
        let t0 = Instant::now();
        let mut src = PgSource::start(cfg).await?;
        let (mut rows, mut carried, mut ended) = (0u64, 0u64, false);
        while !ended {
            let b = tokio::time::timeout(Duration::from_secs(120), src.next_batch())
                .await
                .context("decoding stalled")?
                .context("stream ended")??;
            for e in b.events() {
                if e.op == Op::Insert {
                    ended = true;
                }
                if e.op != Op::Update {
                    continue;
                }
                rows += 1;
                if device(e.old.as_ref().and_then(|r| r.get("device"))).is_some() {
                    carried += 1;
                }
            }
            b.into_parts().2.ack();
        }
        let took = t0.elapsed();
        // Read while the walsender still serves this session.
        let pid: Option<i32> = c
            .query_one(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .get(0);
        let cpu = pid
            .and_then(|p| u32::try_from(p).ok())
            .map_or(Duration::ZERO, process_cpu);
        src.shutdown().await;
        anyhow::Ok((took, cpu, rows, carried))
    })?;
    rt.block_on(async {
        // The session lets go of the slot shortly after shutdown.
        for _ in 0..500 {
            if c.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    Ok(Outcome {
        transactions: result.transactions,
        wal_bytes,
        rows,
        with_old_device: carried,
        decode,
        walsender_cpu,
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let pg = server(&[("full_page_writes", "off"), ("max_wal_size", "4GB")])?;
    for id in Identity::ALL {
        pg.psql(&id.setup())?;
        pg.psql(&format!("VACUUM ANALYZE {}", id.table()))?;
    }
    let load = Load {
        clients: 4,
        duration: Duration::from_secs(if opts.quick { 2 } else { 20 }),
        rate: None,
        vars: Vec::new(),
    };
    let rt = runtime()?;
    let mut out = Vec::new();
    for id in Identity::ALL {
        out.push((id, measure(&pg, &rt, id, &load)?));
    }
    let base = out[0].1.wal_bytes as f64 / out[0].1.transactions.max(1) as f64;
    let mut t = Table::new(&[
        "replica identity",
        "transactions",
        "WAL per tx",
        "vs DEFAULT",
        "walsender CPU per row",
        "decoded by PgSource",
        "events carrying the old device",
    ]);
    for (id, o) in &out {
        let per_tx = o.wal_bytes as f64 / o.transactions.max(1) as f64;
        t.row(vec![
            id.label().into(),
            o.transactions.to_string(),
            format!("{per_tx:.0} B"),
            format!("{:+.0} %", (per_tx / base - 1.0) * 100.0),
            format!(
                "{:.2} µs",
                o.walsender_cpu.as_secs_f64() * 1e6 / o.rows.max(1) as f64
            ),
            rate(o.rows as f64, o.decode),
            format!("{} / {}", o.with_old_device, o.rows),
        ]);
    }
    t.print();
    println!(
        "\none-row UPDATE transactions, 80 % value / 20 % device moves, {} pgbench clients for {} s per identity; \
         full_page_writes off, autovacuum off on the tables; walsender CPU from /proc (10 ms ticks); \
         the old device arrives with every UPDATE under FULL, with the moves under USING INDEX (what a view keyed by device needs), never under DEFAULT",
        load.clients,
        load.duration.as_secs()
    );
    Ok(())
}
