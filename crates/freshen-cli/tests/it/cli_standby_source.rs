//! Decoding on a standby (PostgreSQL 16): a real primary and a streaming standby. `check`
//! and `run` recognise the standby: the publication is made on the primary (the error
//! says the statement), a read-only target is refused at start, the slot is created on
//! the standby promptly when freshen can ask the primary for a standby snapshot, a
//! shutdown ends a slot creation that waits, and the views written on the primary equal
//! truth while the decoding runs on the standby.

use std::time::{Duration, Instant};

use crate::support;

use freshen_testenv::PgServer;
use support::*;

/// A primary of PostgreSQL 16 or later (the run's version when it is, else 16) and a
/// hot standby of it, both with the readings schema.
async fn primary_and_standby() -> (PgServer, PgServer) {
    let mut primary = PgServer::builder()
        .at_least(16)
        // Every statement in the log: the test reads whether freshen asked for a
        // standby snapshot.
        .setting("log_statement", "all")
        .start()
        .unwrap_or_else(|e| panic!("PostgreSQL 16+ (scripts/test-deps-postgres): {e}"));
    let standby = primary
        .start_standby(PgServer::builder())
        .expect("a standby");
    let c = connect(&primary.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    freshen_testenv::refresher::eventually(30, "the schema on the standby", || async {
        (standby.psql("SELECT count(*) FROM sites").ok()? == "10").then_some(())
    })
    .await;
    (primary, standby)
}

/// Waits for a `freshen run` to exit; its status, or a failure naming its log.
fn exits_within(
    run: &mut Running,
    dir: &std::path::Path,
    within: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = run.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "freshen run did not exit within {within:?}; its log:\n{}",
            log_of(dir, 1)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_source_is_recognised_and_its_views_equal_truth() {
    let (primary, standby) = primary_and_standby().await;
    let dir = tempfile::tempdir().unwrap();

    // As a primary would be configured: no [target], publication_mode "create".
    let naive = config(&standby.url(), &format!("127.0.0.1:{}", free_port()));
    let (_, found) = check_json(dir.path(), &naive);
    let cfg = write_config(dir.path(), &naive);
    assert!(
        has(&found, "ok", "standby", "the source is a standby"),
        "{found:#?}"
    );
    assert!(
        has(
            &found,
            "error",
            "publication",
            "make the publication on the primary: CREATE PUBLICATION \"freshen_test\" FOR TABLE"
        ) || has(
            &found,
            "error",
            "publication",
            "make the publication on the primary: CREATE PUBLICATION freshen_test FOR TABLE"
        ),
        "{found:#?}"
    );
    assert!(
        has(&found, "error", "target", "is a standby"),
        "the read-only target is a check error: {found:#?}"
    );
    assert!(
        has(&found, "warning", "primary_url", "pg_log_standby_snapshot"),
        "{found:#?}"
    );
    // `run` refuses at once (exit 1), naming the target: nothing retried for ever.
    let mut run = spawn_run(dir.path(), &cfg, 1);
    let status = exits_within(&mut run, dir.path(), Duration::from_secs(60));
    assert!(!status.success());
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("is a standby") && log.contains("[target]"),
        "{log}"
    );

    // With [target] on the primary, the publication is still missing: the error names
    // the statement to run on the primary.
    let with_target = format!("{naive}\n[target]\nurl = \"{}\"\n", primary.url());
    let cfg = write_config(dir.path(), &with_target);
    let mut run = spawn_run(dir.path(), &cfg, 1);
    let status = exits_within(&mut run, dir.path(), Duration::from_secs(60));
    assert!(!status.success());
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("run on the primary CREATE PUBLICATION") && log.contains("publication_mode"),
        "{log}"
    );
    assert!(
        !log.contains("25006"),
        "no read-only statement was tried: {log}"
    );

    // As documented: the publication made on the primary, "existing", the primary's URL.
    let c = connect(&primary.url()).await;
    c.batch_execute(
        "CREATE PUBLICATION freshen_test FOR TABLE readings, sites WITH (publish_via_partition_root = true)",
    )
    .await
    .unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let good = config(&standby.url(), &format!("127.0.0.1:{port}")).replace(
        "publication = \"freshen_test\"",
        &format!(
            "publication = \"freshen_test\"\npublication_mode = \"existing\"\nprimary_url = \"{}\"",
            primary.url()
        ),
    ) + &format!("\n[target]\nurl = \"{}\"\n", primary.url());
    let (_, found) = check_json(dir.path(), &good);
    let cfg = write_config(dir.path(), &good);
    assert!(
        found.iter().all(|f| f["level"] != "error"),
        "check passes: {found:#?}"
    );
    assert!(has(&found, "ok", "primary_url", "reachable"), "{found:#?}");
    let mut run = spawn_run(dir.path(), &cfg, 2);
    wait_healthy(&base, dir.path(), 2, Duration::from_secs(60)).await;
    assert!(
        primary.log().contains("pg_log_standby_snapshot()"),
        "freshen asked the primary for a standby snapshot"
    );
    assert_eq!(
        standby
            .psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'freshen_test'")
            .unwrap(),
        "1",
        "the slot is on the standby"
    );
    assert_eq!(
        primary
            .psql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'")
            .unwrap(),
        "0",
        "no logical slot on the primary"
    );
    let mut w = connect(&primary.url()).await;
    let mut r = Rng::new(0x5b5b);
    workload(&mut w, &mut r, 120).await;
    wait_equal(&w, Duration::from_secs(60)).await;
    assert!(run.try_wait().unwrap().is_none(), "still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_slot_creation_that_waits_on_a_standby() {
    let (primary, standby) = primary_and_standby().await;
    let c = connect(&primary.url()).await;
    c.batch_execute("CREATE PUBLICATION freshen_test FOR TABLE readings, sites")
        .await
        .unwrap();
    freshen_testenv::refresher::eventually(30, "the publication on the standby", || async {
        (standby
            .psql("SELECT count(*) FROM pg_publication WHERE pubname = 'freshen_test'")
            .ok()?
            == "1")
            .then_some(())
    })
    .await;
    // Nothing more reaches the standby: its slot creation waits for a standby snapshot
    // that cannot come.
    standby.hold_wal_receiver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = config(&standby.url(), &format!("127.0.0.1:{}", free_port())).replace(
        "publication = \"freshen_test\"",
        "publication = \"freshen_test\"\npublication_mode = \"existing\"",
    ) + &format!("\n[target]\nurl = \"{}\"\n", primary.url());
    let cfg = write_config(dir.path(), &text);
    let mut run = spawn_run(dir.path(), &cfg, 1);
    freshen_testenv::refresher::eventually(60, "the slot creation to wait", || async {
        (standby
            .psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'freshen_test'")
            .ok()?
            == "1")
            .then_some(())
    })
    .await;
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = exits_within(&mut run, dir.path(), Duration::from_secs(15));
    assert!(
        status.success(),
        "a shutdown is a clean exit: {}",
        log_of(dir.path(), 1)
    );
    freshen_testenv::refresher::eventually(15, "the creation cancelled on the standby", || async {
        (standby
            .psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'freshen_test'")
            .ok()?
            == "0")
            .then_some(())
    })
    .await;
}
