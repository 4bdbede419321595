//! No loss at failover (PostgreSQL 17: failover slots): a primary, a standby that keeps
//! a synchronized copy of freshen's slot and is named in `synchronized_standby_slots`.
//! The standby receives a source change, then its WAL receiver freezes, so the
//! rebuild that change causes on the primary never reaches it; the slot's copy is
//! synchronized; the primary dies and the standby is promoted. freshen, restarted on
//! the promoted standby from the synchronized slot, must rebuild the change again:
//! confirming it before the standby had the rebuild would have lost it for good (the
//! views have no reconcile sweep, and the witness rows change once, before the fault).

use crate::support;

use freshen_testenv::PgServer;
use freshen_testenv::refresher::Running;
use support::*;
use support::{ROLLUP_DERIVED as DERIVED, ROLLUP_TRUTH as TRUTH, rollup_rows as rows};
use tokio_postgres::Client;

const SCHEMA: &str = "
    CREATE TABLE readings (id serial PRIMARY KEY, device text NOT NULL, value int NOT NULL);
    ALTER TABLE readings REPLICA IDENTITY FULL;
    CREATE TABLE rollup (device text PRIMARY KEY, n int8 NOT NULL, total int8 NOT NULL);
    INSERT INTO readings (device, value) SELECT 'd' || (g % 5), g FROM generate_series(1, 50) g;
    INSERT INTO readings (device, value) VALUES ('w1', 1), ('w2', 2);";

/// Waits until the rollup on `c` equals a fresh GROUP BY there.
async fn equal(c: &Client, what: &str) {
    eventually(60, what, || async {
        (rows(c, TRUTH).await == rows(c, DERIVED).await).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_has_every_rebuild_behind_the_synchronized_slot() {
    let mut primary = PgServer::builder()
        .at_least(17)
        .start()
        .unwrap_or_else(|e| panic!("PostgreSQL 17+ (scripts/test-deps-postgres): {e}"));
    let standby = primary
        .start_standby(PgServer::builder())
        .expect("a standby");
    primary.synchronize_with(&standby).unwrap();
    let c = sql(&primary).await;
    c.batch_execute(SCHEMA).await.unwrap();

    let src = source(config(&primary, "failover", &["readings"])).await;
    let health = src.handle();
    assert_eq!(
        primary
            .psql("SELECT failover FROM pg_replication_slots WHERE slot_name = 'failover'")
            .unwrap(),
        "t",
        "a 17+ primary's slot is a failover slot by default"
    );
    let running = Running::spawn(rollup_refresher(src, rollup_rebuild(&primary, 2).await));
    // The first build: every device dirtied by a touch of each row.
    c.batch_execute("UPDATE readings SET value = value")
        .await
        .unwrap();
    equal(&c, "the first build").await;

    // The standby keeps a synchronized copy of the slot.
    eventually(60, "the slot synchronized to the standby", || async {
        standby.psql("SELECT pg_sync_replication_slots()").ok()?;
        (standby
            .psql(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'failover' AND synced",
            )
            .ok()?
            == "1")
            .then_some(())
    })
    .await;

    // The witnesses change once: the standby receives the change...
    let before = current_lsn(&c).await;
    c.batch_execute("UPDATE readings SET value = value + 100 WHERE device IN ('w1', 'w2')")
        .await
        .unwrap();
    eventually(30, "the change on the standby", || async {
        (standby
            .psql("SELECT sum(value) FROM readings WHERE device IN ('w1', 'w2')")
            .ok()?
            == "203")
            .then_some(())
    })
    .await;
    // ...and nothing after it: the rebuild's WAL is not written there.
    standby.freeze_wal_receiver().unwrap();
    equal(&c, "the witnesses rebuilt on the primary").await;
    eventually(30, "the witnesses' change acknowledged", || async {
        (health.health().acknowledged_lsn > before).then_some(())
    })
    .await;
    // What freshen decided to confirm has reached the primary's slot, and its copy.
    eventually(30, "the confirmation on the primary", || async {
        (confirmed_flush(&c, "failover").await >= health.health().confirmed_lsn).then_some(())
    })
    .await;
    standby.psql("SELECT pg_sync_replication_slots()").unwrap();

    primary.kill().unwrap();
    running.stop().await;
    standby.crash_wal_receiver().unwrap();
    standby.promote().unwrap();

    // Restarted on the promoted standby, from the synchronized slot, no sweep.
    let s = sql(&standby).await;
    let mut cfg = config(&standby, "failover", &["readings"]);
    cfg.slot_mode = freshen_postgres::SlotMode::MustExist;
    let src = source(cfg).await;
    let running = Running::spawn(rollup_refresher(src, rollup_rebuild(&standby, 2).await));
    equal(&s, "the witnesses on the promoted standby").await;
    let witnesses: Vec<(String, i64, i64)> = rows(&s, DERIVED)
        .await
        .into_iter()
        .filter(|(d, _, _)| d.starts_with('w'))
        .collect();
    assert_eq!(
        witnesses,
        [("w1".to_owned(), 1, 101), ("w2".to_owned(), 1, 102)],
        "the rebuild lost at the failover was done again"
    );
    running.stop().await;
    drop(standby);
}
