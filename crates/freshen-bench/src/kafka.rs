//! Kafka: consuming TiCDC canal-json into a refresher (keys marked) against a bare
//! librdkafka consumer that only reads the bytes; and PostgreSQL → Kafka sink against
//! PostgreSQL capture alone.
//!
//! Both on one noida-db broker (single node, loopback) started for the run. The bare
//! consumer is the ceiling: the same client library with no decoding, no scheduling.
//! The sink ratio prices publishing (Debezium encoding, idempotent `acks=all`
//! delivery) on top of capture; both read their own copy of one replication slot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use freshen::{Key, Refresher, RowEvent, Source};
use freshen_codec::Format;
use freshen_kafka::{KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig, TopicMode};
use freshen_postgres::{ConnectionConfig, PgSource, PgSourceConfig, PublicationMode, SlotMode};
use freshen_testenv::{KafkaServer, PgServer};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::Opts;
use crate::report::{Table, dur, rate, ratio};

const PARTITIONS: i32 = 4;

fn canal_insert(i: usize) -> String {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"INSERT","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4}},"mysqlType":{{"id":"int","device":"varchar","value":"int"}},"old":null,"data":[{{"id":"{i}","device":"dev-{}","value":"{}"}}]}}"#,
        i % 10_000,
        i % 97
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

async fn produce(bootstrap: &str, topic: &str, n: usize) -> anyhow::Result<()> {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut pending = Vec::with_capacity(n);
    for i in 0..n {
        let value = canal_insert(i);
        let key = format!("{}", i % 10_000);
        let rec = FutureRecord::to(topic).key(&key).payload(&value);
        pending.push(p.send_result(rec).map_err(|(e, _)| e)?);
    }
    for f in pending {
        f.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

async fn bare(bootstrap: &str, topic: &str, n: usize) -> anyhow::Result<Duration> {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bare")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    c.subscribe(&[topic])?;
    let t0 = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..n {
        let m = c.recv().await?;
        bytes += m.payload().map_or(0, <[u8]>::len);
    }
    std::hint::black_box(bytes);
    Ok(t0.elapsed())
}

async fn refresher(bootstrap: &str, topic: &str, n: usize) -> anyhow::Result<(Duration, Duration)> {
    let config = KafkaSourceConfig::new(bootstrap, [topic], "freshen", Format::CanalJson);
    let refresher = Refresher::builder()
        .source(KafkaSource::new(&config)?)
        .scope(|e: &RowEvent| e.scope_keys(&["device"]))
        .rebuild(|_k: Key| async { Ok::<_, std::io::Error>(()) })
        .workers(8)
        .build()?;
    let handle = refresher.handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let t0 = Instant::now();
    let task = tokio::spawn(async move {
        refresher
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let mut marked = None;
    let deadline = t0 + Duration::from_secs(600);
    loop {
        let s = handle.stats();
        if marked.is_none() && s.events_received as usize >= n {
            marked = Some(t0.elapsed());
        }
        if marked.is_some() && s.unacked_batches == 0 && s.dirty + s.in_flight == 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the refresher did not finish: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = t0.elapsed();
    let _ = stop.send(());
    task.await??;
    Ok((marked.expect("set above"), drained))
}

fn consume(opts: &Opts, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let n = if opts.quick { 20_000 } else { 200_000 };
    let kafka = KafkaServer::start().context("a Kafka broker (scripts/test-deps-brokers)")?;
    let bootstrap = kafka.bootstrap();
    rt.block_on(async {
        create_topic(&bootstrap, "bench").await?;
        produce(&bootstrap, "bench", n).await?;
        let raw = bare(&bootstrap, "bench", n).await?;
        let (marked, drained) = refresher(&bootstrap, "bench", n).await?;
        let mut t = Table::new(&["consumer", "time", "messages/s", "vs bare"]);
        t.row(vec![
            "bare librdkafka (bytes only)".into(),
            dur(raw),
            rate(n as f64, raw),
            "1.0×".into(),
        ]);
        t.row(vec![
            "KafkaSource → Refresher, keys marked".into(),
            dur(marked),
            rate(n as f64, marked),
            ratio(marked, raw),
        ]);
        t.row(vec![
            "… and rebuilt, acked, committed".into(),
            dur(drained),
            rate(n as f64, drained),
            ratio(drained, raw),
        ]);
        println!(
            "{n} TiCDC canal-json single-row inserts, 10,000 keys, {PARTITIONS} partitions:\n"
        );
        t.print();
        anyhow::Ok(())
    })
}

/// Copies of one slot holding `rows` inserted in 100-row transactions.
struct Pg {
    pg: PgServer,
    copies: usize,
}

impl Pg {
    fn setup(rows: usize) -> anyhow::Result<Pg> {
        let pg = PgServer::start().context("PostgreSQL for the sink benchmark")?;
        pg.psql(
            "CREATE TABLE orders (id int PRIMARY KEY, dev text NOT NULL, v int NOT NULL);
             CREATE PUBLICATION bench_pub FOR TABLE orders;",
        )?;
        pg.psql("SELECT pg_create_logical_replication_slot('origin', 'pgoutput')")?;
        let mut sql = String::new();
        for t in 0..rows / 100 {
            sql.push_str(&format!(
                "BEGIN; INSERT INTO orders SELECT g, 'dev-' || (g % 1000), g FROM generate_series({}, {}) g; COMMIT;\n",
                t * 100,
                t * 100 + 99
            ));
        }
        pg.psql(&sql)?;
        Ok(Pg { pg, copies: 0 })
    }

    async fn source(&mut self) -> anyhow::Result<PgSource> {
        self.copies += 1;
        let slot = format!("copy_{}", self.copies);
        self.pg.psql(&format!(
            "SELECT pg_copy_logical_replication_slot('origin', '{slot}')"
        ))?;
        let cfg = PgSourceConfig {
            connection: ConnectionConfig::from_url(&self.pg.url())?,
            slot,
            slot_mode: SlotMode::MustExist,
            publication: "bench_pub".into(),
            publication_mode: PublicationMode::MustExist,
            tables: vec!["orders".parse().map_err(anyhow::Error::msg)?],
            ..PgSourceConfig::default()
        };
        Ok(PgSource::start(cfg).await?)
    }
}

async fn capture_alone(pg: &mut Pg, rows: usize) -> anyhow::Result<Duration> {
    let mut src = pg.source().await?;
    let t0 = Instant::now();
    let mut got = 0;
    while got < rows {
        let b = src.next_batch().await.context("stream ended")??;
        got += b.events().len();
        let (_, _, ack) = b.into_parts();
        ack.ack();
    }
    let took = t0.elapsed();
    src.shutdown().await;
    Ok(took)
}

async fn capture_to_kafka(pg: &mut Pg, bootstrap: &str, rows: usize) -> anyhow::Result<Duration> {
    let src = pg.source().await?;
    let sink = Arc::new(KafkaSink::new(&KafkaSinkConfig::new(
        bootstrap,
        "sink",
        TopicMode::Single,
    ))?);
    let t0 = Instant::now();
    let task = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.run(src, std::future::pending()).await })
    };
    while (sink.stats().delivered as usize) < rows {
        anyhow::ensure!(!task.is_finished(), "the sink stopped: {:?}", task.await);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = t0.elapsed();
    task.abort();
    Ok(took)
}

fn sink(opts: &Opts, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let rows = if opts.quick { 5_000 } else { 100_000 };
    let runs = if opts.quick { 1 } else { 3 };
    let kafka = KafkaServer::start().context("a Kafka broker (scripts/test-deps-brokers)")?;
    let bootstrap = kafka.bootstrap();
    let mut pg = Pg::setup(rows)?;
    rt.block_on(async {
        create_topic(&bootstrap, "sink").await?;
        let (mut alone, mut with_sink) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            alone.push(capture_alone(&mut pg, rows).await?);
            with_sink.push(capture_to_kafka(&mut pg, &bootstrap, rows).await?);
        }
        alone.sort();
        with_sink.sort();
        let (a, s) = (alone[runs / 2], with_sink[runs / 2]);
        let mut t = Table::new(&["pipeline", "time", "events/s", "vs capture alone"]);
        t.row(vec![
            "PgSource alone (decode, ack)".into(),
            dur(a),
            rate(rows as f64, a),
            "1.0×".into(),
        ]);
        t.row(vec![
            "PgSource → KafkaSink (Debezium, acks=all, idempotent)".into(),
            dur(s),
            rate(rows as f64, s),
            ratio(s, a),
        ]);
        println!("\n{rows} rows in 100-row transactions, median of {runs}:\n");
        t.print();
        anyhow::Ok(())
    })
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    consume(opts, &rt)?;
    sink(opts, &rt)
}
