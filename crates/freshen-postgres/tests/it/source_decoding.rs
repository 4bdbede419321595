//! What the source decodes from a real server: types, NULL vs unchanged TOAST, the
//! three UPDATE image shapes, TRUNCATE, transaction metadata.

use crate::support;

use freshen::{BeforeImage, Key, Op, Source, Value};
use support::*;

#[tokio::test]
async fn decodes_types_images_and_transactions() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE typed (id int8 PRIMARY KEY, b bool, i2 int2, i4 int4, f8 float8, f4 float4,
             n numeric, t text, j jsonb, by bytea, u uuid, d date, ts timestamptz, nul text);
         CREATE TABLE docs (id int PRIMARY KEY, grp text, body text);
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
         CREATE TABLE full_docs (id int PRIMARY KEY, grp text, body text);
         ALTER TABLE full_docs REPLICA IDENTITY FULL;
         ALTER TABLE full_docs ALTER COLUMN body SET STORAGE EXTERNAL;",
    )
    .await
    .unwrap();
    let mut src = source(config(&pg, "dec", &["typed", "docs", "public.full_docs"])).await;
    assert_eq!(src.capabilities().before_image, BeforeImage::KeyOnly);
    assert!(src.capabilities().recoverable);

    // One transaction: its xid8 must match what the events carry.
    let xid: String = {
        let tx_sql = "BEGIN;
            INSERT INTO typed VALUES (1, true, -2, 40000, 1.5, 0.25, 12.50, 'hé', '{\"a\": [1]}',
                '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29',
                '2024-01-02 03:04:05+00', NULL);";
        c.batch_execute(tx_sql).await.unwrap();
        let x = c
            .query_one("SELECT pg_current_xact_id()::text", &[])
            .await
            .unwrap()
            .get(0);
        c.batch_execute("COMMIT").await.unwrap();
        x
    };
    let batches = take_events(&mut src, 1, 20).await;
    let ev = &events(&batches)[0];
    assert_eq!(
        (&*ev.schema, &*ev.table, ev.op),
        ("public", "typed", Op::Insert)
    );
    assert_eq!(&*ev.pk_names, &[Box::from("id")]);
    let tx = ev.tx.expect("transaction metadata");
    assert_eq!(tx.id.to_string(), xid, "64-bit xid8 of the writer");
    assert_eq!(tx.index, 0);
    assert!(ev.commit_ts.is_some());
    let row = ev.new.as_ref().unwrap();
    let get = |c: &str| row.get(c).unwrap().clone();
    assert_eq!(get("id"), Value::Int(1));
    assert_eq!(get("b"), Value::Bool(true));
    assert_eq!(get("i2"), Value::Int(-2));
    assert_eq!(get("i4"), Value::Int(40000));
    assert_eq!(get("f8"), Value::Float(1.5));
    assert_eq!(get("f4"), Value::Float(0.25));
    assert_eq!(
        get("n"),
        Value::text("12.50"),
        "numeric stays text, exactly"
    );
    assert_eq!(get("t"), Value::text("hé"));
    assert_eq!(get("j"), Value::Json("{\"a\": [1]}".into()));
    assert_eq!(get("by"), Value::Bytes(vec![0, 255].into()));
    assert_eq!(
        get("u"),
        Value::text("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    );
    assert_eq!(get("d"), Value::text("2024-02-29"));
    assert_eq!(get("ts"), Value::text("2024-01-02 03:04:05+00"));
    assert_eq!(get("nul"), Value::Null);
    for b in batches {
        b.into_parts().2.ack();
    }

    // TOAST: a large value that an UPDATE leaves alone is 'unchanged', not NULL.
    let big = "x".repeat(100_000);
    c.execute(
        "INSERT INTO docs VALUES (1, 'a', $1), (2, 'a', NULL)",
        &[&big],
    )
    .await
    .unwrap();
    c.execute("INSERT INTO full_docs VALUES (1, 'a', $1)", &[&big])
        .await
        .unwrap();
    c.batch_execute(
        "UPDATE docs SET grp = 'b' WHERE id = 1;          -- DEFAULT: no old image
         UPDATE docs SET grp = 'c' WHERE id = 2;          -- a real NULL stays NULL
         UPDATE docs SET id = 10 WHERE id = 1;            -- key change: K image
         UPDATE full_docs SET grp = 'b' WHERE id = 1;     -- FULL: O image
         DELETE FROM docs WHERE id = 10;
         DELETE FROM full_docs WHERE id = 1;",
    )
    .await
    .unwrap();
    let batches = take_events(&mut src, 9, 20).await;
    let evs = events(&batches);
    let ops: Vec<(&str, Op)> = evs.iter().map(|e| (&*e.table, e.op)).collect();
    assert_eq!(
        ops,
        [
            ("docs", Op::Insert),
            ("docs", Op::Insert),
            ("full_docs", Op::Insert),
            ("docs", Op::Update),
            ("docs", Op::Update),
            ("docs", Op::Update),
            ("full_docs", Op::Update),
            ("docs", Op::Delete),
            ("full_docs", Op::Delete),
        ]
    );
    let plain = &evs[3];
    assert!(
        plain.old.is_none(),
        "DEFAULT identity, key unchanged: no old image"
    );
    assert_eq!(
        plain.new.as_ref().unwrap().get("body"),
        Some(&Value::Unchanged)
    );
    assert_eq!(evs[4].new.as_ref().unwrap().get("body"), Some(&Value::Null));
    let keyed = &evs[5];
    let old = keyed.old.as_ref().expect("K image");
    assert_eq!(old.len(), 1, "only the key columns");
    assert_eq!(old.get("id"), Some(&Value::Int(1)));
    assert_eq!(
        keyed.scope_keys(&["id"]).collect::<Vec<_>>(),
        [Key::from("10"), Key::from("1")]
    );
    let full = &evs[6];
    assert_eq!(
        &*full.pk_names,
        &[Box::from("id")],
        "FULL identity flags every column; pk_names is still the primary key"
    );
    assert_eq!(
        full.old.as_ref().unwrap().get("grp"),
        Some(&Value::text("a"))
    );
    assert_eq!(
        full.new.as_ref().unwrap().get("body"),
        Some(&Value::text(big.as_str())),
        "an unchanged TOAST value is filled from the FULL old image"
    );
    assert_eq!(
        full.scope_keys(&["grp"]).collect::<Vec<_>>(),
        [Key::from("b"), Key::from("a")]
    );
    assert_eq!(evs[7].old.as_ref().unwrap().len(), 1);
    assert_eq!(
        evs[8].old.as_ref().unwrap().get("body"),
        Some(&Value::text(big.as_str()))
    );
    for b in batches {
        b.into_parts().2.ack();
    }

    // TRUNCATE of two tables: one event per table.
    c.batch_execute("TRUNCATE docs, full_docs").await.unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let mut truncated: Vec<(&str, Op)> = evs.iter().map(|e| (&*e.table, e.op)).collect();
    truncated.sort_by_key(|(t, _)| *t);
    assert_eq!(
        truncated,
        [("docs", Op::Truncate), ("full_docs", Op::Truncate)]
    );
    assert_eq!(src.health().skipped, 0);
    src.shutdown().await;
    assert!(!src.health().running);
}

/// Generated columns (stored from PostgreSQL 12, virtual from 18, the default kind
/// there) are not published: events carry the columns they are computed from, and a
/// publication `WITH (publish_generated_columns = stored)` (18) adds the stored ones.
#[tokio::test]
async fn generated_columns_are_left_out_unless_published() {
    let pg = server();
    let c = sql(&pg).await;
    let v18 = pg.major_version() >= 18;
    c.batch_execute(&format!(
        "CREATE TABLE g (id int PRIMARY KEY, x int NOT NULL,
             stored int GENERATED ALWAYS AS (x * 2) STORED{});
         CREATE PUBLICATION gen_pub FOR TABLE g{}",
        if v18 {
            ", virt int GENERATED ALWAYS AS (x * 3) VIRTUAL"
        } else {
            ""
        },
        if v18 {
            " WITH (publish_generated_columns = stored)"
        } else {
            ""
        },
    ))
    .await
    .unwrap();
    let mut cfg = config(&pg, "gen", &["g"]);
    cfg.publication = "gen_pub".into();
    let mut src = source(cfg).await;
    c.batch_execute("INSERT INTO g (id, x) VALUES (1, 5); UPDATE g SET x = 6 WHERE id = 1")
        .await
        .unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let new = evs[1].new.as_ref().unwrap();
    assert_eq!(new.get("x"), Some(&Value::Int(6)));
    assert_eq!(new.get("virt"), None, "a virtual column is never published");
    if v18 {
        assert_eq!(new.get("stored"), Some(&Value::Int(12)), "published on 18");
    } else {
        assert_eq!(new.get("stored"), None, "not published before 18");
    }
    assert_eq!(src.health().skipped, 0);
}

