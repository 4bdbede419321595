//! Scaling out: rebuilds/s of one view spread over key stream workers, twice:
//!
//! - *CPU-bound*: 1, 2 and 4 workers on a rebuild-heavy workload (every key's rebuild
//!   aggregates hundreds of rows). On a 2-core machine the database saturates first.
//! - *Latency-bound*: 1, 2, 4 and 8 workers whose rebuilds mostly wait (a server-side
//!   `pg_sleep` stands for a remote target's round trip, e.g. a database in another
//!   region): what workers on machines of their own buy, since a waiting rebuild costs
//!   neither side's CPU.
//!
//! First, what one worker's consumer costs idle at the end of the stream on each test
//! broker: noida-db answers an empty fetch at once (no long poll), so librdkafka fetches
//! in a tight loop and both burn CPU; tansu holds it for `fetch.wait.max.ms` as Kafka
//! does. The tables run on tansu unless `FRESHEN_BENCH_KAFKA=noida`.
//!
//! The key stream is filled once (one record per key, published by the capture end's
//! `KeyPublisher`); each run is a fresh consumer group that reads it from the start with
//! `workers` instances (`freshen run --role worker`'s pipeline, in this process), timed
//! from starting the first worker to the last key's row in the derived table. PostgreSQL's
//! and the broker's CPU over the same span say where the database, not freshen, is the
//! limit: on a 2-core machine it saturates both cores before freshen does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Ack, Batch, Key, Op, Row, RowEvent, Source, Value, channel};
use freshen_cli::pipeline::{Observer, Pipeline};
use freshen_cli::role::Role;
use freshen_kafka::{KeyPublisher, KeySource, KeyStreamConfig};
use freshen_testenv::{KafkaFlavor, KafkaServer};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use tokio::sync::oneshot;

use crate::Opts;
use crate::report::{Table, dur, rate};
use crate::workload::{connect, process_cpu, runtime, server, server_cpu};

const PARTITIONS: i32 = 8;
const TOPIC: &str = "bench-keys";
/// The idle cost's topic: empty, so its one consumer sits at the end of the stream.
const IDLE_TOPIC: &str = "bench-idle";

/// The variable naming the broker the tables run on.
const BROKER_VAR: &str = "FRESHEN_BENCH_KAFKA";

/// The latency-bound runs' wait per rebuild (a remote target's round trip).
const ROUND_TRIP_MS: u64 = 50;

/// The group session timeout for `flavor`: tansu takes half of it to form a group (see
/// `KafkaFlavor::Tansu`), so it gets the shortest the key stream tests use.
fn session_ms(flavor: KafkaFlavor) -> u32 {
    match flavor {
        KafkaFlavor::Tansu => 2000,
        _ => 6000,
    }
}

/// The broker the tables run on: `FRESHEN_BENCH_KAFKA` = `tansu` (the default) or `noida`.
fn flavor() -> anyhow::Result<KafkaFlavor> {
    let name = std::env::var(BROKER_VAR).unwrap_or_default();
    match name.as_str() {
        "" | "tansu" => Ok(KafkaFlavor::Tansu),
        "noida" => Ok(KafkaFlavor::Noida),
        other => anyhow::bail!("{BROKER_VAR}={other:?}: name `tansu` or `noida`"),
    }
}

