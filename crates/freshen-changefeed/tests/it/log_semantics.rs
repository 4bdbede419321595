//! What a change means, replayed by key: primary-key changes, unchanged values filled
//! from the row's last image (or said to be partial), compaction, and retention that
//! keeps what consumer groups have not acknowledged (or reports the gap).

use crate::support;

use freshen::{Op, Row, RowEvent, Tx, Value};
use freshen_changefeed::{Filter, GroupSpec, Keep, RetentionConfig, Start, Unacknowledged};
use serde_json::json;
use support::*;

fn tx(commit: u64, index: u32) -> Tx {
    Tx {
        id: commit,
        commit,
        index,
    }
}

fn insert(id: &str, n: i64, body: &str, at: Tx) -> RowEvent {
    RowEvent::new("public", "docs", Op::Insert)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::text(id)),
            ("n", Value::Int(n)),
            ("body", Value::text(body)),
        ]))
        .with_tx(at)
}

/// An UPDATE under PostgreSQL's default replica identity: `body` unchanged (TOAST), no
/// old image unless the key changed, then the old key columns only.
fn update(old_id: Option<&str>, id: &str, n: i64, at: Tx) -> RowEvent {
    let e = RowEvent::new("public", "docs", Op::Update)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::text(id)),
            ("n", Value::Int(n)),
            ("body", Value::Unchanged),
        ]))
        .with_tx(at);
    match old_id {
        Some(o) => e.with_old(Row::from_pairs([("id", Value::text(o))])),
        None => e,
    }
}

fn delete(id: &str, at: Tx) -> RowEvent {
    RowEvent::new("public", "docs", Op::Delete)
        .with_pk(["id"])
        .with_old(Row::from_pairs([("id", Value::text(id))]))
        .with_tx(at)
}

fn events(cf: &freshen_changefeed::Changefeed) -> Vec<serde_json::Value> {
    replay_by_key(cf).1
}

#[tokio::test]
async fn a_key_change_is_a_delete_then_a_put_and_replays_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cf = open(&cfg).await;
    let workload = [
        insert("alice", 1, "long text", tx(10, 0)),
        update(Some("alice"), "alice-renamed", 2, tx(20, 0)),
    ];
    let out = cf.append(&workload).await.unwrap();
    assert_eq!((out.appended, out.first_sequence), (3, Some(1)));
    let ev = events(&cf);
    let delete = &ev[1];
    let put = &ev[2];
    assert_eq!(
        (delete["sequence"].as_u64(), put["sequence"].as_u64()),
        (Some(2), Some(3)),
        "consecutive sequences"
    );
    assert_eq!(
        (
            delete["type"].as_str(),
            delete["key"].as_str(),
            delete["op"].as_str()
        ),
        (Some("DELETE"), Some("docs:alice"), Some("delete"))
    );
    assert_eq!(delete["new_key"], "docs:alice-renamed");
    assert_eq!(delete["before_snapshot"], r#"{"id":"alice"}"#);
    assert_eq!(
        (
            put["type"].as_str(),
            put["key"].as_str(),
            put["op"].as_str()
        ),
        (Some("PUT"), Some("docs:alice-renamed"), Some("insert"))
    );
    assert_eq!(put["old_key"], "docs:alice");
    assert_eq!(
        (delete["lsn"].clone(), delete["xid"].clone()),
        (put["lsn"].clone(), put["xid"].clone())
    );
    // The unchanged body came from alice's last image: the moved row is whole.
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(put["value"].as_str().unwrap()).unwrap(),
        json!({"id": "alice-renamed", "n": 2, "body": "long text"})
    );
    assert!(put.get("partial").is_none() && put.get("unchanged_columns").is_none());

    // A source replaying after a restart: nothing twice, both halves included.
    cf.close().await;
    drop(cf);
    let cf = open(&cfg).await;
    let again = cf.append(&workload).await.unwrap();
    assert_eq!((again.appended, again.duplicates), (0, 2));
    let (state, ev) = replay_by_key(&cf);
    assert_eq!(ev.len(), 3);
    assert_eq!(
        state,
        [(
            "docs:alice-renamed".to_owned(),
            json!({"id": "alice-renamed", "n": 2, "body": "long text"})
        )]
        .into()
    );
    cf.close().await;
}

