//! The cursor-incremental source on a real MariaDB: ties on the cursor across page
//! boundaries, rows committed late with an earlier cursor value (a transaction held open
//! across polls) — found within the lookback, missed without one —, temporal and binary
//! positions bound back through their types, and a durable cursor resumed after a
//! restart.

use crate::support;

use std::time::Duration;

use freshen::{Backoff, Batch, Source};
use freshen_mysql::incremental::{
    IncrementalConfig, MySqlIncrementalSource, PolledTable, TableName,
};
use freshen_testenv::MariaDbServer;
use support::*;

fn config(
    db: &MariaDbServer,
    cursor: &str,
    page_size: usize,
    lookback: Duration,
) -> IncrementalConfig {
    IncrementalConfig {
        connection: db.url("app"),
        store_connection: None,
        store_table: TableName::new("app", "freshen_cursors"),
        name: "test".into(),
        lookback,
        tables: vec![PolledTable {
            table: TableName::new("app", "events"),
            cursor: cursor.into(),
            poll_interval: Duration::from_millis(20),
            page_size,
        }],
        queue_batches: 4,
        retry: Backoff::new(Duration::from_millis(20), Duration::from_millis(200)),
    }
}

/// `(id, v)` of every row event in `batches`.
fn rows(batches: &[Batch]) -> Vec<(i64, i64)> {
    batches
        .iter()
        .flat_map(|b| b.events())
        .map(|e| {
            let r = e.new.as_ref().expect("a row image");
            let int = |c: &str| match r.get(c) {
                Some(freshen::Value::Int(i)) => *i,
                other => panic!("{c}: {other:?}"),
            };
            (int("id"), int("v"))
        })
        .collect()
}

/// Takes (and acknowledges) batches until `done` holds for the rows seen so far.
async fn take_until(
    src: &mut MySqlIncrementalSource,
    what: &str,
    mut done: impl FnMut(&[(i64, i64)]) -> bool,
) -> Vec<(i64, i64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !done(&seen) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; rows so far {seen:?}"
        );
        let wait = tokio::time::Instant::now() + Duration::from_millis(100);
        let Ok(next) = tokio::time::timeout_at(wait, src.next_batch()).await else {
            continue;
        };
        let batch = next.expect("the source goes on").expect("no source error");
        seen.extend(rows(std::slice::from_ref(&batch)));
        batch.into_parts().2.ack();
    }
    seen
}

/// Takes and acknowledges batches until `polls` more polls completed; the rows seen.
async fn take_polls(src: &mut MySqlIncrementalSource, polls: u64) -> Vec<(i64, i64)> {
    let handle = src.handle();
    let target = handle.stats().polls + polls;
    take_until(src, "more polls", |_| handle.stats().polls >= target).await
}

const SCHEMA: &str =
    "CREATE TABLE events (id INT PRIMARY KEY, seq BIGINT NOT NULL, v INT NOT NULL, KEY (seq))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_on_the_cursor_across_pages_are_neither_lost_nor_repeated() {
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, SCHEMA).await;
    // 3 cursor values, 20 rows each, inserted out of key order; pages of 7 split every
    // group of ties.
    let mut values = Vec::new();
    for id in (0..60).rev() {
        values.push(format!("({id}, {}, {id})", id % 3));
    }
    exec(
        &mut c,
        &format!("INSERT INTO events VALUES {}", values.join(", ")),
    )
    .await;
    let mut src = MySqlIncrementalSource::start(config(&db, "seq", 7, Duration::from_millis(300)))
        .await
        .unwrap();
    let mut seen = take_until(&mut src, "every row", |s| s.len() >= 60).await;
    // Polls go on, re-reading the pending range for the lookback: nothing again.
    seen.extend(take_polls(&mut src, 10).await);
    let mut ids: Vec<i64> = seen.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..60).collect::<Vec<_>>(), "each row exactly once");
    assert_eq!(src.handle().stats().reread_events, 0);
}

