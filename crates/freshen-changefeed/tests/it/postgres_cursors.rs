//! Several tables in one stream, a cursor per table, against a real PostgreSQL through
//! the real HTTP API: a reader that applies `orders` at once and `items` two events a
//! page stops, the changefeed restarts, and the reader resumes from its own per-table
//! cursors while more rows come: it has applied every event of both tables exactly once, in
//! order, none of a table it did not name, and its replay equals the tables. With
//! `tx=1` the markers follow the delivered events only; Server-Sent Events resume from
//! a composite `Last-Event-ID`; bad lists are 400s; a cursor older than retention gets
//! a gap for its table.

use crate::support;

use std::collections::BTreeMap;

use freshen_changefeed::{Changefeed, Filter};
use freshen_testenv::PgServer;
use freshen_testenv::refresher::{eventually, within};
use serde_json::Value;
use support::*;
use tokio_postgres::Client;

pub(crate) async fn stored(cf: &Changefeed, events: u64) {
    eventually(30, "the changes in the changefeed", || async {
        (cf.stats().total_events >= events).then_some(())
    })
    .await;
    assert_eq!(cf.stats().total_events, events, "no more than the changes");
}

/// Every event of `table` in the log, as the truth to compare readers with.
pub(crate) fn truth(cf: &Changefeed, table: &str) -> Vec<u64> {
    cf.read(0, 100_000, &Filter::default().table(table))
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect()
}

pub(crate) fn seq(e: &Value) -> u64 {
    e["sequence"].as_u64().expect("a sequence")
}

fn is_marker(e: &Value) -> bool {
    e["type"] == "TRANSACTION_COMMIT"
}

/// A consumer that materialises `orders` at once and `items` slowly: each page it
/// applies every `orders` event and at most `items_per_page` `items` events; its cursor
/// for a table is where it has applied that table up to.
#[derive(Default)]
struct Reader {
    orders: u64,
    items: u64,
    items_per_page: usize,
    applied: Vec<Value>,
    /// Seen: the `orders` cursor ahead of the `items` cursor.
    paces_differ: bool,
}

impl Reader {
    /// Reads one page; returns how many events it delivered.
    async fn step(&mut self, server: &Server) -> usize {
        let url = server.url(&format!(
            "/changefeed?cursors=public.orders:{},items:{}&limit=8&long_poll_ms=100",
            self.orders, self.items
        ));
        let page = get_json(&url).await;
        let events = page["events"].as_array().expect("events");
        let (mut taken, mut last_item, mut all_items) = (0, None, true);
        let mut previous = 0;
        for e in events {
            assert!(seq(e) > previous, "in log order: {e}");
            previous = seq(e);
            match e["table"].as_str() {
                Some("orders") => {
                    assert!(seq(e) > self.orders, "past its table's cursor: {e}");
                    self.applied.push(e.clone());
                }
                Some("items") => {
                    assert!(seq(e) > self.items, "past its table's cursor: {e}");
                    if taken < self.items_per_page {
                        self.applied.push(e.clone());
                        taken += 1;
                        last_item = Some(seq(e));
                    } else {
                        // Not applied: it must come again after the cursor.
                        all_items = false;
                    }
                }
                _ => panic!("a table the reader did not name: {e}"),
            }
        }
        let cursors = &page["cursors"];
        self.orders = cursors["public.orders"].as_u64().expect("orders' cursor");
        self.items = if all_items {
            cursors["items"].as_u64().expect("items' cursor")
        } else {
            last_item.expect("some items applied")
        };
        self.paces_differ |= self.orders > self.items;
        events.len()
    }

    fn applied(&self, table: &str) -> Vec<u64> {
        self.applied
            .iter()
            .filter(|e| e["table"] == table)
            .map(seq)
            .collect()
    }
}

/// Captures `orders`, `items` and `users` (which no cursor names) into `cf`, three
/// events a batch, until the sender is used.
pub(crate) async fn capture_three(
    pg: &PgServer,
    cf: &Changefeed,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    capture_until_stopped(
        cf,
        pg_source(
            pg,
            "feed",
            &["public.orders", "public.items", "public.users"],
            |c| c.batch_size = 3,
        )
        .await,
    )
}

