//! SqlFanOut and the dependency discovery against a real server: parent keys mapped
//! page by page, the visibility check holding a fan-out until the change is visible,
//! and the relations a statement reads through views, partitions and functions.

use crate::support;

use std::time::Duration;

use freshen::{Due, Key};
use freshen_postgres::depends::{KeyedTable, propose_watch, relations};
use freshen_postgres::{ConnectionConfig, ErrorKind, SqlFanOut, TableName, connect_pool};
use freshen_testenv::PgServer;
use support::*;

fn pool(pg: &PgServer) -> freshen_postgres::Pool {
    connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 4).unwrap()
}

fn due(key: &str) -> Due {
    Due {
        key: Key::from(key),
        txids: Vec::new(),
    }
}

const SUBS: &str = "CREATE TABLE plans (id bigint PRIMARY KEY, price int NOT NULL);
     CREATE TABLE subscriptions (id bigserial PRIMARY KEY, account_id bigint NOT NULL,
                                 plan_id bigint NOT NULL REFERENCES plans);
     INSERT INTO plans VALUES (1, 10), (2, 20), (3, 30);
     INSERT INTO subscriptions (account_id, plan_id)
       SELECT g, CASE WHEN g <= 100 THEN 1 ELSE 2 END FROM generate_series(1, 103) g;";

#[tokio::test]
async fn a_fan_out_estimates_how_many_keys_a_parent_reaches() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SUBS).await.unwrap();
    c.batch_execute("ANALYZE subscriptions").await.unwrap();
    let fanout = SqlFanOut::builder(
        pool(&pg),
        "SELECT account_id FROM subscriptions WHERE plan_id = $1",
    )
    .arity(1)
    .parent_arity(1)
    .build()
    .await
    .unwrap();
    // The planner's estimates from the column's statistics: plan 1 holds 100 of the
    // 103 rows, plan 2 three, plan 3 none (the planner says at least one row).
    let one = fanout.estimate(&[due("1")]).await.unwrap();
    let two = fanout.estimate(&[due("2")]).await.unwrap();
    assert!((90..=110).contains(&one), "{one}");
    assert!((1..=10).contains(&two), "{two}");
    let both = fanout
        .estimate(&[due("1"), due("2"), due("3")])
        .await
        .unwrap();
    assert!(both >= one + two, "summed over the parents: {both}");
}

#[tokio::test]
async fn parent_keys_map_to_view_keys_page_by_page() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SUBS).await.unwrap();
    let fanout = SqlFanOut::builder(
        pool(&pg),
        "SELECT account_id FROM subscriptions WHERE plan_id = $1",
    )
    .arity(1)
    .parent_arity(1)
    .fetch_size(7)
    .build()
    .await
    .unwrap();
    let mut keys = Vec::new();
    let all = fanout
        .run(&[due("1"), due("2"), due("3")], |k| {
            keys.push(k);
            std::future::ready(true)
        })
        .await
        .unwrap();
    assert!(all);
    let mut got: Vec<i64> = keys
        .iter()
        .map(|k| k.as_str().unwrap().parse().unwrap())
        .collect();
    got.sort();
    assert_eq!(
        got,
        (1..=103).collect::<Vec<_>>(),
        "100 keys over 15 pages, and 3 more"
    );

    // A consumer that stops (the refresher shutting down) stops the fan-out.
    let mut n = 0;
    let all = fanout
        .run(&[due("1")], |_| {
            n += 1;
            std::future::ready(n < 10)
        })
        .await
        .unwrap();
    assert!(!all);
    assert_eq!(n, 10);

    // A parent key that cannot be the parameter's type says so.
    let err = fanout
        .run(&[due("basic")], |_| std::future::ready(true))
        .await;
    let err = err.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        err.to_string().contains("not a valid int8") && !err.to_string().contains("basic"),
        "{err}"
    );

    // A statement that does not return the view's key is refused when built.
    let wide = SqlFanOut::builder(
        pool(&pg),
        "SELECT account_id, id FROM subscriptions WHERE plan_id = $1",
    )
    .arity(1)
    .build()
    .await
    .unwrap_err();
    assert!(
        wide.to_string()
            .contains("returns 2 column(s) but the view's key has 1"),
        "{wide}"
    );
}

