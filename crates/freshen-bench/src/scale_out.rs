//! Scaling out: rebuilds/s of one view spread over key stream workers, twice:
//!
//! - *CPU-bound*: 1, 2 and 4 workers on a rebuild-heavy workload (every key's rebuild
//!   aggregates hundreds of rows). On a 2-core machine the database saturates first.
//! - *Latency-bound*: 1, 2, 4 and 8 workers whose rebuilds mostly wait (a server-side
//!   `pg_sleep` stands for a remote target's round trip, e.g. a database in another
//!   region): what workers on machines of their own buy, since a waiting rebuild costs
//!   neither side's CPU. The work grows with the workers (the same keys per worker), so
//!   every run lasts about as long and the start-up weighs the same on each.
//!
//! First, what one worker's consumer costs idle at the end of the stream on each test
//! broker: noida-db answers an empty fetch at once (no long poll), so librdkafka fetches
//! in a tight loop and both burn CPU; tansu holds it for `fetch.wait.max.ms` as Kafka
//! does. The tables run on tansu unless `FRESHEN_BENCH_KAFKA=noida`.
//!
//! The key stream is filled once (one record per key, published by the capture end's
//! `KeyPublisher`); each run is a fresh consumer group that reads it from the start with
//! `workers` instances (`freshen run --role worker`'s pipeline, in this process, started
//! together as on machines of their own), timed from starting them to the last counted
//! key's row in the derived table, and again from the moment the group has formed (the
//! steady state). PostgreSQL's
//! and the broker's CPU over the same span say where the database, not freshen, is the
//! limit: on a 2-core machine it saturates both cores before freshen does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Ack, Batch, Key, Op, Row, RowEvent, Source, Value, channel};
use freshen_cli::Role;
use freshen_cli::{Observer, Pipeline};
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
    let cfg = freshen_cli::config::parse(toml, "bench.toml", &|_| None, freshen_cli::kinds())
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
        .flat_map(|w| freshen_cli::Readout::views(&*w.observer))
        .map(|v| v.stats.rebuilds_ok)
        .sum()
}

/// Whether `w` owns a partition of the key stream now (the group has formed for it).
fn owning(w: &Worker) -> bool {
    let source = freshen_cli::Readout::source(&*w.observer);
    source.partitions.is_some_and(|p| !p.is_empty())
}