fn config(url: &str, bootstrap: &str, group: &str, session_ms: u32, wait_ms: u64) -> String {
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
session_timeout_ms = {session_ms}

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

async fn create_topic(bootstrap: &str, topic: &str) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
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

/// The broker the runs read the key stream from.
struct Broker {
    bootstrap: String,
    flavor: KafkaFlavor,
    /// Its process, whose CPU each run reports.
    pid: Option<u32>,
}

impl Broker {
    fn cpu(&self) -> Duration {
        self.pid.map_or(Duration::ZERO, process_cpu)
    }
}

/// What one run measured.
struct Run {
    /// From starting the first worker to the last key's row.
    span: Duration,
    /// The database's CPU over the span.
    db: Duration,
    /// This process's (the workers') CPU over the span.
    own: Duration,
    /// The broker's CPU over the span.
    broker: Duration,
    /// Each worker's rebuilds at the end, fewest first.
    each: Vec<u64>,
    /// From starting the first worker to the first rebuild of the last worker to rebuild.
    all_in: Duration,
}

/// One run: `n` workers read the stream from its start until `keys` keys are rebuilt,
/// each rebuild waiting `wait_ms` first.
async fn drain(
    url: &str,
    broker: &Broker,
    data_dir: &std::path::Path,
    n: usize,
    keys: usize,
    wait_ms: u64,
) -> anyhow::Result<Run> {
    let c = connect(url).await?;
    c.batch_execute("TRUNCATE device_totals").await?;
    let toml = config(
        url,
        &broker.bootstrap,
        &format!("bench-{wait_ms}-{n}"),
        session_ms(broker.flavor),
        wait_ms,
    );
    // The clock starts before the first worker does: a rebuild call commits its keys
    // (up to `keys_per_transaction`, 16, each waiting its round trip) only at its end, so
    // a clock started at the first commit would miss that call's work and the same work
    // of every other worker's first call — more of it the more workers there are. The
    // group's forming (joins, rebalances) counts against the workers here.
    let (t0, db0, own0, broker0) = (
        Instant::now(),
        server_cpu(data_dir),
        process_cpu(std::process::id()),
        broker.cpu(),
    );
    let mut workers = Vec::new();
    for _ in 0..n {
        workers.push(start_worker(&toml).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
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
    let broker_cpu = broker.cpu().saturating_sub(broker0);
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
        broker: broker_cpu,
        each,
        all_in: all_in.unwrap_or(span),
    })
}

/// What one worker's consumer costs at the end of an empty stream, on `flavor`: the
/// broker's CPU and this process's (the consumer's) over `window`, in cores. A broker
/// that holds an empty fetch for `fetch.wait.max.ms` (Kafka's long poll) costs next to
/// nothing here; one that answers at once makes the consumer fetch in a tight loop.
fn idle_cost(flavor: KafkaFlavor, window: Duration) -> anyhow::Result<(f64, f64)> {
    let kafka = KafkaServer::start_flavor(flavor)
        .with_context(|| format!("a {flavor} broker (scripts/test-deps-brokers)"))?;
    let pid = kafka
        .pid()
        .with_context(|| format!("{flavor} has no process"))?;
    let bootstrap = kafka.bootstrap();
    runtime()?.block_on(async {
        create_topic(&bootstrap, IDLE_TOPIC).await?;
        let cfg = KeyStreamConfig::new(&bootstrap, IDLE_TOPIC, "bench-idle")
            .session_timeout_ms(session_ms(flavor));
        let source = KeySource::connect(&cfg).await?;
        let probe = source.probe();
        let mut views = source.split(vec!["device_totals".into()]);
        // Measured once the consumer owns every partition: it is then fetching.
        let deadline = Instant::now() + Duration::from_secs(60);
        while probe.owned().len() < PARTITIONS as usize {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{flavor}: the idle consumer got no partitions"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (b0, own0) = (process_cpu(pid), process_cpu(std::process::id()));
        // The window is what is measured, not a wait for a condition.
        tokio::time::sleep(window).await;
        let cores = |d: Duration| d.as_secs_f64() / window.as_secs_f64();
        let broker = cores(process_cpu(pid).saturating_sub(b0));
        let own = cores(process_cpu(std::process::id()).saturating_sub(own0));
        for v in &mut views {
            v.close().await;
        }
        Ok((broker, own))
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (keys, rows_per_key) = if opts.quick {
        (2_000, 50)
    } else {
        (10_000, 200)
    };
    let flavor = flavor()?;
    // What an idle worker costs on each broker, before anything else runs.
    let window = Duration::from_secs(if opts.quick { 1 } else { 10 });
    let mut idle = Table::new(&[
        "broker",
        "broker CPU (cores)",
        "consumer process CPU (cores)",
    ]);
    for f in KafkaFlavor::ALL {
        let (broker, own) = idle_cost(f, window)?;
        idle.row(vec![
            f.to_string(),
            format!("{broker:.3}"),
            format!("{own:.3}"),
        ]);
    }
    println!(
        "One key stream worker's consumer at the end of an empty {PARTITIONS}-partition stream, {window:?} (fetch.wait.max.ms = 500, librdkafka's default):\n"
    );
    idle.print();
    let pg = server(&[])?;
    let url = pg.url();
    let kafka = KafkaServer::start_flavor(flavor)
        .with_context(|| format!("a {flavor} broker (scripts/test-deps-brokers)"))?;
    let broker = Broker {
        bootstrap: kafka.bootstrap(),
        flavor,
        pid: kafka.pid(),
    };
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
        create_topic(&broker.bootstrap, TOPIC).await?;
        publish(&broker.bootstrap, keys).await?;
        let cpu = table(&url, &broker, &pg.data_dir(), &[1, 2, 4], keys, 0).await?;
        println!(
            "\nCPU-bound, broker {flavor} ({BROKER_VAR}): {keys} keys, {rows_per_key} rows aggregated per rebuild, {PARTITIONS} partitions; each worker rebuilds 4 keys at once (the default):\n"
        );
        cpu.print();
        // Timed over fewer rebuilds: one worker takes rebuilds × round trip / 4.
        let waiting = keys / if opts.quick { 5 } else { 4 };
        let lat = table(
            &url,
            &broker,
            &pg.data_dir(),
            &[1, 2, 4, 8],
            waiting,
            ROUND_TRIP_MS,
        )
        .await?;
        println!(
            "\nLatency-bound, broker {flavor}: the time to {waiting} rebuilds (from the same {keys}-key stream), each the same rebuild after a {ROUND_TRIP_MS} ms server-side wait (a remote target's round trip); \"of linear\" = rate ÷ (n × the 1-worker rate):\n"
        );
        lat.print();
        anyhow::Ok(())
    })
}

/// Times `keys` rebuilds from the stream with each of `workers` worker counts, rebuilds waiting
/// `wait_ms` each, and tabulates the rates.
async fn table(
    url: &str,
    broker: &Broker,
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
        "broker CPU (cores)",
        "rebuilds per worker",
        "every worker rebuilding after",
    ]);
    let mut base = None;
    for &n in workers {
        let Run {
            span,
            db,
            own,
            broker: broker_cpu,
            each,
            all_in,
        } = drain(url, broker, data_dir, n, keys, wait_ms).await?;
        let per_s = keys as f64 / span.as_secs_f64();
        let b = *base.get_or_insert(per_s);
        let cores = |d: Duration| format!("{:.2}", d.as_secs_f64() / span.as_secs_f64());
        t.row(vec![
            n.to_string(),
            keys.to_string(),
            dur(span),
            rate(keys as f64, span),
            format!("{:.2}×", per_s / b),
            format!("{:.2}", per_s / b / n as f64),
            cores(db),
            cores(own),
            cores(broker_cpu),
            each.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            dur(all_in),
        ]);
    }
    Ok(t)
}
