//! WebSocket subscriptions (`/v2/cdc/stream`) with transaction markers and per-table
//! cursors, against a real PostgreSQL through the real HTTP server: a marker frame after
//! the last event of each transaction, with its xid, LSN and count, even when the pending
//! window cuts a transaction; the same entries as the long poll's; `?tx=1` on the upgrade
//! and `"tx"` per subscription; none for consumer groups. A subscription naming two
//! tables with a cursor each is cut off mid-stream and resumes from the list its last
//! event frame carried: every witness row's event arrives exactly once, from each table's
//! own cursor. Bad lists are one error frame naming every problem; a cursor older than
//! retention gets its table's gap.

use crate::http_ws::{Ws, connect_at, drain_until_probe, recv, send};
use crate::postgres_cursors::{capture_three, seq, stored, truth, write_orders};
use crate::postgres_tx::{check_markers, is_marker, three_transactions};
use crate::support;

use std::collections::BTreeSet;

use freshen_changefeed::Filter;
use freshen_testenv::PgServer;
use freshen_testenv::refresher::within;
use serde_json::{Value, json};
use support::*;

/// Subscribes `frame` and checks the reply.
async fn subscribe(ws: &mut Ws, frame: Value) {
    let id = frame["id"].clone();
    let mut frame = frame;
    frame["action"] = json!("subscribe");
    send(ws, frame).await;
    let reply = recv(ws).await;
    assert_eq!(reply, json!({"action": "subscribed", "id": id}));
}

/// Reads frames of subscription `id`, acknowledging each as it comes (an event's or
/// a marker's `sequence`), until `done` holds for what was read.
async fn read_acking(ws: &mut Ws, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut got: Vec<Value> = Vec::new();
    within(30, "the subscription's frames", async {
        while !done(&got) {
            let f = recv(ws).await;
            assert!(f.get("action").is_none(), "an entry, not {f}");
            assert_eq!(f["sub_id"], id, "{f}");
            send(
                ws,
                json!({"action": "ack", "id": id, "sequence": f["sequence"]}),
            )
            .await;
            got.push(f);
        }
    })
    .await;
    got
}

fn markers_in(frames: &[Value]) -> usize {
    frames.iter().filter(|f| is_marker(f)).count()
}

/// The entry without the field the subscription adds.
fn without_sub_id(f: &Value) -> Value {
    let mut f = f.clone();
    f.as_object_mut().unwrap().remove("sub_id");
    f
}