/// One transaction per order: the order, two items, a user (a table not read).
pub(crate) async fn write_orders(c: &Client, ids: std::ops::RangeInclusive<i32>) {
    for i in ids {
        c.batch_execute(&format!(
            "BEGIN;
             INSERT INTO orders VALUES ({i}, 'new');
             INSERT INTO items VALUES ({a}, {i}, 1), ({b}, {i}, 1);
             INSERT INTO users VALUES ({i});
             COMMIT",
            a = i * 10,
            b = i * 10 + 1
        ))
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_at_two_paces_resume_exactly_from_their_cursors() {
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
    let config = config(dir.path());
    let server = Server::start(&config).await;
    let (stop, task) = capture_three(&pg, &server.cf).await;

    write_orders(&c, 1..=12).await;
    // Single-table transactions: each row changed once more, never again.
    for i in 1..=6 {
        c.batch_execute(&format!("UPDATE orders SET note = 'paid' WHERE id = {i}"))
            .await
            .unwrap();
        c.batch_execute(&format!("UPDATE items SET qty = 5 WHERE id = {}", i * 10))
            .await
            .unwrap();
    }
    stored(&server.cf, 12 * 4 + 12).await;

    // The reader reads a few pages and stops, keeping only its two cursors.
    let mut reader = Reader {
        items_per_page: 2,
        ..Reader::default()
    };
    for _ in 0..4 {
        assert!(reader.step(&server).await > 0);
    }
    assert!(
        reader.paces_differ,
        "the tables were read at different paces"
    );
    let kept = (reader.orders, reader.items);
    let applied = std::mem::take(&mut reader.applied);

    // The changefeed restarts; capture resumes from the slot; more rows come.
    let _ = stop.send(());
    within(20, "capture stops", task).await.unwrap();
    let server = server.restart(&config).await;
    let (stop, task) = capture_three(&pg, &server.cf).await;

    // A new reader process, from the kept cursors only, reading while the new rows come.
    let writes = {
        let c = sql(&pg).await;
        tokio::spawn(async move { write_orders(&c, 13..=20).await })
    };
    let mut reader = Reader {
        orders: kept.0,
        items: kept.1,
        items_per_page: 2,
        applied,
        ..Reader::default()
    };
    let total = 12 * 4 + 12 + 8 * 4;
    within(60, "the reader catches up", async {
        loop {
            reader.step(&server).await;
            // Everything stored first, then the latest sequence: it is then the last.
            let all = writes.is_finished() && server.cf.stats().total_events >= total;
            let latest = server.cf.latest_sequence();
            if all && reader.orders >= latest && reader.items >= latest {
                break;
            }
        }
    })
    .await;
    stored(&server.cf, total).await;
    // Every event of each named table, each once, in order; none of `users`.
    assert_eq!(reader.applied("orders"), truth(&server.cf, "orders"));
    assert_eq!(reader.applied("items"), truth(&server.cf, "items"));
    assert_eq!(reader.applied.len(), 20 + 40 + 12);

    // Replayed by key, what it applied equals the tables.
    let mut notes = BTreeMap::new();
    let mut qty = BTreeMap::new();
    for e in &reader.applied {
        // ThemisDB's `value`: the row as JSON text.
        let v: Value = serde_json::from_str(e["value"].as_str().unwrap()).unwrap();
        match e["table"].as_str().unwrap() {
            "orders" => notes.insert(v["id"].as_i64().unwrap(), v["note"].clone()),
            _ => qty.insert(v["id"].as_i64().unwrap(), v["qty"].clone()),
        };
    }
    let mut want_notes = BTreeMap::new();
    for r in c.query("SELECT id, note FROM orders", &[]).await.unwrap() {
        want_notes.insert(
            i64::from(r.get::<_, i32>(0)),
            Value::from(r.get::<_, String>(1)),
        );
    }
    let mut want_qty = BTreeMap::new();
    for r in c.query("SELECT id, qty FROM items", &[]).await.unwrap() {
        want_qty.insert(
            i64::from(r.get::<_, i32>(0)),
            Value::from(r.get::<_, i32>(1)),
        );
    }
    assert_eq!(notes, want_notes);
    assert_eq!(qty, want_qty);

    transaction_markers(&server).await;
    server_sent_events(&server).await;
    bad_lists(&server).await;
    gaps(&server).await;

    let metrics = server.cf.metrics_text();
    for name in [
        "freshen_changefeed_cursor_reads_total",
        "freshen_changefeed_cursor_gaps_total",
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(name) && !l.ends_with(" 0")),
            "{name} in {metrics}"
        );
    }
    let _ = stop.send(());
    within(20, "capture stops", task).await.unwrap();
    server.stop().await;
}

