//! The binary with Pulsar: TiCDC canal-json on a topic keeps a view fresh; a poison
//! message is skipped and counted. A real Pulsar-protocol broker (pulsar-lite).

use crate::support;

use std::time::Duration;

use freshen_pulsar::PulsarProducer;
use freshen_testenv::PulsarServer;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canal_json_from_pulsar_keeps_a_view_fresh() {
    let pulsar =
        PulsarServer::start().expect("a Pulsar-protocol broker (run scripts/test-deps-brokers)");
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(DEMO_SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(
        dir.path(),
        &format!(
            r#"
[source]
kind = "pulsar"
url = "{}"
topic = "ticdc"
subscription = "freshen"

[target]
url = "{}"

[http]
listen = "127.0.0.1:{port}"
{DEMO_VIEW}
"#,
            pulsar.url(),
            pg.url()
        ),
    );
    let mut producer = PulsarProducer::connect(&pulsar.url(), "ticdc")
        .await
        .expect("producer");
    let mut child = spawn_run(dir.path(), &cfg, 1);
    for id in 0..30i64 {
        let device = format!("d{}", id % 3);
        c.execute(
            "INSERT INTO demo.readings VALUES ($1, $2, $3)",
            &[&id, &device, &id],
        )
        .await
        .unwrap();
        producer
            .send(Some(&device), &canal("INSERT", id, &device, id))
            .await
            .unwrap();
        if id == 10 {
            producer.send(None, b"{\"type\": \"BOGUS\"}").await.unwrap();
        }
    }
    let matched = wait_demo_equal(&c, 3, Duration::from_secs(60)).await;
    let status = freshen_cli::status::get(&base, "/status").await;
    assert!(
        matched,
        "the view never matched: {status:?}\n{}\nbroker: {}",
        log_of(dir.path(), 1),
        pulsar.log_tail(40)
    );
    let metrics = wait_http(&base, "/metrics", 200, Duration::from_secs(10)).await;
    // Counted once per delivery: at-least-once may hand the poison message over again
    // (a redelivery under load), and each time it is skipped, never applied.
    let skipped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("freshen_events_skipped_total{view=\"device_totals\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!((1..=3).contains(&skipped), "{metrics}");
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success(), "{}", log_of(dir.path(), 1));
}