fn metric(server: &Server, name: &str) -> u64 {
    let text = server.cf.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("freshen_changefeed_{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_subscriptions_get_a_marker_after_each_transaction() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);
         CREATE TABLE items (id int PRIMARY KEY, order_id int)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // A window of two events cuts the three-event transactions: their markers come
    // only after acks open it again.
    cfg.http.ws_pending_window = 2;
    let server = Server::start(&cfg).await;
    let (stop, task) = capture_until_stopped(
        &server.cf,
        pg_source(&pg, "feed", &["public.orders", "public.items"], |c| {
            c.batch_size = 2
        })
        .await,
    );
    let mut ws = connect_at(&server, "/v2/cdc/stream").await;
    subscribe(&mut ws, json!({"id": "tx", "from_seq": 0, "tx": true})).await;

    let [t1, t2, t3] = three_transactions(&c).await;

    let frames = read_acking(&mut ws, "tx", |f| markers_in(f) == 3).await;
    assert_eq!(check_markers(&frames, false), [(t1, 3), (t2, 1), (t3, 3)]);
    assert!(drain_until_probe(&mut ws).await.is_empty(), "nothing more");
    // The long poll's entries, marker JSON included.
    let page = get_json(&server.url("/changefeed?from_seq=0&tx=1&limit=100")).await;
    let polled = page["events"].as_array().unwrap();
    assert_eq!(
        &frames.iter().map(without_sub_id).collect::<Vec<_>>(),
        polled
    );
    assert_eq!(metric(&server, "transaction_markers_total"), 3 + 3);
    drop(ws);

    // `?tx=1` on the upgrade: the connection's subscriptions get markers unless they say
    // `"tx":false`; a filtered one counts its own events.
    let mut ws = connect_at(&server, "/v2/cdc/stream?tx=1").await;
    subscribe(&mut ws, json!({"id": "items", "table": "items"})).await;
    let items = read_acking(&mut ws, "items", |f| markers_in(f) == 2).await;
    assert_eq!(check_markers(&items, true), [(t1, 1), (t3, 2)]);
    assert!(drain_until_probe(&mut ws).await.is_empty());
    subscribe(&mut ws, json!({"id": "plain", "tx": false})).await;
    let plain = read_acking(&mut ws, "plain", |f| f.len() == 7).await;
    assert!(!plain.iter().any(is_marker));
    assert!(drain_until_probe(&mut ws).await.is_empty());

    // A consumer group splits transactions among its consumers: no markers, and asking
    // for them is an error.
    let (status, _) = post(&server.url("/changefeed/groups"), json!({"name": "g"})).await;
    assert_eq!(status, hyper::StatusCode::CREATED);
    send(
        &mut ws,
        json!({"action": "subscribe", "group_id": "g", "consumer_id": "c", "tx": true}),
    )
    .await;
    let reply = recv(&mut ws).await;
    assert_eq!(reply["action"], "error");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("no transaction markers"),
        "{reply}"
    );
    subscribe(
        &mut ws,
        json!({"id": "g:c", "group_id": "g", "consumer_id": "c"}),
    )
    .await;
    let grouped = read_acking(&mut ws, "g:c", |f| f.len() == 7).await;
    assert!(!grouped.iter().any(is_marker), "{grouped:?}");
    assert_eq!(
        grouped.iter().map(seq).collect::<Vec<_>>(),
        plain.iter().map(seq).collect::<Vec<_>>()
    );
    assert!(drain_until_probe(&mut ws).await.is_empty());
    drop(ws);

    // Without `tx`, nothing changes for ThemisDB's clients.
    let mut ws = connect_at(&server, "/v2/cdc/stream").await;
    subscribe(&mut ws, json!({"id": "old", "from_seq": 0})).await;
    let old = read_acking(&mut ws, "old", |f| f.len() == 7).await;
    assert!(!old.iter().any(is_marker));
    assert!(drain_until_probe(&mut ws).await.is_empty());

    // A bad flag on the upgrade is refused before it.
    match tokio_tungstenite::connect_async(server.ws_url("/v2/cdc/stream?tx=maybe")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("expected a 400, got {:?}", other.map(|(_, r)| r.status())),
    }
    assert_eq!(metric(&server, "transaction_markers_total"), 3 + 3 + 2);
    let _ = stop.send(());
    within(20, "capture stops", task).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_per_table_cursors_resume_exactly_after_a_disconnect() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);
         CREATE TABLE items (id int PRIMARY KEY, order_id int, qty int);
         CREATE TABLE users (id int PRIMARY KEY)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.ws_pending_window = 4;
    let server = Server::start(&cfg).await;
    let (stop, task) = capture_three(&pg, &server.cf).await;
    // Witness rows: each written once here, never again (one transaction per order: the
    // order, two items, a user the subscription does not name).
    write_orders(&c, 1..=10).await;
    stored(&server.cf, 40).await;
    let orders = truth(&server.cf, "orders");
    let items = truth(&server.cf, "items");

    let mut ws = connect_at(&server, "/v2/cdc/stream").await;
    subscribe(
        &mut ws,
        json!({"id": "m", "cursors": "public.orders:0,items:0", "tx": true}),
    )
    .await;
    // Cut off mid-stream, inside the fifth transaction, with frames still in flight.
    let before = read_acking(&mut ws, "m", |f| {
        f.iter().filter(|e| !is_marker(e)).count() == 13
    })
    .await;
    drop(ws);
    let events: Vec<&Value> = before.iter().filter(|e| !is_marker(e)).collect();
    let mut want: Vec<u64> = orders.iter().chain(&items).copied().collect();
    want.sort_unstable();
    assert_eq!(
        events.iter().map(|e| seq(e)).collect::<Vec<_>>(),
        want[..13]
    );
    for e in &events {
        assert_eq!(
            e["cursors"],
            format!("public.orders:{0},items:{0}", seq(e)),
            "each event says the list to resume with"
        );
    }
    let last = seq(events[12]);
    assert_eq!(
        events[12]["cursors"],
        format!("public.orders:{last},items:{last}")
    );

    // A new connection resumes `orders` from the last frame's list and `items` from an
    // earlier point (the reader applied items only that far), while more rows come.
    let kept_items = items[2];
    let mut ws = connect_at(&server, "/v2/cdc/stream").await;
    subscribe(
        &mut ws,
        json!({"id": "m", "cursors": format!("public.orders:{last},items:{kept_items}"), "tx": true}),
    )
    .await;
    write_orders(&c, 11..=12).await;
    stored(&server.cf, 48).await;
    let orders = truth(&server.cf, "orders");
    let items = truth(&server.cf, "items");
    let mut want: Vec<u64> = orders.iter().copied().filter(|s| *s > last).collect();
    want.extend(items.iter().copied().filter(|s| *s > kept_items));
    want.sort_unstable();
    let after = read_acking(&mut ws, "m", |f| {
        f.iter().filter(|e| !is_marker(e)).count() == want.len() && f.last().is_some_and(is_marker)
    })
    .await;
    assert!(drain_until_probe(&mut ws).await.is_empty(), "nothing more");
    drop(ws);
    let resumed: Vec<&Value> = after.iter().filter(|e| !is_marker(e)).collect();
    assert_eq!(resumed.iter().map(|e| seq(e)).collect::<Vec<_>>(), want);
    // Every order exactly once across the disconnect.
    let applied: Vec<u64> = events
        .iter()
        .chain(&resumed)
        .filter(|e| e["table"] == "orders")
        .map(|e| seq(e))
        .collect();
    assert_eq!(applied, orders);

    // A marker after the last delivered event of each transaction delivered, counting
    // the transaction's events in both tables (those before a cursor included).
    let log: Vec<Value> = server
        .cf
        .read(0, 100_000, &Filter::default())
        .unwrap()
        .iter()
        .map(|e| serde_json::from_str(&e.json).unwrap())
        .collect();
    let mut marked = BTreeSet::new();
    for (i, m) in after.iter().enumerate().filter(|(_, e)| is_marker(e)) {
        let prev = &after[i - 1];
        assert!(!is_marker(prev), "a marker follows an event: {m}");
        assert_eq!(prev["xid"], m["xid"], "{m}");
        let whole = log
            .iter()
            .filter(|e| e["xid"] == m["xid"] && e["table"] != "users")
            .count();
        assert_eq!(m["event_count"].as_u64(), Some(whole as u64), "{m}");
        assert!(marked.insert(m["xid"].as_u64().unwrap()), "one marker: {m}");
    }
    let delivered: BTreeSet<u64> = resumed.iter().map(|e| e["xid"].as_u64().unwrap()).collect();
    assert_eq!(marked, delivered);

    bad_lists(&server).await;
    gaps(&server, &items).await;
    assert_eq!(metric(&server, "cursor_reads_total"), 3);
    assert_eq!(metric(&server, "cursor_gaps_total"), 1);
    let _ = stop.send(());
    within(20, "capture stops", task).await.unwrap();
    server.stop().await;
}

