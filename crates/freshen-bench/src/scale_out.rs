//! Scaling out: rebuilds/s of one view spread over key stream workers, twice:
//!
//! - *CPU-bound*: 1, 2 and 4 workers on a rebuild-heavy workload (every key's rebuild
//!   aggregates hundreds of rows). On a 2-core machine the database saturates first.
//! - *Latency-bound*: 1, 2, 4 and 8 workers whose rebuilds mostly wait (a server-side
//!   `pg_sleep` stands for a remote target's round trip, e.g. a database in another
//!   region): what workers on machines of their own buy, since a waiting rebuild costs
//!   neither side's CPU.
//!
//! The key stream is filled once (one record per key, published by the capture end's
//! `KeyPublisher`); each run is a fresh consumer group that reads it from the start with
//! `workers` instances (`freshen run --role worker`'s pipeline, in this process), timed
//! from the first rebuild to the last key's row in the derived table. PostgreSQL's CPU
//! over the same span says where the database, not freshen, is the limit: on a 2-core
//! machine it saturates both cores before freshen does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Ack, Batch, Key, Op, Row, RowEvent, Value, channel};
use freshen_cli::pipeline::{Observer, Pipeline};
use freshen_cli::role::Role;
use freshen_kafka::{KeyPublisher, KeyStreamConfig};
use freshen_testenv::KafkaServer;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use tokio::sync::oneshot;

use crate::Opts;
use crate::report::{Table, dur, rate};
use crate::workload::{connect, process_cpu, runtime, server, server_cpu};

const PARTITIONS: i32 = 8;
const TOPIC: &str = "bench-keys";

/// The latency-bound runs' wait per rebuild (a remote target's round trip).
const ROUND_TRIP_MS: u64 = 50;

fn config(url: &str, bootstrap: &str, group: &str, wait_ms: u64) -> String {
    // The wait is a statement of the rebuild's own transaction, like a round trip.
    let wait = if wait_ms == 0 {
        String::new()
    } else {
        format!(
            "\"SELECT pg_sleep({}) WHERE $1::text IS NOT NULL\",\n  ",
            wait_ms as f64 / 1000.0
        )
    };
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"

[key_stream]
brokers = "{bootstrap}"
topic = "{TOPIC}"
group = "{group}"
session_timeout_ms = 6000

[[views]]
name = "device_totals"
watch = [{{ table = "readings", key = ["device"] }}]
coalesce = "0s"
rebuild = [
  {wait}"DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals (device, total, n) SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
]
"#
    )
}

async fn create_topic(bootstrap: &str) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let new = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// Publishes one key record per device through the capture end.
async fn publish(bootstrap: &str, keys: usize) -> anyhow::Result<()> {
    let cfg = KeyStreamConfig::new(bootstrap, TOPIC, "unused");
    let publisher = KeyPublisher::connect(&cfg).await?;
    let (feed, source) = channel(4);
    let (acked_tx, acked) = oneshot::channel();
    let producer = tokio::spawn(async move {
        for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
            let events = chunk
                .iter()
                .map(|i| {
                    RowEvent::new("public", "readings", Op::Insert).with_new(Row::from_pairs([(
                        "device",
                        Value::from(format!("dev-{i}").as_str()),
                    )]))
                })
                .collect();
            feed.send(Batch::new(events, Ack::none())).await?;
        }
        let _ = acked_tx.send(());
        anyhow::Ok(())
    });
    let views = vec!["device_totals".to_string()];
    let keyer: Box<freshen_kafka::Keyer> = Box::new(|e, out| {
        out.extend(e.scope_keys(&["device"]).map(|k: Key| (0, k)));
    });
    // The channel ends when the producer is done: run returns once all is delivered.
    publisher
        .run(source, &views, &*keyer, std::future::pending())
        .await?;
    producer.await??;
    let _ = acked.await;
    Ok(())
}

