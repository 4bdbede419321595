//! Streamed in-progress transactions (pgoutput protocol 2) against a real server whose
//! `logical_decoding_work_mem` is 64 kB, so a few thousand rows stream: they reach the
//! source only at commit, whole, without a rolled-back savepoint's rows and without an
//! aborted transaction; interleaved transactions stay apart; and a walsender terminated
//! in the middle of a streamed transaction (after the slot confirmed a position past its
//! start) costs nothing: the next session streams it again from its start.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use freshen::{Batch, RowEvent, Value};
use freshen_postgres::Lsn;
use freshen_testenv::PgServer;
use freshen_testenv::refresher::{Running, within};
use support::*;
use support::{ROLLUP_DERIVED as DERIVED, ROLLUP_TRUTH as TRUTH, rollup_rows as rows};
use tokio_postgres::Client;

/// A server that streams any transaction past 64 kB of decoded changes.
fn streaming_server() -> PgServer {
    PgServer::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start()
        .unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"))
}

/// Transactions the slot has streamed so far (the server's own count).
async fn streamed_txns(c: &Client, slot: &str) -> i64 {
    c.query_opt(
        "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
        &[&slot],
    )
    .await
    .unwrap()
    .map_or(0, |r| r.get(0))
}

fn id(e: &RowEvent) -> i64 {
    match e.new.as_ref().and_then(|r| r.get("id")) {
        Some(Value::Int(i)) => *i,
        other => panic!("no id: {other:?}"),
    }
}

