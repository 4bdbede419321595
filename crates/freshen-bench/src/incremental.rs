//! The source's cost on the server: cursor polling (`PgIncrementalSource`) against
//! logical replication (`PgSource`), on the same workload in the same run.
//!
//! One server, one table with an index on `updated_at`. Each phase runs the same
//! writer (single-row transactions: an insert, or an update that moves `updated_at`)
//! with one source consuming and acknowledging, and ends when the source has handed
//! over the phase's last row. The source's cost is the CPU of its own server backends
//! (the walsender decoding WAL, or the polling connections running the keyset and
//! re-read queries), found by `application_name` and read from /proc — exact, and
//! untouched by the writers or by other work on the machine. Then each source idles
//! for a while with no writes: polling a quiet table against the walsender's
//! keepalives. A phase with no source gives the writes' own pace and server CPU.

use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Backoff, Source};
use freshen_postgres::incremental::{IncrementalConfig, PgIncrementalSource, PolledTable};
use freshen_postgres::{
    ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SlotMode, TableName,
};
use freshen_testenv::PgServer;
use tokio_postgres::Client;

use crate::Opts;
use crate::report::{Table, dur, rate};
use crate::workload::{connect, process_cpu, runtime, server, server_cpu};

/// The `application_name` of every connection a measured source opens.
const APP: &str = "bench_source";

/// The source's backends now (its SQL connections and, for logical replication, the
/// walsender), with their CPU so far.
async fn source_backends(c: &Client) -> anyhow::Result<Vec<(u32, Duration)>> {
    let rows = c
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 OR backend_type = 'walsender'",
            &[&APP],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let pid = r.get::<_, i32>(0) as u32;
            (pid, process_cpu(pid))
        })
        .collect())
}

/// CPU the source's backends spent since `before` (backends opened since count whole).
async fn source_cpu(c: &Client, before: &[(u32, Duration)]) -> anyhow::Result<Duration> {
    let now = source_backends(c).await?;
    Ok(now
        .iter()
        .map(|(pid, cpu)| {
            let was = before
                .iter()
                .find(|(p, _)| p == pid)
                .map_or(Duration::ZERO, |(_, c)| *c);
            cpu.saturating_sub(was)
        })
        .sum())
}

/// Which source a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    None,
    Logical,
    Polling { interval_ms: u64, lookback_s: u64 },
}

impl Reader {
    fn label(self) -> String {
        match self {
            Reader::None => "no source (the writes alone)".into(),
            Reader::Logical => "logical replication (PgSource)".into(),
            Reader::Polling {
                interval_ms,
                lookback_s,
            } => format!("polling every {interval_ms} ms, lookback {lookback_s} s"),
        }
    }
}

/// What a phase measured.
struct Phase {
    reader: Reader,
    /// The source's first read: rows handed over, time, its backends' CPU.
    first: Option<(u64, Duration, Duration)>,
    took: Duration,
    cpu: Duration,
    own: Duration,
    events: u64,
    polls: u64,
}

enum Running {
    Logical(PgSource),
    Polling(PgIncrementalSource),
}

impl Running {
    async fn next(&mut self) -> Option<freshen::Batch> {
        let b = match self {
            Running::Logical(s) => s.next_batch().await,
            Running::Polling(s) => s.next_batch().await,
        };
        b.and_then(Result::ok)
    }

    fn polls(&self) -> u64 {
        match self {
            Running::Logical(_) => 0,
            Running::Polling(s) => s.handle().stats().polls,
        }
    }

    async fn stop(self) {
        match self {
            Running::Logical(mut s) => s.shutdown().await,
            Running::Polling(mut s) => s.shutdown().await,
        }
    }
}

async fn start(pg: &PgServer, reader: Reader, name: &str) -> anyhow::Result<Option<Running>> {
    let mut connection = ConnectionConfig::from_url(&pg.url())?;
    connection.application_name = APP.into();
    Ok(match reader {
        Reader::None => None,
        Reader::Logical => Some(Running::Logical(
            PgSource::start(PgSourceConfig {
                connection,
                slot: name.into(),
                slot_mode: SlotMode::Temporary,
                publication: "bench_pub".into(),
                publication_mode: PublicationMode::MustExist,
                tables: vec![TableName::new("public", "bench")],
                ..PgSourceConfig::default()
            })
            .await?,
        )),
        Reader::Polling {
            interval_ms,
            lookback_s,
        } => {
            let source = PgIncrementalSource::start(IncrementalConfig {
                connection,
                store_connection: None,
                store_table: TableName::new("public", "freshen_cursors"),
                name: name.into(),
                lookback: Duration::from_secs(lookback_s),
                tables: vec![PolledTable {
                    table: TableName::new("public", "bench"),
                    cursor: "updated_at".into(),
                    poll_interval: Duration::from_millis(interval_ms),
                    page_size: 1000,
                }],
                queue_batches: 8,
                retry: Backoff::default(),
            })
            .await?;
            Some(Running::Polling(source))
        }
    })
}