struct Worker {
    observer: Arc<Observer>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_worker(toml: &str) -> anyhow::Result<Worker> {
    let cfg = freshen_cli::config::parse(toml, "bench.toml", &|_| None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let pipeline = Pipeline::start_as(&cfg, &[], Some(Role::Worker)).await?;
    let observer = pipeline.observer();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(pipeline.run(async {
        let _ = stopped.await;
    }));
    Ok(Worker {
        observer,
        stop,
        task,
    })
}

fn rebuilt(workers: &[Worker]) -> u64 {
    workers
        .iter()
        .flat_map(|w| freshen_cli::http::Readout::views(&*w.observer))
        .map(|v| v.stats.rebuilds_ok)
        .sum()
}

/// What one run measured.
struct Run {
    /// From the first rebuild to the last key's row.
    span: Duration,
    /// The database's CPU over the span.
    db: Duration,
    /// This process's (the workers') CPU over the span.
    own: Duration,
    /// Each worker's rebuilds at the end, fewest first.
    each: Vec<u64>,
    /// From the first rebuild to the first of the last worker to start.
    all_in: Duration,
}

/// One run: `n` workers read the stream from its start until `keys` keys are rebuilt,
/// each rebuild waiting `wait_ms` first.
async fn drain(
    url: &str,
    bootstrap: &str,
    data_dir: &std::path::Path,
    n: usize,
    keys: usize,
    wait_ms: u64,
) -> anyhow::Result<Run> {
    let c = connect(url).await?;
    c.batch_execute("TRUNCATE device_totals").await?;
    let toml = config(url, bootstrap, &format!("bench-{wait_ms}-{n}"), wait_ms);
    let mut workers = Vec::new();
    for _ in 0..n {
        workers.push(start_worker(&toml).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while rebuilt(&workers) == 0 {
        anyhow::ensure!(Instant::now() < deadline, "no rebuild started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (t0, db0, own0) = (
        Instant::now(),
        server_cpu(data_dir),
        process_cpu(std::process::id()),
    );
    // When the last worker's first rebuild came: until then the group was still
    // forming (joins and the rebalances they cause), and fewer workers rebuilt.
    let mut all_in = None;
    loop {
        if all_in.is_none() && workers.iter().all(|w| rebuilt(std::slice::from_ref(w)) > 0) {
            all_in = Some(t0.elapsed());
        }
        let rows: i64 = c
            .query_one("SELECT count(*) FROM device_totals", &[])
            .await?
            .get(0);
        if rows as usize >= keys {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{n} workers: only {rows} of {keys} keys rebuilt"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let span = t0.elapsed();
    let db = server_cpu(data_dir).saturating_sub(db0);
    let own = process_cpu(std::process::id()).saturating_sub(own0);
    // How evenly the group spread the work: each worker's rebuilds so far.
    let mut each: Vec<u64> = workers
        .iter()
        .map(|w| rebuilt(std::slice::from_ref(w)))
        .collect();
    each.sort_unstable();
    for w in workers {
        let _ = w.stop.send(());
        w.task.await.context("a worker panicked")??;
    }
    Ok(Run {
        span,
        db,
        own,
        each,
        all_in: all_in.unwrap_or(span),
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (keys, rows_per_key) = if opts.quick {
        (2_000, 50)
    } else {
        (10_000, 200)
    };
    let pg = server(&[])?;
    let url = pg.url();
    let kafka = KafkaServer::start().context("a Kafka broker (scripts/test-deps-brokers)")?;
    let bootstrap = kafka.bootstrap();
    let rt = runtime()?;
    rt.block_on(async {
        let c = connect(&url).await?;
        c.batch_execute(&format!(
            "CREATE TABLE readings (id bigserial PRIMARY KEY, device text NOT NULL, value bigint NOT NULL);
             INSERT INTO readings (device, value)
               SELECT 'dev-' || (g % {keys}), g % 97 FROM generate_series(1, {}) g;
             CREATE INDEX ON readings (device);
             CREATE TABLE device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);",
            keys * rows_per_key
        ))
        .await?;
        // On its own: VACUUM cannot run in the implicit transaction of a batch.
        c.batch_execute("VACUUM ANALYZE readings").await?;
        create_topic(&bootstrap).await?;
        publish(&bootstrap, keys).await?;
        let cpu = table(&url, &bootstrap, &pg.data_dir(), &[1, 2, 4], keys, 0).await?;
        println!(
            "CPU-bound: {keys} keys, {rows_per_key} rows aggregated per rebuild, {PARTITIONS} partitions; each worker rebuilds 4 keys at once (the default):\n"
        );
        cpu.print();
        // Timed over fewer rebuilds: one worker takes rebuilds × round trip / 4.
        let waiting = keys / if opts.quick { 5 } else { 4 };
        let lat = table(
            &url,
            &bootstrap,
            &pg.data_dir(),
            &[1, 2, 4, 8],
            waiting,
            ROUND_TRIP_MS,
        )
        .await?;
        println!(
            "\nLatency-bound: the time to {waiting} rebuilds (from the same {keys}-key stream), each the same rebuild after a {ROUND_TRIP_MS} ms server-side wait (a remote target's round trip); \"of linear\" = rate ÷ (n × the 1-worker rate):\n"
        );
        lat.print();
        anyhow::Ok(())
    })
}

/// Times `keys` rebuilds from the stream with each of `workers` worker counts, rebuilds waiting
/// `wait_ms` each, and tabulates the rates.
async fn table(
    url: &str,
    bootstrap: &str,
    data_dir: &std::path::Path,
    workers: &[usize],
    keys: usize,
    wait_ms: u64,
) -> anyhow::Result<Table> {
    let mut t = Table::new(&[
        "workers",
        "rebuilds",
        "time",
        "rebuilds/s",
        "vs 1 worker",
        "of linear",
        "PostgreSQL CPU (cores)",
        "freshen CPU (cores)",
        "rebuilds per worker",
        "every worker rebuilding after",
    ]);
    let mut base = None;
    for &n in workers {
        let Run {
            span,
            db,
            own,
            each,
            all_in,
        } = drain(url, bootstrap, data_dir, n, keys, wait_ms).await?;
        let per_s = keys as f64 / span.as_secs_f64();
        let b = *base.get_or_insert(per_s);
        t.row(vec![
            n.to_string(),
            keys.to_string(),
            dur(span),
            rate(keys as f64, span),
            format!("{:.2}×", per_s / b),
            format!("{:.2}", per_s / b / n as f64),
            format!("{:.2}", db.as_secs_f64() / span.as_secs_f64()),
            format!("{:.2}", own.as_secs_f64() / span.as_secs_f64()),
            each.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            dur(all_in),
        ]);
    }
    Ok(t)
}
