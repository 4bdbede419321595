//! A big fan-out through a `Refresher` over a `PgSource`, with bulk batches on: a plan's
//! price change maps to 50 000 accounts, rebuilt in calls that may grow past
//! `rebuild_batch` while a backlog waits, ending equal to a fresh computation; and when
//! one account's rebuild fails by data, its batch is retried in halves until that
//! account is alone (a few dozen calls, not one per key of the batch), it alone is
//! quarantined and every other account settles.

use crate::support;

use std::time::Duration;

use freshen::{Handle, Key, Refresher, RowEvent};
use freshen_postgres::{ConnectionConfig, SqlFanOut, SqlRebuild, connect_pool};
use freshen_testenv::refresher::{Running, eventually};
use support::*;
use tokio_postgres::Client;

const ACCOUNTS: i64 = 50_000;
/// The account whose rebuild fails after the second price change (its row, changed once
/// before the fault and never again, is the witness).
const BAD: i64 = 777;

const SCHEMA: &str = "
    CREATE TABLE plans (id bigint PRIMARY KEY, price bigint NOT NULL);
    CREATE TABLE subscriptions (account_id bigint PRIMARY KEY, plan_id bigint NOT NULL REFERENCES plans, seats bigint NOT NULL);
    CREATE INDEX ON subscriptions (plan_id);
    ALTER TABLE subscriptions REPLICA IDENTITY FULL;
    -- The CHECK is the data fault: an mrr above 10^9 cannot be stored (SQLSTATE 23514).
    CREATE TABLE account_mrr (account_id bigint PRIMARY KEY, mrr bigint NOT NULL CHECK (mrr <= 1000000000));
    INSERT INTO plans VALUES (1, 5), (2, 20);
    INSERT INTO subscriptions SELECT g, CASE WHEN g <= 50000 THEN 1 ELSE 2 END, 1 + g % 5 FROM generate_series(1, 51000) g;
    INSERT INTO account_mrr SELECT s.account_id, s.seats * p.price FROM subscriptions s JOIN plans p ON p.id = s.plan_id;";

