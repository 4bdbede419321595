//! What the source refuses and reports: servers not set up for row capture (with the
//! fix named), a missing REPLICATION SLAVE grant told apart from a wrong password,
//! compressed binlogs, and schema changes on watched tables.

use crate::support;

use freshen::Op;
use freshen_mysql::{DdlKind, ErrorKind, MySqlSource};
use freshen_testenv::MariaDbServer;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_full_row_metadata_is_refused_with_the_fix() {
    let db = MariaDbServer::builder()
        .setting("binlog-row-metadata", "MINIMAL")
        .setting("binlog-format", "MIXED")
        .start()
        .unwrap_or_else(|e| panic!("MariaDB for this test: {e}"));
    db.sql("CREATE DATABASE app").unwrap();
    let err = MySqlSource::start(config(&db, "s", &["app.t"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
    let text = err.to_string();
    assert!(text.contains("binlog_row_metadata = 'FULL'"), "{text}");
    assert!(text.contains("binlog_format = 'ROW'"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_replication_grant_is_told_apart_from_a_wrong_password() {
    let db = server();
    db.sql(
        "CREATE USER 'norepl'@'127.0.0.1' IDENTIFIED BY 'pw';
         GRANT ALL PRIVILEGES ON app.* TO 'norepl'@'127.0.0.1';
         GRANT REPLICATION CLIENT ON *.* TO 'norepl'@'127.0.0.1';
         GRANT BINLOG MONITOR ON *.* TO 'norepl'@'127.0.0.1';",
    )
    .unwrap();
    let url = |pw: &str| format!("mysql://norepl:{pw}@127.0.0.1:{}/app", db.port());
    let mut cfg = config(&db, "g", &["app.t"]);
    cfg.url = freshen_mysql::SecretUrl::new(url("pw"));
    let err = MySqlSource::start(cfg.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(err.to_string().contains("REPLICATION SLAVE"), "{err}");
    cfg.url = freshen_mysql::SecretUrl::new(url("wrong"));
    let err = MySqlSource::start(cfg).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(err.to_string().contains("password"), "{err}");
    assert!(!err.to_string().contains("REPLICATION SLAVE"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_binlogs_are_refused() {
    let db = MariaDbServer::builder()
        .setting("log-bin-compress", "ON")
        .start()
        .unwrap_or_else(|e| panic!("MariaDB for this test: {e}"));
    db.sql("CREATE DATABASE app").unwrap();
    let err = MySqlSource::start(config(&db, "z", &["app.t"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup);
    assert!(err.to_string().contains("log_bin_compress"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_changes_are_reported_and_drops_sweep() {
    let db = server();
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "CREATE TABLE app.t (id INT PRIMARY KEY, v INT); CREATE TABLE app.other (id INT)",
    )
    .await;
    let mut src = source(config(&db, "ddl", &["app.t"])).await;
    let mut changes = src.handle().schema_changes();
    exec(&mut c, "ALTER TABLE app.other ADD COLUMN w INT").await; // not watched
    exec(&mut c, "ALTER TABLE app.t DROP COLUMN v").await;
    exec(&mut c, "INSERT INTO app.t VALUES (1)").await;
    exec(&mut c, "DROP TABLE app.t").await;
    let batches = take_events(&mut src, 2, 30).await;
    let evs = events(&batches);
    assert_eq!(
        evs.iter().map(|e| e.op).collect::<Vec<_>>(),
        [Op::Insert, Op::Truncate]
    );
    // The refresher hears them too: the ALTER reported, the drop breaking the table.
    let seen: Vec<String> = batches
        .iter()
        .flat_map(|b| b.schema_changes().iter().map(ToString::to_string))
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0].starts_with("app.t: altered (") && seen[0].contains("DROP COLUMN v"),
        "{seen:?}"
    );
    assert_eq!(seen[1], "app.t: dropped");
    let first = changes.recv().await.unwrap();
    assert_eq!(
        (first.table.as_str(), first.kind),
        ("t", DdlKind::AlterTable)
    );
    assert!(first.statement.contains("DROP COLUMN v"));
    let second = changes.recv().await.unwrap();
    assert_eq!(second.kind, DdlKind::DropTable);
    let h = src.handle().health();
    assert_eq!(h.schema_changes, 2);
    assert_eq!(h.truncates, 1);
}