/// A transaction inserts a row with an early cursor value, another commits a later
/// one, a poll reads past it, then the first commits: with a lookback longer than the
/// wait the re-read finds it; with none the cursor had moved past it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_is_found_within_the_lookback_and_missed_without_one() {
    for (lookback, found) in [(Duration::from_secs(60), true), (Duration::ZERO, false)] {
        let db = server();
        let mut c = sql(&db).await;
        exec(&mut c, SCHEMA).await;
        let mut src = MySqlIncrementalSource::start(config(&db, "seq", 100, lookback))
            .await
            .unwrap();
        let mut late = sql(&db).await;
        exec(&mut late, "BEGIN").await;
        exec(&mut late, "INSERT INTO events VALUES (1, 10, 1)").await;
        exec(&mut c, "INSERT INTO events VALUES (2, 20, 2)").await;
        let seen = take_until(&mut src, "the later row", |s| s.contains(&(2, 2))).await;
        assert!(!seen.contains(&(1, 1)), "not committed yet");
        // Held open across polls, then committed.
        let mut seen = take_polls(&mut src, 5).await;
        exec(&mut late, "COMMIT").await;
        if found {
            seen.extend(take_until(&mut src, "the late row", |s| s.contains(&(1, 1))).await);
            assert_eq!(
                src.handle().stats().reread_events,
                1,
                "found by the re-read"
            );
            // And handed over once: the range is read again until the lookback passes.
            seen.extend(take_polls(&mut src, 5).await);
            assert_eq!(seen.iter().filter(|r| **r == (1, 1)).count(), 1);
        } else {
            seen.extend(take_polls(&mut src, 10).await);
            assert!(
                !seen.contains(&(1, 1)),
                "without a lookback the late row is lost: {seen:?}"
            );
            assert_eq!(src.handle().stats().reread_events, 0);
        }
        src.shutdown().await;
    }
}

/// A DATETIME(6) cursor with ties and a binary primary key: positions are read as the
/// server's text (hex for bytes) and bound back through casts, so pages continue exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporal_cursors_and_binary_keys_page_exactly() {
    let db = server();
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "CREATE TABLE events (pk VARBINARY(8) PRIMARY KEY, id INT NOT NULL, v INT NOT NULL, \
         updated_at DATETIME(6) NOT NULL, KEY (updated_at))",
    )
    .await;
    let mut values = Vec::new();
    for id in 0..30 {
        values.push(format!(
            "(UNHEX('{:02x}00ff'), {id}, {id}, '2024-01-01 00:00:0{}.00000{}')",
            id,
            id % 2,
            id % 3
        ));
    }
    exec(
        &mut c,
        &format!("INSERT INTO events VALUES {}", values.join(", ")),
    )
    .await;
    let mut src = MySqlIncrementalSource::start(config(&db, "updated_at", 4, Duration::ZERO))
        .await
        .unwrap();
    let mut seen = take_until(&mut src, "every row", |s| s.len() >= 30).await;
    seen.extend(take_polls(&mut src, 3).await);
    let mut ids: Vec<i64> = seen.iter().map(|r| r.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..30).collect::<Vec<_>>(), "each row exactly once");
}

/// The cursor is stored only once acknowledged, and a restarted source resumes after it:
/// what was handed over and acknowledged is not read again, a new row is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_stored_cursor() {
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, SCHEMA).await;
    exec(
        &mut c,
        "INSERT INTO events VALUES (1, 1, 1), (2, 2, 2), (3, 3, 3)",
    )
    .await;
    let cfg = config(&db, "seq", 100, Duration::ZERO);
    let mut src = MySqlIncrementalSource::start(cfg.clone()).await.unwrap();
    take_until(&mut src, "the rows", |s| s.len() >= 3).await;
    let handle = src.handle();
    take_until(&mut src, "the cursor stored", |_| {
        handle.stats().stored >= 1
    })
    .await;
    src.shutdown().await;
    drop(src);
    let stored: Option<String> = mysql_async::prelude::Queryable::query_first(
        &mut c,
        "SELECT position FROM freshen_cursors WHERE name = 'test' AND source_table = 'app.events'",
    )
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), Some("1:31:3"), "(seq 3, id 3)");

    exec(&mut c, "INSERT INTO events VALUES (4, 4, 4)").await;
    let mut src = MySqlIncrementalSource::start(cfg).await.unwrap();
    let mut seen = take_until(&mut src, "the new row", |s| s.contains(&(4, 4))).await;
    seen.extend(take_polls(&mut src, 3).await);
    assert_eq!(seen, [(4, 4)], "only what came after the stored cursor");
}

