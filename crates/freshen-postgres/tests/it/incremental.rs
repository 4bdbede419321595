//! The cursor-incremental source on a real PostgreSQL: ties on the cursor across page
//! boundaries, rows committed late with an earlier cursor value (long transactions held
//! open across polls), the lookback for a value taken before the transaction's first
//! write, and a durable cursor that never passes a transaction still running.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use freshen::{Backoff, Batch, Source};
use freshen_postgres::TableName;
use freshen_postgres::incremental::{IncrementalConfig, PgIncrementalSource, PolledTable};
use freshen_testenv::PgServer;
use support::*;
use tokio_postgres::Client;

const SCHEMA: &str = "
    CREATE TABLE events (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now(), v int NOT NULL);
    CREATE INDEX ON events (updated_at);";

fn config(pg: &PgServer, page_size: usize, lookback: Duration) -> IncrementalConfig {
    IncrementalConfig {
        connection: freshen_postgres::ConnectionConfig::from_url(&pg.url()).unwrap(),
        store_connection: None,
        store_table: TableName::new("public", "freshen_cursors"),
        name: "test".into(),
        lookback,
        tables: vec![PolledTable {
            table: TableName::new("public", "events"),
            cursor: "updated_at".into(),
            poll_interval: Duration::from_millis(20),
            page_size,
        }],
        queue_batches: 4,
        retry: Backoff::new(Duration::from_millis(20), Duration::from_millis(200)),
    }
}

/// `(id, v)` of every row event in `batches`, in order.
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
    src: &mut PgIncrementalSource,
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
        // A quiet poll hands nothing over: re-check `done` now and then.
        let wait = tokio::time::Instant::now() + Duration::from_millis(100);
        let Ok(next) = tokio::time::timeout_at(wait, src.next_batch()).await else {
            continue;
        };
        let batch = next.expect("the source goes on").expect("no source error");
        seen.extend(rows(std::slice::from_ref(&batch)));
        let (_, _, ack) = batch.into_parts();
        ack.ack();
    }
    seen
}

/// Takes and acknowledges batches until the stored cursor satisfies `done`.
async fn ack_until_stored(
    src: &mut PgIncrementalSource,
    c: &Client,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(p) = stored(c).await.filter(|p| done(p)) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cursor was never stored as expected: {:?}",
            stored(c).await
        );
        let wait = tokio::time::Instant::now() + Duration::from_millis(100);
        if let Ok(Some(Ok(batch))) = tokio::time::timeout_at(wait, src.next_batch()).await {
            batch.into_parts().2.ack();
        }
    }
}

async fn stored(c: &Client) -> Option<Vec<String>> {
    c.query_opt(
        "SELECT position FROM freshen_cursors WHERE name = 'test' AND source_table = 'public.events'",
        &[],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_on_the_cursor_across_pages_are_neither_lost_nor_repeated() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // 3 cursor values, 40 rows each, inserted out of key order; pages of 7 split every
    // tie group several times.
    c.batch_execute(
        "INSERT INTO events (id, updated_at, v) \
         SELECT g, '2026-01-01'::timestamptz + (g % 3) * interval '1 second', g * 10 \
           FROM generate_series(120, 1, -1) g",
    )
    .await
    .unwrap();
    let mut src = PgIncrementalSource::start(config(&pg, 7, Duration::ZERO))
        .await
        .unwrap();
    let seen = take_until(&mut src, "120 rows", |s| s.len() >= 120).await;
    let mut ids: Vec<i64> = seen.iter().map(|r| r.0).collect();
    // Delivered in (updated_at, id) order: ids ≡ 0 mod 3 first, ascending within.
    let order: Vec<(i64, i64)> = ids.iter().map(|id| (id % 3, *id)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "keyset order (cursor, pk)");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120, "every row exactly once: {seen:?}");
    assert!(seen.iter().all(|(id, v)| *v == id * 10));
    // Once caught up, the cursor is stored at the last row of the last tie group.
    ack_until_stored(&mut src, &c, |p| p[1] == "119").await;
    let stats = src.handle().stats();
    assert_eq!(stats.events, 120, "nothing read twice: {stats:?}");
    src.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_committed_late_with_an_earlier_cursor_value_are_found() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let mut src = PgIncrementalSource::start(config(&pg, 50, Duration::ZERO))
        .await
        .unwrap();
    // Two long transactions write first (their updated_at is their start, now()).
    let long1 = sql(&pg).await;
    long1
        .batch_execute("BEGIN; INSERT INTO events (id, v) VALUES (1, 1)")
        .await
        .unwrap();
    let long2 = sql(&pg).await;
    long2
        .batch_execute("BEGIN; INSERT INTO events (id, v) VALUES (2, 2)")
        .await
        .unwrap();
    let early: String = long1
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    // Later rows commit and are read: polls move past the long transactions' values.
    for i in 0..5 {
        c.batch_execute(&format!(
            "INSERT INTO events (id, v) SELECT g, g FROM generate_series({a}, {b}) g",
            a = 100 + i * 10,
            b = 109 + i * 10
        ))
        .await
        .unwrap();
        take_until(&mut src, "the later rows", |s| {
            s.iter().any(|r| r.0 == 109 + i * 10)
        })
        .await;
    }
    // The stored cursor is held below the open transactions' values.
    let position = stored(&c).await;
    if let Some(p) = &position {
        let below: bool = c
            .query_one(
                "SELECT $1::text::timestamptz < $2::text::timestamptz",
                &[&p[0], &early],
            )
            .await
            .unwrap()
            .get(0);
        assert!(below, "stored {p:?} passed a running transaction's {early}");
    }
    long1.batch_execute("COMMIT").await.unwrap();
    let seen = take_until(&mut src, "the first late row", |s| {
        s.iter().any(|r| r.0 == 1)
    })
    .await;
    assert!(seen.contains(&(1, 1)));
    // The second writes more, then commits.
    long2
        .batch_execute("UPDATE events SET v = 20 WHERE id = 2; COMMIT")
        .await
        .unwrap();
    take_until(&mut src, "the second late row", |s| s.contains(&(2, 20))).await;
    let stats = src.handle().stats();
    assert!(stats.reread_events >= 2, "{stats:?}");
    src.shutdown().await;
}

