//! Set statements on a real MariaDB: a call past `keys_per_transaction` binds each key
//! part of every key as one JSON array, read with `JSON_TABLE`, and runs the set
//! statements once; a smaller call runs the per-key statements.

use crate::support;

use freshen::{Due, Key, Rebuild};
use freshen_mysql::{KeyType, MySqlRebuild, connect_pool};
use mysql_async::prelude::Queryable;
use support::*;

fn due(key: &str) -> Due {
    Due {
        key: Key::from(key),
        txids: Vec::new(),
    }
}

/// `$1` as a table of keys.
const KEYS: &str = "JSON_TABLE($1, '$[*]' COLUMNS (dev BIGINT PATH '$')) AS k";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_a_batch_runs_the_set_statements_over_json_arrays() {
    let db = server();
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "CREATE TABLE app.readings (id INT AUTO_INCREMENT PRIMARY KEY, dev BIGINT, v INT);
         INSERT INTO app.readings (dev, v) SELECT seq, seq * 10 FROM seq_1_to_40;
         INSERT INTO app.readings (dev, v) VALUES (9007199254740993, 1);
         CREATE TABLE app.rollup (dev BIGINT PRIMARY KEY, total BIGINT, written_by TEXT);
         INSERT INTO app.rollup VALUES (99, 1, 'old')",
    )
    .await;
    let pool = connect_pool(&db.url("app"), 2).unwrap();
    // Per key: delete and insert, marked `key`. The set statements write only the rows
    // that differ and mark them `set`.
    let rebuild = MySqlRebuild::builder(pool)
        .key_types([KeyType::Int])
        .keys_per_transaction(4)
        .statement("DELETE FROM app.rollup WHERE dev = $1")
        .statement(
            "INSERT INTO app.rollup SELECT dev, sum(v), 'key' FROM app.readings WHERE dev = $1 GROUP BY dev",
        )
        .set_statements([
            format!(
                "DELETE r FROM app.rollup r JOIN {KEYS} ON r.dev = k.dev
                 WHERE NOT EXISTS (SELECT 1 FROM app.readings s WHERE s.dev = r.dev)"
            ),
            format!(
                "INSERT INTO app.rollup SELECT s.dev, sum(s.v), 'set' FROM app.readings s JOIN {KEYS} ON s.dev = k.dev
                 GROUP BY s.dev
                 ON DUPLICATE KEY UPDATE written_by = IF(total <=> VALUES(total), written_by, 'set'),
                   total = VALUES(total)"
            ),
        ])
        .build()
        .await
        .unwrap();
    assert_eq!(rebuild.max_batch(), 4);
    assert!(
        rebuild.bulk_batch() > 4,
        "set statements let a backlog's calls grow"
    );
    let keys = |range: std::ops::RangeInclusive<u32>| -> Vec<Due> {
        range.map(|d| due(&d.to_string())).collect()
    };
    // A call within a batch runs the per-key statements.
    rebuild.run(&keys(1..=4)).await.unwrap();
    // A larger one runs the set statements: keys 1..=4 are unchanged and stay so, 99
    // vanished, and a key above 2^53 is matched exactly (a JSON number, not a double).
    let mut large = keys(1..=40);
    large.push(due("99"));
    large.push(due("9007199254740993"));
    rebuild.run(&large).await.unwrap();
    let rows: Vec<(u64, i64, String)> = c
        .query("SELECT dev, total, written_by FROM app.rollup ORDER BY dev")
        .await
        .unwrap();
    let mut want: Vec<(u64, i64, String)> = (1..=40u64)
        .map(|d| {
            (
                d,
                d as i64 * 10,
                if d <= 4 { "key" } else { "set" }.to_string(),
            )
        })
        .collect();
    want.push((9_007_199_254_740_993, 1, "set".into()));
    assert_eq!(rows, want);

    // A key part that is not a valid integer fails the set call, without its value in
    // the message (the refresher then splits the call down to the key).
    let mut bad = keys(1..=10);
    bad.push(due("not-a-number"));
    let e = rebuild.run(&bad).await.unwrap_err().to_string();
    assert!(
        e.contains("not a valid int")
            && !e.contains("not-a-number")
            && e.starts_with("rebuild_set statement"),
        "{e}"
    );

    // A set statement that fails names the key it came from: `rebuild_set`.
    exec(
        &mut c,
        "ALTER TABLE app.rollup ADD CONSTRAINT not_301 CHECK (total <> 301);
         UPDATE app.readings SET v = v + 1",
    )
    .await;
    let e = rebuild.run(&keys(1..=40)).await.unwrap_err().to_string();
    assert!(
        e.starts_with("rebuild_set statement 2 failed for a set of 40 keys"),
        "{e}"
    );
}
