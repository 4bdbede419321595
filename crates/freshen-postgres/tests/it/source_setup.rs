//! Connecting and setting up: TLS (require, verify-full) and passwords on both the SQL
//! and the replication connections, and clear errors for what a person must fix —
//! wrong password, untrusted certificate, missing slot or publication, wal_level,
//! an invalidated slot.

use crate::support;

use std::time::Duration;

use freshen::Source;
use freshen_postgres::{
    ConnectionConfig, ErrorKind, PgAdmin, PgSource, PublicationMode, SlotMode, SslMode,
};
use freshen_testenv::PgServer;
use support::*;

fn tls_server() -> PgServer {
    PgServer::builder()
        .tls(true)
        .password("pw with spaces")
        .start()
        .expect("PostgreSQL with TLS for this test")
}

#[tokio::test]
async fn streams_over_tls_with_a_password_and_verifies_the_server() {
    let pg = tls_server();
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();

    let mut cfg = config(&pg, "tls", &["t"]);
    cfg.connection.host = "localhost".into();
    cfg.connection.sslmode = SslMode::VerifyFull;
    cfg.connection.sslrootcert = pg.ca_cert();
    assert!(
        !format!("{cfg:?}").contains("pw with spaces"),
        "the password is never printed"
    );
    let mut src = source(cfg.clone()).await;
    c.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
    assert_eq!(events(&take_events(&mut src, 1, 20).await).len(), 1);
    let walsender_ssl: bool = c
        .query_one(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_replication r USING (pid)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(walsender_ssl, "the replication connection is encrypted");
    let admin = PgAdmin::connect(&cfg.connection).await.unwrap();
    let sql_ssl: bool = admin
        .pool()
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(sql_ssl, "the SQL connections are encrypted");
    src.shutdown().await;

    // require: encrypted, certificate not checked (any host name will do).
    let mut req = config(&pg, "tls_req", &["t"]);
    req.connection.sslmode = SslMode::Require;
    let src = source(req).await;
    drop(src);

    // verify-full against a CA that did not sign the server certificate.
    let other = tls_server();
    let mut untrusted = cfg.clone();
    untrusted.slot = "tls_bad".into();
    untrusted.connection.sslrootcert = other.ca_cert();
    let err = PgSource::start(untrusted).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
}

#[tokio::test]
async fn setup_problems_are_clear_errors() {
    let pg = PgServer::builder()
        .password("right")
        .start()
        .expect("PostgreSQL");
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE u (id int PRIMARY KEY)")
        .await
        .unwrap();

    let mut wrong = config(&pg, "auth", &["t"]);
    wrong.connection.password = Some("wrong".into());
    let err = PgSource::start(wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert_eq!(err.retry(), freshen::Retry::Fix);
    assert!(
        !err.to_string().contains("wrong"),
        "no password in messages: {err}"
    );

    let mut must = config(&pg, "missing_slot", &["t"]);
    must.slot_mode = SlotMode::MustExist;
    let err = PgSource::start(must).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Slot);
    assert!(err.to_string().contains("does not exist") && err.to_string().contains("reconcile"));

    let mut no_pub = config(&pg, "nopub", &["t"]);
    no_pub.publication_mode = PublicationMode::MustExist;
    let err = PgSource::start(no_pub).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
    assert!(
        err.to_string()
            .contains("CREATE PUBLICATION \"nopub_pub\" FOR TABLE \"public\".\"t\""),
        "{err}"
    );

    c.batch_execute("CREATE PUBLICATION partial FOR TABLE t WITH (publish = 'insert, update')")
        .await
        .unwrap();
    let mut partial = config(&pg, "partial", &["t", "u"]);
    partial.publication = "partial".into();
    let err = PgSource::start(partial).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("ADD TABLE \"public\".\"u\""), "{msg}");
    assert!(msg.contains("delete, truncate"), "{msg}");

    let missing_table = config(&pg, "notable", &["nope"]);
    let err = PgSource::start(missing_table).await.unwrap_err();
    assert!(
        err.to_string().contains("public.nope does not exist"),
        "{err}"
    );

    let bad = PgSource::builder()
        .url("postgres://h/db")
        .slot("Bad Name", SlotMode::MustExist)
        .start()
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::Config);
    assert!(bad.to_string().contains("slot name") && bad.to_string().contains("publication name"));

    let admin = PgAdmin::connect(&ConnectionConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    assert_eq!(admin.wal_level().await.unwrap(), "logical");
    assert!(admin.can_replicate().await.unwrap());
    c.batch_execute("CREATE ROLE plain LOGIN PASSWORD 'right'")
        .await
        .unwrap();
    let mut plain = ConnectionConfig::from_url(&pg.url()).unwrap();
    plain.user = "plain".into();
    let err = PgAdmin::connect(&plain)
        .await
        .unwrap()
        .require_replication_privilege()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("ALTER ROLE \"plain\" REPLICATION"),
        "{err}"
    );
}

#[tokio::test]
async fn wal_level_replica_is_refused_with_the_fix() {
    let pg = PgServer::builder()
        .setting("wal_level", "replica")
        .start()
        .expect("PostgreSQL");
    let err = PgSource::start(config(&pg, "wal", &["t"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
    assert!(err.to_string().contains("wal_level = logical"), "{err}");
}

#[tokio::test]
async fn an_invalidated_slot_is_a_fatal_error_that_says_what_to_do() {
    let pg = PgServer::builder()
        .setting("max_slot_wal_keep_size", "1MB")
        .start()
        .expect("PostgreSQL");
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
        .await
        .unwrap();
    let mut src = source(config(&pg, "lost", &["t"])).await;
    let handle = src.handle();
    assert!(handle.lag().await.unwrap().lag_bytes.is_some());
    // Hold the slot back: a delivered transaction is never acknowledged.
    c.execute("INSERT INTO t VALUES (0, 'x')", &[])
        .await
        .unwrap();
    let held = take_events(&mut src, 1, 20).await;
    // Push the WAL far past max_slot_wal_keep_size, then checkpoint.
    for i in 1..=4 {
        c.execute("INSERT INTO t VALUES ($1, repeat('x', 1000))", &[&i])
            .await
            .unwrap();
        c.batch_execute("SELECT pg_switch_wal()").await.unwrap();
    }
    c.batch_execute("CHECKPOINT").await.unwrap();
    eventually(20, "the slot to be invalidated", || async {
        let s: Option<String> = c
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (s.as_deref() == Some("lost")).then_some(())
    })
    .await;
    // The stream fails for good with advice, and lag() says the same.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let failure = loop {
        let item = tokio::time::timeout_at(deadline, src.next_batch())
            .await
            .expect("the source to report the invalidated slot");
        match item {
            Some(Err(e)) => break e,
            Some(Ok(b)) => drop(b),
            None => panic!("the stream ended without an error"),
        }
    };
    let msg = failure.to_string();
    assert!(
        msg.contains("invalidated") || msg.contains("unusable"),
        "{msg}"
    );
    assert!(msg.contains("reconcile"), "{msg}");
    let lag = handle.lag().await.unwrap_err();
    assert_eq!(lag.kind(), ErrorKind::Slot);
    assert!(
        lag.to_string().contains("pg_drop_replication_slot"),
        "{lag}"
    );
    drop(held);
}