#[tokio::test]
async fn a_fan_out_waits_until_the_parents_change_is_visible() {
    // A synchronous standby that never connects holds a commit out of the proc array
    // (see sql_helpers.rs): the change is "in the stream" but not visible yet.
    let pg = PgServer::builder()
        .setting("synchronous_standby_names", "ghost")
        .setting("synchronous_commit", "local")
        .start()
        .expect("PostgreSQL for this test");
    let c = sql(&pg).await;
    c.batch_execute(SUBS).await.unwrap();
    let writer = sql(&pg).await;
    let pid: i32 = writer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    writer
        .batch_execute("SET synchronous_commit = on; BEGIN; INSERT INTO subscriptions (account_id, plan_id) VALUES (500, 3)")
        .await
        .unwrap();
    let xid: String = writer
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    let stuck = tokio::spawn(async move { writer.batch_execute("COMMIT").await });
    let dirty = Due {
        key: Key::from("3"),
        txids: vec![xid.parse().unwrap()],
    };
    let build = |wait| {
        SqlFanOut::builder(
            pool(&pg),
            "SELECT account_id FROM subscriptions WHERE plan_id = $1",
        )
        .visibility_wait(wait)
        .build()
    };
    let hasty = build(Duration::from_millis(300)).await.unwrap();
    let err = hasty
        .run(std::slice::from_ref(&dirty), |_| std::future::ready(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotVisible, "{err}");
    assert!(!stuck.is_finished());

    let patient = build(Duration::from_secs(30)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let mut keys = Vec::new();
        patient
            .run(&[dirty], |k| {
                keys.push(k);
                std::future::ready(true)
            })
            .await
            .map(|_| keys)
    });
    // The fan-out is checking its snapshot again and again, and has sent nothing.
    freshen_testenv::refresher::eventually(10, "the fan-out polls visibility", || {
        let c = &c;
        async move {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_visible_in_snapshot%' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (n > 0).then_some(())
        }
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "the fan-out holds while the change is invisible"
    );
    c.query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap();
    let keys = waiting.await.unwrap().unwrap();
    assert_eq!(keys, vec![Key::from("500")], "the new subscription is seen");
}

#[tokio::test]
async fn the_relations_a_statement_reads_come_from_its_plan() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(SUBS).await.unwrap();
    c.batch_execute(
        "CREATE TABLE countries (code text PRIMARY KEY, name text);
         CREATE VIEW priced AS SELECT s.account_id, p.price FROM subscriptions s JOIN plans p ON p.id = s.plan_id;
         CREATE TABLE events (id int, at date NOT NULL, account_id bigint) PARTITION BY RANGE (at);
         CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
         CREATE FUNCTION country_count() RETURNS bigint LANGUAGE sql STABLE
           BEGIN ATOMIC SELECT count(*) FROM countries; END;
         CREATE TABLE mrr (account_id bigint PRIMARY KEY, mrr bigint, n bigint, countries bigint);",
    )
    .await
    .unwrap();
    let client = pool(&pg).get().await.unwrap();
    let r = relations(
        &client,
        "INSERT INTO mrr SELECT account_id, sum(price), (SELECT count(*) FROM events e WHERE e.account_id = $1), country_count()
           FROM priced WHERE account_id = $1 GROUP BY account_id",
    )
    .await
    .unwrap();
    let t = |n: &str| TableName::new("public", n);
    assert_eq!(
        r.reads,
        vec![t("countries"), t("events"), t("plans"), t("subscriptions")],
        "through the view, the partition's root and the function's body"
    );
    assert_eq!(r.writes, vec![t("mrr")]);
    assert!(r.opaque_functions.is_empty(), "{:?}", r.opaque_functions);

    // A PL/pgSQL body hides its reads: named, so check can warn.
    c.batch_execute(
        "CREATE FUNCTION hidden() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT count(*) FROM countries); END $$;",
    )
    .await
    .unwrap();
    let r = relations(&client, "SELECT hidden() FROM plans WHERE id = $1")
        .await
        .unwrap();
    assert_eq!(r.opaque_functions, vec!["public.hidden".to_string()]);

    // The connection is left as it was: no open transaction, nothing prepared.
    let again = relations(&client, "DELETE FROM mrr WHERE account_id = $1")
        .await
        .unwrap();
    assert_eq!(again.writes, vec![t("mrr")]);

    // plans reaches the key through subscriptions' foreign key.
    let keyed = [KeyedTable {
        table: t("subscriptions"),
        key: vec!["account_id".into()],
    }];
    let proposal = propose_watch(&client, &t("plans"), &keyed).await.unwrap();
    assert_eq!(
        proposal.as_deref(),
        Some(
            "{ table = \"public.plans\", key = [\"id\"], keys = \"SELECT account_id FROM public.subscriptions WHERE plan_id = $1\" }"
        )
    );
    // events carries the key column itself.
    let proposal = propose_watch(&client, &t("events"), &keyed).await.unwrap();
    assert_eq!(
        proposal.as_deref(),
        Some("{ table = \"public.events\", key = [\"account_id\"] }")
    );
    assert_eq!(
        propose_watch(&client, &t("countries"), &keyed)
            .await
            .unwrap(),
        None
    );
}