/// Accounts whose derived row differs from a fresh computation.
async fn differing(c: &Client) -> Vec<i64> {
    c.query(
        "SELECT DISTINCT account_id FROM (
           (SELECT account_id, mrr FROM account_mrr
            EXCEPT SELECT s.account_id, s.seats * p.price FROM subscriptions s JOIN plans p ON p.id = s.plan_id)
           UNION
           (SELECT s.account_id, s.seats * p.price FROM subscriptions s JOIN plans p ON p.id = s.plan_id
            EXCEPT SELECT account_id, mrr FROM account_mrr)) d ORDER BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn mrr(c: &Client, account: i64) -> i64 {
    c.query_one(
        "SELECT mrr FROM account_mrr WHERE account_id = $1",
        &[&account],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until the refresher is idle and the accounts differing from the truth are
/// exactly `expected`.
async fn settled(c: &Client, handle: &Handle, expected: &[i64], what: &str) {
    eventually(240, what, || async {
        let s = handle.stats();
        if s.dirty != 0 || s.in_flight != 0 {
            return None;
        }
        (differing(c).await == expected).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_fan_out_settles_in_bulk_batches_and_isolates_a_failing_key() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let src = source(config(&pg, "bulk", &["plans", "subscriptions"])).await;
    let pool = connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 6).unwrap();
    // Each call costs at least 20 ms: the fan-out outpaces the rebuilds and a backlog
    // forms, as it does for 1M keys (BENCHMARKS.md, "fanout").
    let rebuild = SqlRebuild::builder(pool.clone())
        .statement("SELECT pg_sleep(0.02)")
        .statement("DELETE FROM account_mrr WHERE account_id = ANY($1)")
        .statement(
            "INSERT INTO account_mrr SELECT s.account_id, s.seats * p.price \
             FROM subscriptions s JOIN plans p ON p.id = s.plan_id WHERE s.account_id = ANY($1)",
        )
        .batch(1000)
        .bulk_batch(2000)
        .build()
        .await
        .unwrap();
    let fanout = SqlFanOut::builder(
        pool,
        "SELECT account_id FROM subscriptions WHERE plan_id = $1",
    )
    .arity(1)
    .parent_arity(1)
    .build()
    .await
    .unwrap();
    let table = |name: &'static str| move |e: &RowEvent| &*e.table == name;
    let (subs, plans) = (table("subscriptions"), table("plans"));
    let refresher = Refresher::builder()
        .source(src)
        .scope(move |e: &RowEvent| {
            let keys: Vec<Key> = if subs(e) {
                e.scope_keys(&["account_id"]).collect()
            } else {
                Vec::new()
            };
            keys
        })
        .fan_out(
            move |e: &RowEvent| {
                let keys: Vec<Key> = if plans(e) {
                    e.scope_keys(&["id"]).collect()
                } else {
                    Vec::new()
                };
                keys
            },
            fanout,
        )
        .rebuild_with(rebuild)
        .coalesce(Duration::from_millis(10))
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .poison_after(3)
        .build()
        .unwrap();
    let running = Running::spawn(refresher);
    let handle = running.handle.clone();

    // A clean fan-out: 50 000 accounts, in fewer calls than `rebuild_batch` allows.
    let before = handle.stats();
    c.batch_execute("UPDATE plans SET price = 10 WHERE id = 1")
        .await
        .unwrap();
    settled(&c, &handle, &[], "the first fan-out equals the truth").await;
    let s = handle.stats();
    let calls = s.rebuild_calls - before.rebuild_calls;
    assert!(
        s.fanout_keys - before.fanout_keys >= ACCOUNTS as u64,
        "every account of plan 1 was fanned: {s:?}"
    );
    assert!(
        s.rebuilds_ok - before.rebuilds_ok >= ACCOUNTS as u64,
        "every fanned account was rebuilt: {s:?}"
    );
    // How far calls grow depends on how far the fan-out outpaces the rebuilds (the
    // sizing itself is unit-tested in the core): never fewer than the keys need.
    assert!(
        calls >= (ACCOUNTS / 2000) as u64,
        "{calls} calls: none takes more than the bulk batch"
    );
    assert_eq!(s.rebuilds_failed, 0);

    // The witness: its seats change once (price 10: mrr 10^9, just storable), never again.
    c.batch_execute(&format!(
        "UPDATE subscriptions SET seats = 100000000 WHERE account_id = {BAD}"
    ))
    .await
    .unwrap();
    settled(&c, &handle, &[], "the witness's own change is rebuilt").await;
    assert_eq!(mrr(&c, BAD).await, 1_000_000_000);

    // Price 11: the witness's mrr no longer fits; its bulk batch fails, is retried in
    // halves, and only the witness ends in quarantine.
    let before = handle.stats();
    c.batch_execute("UPDATE plans SET price = 11 WHERE id = 1")
        .await
        .unwrap();
    settled(
        &c,
        &handle,
        &[BAD],
        "every account but the failing one settles",
    )
    .await;
    eventually(60, "the failing account is quarantined", || async {
        (handle.stats().keys_poisoned > before.keys_poisoned).then_some(())
    })
    .await;
    let quarantined: Vec<Key> = handle.quarantined().into_iter().map(|q| q.key).collect();
    assert_eq!(quarantined, vec![Key::from(BAD.to_string())]);
    assert_eq!(
        mrr(&c, BAD).await,
        1_000_000_000,
        "the failing rebuild rolled back: the witness keeps its last good row"
    );
    let s = handle.stats();
    assert!(
        s.rebuilds_failed - before.rebuilds_failed > 1,
        "a multi-key batch failed, then the witness alone: {s:?}"
    );
    assert!(s.rebuilds_ok - before.rebuilds_ok >= (ACCOUNTS - 1) as u64);
    // Halving isolates the witness in at most 2·11 calls of a batch of up to 2000 keys,
    // plus its retries alone; key by key, its batch alone would take one call per key.
    let failing = s.rebuild_calls - before.rebuild_calls;
    assert!(
        failing <= calls + 2 * 11 + 3 + 20,
        "{failing} calls with a failing key against {calls} without: {s:?}"
    );
    running.stop().await;
}