/// Every problem of a list in one error frame, and the subscription refused.
async fn bad_lists(server: &Server) {
    let mut ws = connect_at(server, "/v2/cdc/stream").await;
    let many: Vec<String> = (0..65).map(|i| format!("t{i}:0")).collect();
    for (frame, says) in [
        (
            json!({"cursors": "orders,items:x,:5,orders:1,public.orders:2"}),
            &[
                "\"orders\" has no sequence",
                "\"x\" is not a sequence",
                "\":5\": expected a table",
                "\"public.orders\" and \"orders\" name the same table",
            ][..],
        ),
        (json!({"cursors": " , "}), &["at least one table"]),
        (json!({"cursors": many.join(",")}), &["at most 64"]),
        (
            json!({"cursors": "orders:1", "from_seq": 3}),
            &["leave out from_seq and table"],
        ),
        (
            json!({"cursors": "orders:1", "table": "items"}),
            &["leave out from_seq and table"],
        ),
        (
            json!({"cursors": "orders:1", "group_id": "g"}),
            &["consumer group"],
        ),
    ] {
        let mut frame = frame;
        frame["action"] = json!("subscribe");
        frame["id"] = json!("bad");
        send(&mut ws, frame.clone()).await;
        let reply = recv(&mut ws).await;
        assert_eq!(reply["action"], "error", "{frame}: {reply}");
        let message = reply["message"].as_str().unwrap();
        assert!(message.starts_with("cursors: "), "{message}");
        for part in says {
            assert!(message.contains(part), "{part} in {message}");
        }
    }
    // None of them subscribed: nothing is delivered.
    assert!(drain_until_probe(&mut ws).await.is_empty());
}

/// A table whose cursor is older than retention gets a gap frame of its own, then its
/// events from the oldest kept.
async fn gaps(server: &Server, items: &[u64]) {
    let front = items[10];
    server.cf.delete_before(front).await.unwrap();
    let latest = server.cf.latest_sequence();
    let mut ws = connect_at(server, "/v2/cdc/stream").await;
    subscribe(
        &mut ws,
        json!({"id": "gap", "cursors": format!("orders:{latest},items:0")}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await,
        json!({"action": "gap", "id": "gap", "after": 0, "before": front, "table": "items"})
    );
    let got = read_acking(&mut ws, "gap", |f| f.len() == items.len() - 10).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), items[10..]);
    assert!(drain_until_probe(&mut ws).await.is_empty());
}