#[tokio::test]
async fn unchanged_values_are_filled_or_the_event_says_it_is_partial() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    let out = cf
        .append(&[
            // No earlier image of "ghost" in the log: its body stays unknown.
            update(None, "ghost", 1, tx(1, 0)),
            insert("a", 1, "A's body", tx(2, 0)),
            // Filled from the insert in the same commit.
            update(None, "a", 2, tx(2, 1)),
            update(None, "a", 3, tx(3, 0)),
            delete("a", tx(4, 0)),
            // After a delete there is no image to take.
            update(None, "a", 4, tx(5, 0)),
        ])
        .await
        .unwrap();
    assert_eq!((out.filled, out.partial), (2, 2));
    let ev = events(&cf);
    let ghost = &ev[0];
    assert_eq!(ghost["partial"], true);
    assert_eq!(ghost["unchanged_columns"], json!(["body"]));
    assert_eq!(ghost["value"], r#"{"id":"ghost","n":1}"#, "never a null");
    for e in &ev[2..4] {
        let v: serde_json::Value = serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
        assert_eq!(v["body"], "A's body", "{e}");
        assert!(e.get("partial").is_none(), "{e}");
    }
    assert_eq!(ev[5]["partial"], true);
    let metrics = cf.metrics_text();
    assert!(
        metrics.contains("freshen_changefeed_filled_events_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("freshen_changefeed_partial_events_total 2"),
        "{metrics}"
    );
    cf.close().await;

    // Without the index nothing is filled, and every such event says so.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.key_index = false;
    let cf = open(&cfg).await;
    cf.append(&[
        insert("a", 1, "x", tx(1, 0)),
        update(None, "a", 2, tx(2, 0)),
    ])
    .await
    .unwrap();
    assert_eq!(events(&cf)[1]["partial"], true);
    cf.close().await;
}

#[tokio::test]
async fn the_index_catches_up_when_turned_on_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.key_index = false;
    let cf = open(&cfg).await;
    cf.append(&[insert("a", 1, "first", tx(1, 0))])
        .await
        .unwrap();
    cf.close().await;
    drop(cf);
    cfg.key_index = true;
    let cf = open(&cfg).await;
    let out = cf.append(&[update(None, "a", 2, tx(2, 0))]).await.unwrap();
    assert_eq!(
        out.filled, 1,
        "the insert appended without the index was indexed on open"
    );
    cf.close().await;
}

#[tokio::test]
async fn compaction_keeps_the_latest_event_of_each_row() {
    let dir = tempfile::tempdir().unwrap();
    let cf = open(&config(dir.path())).await;
    let mut workload = Vec::new();
    let mut commit = 0;
    let mut next = || {
        commit += 1;
        tx(commit, 0)
    };
    for i in 0..20 {
        workload.push(insert(&format!("k{i}"), 0, &format!("body {i}"), next()));
    }
    for round in 1..=3 {
        for i in 0..20 {
            workload.push(update(None, &format!("k{i}"), round, next()));
        }
    }
    for i in 0..5 {
        workload.push(delete(&format!("k{i}"), next()));
    }
    workload.push(update(Some("k5"), "k5-moved", 9, next()));
    // A table without a key: every event is kept.
    for i in 0..3 {
        workload.push(
            RowEvent::new("public", "log", Op::Insert)
                .with_new(Row::from_pairs([("line", Value::Int(i))]))
                .with_tx(next()),
        );
    }
    cf.append(&workload).await.unwrap();
    let (before, all) = replay_by_key(&cf);
    assert_eq!(all.len(), 20 + 60 + 5 + 2 + 3);

    let policy = RetentionConfig {
        keep: Keep::LatestPerKey,
        ..RetentionConfig::default()
    };
    cf.enforce_retention(&policy).await.unwrap();
    let (after, kept) = replay_by_key(&cf);
    assert_eq!(after, before, "the compacted log replays to the same state");
    // 14 live rows + 1 moved + 5 deletes + the move's delete (tombstones) + 3 unkeyed.
    assert_eq!(kept.len(), 14 + 1 + 6 + 3, "{kept:?}");
    assert_eq!(cf.stats().total_events, 24);

    // Tombstones go once they are older than tombstone_secs.
    let now = RetentionConfig {
        tombstone_secs: 0,
        ..policy.clone()
    };
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    cf.enforce_retention(&now).await.unwrap();
    let (state, kept) = replay_by_key(&cf);
    assert_eq!(state, before);
    assert!(kept.iter().all(|e| e["type"] == "PUT"), "{kept:?}");
    assert_eq!(kept.len(), 18);
    // The index forgot the deleted rows: a new row under an old key starts afresh.
    let out = cf.append(&[update(None, "k0", 1, next())]).await.unwrap();
    assert_eq!(out.partial, 1);
    cf.close().await;
}

