//! SqlRebuild and SqlEnumerate against a real server: typed parameters from stream
//! key texts, NULL parts, batch statements over arrays, keys that match the stream's,
//! and the visibility check holding a rebuild until the dirtying commit is visible.

use crate::support;

use std::time::Duration;

use freshen::{Due, Key, Value};
use freshen_postgres::{ConnectionConfig, ErrorKind, SqlEnumerate, SqlRebuild, connect_pool};
use freshen_testenv::PgServer;
use support::*;

fn pool(pg: &PgServer) -> freshen_postgres::Pool {
    connect_pool(&ConnectionConfig::from_url(&pg.url()).unwrap(), 4).unwrap()
}

fn due(key: Key) -> Due {
    Due {
        key,
        txids: Vec::new(),
    }
}

#[tokio::test]
async fn stream_key_texts_bind_as_typed_parameters_and_match_enumerated_keys() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE src (i2 int2, i4 int4, i8 int8, t text, vc varchar(10), u uuid,
             n numeric, b bool, d date, ts timestamp, tz timestamptz, id serial PRIMARY KEY);
         CREATE TABLE found (what text, n int8);",
    )
    .await
    .unwrap();
    let mut src = source(config(&pg, "keys", &["src"])).await;
    c.batch_execute(
        "INSERT INTO src VALUES (-3, 70000, 9000000000, 'it''s', 'v,\"c', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
             12.50, true, '2024-02-29', '2024-01-02 03:04:05.5', '2024-01-02 03:04:05+02');
         INSERT INTO src (i4, t) VALUES (1, NULL);",
    )
    .await
    .unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let cols = ["i2", "i4", "i8", "t", "vc", "u", "n", "b", "d", "ts", "tz"];
    let key = evs[0]
        .new
        .as_ref()
        .unwrap()
        .key(&cols)
        .expect("a key from the stream");

    // Per key: every part binds to its column's type.
    let rebuild = SqlRebuild::builder(pool(&pg))
        .statement(
            "INSERT INTO found SELECT 'all', count(*) FROM src WHERE i2 = $1 AND i4 = $2 AND i8 = $3
               AND t = $4 AND vc = $5 AND u = $6 AND n = $7 AND b = $8 AND d = $9 AND ts = $10 AND tz = $11",
        )
        .build()
        .await
        .unwrap();
    rebuild.run(&[due(key.clone())]).await.unwrap();
    let n: i64 = c
        .query_one("SELECT n FROM found WHERE what = 'all'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        n, 1,
        "the stream's text forms parse back to the same values"
    );

    // A NULL part binds NULL.
    let null_key = evs[1].new.as_ref().unwrap().key(&["t"]).unwrap();
    assert_eq!(null_key, Key::from_parts([None::<&str>]));
    let nulls = SqlRebuild::builder(pool(&pg))
        .statement(
            "INSERT INTO found SELECT 'null', count(*) FROM src WHERE t IS NOT DISTINCT FROM $1",
        )
        .build()
        .await
        .unwrap();
    nulls.run(&[due(null_key.clone())]).await.unwrap();
    let n: i64 = c
        .query_one("SELECT n FROM found WHERE what = 'null'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);

    // A bad key part is a clear error, not a server round trip.
    let bad = rebuild
        .run(&[due(Key::from_parts([Some("x"); 11]))])
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("not a valid int2"), "{bad}");

    // Enumerated keys equal streamed keys for the same rows.
    let listed = SqlEnumerate::new(
        pool(&pg),
        format!("SELECT {} FROM src ORDER BY id;", cols.join(", ")),
    )
    .collect()
    .await
    .unwrap();
    assert_eq!(listed[0], key);
    let listed_t = SqlEnumerate::new(pool(&pg), "SELECT t FROM src ORDER BY id")
        .collect()
        .await
        .unwrap();
    assert_eq!(listed_t[1], null_key);
}