/// Reads and acknowledges batches until the event with id `last` arrived.
async fn events_through(src: &mut freshen_postgres::PgSource, last: i64) -> Vec<RowEvent> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !got.iter().any(|e| id(e) == last) {
        let b: Batch = tokio::time::timeout_at(deadline, freshen::Source::next_batch(src))
            .await
            .unwrap_or_else(|_| panic!("{} events, no id {last}: {:?}", got.len(), src.health()))
            .expect("stream ended")
            .expect("source failed");
        let (events, _, ack) = b.into_parts();
        got.extend(events.iter().cloned());
        ack.ack();
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_transactions_reach_the_source_whole_at_their_commit() {
    let pg = streaming_server();
    let c = sql(&pg).await;
    let other = sql(&pg).await;
    c.batch_execute("CREATE TABLE t (id int8 PRIMARY KEY, pad text NOT NULL)")
        .await
        .unwrap();
    let mut src = source(config(&pg, "strm", &["t"])).await;
    // Read all along: a reader that stops reading stops the walsender's decoding too.
    let reader = tokio::spawn(async move {
        let got = events_through(&mut src, 99_999).await;
        src.shutdown().await;
        got
    });

    // A: committed, with a rolled-back savepoint in the middle (ids 1..=3000 and
    // 5001..=6000 stay, 3001..=5000 roll back).
    c.batch_execute(
        "BEGIN;
         INSERT INTO t SELECT g, repeat('a', 40) FROM generate_series(1, 3000) g;
         SAVEPOINT s;
         INSERT INTO t SELECT g, repeat('r', 40) FROM generate_series(3001, 5000) g;
         UPDATE t SET pad = 'rolled back' WHERE id <= 100;
         ROLLBACK TO SAVEPOINT s;
         INSERT INTO t SELECT g, repeat('a', 40) FROM generate_series(5001, 6000) g;
         COMMIT;",
    )
    .await
    .unwrap();
    // B: aborted after it streamed.
    c.batch_execute(
        "BEGIN;
         INSERT INTO t SELECT g, repeat('b', 40) FROM generate_series(10001, 14000) g;",
    )
    .await
    .unwrap();
    // Asked on another connection: inside B the statistics would be B's snapshot.
    eventually(30, "B to stream", || async {
        (streamed_txns(&other, "strm").await >= 2).then_some(())
    })
    .await;
    c.batch_execute("ROLLBACK").await.unwrap();
    // C and D interleaved on two connections, D committing first.
    c.batch_execute("BEGIN").await.unwrap();
    other.batch_execute("BEGIN").await.unwrap();
    for k in 0..4i64 {
        let (lo_c, lo_d) = (20_001 + k * 1000, 30_001 + k * 1000);
        c.execute(
            "INSERT INTO t SELECT g, repeat('c', 40) FROM generate_series($1::int8, $1::int8 + 999) g",
            &[&lo_c],
        )
        .await
        .unwrap();
        other
            .execute(
                "INSERT INTO t SELECT g, repeat('d', 40) FROM generate_series($1::int8, $1::int8 + 999) g",
                &[&lo_d],
            )
            .await
            .unwrap();
    }
    other.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    // The witness: a small transaction after everything.
    c.execute("INSERT INTO t VALUES (99999, 'w')", &[])
        .await
        .unwrap();

    let got = within(90, "every event through the witness", reader)
        .await
        .unwrap();
    let ids: Vec<i64> = got.iter().map(id).collect();
    let want: Vec<i64> = (1..=3000)
        .chain(5001..=6000)
        .chain(30_001..=34_000)
        .chain(20_001..=24_000)
        .chain([99_999])
        .collect();
    assert_eq!(ids.len(), want.len(), "no rolled-back or aborted rows");
    assert_eq!(ids, want, "each transaction whole, in commit order");
    // Each transaction's events carry its one commit position, indexed in order.
    for range in [0..4000, 4000..8000, 8000..12000] {
        let tx: Vec<_> = got[range].iter().map(|e| e.tx.unwrap()).collect();
        assert!(
            tx.iter()
                .all(|t| t.commit == tx[0].commit && t.id == tx[0].id)
        );
        assert!(tx.iter().enumerate().all(|(i, t)| t.index as usize == i));
    }
    // PostgreSQL 14's statistics collector reports a moment later: polled.
    eventually(30, "A, B, C and D streamed by the server", || async {
        (streamed_txns(&c, "strm").await >= 4).then_some(())
    })
    .await;
}

const SCHEMA: &str = "
    CREATE TABLE readings (id serial PRIMARY KEY, device text NOT NULL, value int NOT NULL);
    CREATE TABLE rollup (device text PRIMARY KEY, n int8 NOT NULL, total int8 NOT NULL);";

/// Waits until nothing is dirty or running and the rollup equals a fresh GROUP BY.
async fn settled(c: &Client, handle: &freshen::Handle) {
    eventually(90, "the rollup to equal a fresh GROUP BY", || async {
        let s = handle.stats();
        let (truth, derived) = (rows(c, TRUTH).await, rows(c, DERIVED).await);
        (s.dirty == 0 && s.in_flight == 0 && truth == derived).then_some(())
    })
    .await;
}

/// The witness devices `w0`..`w4`, written once (value 10 + i) and never again.
async fn witnesses_fresh(c: &Client, what: &str) {
    assert_eq!(
        rows(
            c,
            "SELECT device, n, total FROM rollup WHERE device LIKE 'w%' ORDER BY device"
        )
        .await,
        (0..5)
            .map(|i| (format!("w{i}"), 1, 10 + i))
            .collect::<Vec<_>>(),
        "{what}"
    );
}

async fn refresher(pg: &PgServer, slot: &str) -> Running {
    let mut cfg = config(pg, slot, &["readings"]);
    // Everything streamed goes through the spill file.
    cfg.stream_memory = 0;
    refresher_with(pg, cfg).await
}

async fn refresher_with(pg: &PgServer, cfg: freshen_postgres::PgSourceConfig) -> Running {
    Running::spawn(rollup_refresher(
        source(cfg).await,
        rollup_rebuild(pg, 2).await,
    ))
}

async fn active_pid(c: &Client, slot: &str) -> Option<i32> {
    c.query_one(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        &[&slot],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walsender_terminated_mid_streamed_transaction_still_ends_fresh() {
    let pg = streaming_server();
    let c = sql(&pg).await;
    let big = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let running = refresher(&pg, "strm_fault").await;
    let handle = running.handle.clone();

    // The streamed transaction: witnesses (one row per device, never changed again),
    // bulk rows, and a rolled-back savepoint.
    let before = current_lsn(&c).await;
    big.batch_execute(
        "BEGIN;
         INSERT INTO readings (device, value) SELECT 'w' || i, 10 + i FROM generate_series(0, 4) i;
         INSERT INTO readings (device, value) SELECT 'd' || (g % 8), g FROM generate_series(1, 4000) g;
         SAVEPOINT s;
         INSERT INTO readings (device, value) SELECT 'rb', g FROM generate_series(1, 3000) g;
         UPDATE readings SET value = -1 WHERE device = 'w0';
         ROLLBACK TO SAVEPOINT s;",
    )
    .await
    .unwrap();
    eventually(30, "the open transaction to stream", || async {
        (streamed_txns(&c, "strm_fault").await >= 1).then_some(())
    })
    .await;
    // A small transaction committed meanwhile, rebuilt and acknowledged: the slot then
    // confirms a position past the start of the still-open streamed transaction.
    c.execute("INSERT INTO readings (device, value) VALUES ('x', 1)", &[])
        .await
        .unwrap();
    let past: Lsn = current_lsn(&c).await;
    eventually(
        30,
        "a confirmed position past the open transaction's start",
        || async { (confirmed_flush(&c, "strm_fault").await >= past).then_some(()) },
    )
    .await;
    assert!(past > before);

    // The walsender goes in the middle of the streamed transaction.
    let pid = active_pid(&c, "strm_fault").await.expect("streaming");
    c.execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    eventually(30, "a new session on the slot", || async {
        active_pid(&c, "strm_fault")
            .await
            .filter(|p| *p != pid)
            .map(|_| ())
    })
    .await;
    // An aborted streamed transaction meanwhile.
    c.batch_execute(
        "BEGIN;
         INSERT INTO readings (device, value) SELECT 'ab', g FROM generate_series(1, 4000) g;
         ROLLBACK;",
    )
    .await
    .unwrap();
    big.batch_execute(
        "INSERT INTO readings (device, value) SELECT 'd' || (g % 8), g FROM generate_series(4001, 6000) g;
         COMMIT;",
    )
    .await
    .unwrap();

    settled(&c, &handle).await;
    let devices: BTreeSet<String> = rows(&c, DERIVED).await.into_iter().map(|r| r.0).collect();
    assert!(!devices.contains("rb") && !devices.contains("ab"));
    witnesses_fresh(&c, "the witnesses of the streamed transaction").await;
    assert_eq!(rows(&c, DERIVED).await.len(), 8 + 5 + 1);
    eventually(30, "streamed before the fault and after it", || async {
        (streamed_txns(&c, "strm_fault").await >= 2).then_some(())
    })
    .await;
    assert_eq!(handle.stats().reconciles, 0, "healed by replay alone");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_directory_that_cannot_be_written_falls_back_to_whole_transactions() {
    let pg = streaming_server();
    let c = sql(&pg).await;
    let big = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = config(&pg, "strm_nodir", &["readings"]);
    // Every streamed message must spill, and the directory does not exist.
    cfg.stream_memory = 0;
    cfg.stream_spill_dir = Some("/nonexistent/freshen-spill".into());
    let running = refresher_with(&pg, cfg).await;
    let handle = running.handle.clone();
    let first = eventually(30, "a session on the slot", || async {
        active_pid(&c, "strm_nodir").await
    })
    .await;

    // Witnesses: written once, in a transaction large enough to stream, never again.
    big.batch_execute(
        "BEGIN;
         INSERT INTO readings (device, value) SELECT 'w' || i, 10 + i FROM generate_series(0, 4) i;
         INSERT INTO readings (device, value) SELECT 'd' || (g % 8), g FROM generate_series(1, 4000) g;",
    )
    .await
    .unwrap();
    // The first streamed message cannot be held: that session ends (nothing else ends
    // it), the next one asks for whole transactions. The server's `stream_txns` is no
    // witness here: a walsender whose reader left in the middle of a stream block may
    // exit before it counts the block.
    eventually(
        30,
        "the session that could not hold the stream to end",
        || async {
            active_pid(&c, "strm_nodir")
                .await
                .filter(|p| *p != first)
                .map(|_| ())
        },
    )
    .await;
    let streamed = streamed_txns(&c, "strm_nodir").await;
    big.batch_execute("COMMIT").await.unwrap();
    // Another large transaction after the fallback: sent whole, not streamed.
    c.batch_execute(
        "INSERT INTO readings (device, value) SELECT 'e' || (g % 4), g FROM generate_series(1, 4000) g",
    )
    .await
    .unwrap();

    settled(&c, &handle).await;
    witnesses_fresh(
        &c,
        "the witnesses of the transaction that could not be held",
    )
    .await;
    assert_eq!(
        streamed_txns(&c, "strm_nodir").await,
        streamed,
        "after the spill failed, the server sends whole transactions"
    );
    assert_eq!(handle.stats().reconciles, 0, "healed by replay alone");
    running.stop().await;
}
