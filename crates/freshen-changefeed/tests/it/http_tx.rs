//! Transaction markers at the edges of a read, in-process events with source positions:
//! a page cut by the scan bound right at a transaction's end still says it ended, once.

use crate::support;

use freshen::{Op, Tx};
use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_ending_at_the_scan_bound_keeps_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    // Transaction A: exactly one scan step (10000 records) of orders; then B, an item.
    let a: Vec<_> = (0..10_000).map(|i| order(i, 100, i as u32)).collect();
    server.cf.append(&a).await.unwrap();
    let b = plain("items", 1, Op::Insert).with_tx(Tx {
        id: 2000,
        commit: 200,
        index: 0,
    });
    server.cf.append(&[b]).await.unwrap();

    // A reader of orders with a page larger than a scan step: the first read stops at
    // the bound, on A's last record; the next record, B's, ends A there, so A's marker
    // closes that page (the next page, starting at B, could not tell). Pages after it
    // have nothing for this reader: B is filtered out.
    let mut entries: Vec<Value> = Vec::new();
    let mut from = 0;
    for _ in 0..3 {
        let page = get_json(&server.url(&format!(
            "/changefeed?from_seq={from}&tx=1&table=orders&limit=20000"
        )))
        .await;
        entries.extend(page["events"].as_array().unwrap().iter().cloned());
        from = page["next_from_seq"].as_u64().unwrap();
    }
    let markers: Vec<&Value> = entries
        .iter()
        .filter(|e| e["type"] == "TRANSACTION_COMMIT")
        .collect();
    assert_eq!(markers.len(), 1, "A's marker, once: {markers:?}");
    assert_eq!(markers[0]["event_count"], 10_000);
    assert_eq!(markers[0]["sequence"], 10_000);
    assert_eq!(entries.len(), 10_001);
    assert_eq!(entries.last().unwrap()["type"], "TRANSACTION_COMMIT");
    server.stop().await;
}
