//! Transaction markers against a real PostgreSQL through the real HTTP API: each
//! multi-statement transaction is followed by one `TRANSACTION_COMMIT` with the
//! transaction's xid (as PostgreSQL reports it), commit LSN and event count, right after
//! its last event; the last transaction's marker comes without waiting for another;
//! resuming inside a transaction and a page limit inside one behave as documented;
//! Server-Sent Events carry the same; without `tx=1` nothing changes; a restart keeps
//! what it knew.

use crate::support;

use freshen_testenv::PgServer;
use freshen_testenv::refresher::within;
use serde_json::Value;
use support::*;
use tokio_postgres::Client;

/// Runs `statements` in one transaction; returns its xid as PostgreSQL reports it.
pub(crate) async fn transaction(c: &Client, statements: &[&str]) -> u64 {
    c.batch_execute("BEGIN").await.unwrap();
    let xid: String = c
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    for s in statements {
        c.batch_execute(s).await.unwrap();
    }
    c.batch_execute("COMMIT").await.unwrap();
    xid.parse().expect("an xid8")
}

/// Three transactions over `orders` and `items` (three, one and three events); their xids.
/// The last one's marker must come without another transaction after it.
pub(crate) async fn three_transactions(c: &Client) -> [u64; 3] {
    let t1 = transaction(
        c,
        &[
            "INSERT INTO orders VALUES (1, 'a')",
            "INSERT INTO items VALUES (10, 1)",
            "UPDATE orders SET note = 'b' WHERE id = 1",
        ],
    )
    .await;
    let t2 = transaction(c, &["INSERT INTO orders VALUES (2, 'c')"]).await;
    let t3 = transaction(
        c,
        &[
            "INSERT INTO items VALUES (11, 2), (12, 2)",
            "DELETE FROM orders WHERE id = 2",
        ],
    )
    .await;
    [t1, t2, t3]
}

pub(crate) fn is_marker(e: &Value) -> bool {
    e["type"] == "TRANSACTION_COMMIT"
}

/// Reads pages from the start (each long poll is the wait) until `markers` markers were
/// read; returns every entry.
async fn read_markers(server: &Server, query: &str, markers: usize) -> Vec<Value> {
    within(20, "the transactions' markers", async {
        let mut all: Vec<Value> = Vec::new();
        let mut from = 0;
        while all.iter().filter(|e| is_marker(e)).count() < markers {
            let url = server.url(&format!(
                "/changefeed?from_seq={from}&long_poll_ms=500&{query}"
            ));
            let page = get_json(&url).await;
            all.extend(page["events"].as_array().unwrap().iter().cloned());
            from = page["next_from_seq"].as_u64().unwrap();
        }
        all
    })
    .await
}

