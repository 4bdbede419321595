//! A promotion followed without a restart (PostgreSQL 17: failover slots): `freshen run`
//! on a URL naming the primary and its standby with `target_session_attrs=read-write`.
//! The standby keeps a synchronized copy of freshen's slot and is named in
//! `synchronized_standby_slots`; the primary dies (immediate stop) under load and the
//! standby is promoted. The same process streams from the promoted standby and
//! rebuilds there: the views equal truth, the witness rows (changed once before the
//! fault, never again, no reconcile sweep) included.

use std::time::Duration;

use crate::support;

use freshen_testenv::PgServer;
use freshen_testenv::refresher::eventually;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_both_hosts_follows_a_promotion_and_loses_nothing() {
    let mut primary = PgServer::builder()
        .at_least(17)
        .start()
        .unwrap_or_else(|e| panic!("PostgreSQL 17+ (scripts/test-deps-postgres): {e}"));
    let standby = primary
        .start_standby(PgServer::builder().setting("sync_replication_slots", "on"))
        .expect("a standby");
    primary.synchronize_with(&standby).unwrap();
    let mut c = connect(&primary.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();

    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    // Every view without a sweep: a change lost at the fault stays lost.
    let text = |http: &str| {
        let t = config(&both, http).replace(
            "reconcile = { every = \"1h\", keys = \"SELECT id FROM sites\" }\n",
            "",
        );
        assert!(!t.contains("reconcile"), "no view sweeps");
        t
    };
    let Started { dir, base, mut run } = run_healthy(text, None).await;
    let mut r = Rng::new(0xfa11);
    workload(&mut c, &mut r, 100).await;
    witness(&c, "f", 4).await;
    wait_equal(&c, Duration::from_secs(60)).await;
    // The standby's copy of the slot has caught up with what freshen confirmed.
    eventually(60, "the slot synchronized to the standby", || async {
        let primary_at = primary
            .psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'freshen_test'")
            .ok()?;
        let standby_at = standby
            .psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'freshen_test' AND synced")
            .ok()?;
        (!primary_at.is_empty() && primary_at == standby_at).then_some(())
    })
    .await;

    // More load, then the primary dies in the middle of it and the standby takes over.
    workload(&mut c, &mut r, 50).await;
    witness(&c, "f", 4).await;
    primary.kill().unwrap();
    standby.promote().unwrap();
    let mut s = connect(&standby.url()).await;
    workload(&mut s, &mut r, 100).await;
    wait_equal(&s, Duration::from_secs(120)).await;
    assert_witnesses(&s, &["f"], 4).await;
    // And the slot moves on there: nothing waits for the old primary's standbys.
    let now = standby.psql("SELECT pg_current_wal_lsn()").unwrap();
    eventually(60, "the slot confirmed on the new primary", || async {
        let ahead = standby
            .psql(&format!(
                "SELECT confirmed_flush_lsn >= '{now}' FROM pg_replication_slots WHERE slot_name = 'freshen_test'"
            ))
            .ok()?;
        (ahead == "t").then_some(())
    })
    .await;
    assert!(
        run.try_wait().unwrap().is_none(),
        "the same process followed the promotion: {}",
        log_of(dir.path(), 1)
    );
    wait_healthy(&base, dir.path(), 1, Duration::from_secs(60)).await;
}