#[tokio::test]
async fn batch_statements_run_over_arrays() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE readings (dev int, site text, v int);
         INSERT INTO readings VALUES (1, 'a', 10), (1, 'a', 5), (2, 'b', 7), (3, NULL, 1);
         CREATE TABLE rollup (dev int, site text, total int);
         INSERT INTO rollup VALUES (9, 'gone', 99);",
    )
    .await
    .unwrap();
    let rebuild = SqlRebuild::builder(pool(&pg))
        .batch(100)
        .statement(
            "DELETE FROM rollup WHERE (dev, site) IN (SELECT * FROM unnest($1::int[], $2::text[]))
               OR (site IS NULL AND dev = ANY($1))",
        )
        .statement(
            "INSERT INTO rollup SELECT dev, site, sum(v) FROM readings
             WHERE (dev, coalesce(site, '')) IN (SELECT d, coalesce(s, '') FROM unnest($1::int[], $2::text[]) AS k(d, s))
             GROUP BY dev, site",
        )
        .build()
        .await
        .unwrap();
    let keys = [
        Key::from_parts([Some("1"), Some("a")]),
        Key::from_parts([Some("2"), Some("b")]),
        Key::from_parts([Some("3"), None]),
        Key::from_parts([Some("9"), Some("gone")]),
    ];
    let dues: Vec<Due> = keys.into_iter().map(due).collect();
    rebuild.run(&dues).await.unwrap();
    let rows: Vec<(i32, Option<String>, i64)> = c
        .query(
            "SELECT dev, site, total::int8 FROM rollup ORDER BY dev",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            (1, Some("a".into()), 15),
            (2, Some("b".into()), 7),
            (3, None, 1)
        ]
    );

    // Statements that do not suit the mode are refused when built.
    let scalar_in_batch = SqlRebuild::builder(pool(&pg))
        .batch(10)
        .statement("DELETE FROM rollup WHERE dev = $1")
        .build()
        .await
        .unwrap_err();
    assert!(
        scalar_in_batch.to_string().contains("ANY($1)"),
        "{scalar_in_batch}"
    );
    let array_per_key = SqlRebuild::builder(pool(&pg))
        .statement("DELETE FROM rollup WHERE dev = ANY($1::int[])")
        .build()
        .await
        .unwrap_err();
    assert!(
        array_per_key.to_string().contains("batch mode"),
        "{array_per_key}"
    );
}

#[tokio::test]
async fn a_call_past_a_batch_runs_the_set_statements() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE readings (dev int, v int);
         INSERT INTO readings SELECT d, d * 10 FROM generate_series(1, 40) AS d;
         CREATE TABLE rollup (dev int PRIMARY KEY, total int, by text);
         INSERT INTO rollup VALUES (99, 1, 'old');",
    )
    .await
    .unwrap();
    // Per key: delete and insert, marked `key`. The set statements write only the rows
    // that differ and mark them `set`.
    let rebuild = SqlRebuild::builder(pool(&pg))
        .keys_per_transaction(4)
        .statement("DELETE FROM rollup WHERE dev = $1")
        .statement("INSERT INTO rollup SELECT dev, sum(v), 'key' FROM readings WHERE dev = $1 GROUP BY dev")
        .set_statements([
            "DELETE FROM rollup r WHERE r.dev = ANY($1) AND NOT EXISTS (SELECT 1 FROM readings s WHERE s.dev = r.dev)",
            "INSERT INTO rollup SELECT dev, sum(v), 'set' FROM readings WHERE dev = ANY($1) GROUP BY dev
             ON CONFLICT (dev) DO UPDATE SET total = excluded.total, by = excluded.by
             WHERE rollup.total IS DISTINCT FROM excluded.total",
        ])
        .build()
        .await
        .unwrap();
    assert_eq!(freshen::Rebuild::max_batch(&rebuild), 4);
    assert!(
        freshen::Rebuild::bulk_batch(&rebuild) > 4,
        "set statements let a backlog's calls grow"
    );
    let keys = |range: std::ops::RangeInclusive<i32>| -> Vec<Due> {
        range
            .map(|d| due(Key::from(d.to_string().as_str())))
            .collect()
    };
    // A call within a batch runs the per-key statements.
    rebuild.run(&keys(1..=4)).await.unwrap();
    // A larger one runs the set statements: its keys 1..=4 are unchanged (written by the
    // per-key call) and stay so, 99 vanished.
    let mut large = keys(1..=40);
    large.push(due(Key::from("99")));
    rebuild.run(&large).await.unwrap();
    let rows: Vec<(i32, i32, String)> = c
        .query("SELECT dev, total, by FROM rollup ORDER BY dev", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want: Vec<(i32, i32, String)> = (1..=40)
        .map(|d| (d, d * 10, if d <= 4 { "key" } else { "set" }.to_string()))
        .collect();
    assert_eq!(rows, want);

    // A set statement that fails says which key it came from: `rebuild_set`.
    c.batch_execute("ALTER TABLE rollup ADD CHECK (total <> 301)")
        .await
        .unwrap();
    c.batch_execute("UPDATE readings SET v = v + 1")
        .await
        .unwrap();
    let e = rebuild.run(&keys(1..=40)).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("rebuild_set statement 2 failed for a batch of 40 keys"),
        "{e}"
    );

    // Set statements that take a scalar are refused, with the own statements' problems
    // in the same error.
    let e = SqlRebuild::builder(pool(&pg))
        .batch(10)
        .statement("DELETE FROM rollup WHERE dev = $1")
        .set_statements(["DELETE FROM rollup WHERE dev = $1"])
        .build()
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("set statements") && text.matches("ANY($1)").count() == 2,
        "{text}"
    );
}

