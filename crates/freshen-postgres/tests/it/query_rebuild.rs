//! QueryRebuild against a real server: a batch of keys becomes one set-based statement
//! that rewrites only rows whose values changed (their `xmin` stays put otherwise),
//! deletes the rows of keys the query no longer returns, works over composite keys,
//! lists every mismatch between the query and the target, and waits, like hand-written
//! rebuilds, for the transactions that dirtied its keys to be visible.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use freshen::{Due, Key, Rebuild};
use freshen_postgres::{ConnectionConfig, ErrorKind, QueryRebuild, TableName, connect_pool};
use freshen_testenv::PgServer;
use support::*;
use tokio_postgres::Client;

fn pool(pg: &PgServer) -> freshen_postgres::Pool {
    connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 4).unwrap()
}

fn due(key: &str) -> Due {
    Due {
        key: Key::from(key),
        txids: Vec::new(),
    }
}

const SCHEMA: &str = "
CREATE TABLE readings (id serial PRIMARY KEY, device int NOT NULL, value int NOT NULL);
CREATE INDEX ON readings (device);
CREATE TABLE device_totals (device int PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
INSERT INTO readings (device, value) SELECT 1 + g % 4, g FROM generate_series(1, 40) g;
";

const QUERY: &str = "SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings WHERE device = ANY($1) GROUP BY device";

async fn totals(pg: &PgServer) -> QueryRebuild {
    QueryRebuild::builder(
        pool(pg),
        TableName::new("public", "device_totals"),
        vec!["device".into()],
        QUERY,
    )
    .build()
    .await
    .unwrap()
}

/// device → (total, n, xmin) of the target.
async fn target(c: &Client) -> BTreeMap<i32, (i64, i64, String)> {
    c.query(
        "SELECT device, total, n, xmin::text FROM device_totals",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
    .collect()
}

async fn truth(c: &Client) -> BTreeMap<i32, (i64, i64)> {
    c.query(
        "SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), (r.get(1), r.get(2))))
    .collect()
}

fn values(t: &BTreeMap<i32, (i64, i64, String)>) -> BTreeMap<i32, (i64, i64)> {
    t.iter().map(|(k, (a, b, _))| (*k, (*a, *b))).collect()
}

#[tokio::test]
async fn only_changed_rows_are_rewritten_and_vanished_keys_are_deleted() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let rebuild = totals(&pg).await;
    assert_eq!(rebuild.max_batch(), freshen_postgres::DEFAULT_QUERY_BATCH);
    // Device 9 has no readings: nothing to write, nothing to delete.
    let all: Vec<Due> = ["1", "2", "3", "4", "9"].into_iter().map(due).collect();
    rebuild.run(&all).await.unwrap();
    let before = target(&c).await;
    assert_eq!(values(&before), truth(&c).await);
    assert_eq!(before.len(), 4);

    // Device 1: two readings swap values (its sum and count stay); device 2: one value
    // changes; device 3: every reading goes; device 4: untouched.
    c.batch_execute(
        "UPDATE readings SET value = CASE id WHEN 4 THEN 8 ELSE 4 END WHERE id IN (4, 8);
         UPDATE readings SET value = value + 1 WHERE id = 1;
         DELETE FROM readings WHERE device = 3;",
    )
    .await
    .unwrap();
    let devices: Vec<i32> = c
        .query_one(
            "SELECT array_agg(device ORDER BY id) FROM readings WHERE id IN (1, 4, 8)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        devices,
        [2, 1, 1],
        "ids 4 and 8 are device 1's, id 1 device 2's"
    );
    rebuild.run(&all).await.unwrap();
    let after = target(&c).await;
    assert_eq!(values(&after), truth(&c).await, "the target equals truth");
    assert!(
        !after.contains_key(&3),
        "a key whose rows all vanished loses its row"
    );
    assert_eq!(
        after[&1].2, before[&1].2,
        "an unchanged aggregate is not rewritten (same xmin: no new tuple)"
    );
    assert_eq!(
        after[&4].2, before[&4].2,
        "an untouched key is not rewritten"
    );
    assert_ne!(
        after[&2].2, before[&2].2,
        "a changed aggregate is rewritten"
    );
    assert_eq!(after[&2].0, before[&2].0 + 1);

    // A key that comes back is inserted again.
    c.batch_execute("INSERT INTO readings (device, value) VALUES (3, 5)")
        .await
        .unwrap();
    rebuild.run(&[due("3")]).await.unwrap();
    assert_eq!(values(&target(&c).await), truth(&c).await);
}

#[tokio::test]
async fn a_composite_key_is_bound_as_one_array_per_part() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE sales (id serial PRIMARY KEY, region text NOT NULL, day date NOT NULL, amount numeric NOT NULL);
         CREATE TABLE daily (region text, day date, total numeric, note text DEFAULT 'x', PRIMARY KEY (region, day));
         INSERT INTO sales (region, day, amount) VALUES
           ('eu', '2024-01-01', 1.5), ('eu', '2024-01-01', 2), ('us', '2024-01-01', 7), ('eu', '2024-01-02', 3);
         INSERT INTO daily (region, day, total) VALUES ('ap', '2024-01-01', 99);",
    )
    .await
    .unwrap();
    let rebuild = QueryRebuild::builder(
        pool(&pg),
        TableName::new("public", "daily"),
        vec!["region".into(), "day".into()],
        "SELECT region, day, sum(amount) AS total FROM sales \
         WHERE (region, day) IN (SELECT * FROM unnest($1::text[], $2::date[])) GROUP BY region, day",
    )
    .batch(2)
    .build()
    .await
    .unwrap();
    assert_eq!(rebuild.max_batch(), 2, "the batch setting is honoured");
    let key = |r: &str, d: &str| Due {
        key: Key::from_parts([Some(r), Some(d)]),
        txids: Vec::new(),
    };
    rebuild
        .run(&[key("eu", "2024-01-01"), key("ap", "2024-01-01")])
        .await
        .unwrap();
    rebuild.run(&[key("us", "2024-01-01")]).await.unwrap();
    let rows: Vec<(String, String, String)> = c
        .query(
            "SELECT region, day::text, total::text FROM daily ORDER BY region, day",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("eu".into(), "2024-01-01".into(), "3.5".into()),
            ("us".into(), "2024-01-01".into(), "7".into()),
        ],
        "ap's row went (its key was in the batch, the query no longer returns it); eu 01-02 was not asked for"
    );
}