/// Reads (and acknowledges) until the row `marker` arrives.
async fn drain_until(src: &mut Running, marker: i64) -> anyhow::Result<u64> {
    let mut events = 0u64;
    loop {
        let b = tokio::time::timeout(Duration::from_secs(120), src.next())
            .await
            .context("the source stalled")?
            .context("the source ended")?;
        events += b.events().len() as u64;
        let found = b.events().iter().any(|e| {
            e.new
                .as_ref()
                .and_then(|r| r.get("id"))
                .is_some_and(|v| *v == freshen::Value::Int(marker))
        });
        b.into_parts().2.ack();
        if found {
            return Ok(events);
        }
    }
}

/// `txs` single-row transactions (2 in 3 inserts, 1 in 3 an update of a recent row),
/// new ids from `next_id`; returns the last id inserted.
async fn write(c: &Client, next_id: &mut i64, txs: usize, rng: &mut freshen::Jitter) -> i64 {
    let insert = c
        .prepare("INSERT INTO bench (id, dev, v) VALUES ($1::int8, 'd' || ($1::int8 % 100), 1)")
        .await
        .expect("prepare");
    let update = c
        .prepare("UPDATE bench SET v = v + 1, updated_at = now() WHERE id = $1")
        .await
        .expect("prepare");
    for i in 0..txs {
        if i % 3 == 2 && *next_id > 1 {
            let id = *next_id - 1 - rng.below(100.min(*next_id as u64 - 1)) as i64;
            c.execute(&update, &[&id]).await.expect("update");
        } else {
            c.execute(&insert, &[&*next_id]).await.expect("insert");
            *next_id += 1;
        }
    }
    // The marker: the phase's last row.
    c.execute(&insert, &[&*next_id]).await.expect("insert");
    *next_id += 1;
    *next_id - 1
}

/// Catches up with earlier phases' rows (the poller's first read of the table) before
/// anything is measured.
/// Returns the rows handed over, the time and the source backends' CPU.
async fn warm(
    c: &Client,
    s: &mut Running,
    next_id: &mut i64,
) -> anyhow::Result<(u64, Duration, Duration)> {
    let marker = *next_id;
    c.execute(
        "INSERT INTO bench (id, dev, v) VALUES ($1, 'warm', 0)",
        &[&marker],
    )
    .await?;
    *next_id += 1;
    let own0 = source_backends(c).await?;
    let t0 = Instant::now();
    let rows = drain_until(s, marker).await?;
    Ok((rows, t0.elapsed(), source_cpu(c, &own0).await?))
}

async fn phase(
    pg: &PgServer,
    c: &Client,
    reader: Reader,
    txs: usize,
    next_id: &mut i64,
    n: usize,
) -> anyhow::Result<Phase> {
    let mut src = start(pg, reader, &format!("bench_{n}")).await?;
    let first = match &mut src {
        Some(s) => Some(warm(c, s, next_id).await?),
        None => None,
    };
    let mut rng = freshen::Jitter::new(n as u64);
    let polls0 = src.as_ref().map_or(0, Running::polls);
    let own0 = source_backends(c).await?;
    let cpu0 = server_cpu(&pg.data_dir());
    let t0 = Instant::now();
    let events = match src.take() {
        Some(mut s) => {
            // The source reads while the writer writes: a task of its own.
            let marker = *next_id + txs as i64 - (txs / 3) as i64;
            let reader_task = tokio::spawn(async move {
                let n = drain_until(&mut s, marker).await;
                (s, n)
            });
            let last = write(c, next_id, txs, &mut rng).await;
            anyhow::ensure!(last == marker, "marker {marker}, last {last}");
            let (s, n) = reader_task.await?;
            src = Some(s);
            n?
        }
        None => {
            write(c, next_id, txs, &mut rng).await;
            0
        }
    };
    let took = t0.elapsed();
    let cpu = server_cpu(&pg.data_dir()).saturating_sub(cpu0);
    let own = source_cpu(c, &own0).await?;
    let polls = src.as_ref().map_or(0, Running::polls) - polls0;
    if let Some(s) = src {
        s.stop().await;
    }
    Ok(Phase {
        reader,
        first,
        took,
        cpu,
        own,
        events,
        polls,
    })
}