/// With `tx=1`: the same events, each transaction's marker after its last delivered
/// event, counting the transaction's events of both tables; none for a transaction
/// whose events all lay before their table's cursor.
async fn transaction_markers(server: &Server) {
    let orders = truth(&server.cf, "orders");
    let items = truth(&server.cf, "items");
    // Past the single-table updates of orders (ids 1..6, after the 12 first orders).
    let k = orders[17];
    let url = server.url(&format!(
        "/changefeed?cursors=orders:{k},items:0&tx=1&limit=1000"
    ));
    let page = get_json(&url).await;
    let entries = page["events"].as_array().unwrap();
    let events: Vec<u64> = entries.iter().filter(|e| !is_marker(e)).map(seq).collect();
    let mut want: Vec<u64> = orders.iter().copied().filter(|s| *s > k).collect();
    want.extend(&items);
    want.sort_unstable();
    assert_eq!(events, want);
    let all = server.cf.read(0, 100_000, &Filter::default()).unwrap();
    let log: Vec<Value> = all
        .iter()
        .map(|e| serde_json::from_str(&e.json).unwrap())
        .collect();
    let mut markers = 0;
    for (i, m) in entries.iter().enumerate().filter(|(_, e)| is_marker(e)) {
        markers += 1;
        let before = &entries[i - 1];
        assert!(!is_marker(before), "a marker follows a delivered event");
        assert_eq!(before["xid"], m["xid"], "{m}");
        let whole = log
            .iter()
            .filter(|e| e["xid"] == m["xid"] && e["table"] != "users")
            .count();
        assert_eq!(m["event_count"].as_u64(), Some(whole as u64), "{m}");
    }
    // One per transaction with an item (20 orders, 6 item updates); none for the
    // orders-only updates before `k`.
    assert_eq!(markers, 20 + 6);
}

/// Server-Sent Events: each event's id is the list to resume with; a reconnect with
/// that id, or with another list, resumes each table from its own position.
async fn server_sent_events(server: &Server) {
    let orders = truth(&server.cf, "orders");
    let items = truth(&server.cf, "items");
    let mut sse = SseReader::open(
        &server.url("/changefeed/stream?cursors=orders:0,items:0&max_events=5"),
        &[],
    )
    .await;
    assert_eq!(sse.status, 200);
    let mut last = (String::new(), 0);
    for _ in 0..10 {
        loop {
            match sse.next(PATIENCE).await.expect("the stream goes on") {
                Sse::Listed { id, data } => {
                    let e: Value = serde_json::from_str(&data).unwrap();
                    assert_eq!(id, format!("orders:{0},items:{0}", seq(&e)));
                    last = (id, seq(&e));
                    break;
                }
                Sse::Retry(_) | Sse::Comment(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    drop(sse);
    // Resume orders from the id, items from the start again.
    let id = last.0.replace(&format!("items:{}", last.1), "items:0");
    let mut sse = SseReader::open(
        &server.url("/changefeed/stream?cursors=orders:0,items:0&keep_alive=false"),
        &[("last-event-id", &id)],
    )
    .await;
    let mut got = Vec::new();
    while let Some(item) = sse.next(PATIENCE).await {
        if let Sse::Listed { data, .. } = item {
            got.push(seq(&serde_json::from_str(&data).unwrap()));
        }
    }
    let mut want: Vec<u64> = orders.iter().copied().filter(|s| *s > last.1).collect();
    want.extend(&items);
    want.sort_unstable();
    assert_eq!(got, want);
}

async fn bad_lists(server: &Server) {
    for (query, says) in [
        ("cursors=orders", "\"orders\" has no sequence"),
        ("cursors=orders:x", "\"x\" is not a sequence"),
        ("cursors=orders:1,public.orders:2", "name the same table"),
        ("cursors=,", "at least one table"),
        (
            "cursors=orders:1&from_seq=3",
            "leave out from_seq and table",
        ),
        (
            "cursors=orders:1&table=items",
            "leave out from_seq and table",
        ),
    ] {
        for path in ["/changefeed", "/changefeed/stream"] {
            let (status, body) = get(&server.url(&format!("{path}?{query}"))).await;
            assert_eq!(status, 400, "{path}?{query}: {body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            let message = body["message"].as_str().unwrap();
            assert!(message.starts_with("cursors: "), "{message}");
            assert!(message.contains(says), "{path}?{query}: {message}");
        }
    }
    let (status, body) = send(
        hyper::Method::GET,
        &server.url("/changefeed/stream?cursors=orders:1"),
        &[("last-event-id", "orders:")],
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Last-Event-ID"), "{body}");
}

/// A table whose cursor is older than retention gets a gap of its own, once.
async fn gaps(server: &Server) {
    let items = truth(&server.cf, "items");
    let front = items[10];
    server.cf.delete_before(front).await.unwrap();
    let latest = server.cf.latest_sequence();
    let page = get_json(&server.url(&format!(
        "/changefeed?cursors=orders:{latest},items:0&limit=1000"
    )))
    .await;
    assert_eq!(
        page["gaps"],
        serde_json::json!({"items": {"after": 0, "before": front}})
    );
    let got: Vec<u64> = page["events"].as_array().unwrap().iter().map(seq).collect();
    assert_eq!(got, items[10..]);
    assert_eq!(page["cursors"]["items"].as_u64(), Some(latest));
    let mut sse = SseReader::open(
        &server.url(&format!(
            "/changefeed/stream?cursors=orders:{latest},items:0&keep_alive=false"
        )),
        &[],
    )
    .await;
    let (event, data) = sse.next_named(PATIENCE).await.expect("a gap");
    assert_eq!(event, "gap");
    assert_eq!(
        data,
        serde_json::json!({"after": 0, "before": front, "table": "items"})
    );
}