#[tokio::test]
async fn retention_keeps_what_a_group_has_not_acknowledged_or_reports_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let server = Server::start(&cfg).await;
    let cf = server.cf.clone();
    cf.append(&orders(1, 10)).await.unwrap();
    let spec = GroupSpec::new(&cfg.groups);
    cf.create_group("slow", spec, Start::Earliest)
        .await
        .unwrap();
    let (_, got) = post(
        &server.url("/changefeed/groups/slow/receive"),
        json!({"consumer_id": "c", "max_events": 3}),
    )
    .await;
    assert_eq!(sequences(&got), [1, 2, 3]);
    let (_, _) = post(
        &server.url("/changefeed/groups/slow/ack"),
        json!({"sequences": [1, 2]}),
    )
    .await;

    // Keep (the default): nothing after the group's committed offset (2) goes.
    let keep = RetentionConfig {
        max_events: Some(1),
        ..RetentionConfig::default()
    };
    assert_eq!(cf.enforce_retention(&keep).await.unwrap(), 2);
    assert_eq!(cf.stats().oldest_sequence, 3);

    // Drop: the events go, and the group is told what it missed.
    let drop = RetentionConfig {
        unacknowledged: Unacknowledged::Drop,
        ..keep
    };
    assert_eq!(cf.enforce_retention(&drop).await.unwrap(), 7);
    let (_, got) = post(
        &server.url("/changefeed/groups/slow/receive"),
        json!({"consumer_id": "c", "max_events": 10}),
    )
    .await;
    assert_eq!(got["gap"], json!({"after": 3, "before": 10}), "{got}");
    assert_eq!(sequences(&got), [10]);
    let info = get_json(&server.url("/changefeed/groups/slow")).await;
    assert_eq!(info["dropped_sequences"], 6);
    assert_eq!(info["last_gap"], json!({"after": 3, "before": 10}));

    // Plain readers behind the front hear of it too.
    let page = get_json(&server.url("/changefeed?from_seq=0")).await;
    assert_eq!(page["gap"], json!({"after": 0, "before": 10}));
    assert_eq!(sequences(&page), [10]);
    let page = get_json(&server.url("/changefeed?from_seq=9")).await;
    assert!(page.get("gap").is_none(), "{page}");
    let mut sse = SseReader::open(&server.url("/changefeed/stream?from_seq=2"), &[]).await;
    let gap = sse.next_named(PATIENCE).await.expect("the gap event");
    assert_eq!(gap, ("gap".to_owned(), json!({"after": 2, "before": 10})));
    let (seq, _) = sse.next_event(PATIENCE).await.expect("then the events");
    assert_eq!(seq, 10);
    assert_eq!(cf.read(0, 10, &Filter::default()).unwrap().len(), 1);
    server.stop().await;
}