#[tokio::test]
async fn every_mismatch_with_the_target_is_listed() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE readings (id serial PRIMARY KEY, device int NOT NULL, value int NOT NULL);
         CREATE TABLE loose (device int, total bigint, label text NOT NULL, at timestamptz);",
    )
    .await
    .unwrap();
    let err = QueryRebuild::builder(
        pool(&pg),
        TableName::new("public", "loose"),
        vec!["device".into()],
        "SELECT 'd' || device AS device, sum(value)::bigint AS totl, now()::date::text AS at \
         FROM readings WHERE device = ANY($1) GROUP BY device",
    )
    .build()
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let text = err.to_string();
    for want in [
        "the query returns `totl`, which the target table does not have (did you mean `total`?)",
        "public.loose.label is NOT NULL without a default, and the query does not return it",
        "public.loose has no primary key or unique index on (device)",
        "column `device`: the query returns text, which does not fit public.loose.device (integer)",
        "column `at`: the query returns text, which does not fit public.loose.at (timestamp with time zone)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let err = QueryRebuild::builder(
        pool(&pg),
        TableName::new("public", "nowhere"),
        vec!["device".into()],
        "SELECT device FROM readings WHERE device = $1",
    )
    .build()
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("one array per key part (\"device\" = ANY($1)): $1 is int4"),
        "{text}"
    );
    assert!(
        text.contains("the target table public.nowhere does not exist"),
        "{text}"
    );
}

#[tokio::test]
async fn a_rebuild_waits_for_the_transactions_that_dirtied_its_keys() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let mut writer = sql(&pg).await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute("INSERT INTO readings (device, value) VALUES (1, 1000)")
        .await
        .unwrap();
    let txid: i64 = tx
        .query_one("SELECT pg_current_xact_id()::text::int8", &[])
        .await
        .unwrap()
        .get(0);
    let dirty = Due {
        key: Key::from("1"),
        txids: vec![txid as u64],
    };
    let impatient = QueryRebuild::builder(
        pool(&pg),
        TableName::new("public", "device_totals"),
        vec!["device".into()],
        QUERY,
    )
    .visibility_wait(Duration::from_millis(200))
    .build()
    .await
    .unwrap();
    let err = impatient
        .run(std::slice::from_ref(&dirty))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotVisible, "{err}");
    let boxed: freshen::BoxError = Box::new(err);
    assert_eq!(
        impatient.classify(&boxed),
        freshen::Retry::Path,
        "an invisible change delays the key, never poisons it"
    );
    assert!(target(&c).await.is_empty(), "nothing was written");
    tx.commit().await.unwrap();
    impatient.run(&[dirty]).await.unwrap();
    assert_eq!(values(&target(&c).await), {
        let mut t = truth(&c).await;
        t.retain(|k, _| *k == 1);
        t
    });
}