/// SELECT is all the polled database needs: a user with SELECT on the table alone polls
/// it, its cursors kept in another database it may write; a revoked grant is reported
/// for the table (health problems) and polling resumes once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_only_user_polls_and_a_revoked_grant_is_reported_until_restored() {
    use freshen::SourceProbe;
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, SCHEMA).await;
    exec(
        &mut c,
        "CREATE DATABASE meta; CREATE USER reader@'%'; CREATE USER reader@localhost; \
         GRANT SELECT ON app.events TO reader@'%'; GRANT SELECT ON app.events TO reader@localhost; \
         GRANT ALL ON meta.* TO reader@'%'; GRANT ALL ON meta.* TO reader@localhost; \
         INSERT INTO events VALUES (1, 1, 1)",
    )
    .await;
    let url = |database: &str| db.url(database).replacen("://root@", "://reader@", 1);
    let mut cfg = config(&db, "seq", 100, Duration::ZERO);
    cfg.connection = url("app");
    cfg.store_connection = Some(url("meta"));
    cfg.store_table = TableName::new("meta", "freshen_cursors");
    let mut src = MySqlIncrementalSource::start(cfg).await.unwrap();
    take_until(&mut src, "the first row", |s| s.contains(&(1, 1))).await;
    let handle = src.handle();
    take_until(&mut src, "the cursor stored", |_| {
        handle.stats().stored >= 1
    })
    .await;

    exec(
        &mut c,
        "REVOKE SELECT ON app.events FROM reader@'%'; REVOKE SELECT ON app.events FROM reader@localhost",
    )
    .await;
    take_until(&mut src, "the problem reported", |_| {
        handle.health().problems.iter().any(|p| {
            p.table == Some(("app".into(), "events".into())) && p.message.contains("app.events")
        })
    })
    .await;
    exec(
        &mut c,
        "GRANT SELECT ON app.events TO reader@'%'; GRANT SELECT ON app.events TO reader@localhost; \
         INSERT INTO events VALUES (2, 2, 2)",
    )
    .await;
    take_until(&mut src, "polling again", |s| s.contains(&(2, 2))).await;
    // The problem clears with the poll that read the row (it may be handed over
    // before that poll's end is recorded).
    take_until(&mut src, "the problem cleared", |_| {
        handle.health().problems.is_empty()
    })
    .await;
}

/// One active process per source name: a second `mysql-incremental` on the same name
/// waits, a binlog source of that name does not (its lock is keyed apart), and once the
/// holder's session ends the standby takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_leads_per_name_and_a_standby_takes_over() {
    use freshen::plug::{Lease, SourcePlug};
    use freshen_mysql::MySqlIncrementalSettings;
    let db = server();
    let settings: MySqlIncrementalSettings =
        serde_json::from_value(serde_json::json!({"url": db.url("app"), "name": "rollups"}))
            .unwrap();
    let first = settings.lead().await.unwrap();
    assert!(matches!(first, Lease::Granted(_)), "the first leads");
    match settings.lead().await.unwrap() {
        Lease::Held(who) => assert!(who.contains("connection"), "{who}"),
        _ => panic!("a second process on the same name must wait"),
    }
    let binlog = freshen_mysql::MySqlSourceConfig::new(db.url("app"), "rollups");
    assert!(matches!(binlog.lead().await.unwrap(), Lease::Granted(_)));
    drop(first);
    eventually(20, "the standby takes over", || {
        let settings = settings.clone();
        async move { matches!(settings.lead().await.unwrap(), Lease::Granted(_)).then_some(()) }
    })
    .await;
}
