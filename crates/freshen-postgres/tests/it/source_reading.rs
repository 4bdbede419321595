//! How the reader paces its reads of a real server: pauses between reads of a busy stream,
//! and on a loopback connection the socket's wake-up threshold. Neither may hold a change
//! back once the stream goes quiet. And a reader that stops reading is told from one that
//! has nothing to read, by the server's WAL position read apart from the stream.

use crate::support;

use std::time::Duration;

use freshen::{Source, SourceProbe, Value};
use support::*;

/// A busy stream of one-row transactions raises the threshold; the lone change after it
/// is fewer bytes than the threshold, so only lowering it on the reader's deadline
/// delivers it (the server sends nothing more for tens of seconds).
async fn lone_change_after_a_busy_stream(read_gap: Duration, threshold: bool) {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE paced (id int PRIMARY KEY, v text NOT NULL);
         CREATE PROCEDURE fill(n int) LANGUAGE plpgsql AS $$
         BEGIN
           FOR i IN 1..n LOOP INSERT INTO paced VALUES (i, 'busy'); COMMIT; END LOOP;
         END $$;",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "paced", &["paced"]);
    cfg.read_gap = read_gap;
    let mut src = source(cfg).await;
    assert_eq!(src.health().wake_threshold, threshold);

    c.batch_execute("CALL fill(5000)").await.unwrap();
    let busy = take_events(&mut src, 5000, 60).await;
    assert_eq!(events(&busy).len(), 5000);

    c.batch_execute("INSERT INTO paced VALUES (0, 'lone')")
        .await
        .unwrap();
    let lone = events(&take_events(&mut src, 1, 10).await);
    assert_eq!(lone.len(), 1);
    assert_eq!(
        lone[0].new.as_ref().unwrap().get("v"),
        Some(&Value::Text("lone".into()))
    );
}

#[tokio::test]
async fn the_wake_up_threshold_holds_no_change_back() {
    lone_change_after_a_busy_stream(Duration::from_millis(10), true).await;
}

#[tokio::test]
async fn reading_each_message_uses_no_threshold() {
    lone_change_after_a_busy_stream(Duration::ZERO, false).await;
}

/// Samples the source's probe every 250 ms until `cond` holds for its health, or fails
/// after `secs` with the last health.
async fn sample_until(
    probe: &freshen_postgres::PgHandle,
    secs: u64,
    what: &str,
    cond: impl Fn(&freshen::SourceHealth) -> bool,
) -> freshen::SourceHealth {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        probe.sample().await;
        let h = SourceProbe::health(probe);
        if cond(&h) {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {secs}s; last health {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A reader that stops reading — here because nothing takes its batches, so its queue,
/// the client's buffer and the socket fill and the server waits — is reported stalled
/// within `stall_after` plus a sample, with the positions that show it, and reads again
/// once batches are taken.
#[tokio::test]
async fn a_reader_that_stops_reading_is_reported_stalled() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE st (id int PRIMARY KEY, pad text)")
        .await
        .unwrap();
    let mut cfg = config(&pg, "stalls", &["st"]);
    cfg.queue_batches = 1;
    cfg.stall_after = Duration::from_secs(2);
    let mut src = source(cfg).await;
    let probe = src.handle();
    c.execute(
        "INSERT INTO st SELECT g, repeat('x', 200) FROM generate_series(1, 100000) g",
        &[],
    )
    .await
    .unwrap();
    let h = sample_until(&probe, 30, "a stall reported", |h| {
        h.stalled_for.is_some_and(|d| d >= Duration::from_secs(2))
    })
    .await;
    let p = h
        .problems
        .iter()
        .find(|p| p.message.contains("has read nothing"))
        .unwrap_or_else(|| panic!("a stall is a problem: {h:?}"));
    assert!(
        p.message.contains("waits for the pipeline"),
        "says why: {p:?}"
    );
    assert!(
        h.head > h.received,
        "the server's position comes from outside the stream: {h:?}"
    );

    // Taking the batches lets it read again: the stall is gone at the next sample.
    let reading = tokio::spawn(async move {
        while let Some(Ok(b)) = src.next_batch().await {
            b.into_parts().2.ack();
        }
    });
    sample_until(&probe, 60, "the stall cleared", |h| {
        h.stalled_for == Some(Duration::ZERO) && h.problems.is_empty()
    })
    .await;
    reading.abort();
}

/// A reader with nothing to read is never stalled, however the server's WAL moves: here
/// it moves with a table outside the publication, for several times `stall_after`.
#[tokio::test]
async fn an_idle_reader_is_not_stalled_while_other_tables_change() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE watched (id int PRIMARY KEY); CREATE TABLE other (id serial PRIMARY KEY, v text);",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "idle", &["watched"]);
    cfg.stall_after = Duration::from_secs(1);
    let src = source(cfg).await;
    let probe = src.handle();
    let start = current_lsn(&c).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        c.execute(
            "INSERT INTO other (v) SELECT repeat('y', 100) FROM generate_series(1, 50)",
            &[],
        )
        .await
        .unwrap();
        probe.sample().await;
        let h = SourceProbe::health(&probe);
        assert_eq!(h.stalled_for, Some(Duration::ZERO), "{h:?}");
        assert!(h.problems.is_empty(), "{h:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        current_lsn(&c).await.0 > start.0 + 100_000,
        "the WAL moved on"
    );
    drop(src);
}