#[tokio::test]
async fn unwatched_tables_in_the_publication_are_not_delivered() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY);
         CREATE PUBLICATION both_pub FOR TABLE a, b;",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "filter", &["a"]);
    cfg.publication = "both_pub".into();
    let mut src = source(cfg).await;
    c.batch_execute("INSERT INTO b VALUES (1); INSERT INTO a VALUES (2);")
        .await
        .unwrap();
    let evs = events(&take_events(&mut src, 1, 20).await);
    assert_eq!(evs.len(), 1);
    assert_eq!(&*evs[0].table, "a");
}

/// `readings` → a view keyed by `device` under what `check` recommends: the identity a
/// unique index over (device, id), the publication listing only (id, device). Events
/// carry just those columns, and every change still names the scopes it touched — the
/// new device, and the old one on a move and a delete.
#[tokio::test]
async fn column_listed_publication_under_an_identity_index_keeps_scope_keys() {
    let pg = server();
    let c = sql(&pg).await;
    if pg.major_version() < 15 {
        // Column lists came with PostgreSQL 15 (and `check` reads them only there).
        let err = c
            .batch_execute(
                "CREATE TABLE t (id int PRIMARY KEY, x int); CREATE PUBLICATION p FOR TABLE t (id)",
            )
            .await
            .unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("42601"), "{err}");
        return;
    }
    c.batch_execute(
        "CREATE TABLE readings (id int8 PRIMARY KEY, device int NOT NULL, value int8 NOT NULL,
             note text);
         CREATE UNIQUE INDEX readings_device_id_identity ON readings (device, id);
         ALTER TABLE readings REPLICA IDENTITY USING INDEX readings_device_id_identity;
         CREATE PUBLICATION narrow FOR TABLE readings (id, device);",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "narrow", &["readings"]);
    cfg.publication = "narrow".into();
    let mut src = source(cfg).await;
    c.batch_execute(
        "INSERT INTO readings VALUES (1, 7, 10, 'x');
         UPDATE readings SET value = 11, note = 'y' WHERE id = 1;
         UPDATE readings SET device = 8 WHERE id = 1;
         DELETE FROM readings WHERE id = 1;",
    )
    .await
    .unwrap();
    let batches = take_events(&mut src, 4, 20).await;
    let evs = events(&batches);
    let ops: Vec<Op> = evs.iter().map(|e| e.op).collect();
    assert_eq!(ops, [Op::Insert, Op::Update, Op::Update, Op::Delete]);
    for e in &evs {
        for row in e.new.iter().chain(e.old.iter()) {
            let names: Vec<&str> = row.iter().map(|(n, _)| n).collect();
            assert!(
                names.iter().all(|n| ["id", "device"].contains(n)),
                "{:?}: only the listed columns, got {names:?}",
                e.op
            );
            assert_eq!(row.get("value"), None, "value is not published");
        }
    }
    let keys: Vec<Vec<Key>> = evs
        .iter()
        .map(|e| e.scope_keys(&["device"]).collect())
        .collect();
    assert_eq!(
        keys,
        [
            vec![Key::from("7")],
            vec![Key::from("7")],
            vec![Key::from("8"), Key::from("7")],
            vec![Key::from("8")],
        ],
        "insert, value update, move (new then old), delete"
    );
    assert_eq!(
        evs[1].old, None,
        "a value update logs no old image: the identity's columns did not change"
    );
    for b in batches {
        b.into_parts().2.ack();
    }
}