#[tokio::test]
async fn a_rebuild_waits_until_the_dirtying_commit_is_visible() {
    // A synchronous standby that never connects: a committing backend writes and flushes
    // its commit record (so logical decoding ships it) and then waits for the standby
    // before it leaves the proc array — the commit is in the stream but not yet visible.
    let pg = PgServer::builder()
        .setting("synchronous_standby_names", "ghost")
        .setting("synchronous_commit", "local")
        .start()
        .expect("PostgreSQL for this test");
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE readings (dev text, v int);
         ALTER TABLE readings REPLICA IDENTITY FULL;
         CREATE TABLE rollup (dev text PRIMARY KEY, total int8);",
    )
    .await
    .unwrap();
    let mut src = source(config(&pg, "vis", &["readings"])).await;

    let writer = sql(&pg).await;
    let writer_pid: i32 = writer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let stuck = tokio::spawn(async move {
        writer
            .batch_execute("SET synchronous_commit = on; INSERT INTO readings VALUES ('d1', 42)")
            .await
    });

    // The commit arrives through logical decoding…
    let evs = events(&take_events(&mut src, 1, 20).await);
    let ev = &evs[0];
    assert_eq!(ev.new.as_ref().unwrap().get("v"), Some(&Value::Int(42)));
    let txid = ev.tx.unwrap().id;
    // …while new snapshots do not see it yet: the window is really open.
    let visible: i64 = c
        .query_one("SELECT count(*) FROM readings", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(visible, 0, "the shipped commit is not visible yet");
    assert!(!stuck.is_finished(), "the writer waits for the standby");

    let statements = [
        "DELETE FROM rollup WHERE dev = $1",
        "INSERT INTO rollup SELECT dev, sum(v) FROM readings WHERE dev = $1 GROUP BY dev",
    ];
    let key = Key::from("d1");
    let dirty = Due {
        key: key.clone(),
        txids: vec![txid],
    };

    // Without the check the rebuild would run now and miss the change.
    let unchecked = SqlRebuild::builder(pool(&pg))
        .statements(statements)
        .check_visibility(false)
        .build()
        .await
        .unwrap();
    unchecked.run(std::slice::from_ref(&dirty)).await.unwrap();
    let rows: i64 = c
        .query_one("SELECT count(*) FROM rollup", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 0,
        "an unchecked rebuild misses the change (the hazard)"
    );

    // With the check, a short wait fails the rebuild (the core's backoff retries)…
    let checked = SqlRebuild::builder(pool(&pg))
        .statements(statements)
        .visibility_wait(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let err = checked.run(std::slice::from_ref(&dirty)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotVisible);
    assert_eq!(err.retry(), freshen::Retry::Path);
    assert!(err.to_string().contains(&txid.to_string()), "{err}");

    // …and a longer one succeeds as soon as the commit becomes visible.
    let patient = SqlRebuild::builder(pool(&pg))
        .statements(statements)
        .visibility_wait(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { patient.run(&[dirty]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the rebuild holds while the commit is invisible"
    );
    // Release the writer: cancelling the wait leaves the commit in place and visible.
    let cancelled: bool = c
        .query_one("SELECT pg_cancel_backend($1)", &[&writer_pid])
        .await
        .unwrap()
        .get(0);
    assert!(cancelled);
    waiting
        .await
        .unwrap()
        .expect("the rebuild succeeds once the commit is visible");
    let total: i64 = c
        .query_one("SELECT total FROM rollup WHERE dev = 'd1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(total, 42);
    let _ = stuck.await;
}

#[tokio::test]
async fn several_keys_share_one_pipelined_transaction_and_fail_together() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE r (device text, value int);
         CREATE TABLE totals (device text PRIMARY KEY, total bigint NOT NULL);
         INSERT INTO r VALUES ('a', 1), ('a', 2), ('b', 5), ('c', 7);",
    )
    .await
    .unwrap();
    let rebuild = SqlRebuild::builder(pool(&pg))
        .statement("DELETE FROM totals WHERE device = $1")
        .statement(
            "INSERT INTO totals SELECT device, sum(value) FROM r WHERE device = $1 GROUP BY device",
        )
        .keys_per_transaction(8)
        .build()
        .await
        .unwrap();
    assert_eq!(freshen::Rebuild::max_batch(&rebuild), 8);
    let keys: Vec<Due> = ["a", "b", "c"].map(|k| due(Key::from(k))).into();
    rebuild.run(&keys).await.unwrap();
    let rows: Vec<(String, i64)> = c
        .query("SELECT device, total FROM totals ORDER BY device", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [("a".into(), 3), ("b".into(), 5), ("c".into(), 7)]);

    // One key whose statement fails undoes the whole transaction: nothing half-done.
    c.batch_execute("INSERT INTO r VALUES ('a', 10); ALTER TABLE totals ADD CHECK (total < 100); INSERT INTO r VALUES ('c', 500)")
        .await
        .unwrap();
    let err = rebuild.run(&keys).await.unwrap_err();
    assert!(
        err.to_string().contains("failed for one of 3 keys"),
        "the key's value is the refresher's to report, shown as [[redact]] says: {err}"
    );
    let a: i64 = c
        .query_one("SELECT total FROM totals WHERE device = 'a'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(a, 3, "key a's rebuild was rolled back with c's failure");
}