/// The group's rebalances as `w` saw them.
fn rebalances(w: &Worker) -> u64 {
    freshen_cli::Readout::source(&*w.observer).reconnects
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

/// When a run's start-up phases ended for its slowest worker, from the clock's start.
struct Startup {
    /// Every worker's pipeline started: target connected, statements prepared, the
    /// consumer created and subscribed.
    started: Duration,
    /// Every worker owned a partition: the group had formed, the steady state's start.
    owning: Duration,
    /// Every worker had finished a rebuild call.
    rebuilding: Duration,
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
    /// The start-up's phases.
    startup: Startup,
    /// Rows in the derived table when every worker owned a partition: the steady
    /// state's rate counts the rest.
    rows_at_steady: usize,
    /// The most rebalances any worker saw.
    rebalances: u64,
}

impl Run {
    /// Rebuilds/s over the whole span, start-up included.
    fn whole_rate(&self, keys: usize) -> f64 {
        keys as f64 / self.span.as_secs_f64()
    }

    /// Rebuilds/s from the moment every worker owned a partition (`None`: too little
    /// time was left). Not from every worker's first commit: a worker runs 4 calls at
    /// once, started together, so at its first commit the other three have done most of
    /// their work, which that clock would count without its time.
    fn steady_rate(&self, keys: usize) -> Option<f64> {
        let left = self.span.checked_sub(self.startup.owning)?;
        let rows = keys.checked_sub(self.rows_at_steady)?;
        (left >= Duration::from_millis(500) && rows > 0).then(|| rows as f64 / left.as_secs_f64())
    }
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
    // All at once, as workers on machines of their own start.
    let workers = futures_util::future::try_join_all((0..n).map(|_| start_worker(&toml))).await?;
    let started = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    // When the last worker came to own a partition and to finish its first rebuild
    // call: until the first the group was still forming (joins and the rebalances they
    // cause), and fewer workers rebuilt.
    let mut owned: Option<(Duration, usize)> = None;
    let mut all_in = None;
    loop {
        let owning_now = owned.is_none() && workers.iter().all(owning);
        if all_in.is_none() && workers.iter().all(|w| rebuilt(std::slice::from_ref(w)) > 0) {
            all_in = Some(t0.elapsed());
        }
        let at = t0.elapsed();
        let rows: i64 = c
            .query_one("SELECT count(*) FROM device_totals", &[])
            .await?
            .get(0);
        if owning_now {
            owned = Some((at, rows as usize));
        }
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
    let rebalances = workers.iter().map(rebalances).max().unwrap_or(0);
    for w in workers {
        let _ = w.stop.send(());
        w.task.await.context("a worker panicked")??;
    }
    let (owning, rows_at_steady) = owned.unwrap_or((span, keys));
    Ok(Run {
        span,
        db,
        own,
        broker: broker_cpu,
        each,
        startup: Startup {
            started,
            owning,
            rebuilding: all_in.unwrap_or(span),
        },
        rows_at_steady,
        rebalances,
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

/// The latency-bound runs' rebuilds per worker: every run then lasts about as long
/// (≥ 20 s at 80 rebuilds/s per worker), so the start-up (the group's forming, the first
/// call) weighs the same on 1 worker as on 8.
fn per_worker(quick: bool) -> usize {
    if quick { 100 } else { 1600 }
}

/// The most workers of the latency-bound runs.
const MOST_WORKERS: usize = 8;

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let (cpu_keys, rows_per_key) = if opts.quick {
        (2_000, 50)
    } else {
        (10_000, 200)
    };
    // The stream holds more keys than any run counts, so no run waits on the last
    // records of one partition (each run counts the first `keys` rows to appear).
    let keys = cpu_keys.max(per_worker(opts.quick) * MOST_WORKERS * 5 / 4);
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
        let cpu = table(&url, &broker, &pg.data_dir(), &[1, 2, 4], |_| cpu_keys, 0).await?;
        println!(
            "\nCPU-bound, broker {flavor} ({BROKER_VAR}): the time to {cpu_keys} rebuilds (from a {keys}-key stream), {rows_per_key} rows aggregated per rebuild, {PARTITIONS} partitions; each worker rebuilds 4 keys at once (the default):\n"
        );
        cpu.print();
        let each = per_worker(opts.quick);
        let lat = table(
            &url,
            &broker,
            &pg.data_dir(),
            &[1, 2, 4, MOST_WORKERS],
            |n| n * each,
            ROUND_TRIP_MS,
        )
        .await?;
        println!(
            "\nLatency-bound, broker {flavor}: the time to {each} rebuilds per worker (from the same {keys}-key stream), each the same rebuild after a {ROUND_TRIP_MS} ms server-side wait (a remote target's round trip); \"of linear\" = rate ÷ (n × the 1-worker rate); \"steady\" counts from the moment every worker owned a partition (the group formed); start-up = every worker's pipeline started / owning a partition / done with a rebuild call:\n"
        );
        lat.print();
        anyhow::Ok(())
    })
}

/// Times `keys(n)` rebuilds from the stream with each of `workers` worker counts `n`,
/// rebuilds waiting `wait_ms` each, and tabulates the rates: over the whole run and
/// once the group had formed.
async fn table(
    url: &str,
    broker: &Broker,
    data_dir: &std::path::Path,
    workers: &[usize],
    keys: impl Fn(usize) -> usize,
    wait_ms: u64,
) -> anyhow::Result<Table> {
    let mut t = Table::new(&[
        "workers",
        "rebuilds",
        "time",
        "rebuilds/s",
        "vs 1 worker",
        "of linear",
        "steady rebuilds/s",
        "steady of linear",
        "PostgreSQL CPU (cores)",
        "freshen CPU (cores)",
        "broker CPU (cores)",
        "rebuilds per worker",
        "start-up",
        "rebalances",
    ]);
    let mut base = None;
    let mut steady_base = None;
    for &n in workers {
        let keys = keys(n);
        let run = drain(url, broker, data_dir, n, keys, wait_ms).await?;
        let per_s = run.whole_rate(keys);
        let b = *base.get_or_insert(per_s);
        let steady = run.steady_rate(keys);
        let sb = *steady_base.get_or_insert(steady);
        let (steady_rate, steady_linear) = match (steady, sb) {
            (Some(s), Some(sb)) => (
                rate(s, Duration::from_secs(1)),
                format!("{:.2}", s / sb / n as f64),
            ),
            _ => ("–".into(), "–".into()),
        };
        let cores = |d: Duration| format!("{:.2}", d.as_secs_f64() / run.span.as_secs_f64());
        let s = &run.startup;
        t.row(vec![
            n.to_string(),
            keys.to_string(),
            dur(run.span),
            rate(keys as f64, run.span),
            format!("{:.2}×", per_s / b),
            format!("{:.2}", per_s / b / n as f64),
            steady_rate,
            steady_linear,
            cores(run.db),
            cores(run.own),
            cores(run.broker),
            run.each
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            format!(
                "{} / {} / {}",
                dur(s.started),
                dur(s.owning),
                dur(s.rebuilding)
            ),
            run.rebalances.to_string(),
        ]);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(span_ms: u64, owning_ms: u64, rows_at_steady: usize) -> Run {
        Run {
            span: Duration::from_millis(span_ms),
            db: Duration::ZERO,
            own: Duration::ZERO,
            broker: Duration::ZERO,
            each: Vec::new(),
            startup: Startup {
                started: Duration::from_millis(50),
                owning: Duration::from_millis(owning_ms),
                rebuilding: Duration::from_millis(owning_ms + 800),
            },
            rows_at_steady,
            rebalances: 1,
        }
    }

    #[test]
    fn the_steady_rate_counts_only_what_came_after_the_group_formed() {
        // 1600 rows in 22 s, of which 2 s before the group formed with no row yet.
        let r = run(22_000, 2_000, 0);
        assert!((r.whole_rate(1600) - 1600.0 / 22.0).abs() < 1e-9);
        assert_eq!(r.steady_rate(1600), Some(80.0));
        // Rows already written when the group formed are left out with their time.
        assert_eq!(run(22_000, 2_000, 400).steady_rate(1600), Some(60.0));
    }

    #[test]
    fn no_steady_rate_without_time_or_rows_after_the_group_formed() {
        assert_eq!(run(2_000, 1_800, 0).steady_rate(100), None);
        assert_eq!(run(22_000, 2_000, 1600).steady_rate(1600), None);
        // The group never formed: the span stands in, nothing is left.
        assert_eq!(run(22_000, 22_000, 1600).steady_rate(1600), None);
    }
}