/// Checks every marker against the events before it: it follows its transaction's
/// last event, which carry its xid and lsn, and counts them. Returns (xid, count) per
/// marker. For a `filtered` reader the marker's `sequence` is still the transaction's
/// last event in the log, which the filter may have left out.
pub(crate) fn check_markers(entries: &[Value], filtered: bool) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut run: Vec<&Value> = Vec::new();
    for e in entries {
        if is_marker(e) {
            assert!(!run.is_empty(), "a marker after no event: {e}");
            let last = run.last().unwrap();
            if filtered {
                assert!(e["sequence"].as_u64() >= last["sequence"].as_u64(), "{e}");
                assert!(e["first_sequence"].as_u64() <= run[0]["sequence"].as_u64());
            } else {
                assert_eq!(
                    e["sequence"], last["sequence"],
                    "marker after its last event"
                );
                assert_eq!(e["first_sequence"], run[0]["sequence"]);
            }
            assert_eq!(e["event_count"].as_u64(), Some(run.len() as u64));
            for r in &run {
                assert_eq!((&r["xid"], &r["lsn"]), (&e["xid"], &e["lsn"]), "{r}");
            }
            out.push((
                e["xid"].as_u64().unwrap(),
                e["event_count"].as_u64().unwrap(),
            ));
            run.clear();
        } else {
            if let Some(prev) = run.last() {
                assert_eq!(
                    prev["xid"], e["xid"],
                    "a transaction's events end with its marker before the next one's"
                );
            }
            run.push(e);
        }
    }
    assert!(run.is_empty(), "events without a marker: {run:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transaction_ends_with_one_marker_after_its_last_event() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"));
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, note text);
         CREATE TABLE items (id int PRIMARY KEY, order_id int)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let server = Server::start(&config).await;
    let (stop, task) = capture_until_stopped(
        &server.cf,
        // Batches of 2 events: the transactions below span batches, so their ends
        // come in batches of their own or with the next one's rows.
        pg_source(&pg, "feed", &["public.orders", "public.items"], |c| {
            c.batch_size = 2
        })
        .await,
    );

    let [t1, t2, t3] = three_transactions(&c).await;

    let entries = read_markers(&server, "tx=1", 3).await;
    assert_eq!(check_markers(&entries, false), [(t1, 3), (t2, 1), (t3, 3)]);
    let lsns: Vec<&str> = entries
        .iter()
        .filter(|e| is_marker(e))
        .map(|m| m["lsn"].as_str().unwrap())
        .collect();
    assert!(
        lsns.windows(2).all(|w| w[0] != w[1]),
        "distinct commits: {lsns:?}"
    );

    // Off by default: the same events, no markers.
    let plain = get_json(&server.url("/changefeed?from_seq=0&limit=100")).await;
    let plain = plain["events"].as_array().unwrap();
    let events: Vec<&Value> = entries.iter().filter(|e| !is_marker(e)).collect();
    assert_eq!(plain.iter().collect::<Vec<_>>(), events);
    let off = get_json(&server.url("/changefeed?from_seq=0&limit=100&tx=0")).await;
    assert!(!off["events"].as_array().unwrap().iter().any(is_marker));

    // A reader whose cursor is inside t1 (after its first event) gets the rest of t1,
    // then the marker describing the whole transaction.
    let first = events[0]["sequence"].as_u64().unwrap();
    let page = get_json(&server.url(&format!("/changefeed?from_seq={first}&tx=1&limit=100"))).await;
    let got = page["events"].as_array().unwrap();
    assert_eq!(got[0]["sequence"].as_u64(), Some(first + 1));
    assert!(is_marker(&got[2]), "{}", got[2]);
    assert_eq!(
        (
            got[2]["event_count"].as_u64(),
            got[2]["first_sequence"].as_u64()
        ),
        (Some(3), Some(first))
    );
    assert_eq!(got[2]["xid"].as_u64(), Some(t1));

    // A page limit inside t1 ends the page there; the marker opens the next page.
    let page = get_json(&server.url("/changefeed?from_seq=0&tx=1&limit=2")).await;
    let got = page["events"].as_array().unwrap();
    assert_eq!(got.len(), 2);
    assert!(!got.iter().any(is_marker));
    let next = page["next_from_seq"].as_u64().unwrap();
    let page = get_json(&server.url(&format!("/changefeed?from_seq={next}&tx=1&limit=1"))).await;
    let got = page["events"].as_array().unwrap();
    assert!(!is_marker(&got[0]) && is_marker(&got[1]), "{got:?}");
    assert_eq!(got[1]["event_count"].as_u64(), Some(3));

    // A filtered reader counts its own events and gets no marker for a transaction it
    // saw nothing of.
    let items = read_markers(&server, "tx=1&table=items", 2).await;
    assert_eq!(check_markers(&items, true), [(t1, 1), (t3, 2)]);

    // Server-Sent Events: the same entries, a marker as `event: transaction` without an
    // id (Last-Event-ID stays the last event's sequence).
    let mut sse = SseReader::open(&server.url("/changefeed/stream?from_seq=0&tx=1"), &[]).await;
    let mut streamed: Vec<Value> = Vec::new();
    while streamed.len() < entries.len() {
        match sse.next(PATIENCE).await.expect("the stream goes on") {
            Sse::Event { id, data } => {
                let e: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(id, e["sequence"].as_u64());
                streamed.push(e);
            }
            Sse::Named { event, data } => {
                assert_eq!(event, "transaction");
                streamed.push(serde_json::from_str(&data).unwrap());
            }
            _ => {}
        }
    }
    assert_eq!(streamed, entries);
    drop(sse);

    let metrics = server.cf.metrics_text();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("freshen_changefeed_transaction_markers_total") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );

    // After a restart (nothing new from the source), the last transaction is still
    // known complete: its marker comes at once.
    let _ = stop.send(());
    task.await.unwrap();
    let server = server.restart(&config).await;
    let page = get_json(&server.url("/changefeed?from_seq=0&tx=1&limit=100")).await;
    let again = page["events"].as_array().unwrap();
    assert_eq!(again, &entries, "the same page after the restart");
    server.stop().await;
}