/// A transaction takes its cursor value (`now()`) before a poll reads later rows, and
/// writes only after several more polls: whether its row is handed over.
async fn value_taken_before_the_first_write(pg: &PgServer, lookback: Duration) -> bool {
    let c = sql(pg).await;
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS events; DROP TABLE IF EXISTS freshen_cursors; {SCHEMA}"
    ))
    .await
    .unwrap();
    let mut src = PgIncrementalSource::start(config(pg, 50, lookback))
        .await
        .unwrap();
    // now() is fixed at the first statement; no transaction id until the first write.
    let late = sql(pg).await;
    late.batch_execute("BEGIN; SELECT now()").await.unwrap();
    c.batch_execute("INSERT INTO events (id, v) SELECT g, g FROM generate_series(10, 19) g")
        .await
        .unwrap();
    let mut seen = take_until(&mut src, "the later rows", |s| s.len() >= 10).await;
    // Polls go on (acknowledged) while nothing holding an id runs.
    let handle = src.handle();
    let polls = handle.stats().polls;
    seen.extend(
        take_until(&mut src, "more polls", |_| {
            handle.stats().polls >= polls + 5
        })
        .await,
    );
    late.batch_execute("INSERT INTO events (id, v) VALUES (1, 1); COMMIT")
        .await
        .unwrap();
    let polls = handle.stats().polls;
    seen.extend(
        take_until(&mut src, "polls after the commit", |s| {
            s.contains(&(1, 1)) || handle.stats().polls >= polls + 10
        })
        .await,
    );
    src.shutdown().await;
    seen.contains(&(1, 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookback_finds_a_value_taken_before_the_first_write_and_is_needed_for_it() {
    let pg = server();
    assert!(
        value_taken_before_the_first_write(&pg, Duration::from_secs(60)).await,
        "a 60s lookback holds the range until the late writer commits"
    );
    // The transaction had no id while polls moved on: only the lookback covers it.
    assert!(
        !value_taken_before_the_first_write(&pg, Duration::ZERO).await,
        "without a lookback the row is missed (this is what the setting is for)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_stored_cursor() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute("INSERT INTO events (id, v) SELECT g, g FROM generate_series(1, 300) g")
        .await
        .unwrap();
    let mut src = PgIncrementalSource::start(config(&pg, 64, Duration::ZERO))
        .await
        .unwrap();
    take_until(&mut src, "300 rows", |s| s.len() >= 300).await;
    ack_until_stored(&mut src, &c, |p| p[1] == "300").await;
    drop(src);
    c.batch_execute(
        "INSERT INTO events (id, v) SELECT g, g FROM generate_series(301, 310) g; \
         UPDATE events SET v = -1, updated_at = now() WHERE id = 5",
    )
    .await
    .unwrap();
    let mut again = PgIncrementalSource::start(config(&pg, 64, Duration::ZERO))
        .await
        .unwrap();
    let seen = take_until(&mut again, "the rows written while stopped", |s| {
        s.len() >= 11
    })
    .await;
    let ids: BTreeMap<i64, i64> = seen.iter().copied().collect();
    assert_eq!(
        ids.len(),
        11,
        "only what changed since the stored cursor: {seen:?}"
    );
    assert_eq!(ids.get(&5), Some(&-1));
    assert!((301..=310).all(|id| ids.contains_key(&id)));
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_is_reported_for_its_table_and_polling_resumes_once_fixed() {
    use freshen::SourceProbe;
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(
        "CREATE ROLE reader LOGIN; GRANT SELECT ON events TO reader; \
         CREATE TABLE freshen_cursors (name text NOT NULL, source_table text NOT NULL, \
           columns text[] NOT NULL, position text[] NOT NULL, \
           updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (name, source_table)); \
         GRANT SELECT, INSERT, UPDATE ON freshen_cursors TO reader; \
         INSERT INTO events (id, v) VALUES (1, 1)",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, 50, Duration::ZERO);
    let url = pg.url().replacen("://postgres@", "://reader@", 1);
    cfg.connection = freshen_postgres::ConnectionConfig::from_url(&url).unwrap();
    let mut src = PgIncrementalSource::start(cfg).await.unwrap();
    take_until(&mut src, "the first row", |s| s.contains(&(1, 1))).await;
    let handle = src.handle();
    assert!(handle.health().problems.is_empty());

    c.batch_execute("REVOKE SELECT ON events FROM reader")
        .await
        .unwrap();
    freshen_testenv::refresher::until_within("a problem named", Duration::from_secs(20), || {
        handle.health().problems.iter().any(|p| {
            p.table == Some(("public".into(), "events".into()))
                && p.message.contains("permission denied")
        })
    })
    .await;
    assert!(!handle.health().streaming);

    c.batch_execute("GRANT SELECT ON events TO reader; INSERT INTO events (id, v) VALUES (2, 2)")
        .await
        .unwrap();
    take_until(&mut src, "the row written meanwhile", |s| {
        s.contains(&(2, 2))
    })
    .await;
    // The poll that handed it over ends after the batch was taken.
    take_until(&mut src, "the problem cleared", |_| {
        let h = handle.health();
        h.problems.is_empty() && h.streaming
    })
    .await;
    src.shutdown().await;
}