/// Server CPU while `reader` idles on a quiet table for `span`, and its polls.
async fn idle(
    pg: &PgServer,
    c: &Client,
    next_id: &mut i64,
    reader: Reader,
    span: Duration,
    n: usize,
) -> anyhow::Result<(Duration, u64)> {
    let mut src = start(pg, reader, &format!("idle_{n}")).await?;
    // Past the first (catch-up) read.
    if let Some(s) = &mut src {
        warm(c, s, next_id).await?;
    }
    // The catch-up's range is re-read until the lookback has passed: the steady state
    // of a quiet table comes after it.
    if let Reader::Polling { lookback_s, .. } = reader {
        tokio::time::sleep(Duration::from_secs(lookback_s + 1)).await;
    }
    let polls0 = src.as_ref().map_or(0, Running::polls);
    let own0 = source_backends(c).await?;
    tokio::time::sleep(span).await;
    let cpu = source_cpu(c, &own0).await?;
    let polls = src.as_ref().map_or(0, Running::polls) - polls0;
    if let Some(s) = src {
        s.stop().await;
    }
    Ok((cpu, polls))
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (txs, idle_span) = if opts.quick {
        (3_000, Duration::from_secs(2))
    } else {
        (30_000, Duration::from_secs(10))
    };
    let pg = server(&[])?;
    pg.psql(
        "CREATE TABLE bench (id int8 PRIMARY KEY, dev text NOT NULL, v int NOT NULL, \
                             updated_at timestamptz NOT NULL DEFAULT now());
         CREATE INDEX ON bench (updated_at);
         ALTER TABLE bench REPLICA IDENTITY FULL;
         CREATE PUBLICATION bench_pub FOR TABLE bench;",
    )?;
    let rt = runtime()?;
    rt.block_on(async {
        let c = connect(&pg.url()).await?;
        let mut next_id = 1i64;
        let readers = [
            Reader::None,
            Reader::Logical,
            Reader::Polling {
                interval_ms: 100,
                lookback_s: 0,
            },
            Reader::Polling {
                interval_ms: 100,
                lookback_s: 5,
            },
            Reader::Polling {
                interval_ms: 1000,
                lookback_s: 5,
            },
            Reader::None,
        ];
        let mut phases = Vec::new();
        for (n, r) in readers.into_iter().enumerate() {
            phases.push(phase(&pg, &c, r, txs, &mut next_id, n).await?);
        }
        let rows = txs as u64 + 1;
        let mut t = Table::new(&[
            "source",
            &format!("{txs} single-row tx"),
            "changes/s",
            "server CPU (all)",
            "source's backends' CPU",
            "per change",
            "events handed over",
            "polls",
        ]);
        for p in &phases {
            let own = p.own;
            let source = p.reader != Reader::None;
            t.row(vec![
                p.reader.label(),
                dur(p.took),
                rate(rows as f64, p.took),
                ms(p.cpu),
                if source { ms(own) } else { "–".into() },
                if source { us(own / rows as u32) } else { "–".into() },
                if source { p.events.to_string() } else { "–".into() },
                if source { p.polls.to_string() } else { "–".into() },
            ]);
        }
        t.print();
        println!(
            "\nsource's backends' CPU: the walsender or the polling connections, from /proc (10 ms ticks); polling hands over a row's latest state, so changes between two polls of one row are one event\n"
        );

        let mut t = Table::new(&[
            "first read (polling: the existing table from its start)",
            "rows",
            "took",
            "rows/s",
            "source's backends' CPU",
        ]);
        for p in &phases {
            if let (Some((rows, took, cpu)), Reader::Polling { .. }) = (p.first, p.reader) {
                t.row(vec![
                    p.reader.label(),
                    rows.to_string(),
                    dur(took),
                    rate(rows as f64, took),
                    ms(cpu),
                ]);
            }
        }
        t.print();
        println!("\nthe first run of a polling source reads every row (pages of 1000, keyset by (updated_at, id))\n");

        let mut t = Table::new(&["source, idle table", "source's backends' CPU", "polls", "per poll"]);
        for (n, r) in [
            Reader::Logical,
            Reader::Polling {
                interval_ms: 100,
                lookback_s: 5,
            },
            Reader::Polling {
                interval_ms: 1000,
                lookback_s: 5,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let (cpu, polls) = idle(&pg, &c, &mut next_id, r, idle_span, n).await?;
            t.row(vec![
                format!("{} for {}", r.label(), dur(idle_span)),
                ms(cpu),
                polls.to_string(),
                if polls > 0 {
                    us(cpu / polls as u32)
                } else {
                    "–".into()
                },
            ]);
        }
        t.print();
        println!("\nidle: what watching a quiet table costs the server (polls vs the walsender's keepalives)");
        anyhow::Ok(())
    })
}
