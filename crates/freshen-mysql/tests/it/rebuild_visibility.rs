//! The visibility hazard, for real: with semi-synchronous replication waiting after the
//! binlog sync (`AFTER_SYNC`) for a replica that never acknowledges, a MariaDB commit
//! is in the binlog — the source delivers its row — while new snapshots do not see it.
//! A rebuild without the guard recomputes the scope without the change (and nothing
//! would dirty it again); the guarded rebuild waits until the commit is visible.
//! And how rebuild failures are classified, from real server errors, and what a pooled
//! session keeps when the pool takes it back.

use crate::support;

use std::time::Duration;

use freshen::{Due, Key, Retry};
use freshen_mysql::{ErrorKind, MySqlRebuild, connect_pool, connect_pool_limited};
use mysql_async::prelude::Queryable;
use support::*;

fn statements(table: &str) -> [String; 2] {
    [
        format!("DELETE FROM app.{table} WHERE dev = $1"),
        format!(
            "INSERT INTO app.{table} SELECT dev, sum(v) FROM app.readings WHERE dev = $1 GROUP BY dev"
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_waits_until_the_dirtying_commit_is_visible() {
    let db = server();
    let url = db.url("app");
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "CREATE TABLE app.readings (id INT PRIMARY KEY, dev VARCHAR(10), v INT);
         CREATE TABLE app.rollup (dev VARCHAR(10) PRIMARY KEY, total BIGINT);
         CREATE TABLE app.rollup_unchecked (dev VARCHAR(10) PRIMARY KEY, total BIGINT)",
    )
    .await;
    let pool = connect_pool(&url, 4).unwrap();
    // Built (their statements prepared) before commits start to wait.
    let unchecked = MySqlRebuild::builder(pool.clone())
        .statements(statements("rollup_unchecked"))
        .check_visibility(false)
        .build()
        .await
        .unwrap();
    let impatient = MySqlRebuild::builder(pool.clone())
        .statements(statements("rollup"))
        .visibility_wait(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let patient = MySqlRebuild::builder(pool.clone())
        .statements(statements("rollup"))
        .visibility_wait(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    assert!(patient.guards_visibility() && !unchecked.guards_visibility());
    let mut src = source(config(&db, "vis", &["app.readings"])).await;

    exec(
        &mut c,
        "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC';
         SET GLOBAL rpl_semi_sync_master_timeout = 120000;
         SET GLOBAL rpl_semi_sync_master_enabled = ON",
    )
    .await;
    let writer_url = url.clone();
    let writer = tokio::spawn(async move {
        let mut w = mysql_async::Conn::from_url(&writer_url).await.unwrap();
        w.query_drop("INSERT INTO app.readings VALUES (1, 'd1', 5)")
            .await
    });
    // The row reaches the stream…
    let evs = events(&take_events(&mut src, 1, 30).await);
    let tx = evs[0].tx.expect("binlog events carry their transaction");
    let dirty = Due {
        key: Key::from("d1"),
        txids: vec![tx.id],
    };
    // …while new snapshots do not see it.
    let visible: Option<i64> = c
        .query_first("SELECT count(*) FROM app.readings")
        .await
        .unwrap();
    assert_eq!(visible, Some(0), "the shipped commit is not visible yet");
    assert!(!writer.is_finished(), "the writer waits for the replica");

    // Without the guard, the rebuild recomputes d1 from a snapshot without the row.
    unchecked.run(std::slice::from_ref(&dirty)).await.unwrap();
    // With it, a short wait ends in a path failure (retried, never quarantined)…
    let err = impatient
        .run(std::slice::from_ref(&dirty))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotVisible);
    assert_eq!(err.retry(), Retry::Path);
    // …and a longer one holds until the commit is visible.
    let waiting = tokio::spawn(async move { patient.run(&[dirty]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the rebuild holds while the commit is invisible"
    );

    // Release the writer: without semi-sync its commit completes.
    exec(&mut c, "SET GLOBAL rpl_semi_sync_master_enabled = OFF").await;
    writer.await.unwrap().expect("the writer commits");
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the rebuild finishes once the commit is visible")
        .unwrap()
        .expect("the rebuild succeeds");
    let total: Option<i64> = c
        .query_first("SELECT total FROM app.rollup WHERE dev = 'd1'")
        .await
        .unwrap();
    assert_eq!(total, Some(5), "the guarded rebuild saw the change");
    let stale: Option<i64> = c
        .query_first("SELECT total FROM app.rollup_unchecked WHERE dev = 'd1'")
        .await
        .unwrap();
    assert_eq!(
        stale, None,
        "the unguarded rebuild missed it (the hazard is real)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_from_error_numbers() {
    use freshen::{BoxError, Rebuild};
    let db = server();
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "CREATE TABLE app.src (dev VARCHAR(10) PRIMARY KEY, v INT);
         CREATE TABLE app.dst (dev VARCHAR(10) PRIMARY KEY, v INT NOT NULL);
         INSERT INTO app.src VALUES ('locked', 1), ('nulls', NULL);
         SET GLOBAL innodb_lock_wait_timeout = 1",
    )
    .await;
    let pool = connect_pool(&db.url("app"), 2).unwrap();
    let rebuild = MySqlRebuild::builder(pool)
        .statement("DELETE FROM app.dst WHERE dev = $1")
        .statement("INSERT INTO app.dst SELECT dev, v FROM app.src WHERE dev = $1")
        .build()
        .await
        .unwrap();
    let due = |k: &str| Due {
        key: Key::from(k),
        txids: Vec::new(),
    };
    let classify = |e: freshen_mysql::MySqlError| rebuild.classify(&(Box::new(e) as BoxError));

    // The key's data: a NULL into a NOT NULL column (1048).
    let e = rebuild.run(&[due("nulls")]).await.unwrap_err();
    assert_eq!(e.code(), Some(1048), "{e}");
    assert_eq!(classify(e), Retry::Key);

    // The path: a lock another session holds (lock wait timeout, 1205).
    exec(&mut c, "INSERT INTO app.dst VALUES ('locked', 0)").await;
    exec(
        &mut c,
        "START TRANSACTION; UPDATE app.dst SET v = 2 WHERE dev = 'locked'",
    )
    .await;
    let e = rebuild.run(&[due("locked")]).await.unwrap_err();
    assert_eq!(e.code(), Some(1205), "{e}");
    assert_eq!(classify(e), Retry::Path);
    exec(&mut c, "ROLLBACK").await;

    // A person: the table is gone (1146).
    exec(&mut c, "DROP TABLE app.src").await;
    let e = rebuild.run(&[due("x")]).await.unwrap_err();
    assert_eq!(e.code(), Some(1146), "{e}");
    assert_eq!(classify(e), Retry::Fix);
}

/// A session taken back by a pool is reset, and the session settings come back with it:
/// UTC and utf8mb4 always, and a statement bound where one is asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sessions_keep_their_settings_across_uses() {
    let db = server();
    let url = db.url("app");
    let settings = "SELECT @@session.time_zone, @@session.character_set_client, \
                    CAST(@@session.max_statement_time AS CHAR), @@session.lock_wait_timeout";
    for (pool, bound) in [
        (connect_pool(&url, 1).unwrap(), None),
        (
            connect_pool_limited(&url, 1, Some(Duration::from_millis(1500))).unwrap(),
            Some(("1.500000", 2u64)),
        ),
    ] {
        for round in 0..3 {
            // One connection: every round takes back the session the last one used, after
            // the last round changed it.
            let mut conn = pool.get_conn().await.unwrap();
            let (tz, charset, statement, lock): (String, String, String, u64) =
                conn.query_first(settings).await.unwrap().unwrap();
            assert_eq!(
                (tz.as_str(), charset.as_str()),
                ("+00:00", "utf8mb4"),
                "round {round}"
            );
            if let Some((s, l)) = bound {
                assert_eq!((statement.as_str(), lock), (s, l), "round {round}");
            } else {
                assert_eq!(statement, "0.000000", "round {round}");
            }
            conn.query_drop("SET time_zone = '+05:00', max_statement_time = 9")
                .await
                .unwrap();
        }
    }
}

/// A statement past the bound is cut off by the server, as a failure of the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_past_its_bound_is_cut_off_as_a_failure_of_the_path() {
    let db = server();
    let pool = connect_pool_limited(&db.url("app"), 1, Some(Duration::from_millis(300))).unwrap();
    let mut conn = pool.get_conn().await.unwrap();
    let e = conn
        .query_drop("SELECT SLEEP(30)")
        .await
        .expect_err("cut off by max_statement_time");
    let code = match &e {
        mysql_async::Error::Server(s) => s.code,
        other => panic!("not a server error: {other:?}"),
    };
    assert_eq!(code, 1969, "{e}");
    assert_eq!(freshen_mysql::retry_for(code), Retry::Path);
}
