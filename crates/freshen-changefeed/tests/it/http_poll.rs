//! `GET /changefeed`: pages, filters, long-poll wake-up, and a checkpointing client
//! across server restarts.

use crate::support;

use std::time::Duration;

use freshen::Op;
use hyper::StatusCode;
use support::*;

#[tokio::test]
async fn pages_are_exclusive_of_from_seq_filtered_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.max_limit = 5;
    cfg.http.default_limit = 3;
    let server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 4)).await.unwrap();
    server
        .cf
        .append(&[plain("items", 1, Op::Insert), plain("items", 2, Op::Delete)])
        .await
        .unwrap();

    let page = get_json(&server.url("/changefeed")).await;
    assert_eq!(sequences(&page), [1, 2, 3], "default limit");
    assert_eq!(page["count"], 3);
    assert_eq!(page["latest_sequence"], 6);
    let e = &page["events"][0];
    assert_eq!(
        (e["type"].as_str(), e["key"].as_str(), e["op"].as_str()),
        (Some("PUT"), Some("orders:1"), Some("insert"))
    );
    assert_eq!(e["metadata"]["table"], "orders");
    assert!(e["value"].as_str().unwrap().contains("\"id\":1"));

    let page = get_json(&server.url("/changefeed?limit=1000")).await;
    assert_eq!(
        sequences(&page),
        [1, 2, 3, 4, 5],
        "an oversize limit is capped"
    );
    let page = get_json(&server.url("/changefeed?from_seq=2&limit=5")).await;
    assert_eq!(sequences(&page), [3, 4, 5, 6], "from_seq is exclusive");
    let page = get_json(&server.url("/changefeed?from_seq=6")).await;
    assert_eq!(
        (page["count"].as_u64(), page["next_from_seq"].as_u64()),
        (Some(0), Some(6))
    );

    let page = get_json(&server.url("/changefeed?table=items")).await;
    assert_eq!(sequences(&page), [5, 6]);
    let page = get_json(&server.url("/changefeed?table=public.orders&key_prefix=orders:3")).await;
    assert_eq!(sequences(&page), [3]);
    let page = get_json(&server.url("/changefeed?op=delete")).await;
    assert_eq!(sequences(&page), [6]);
    let page = get_json(&server.url("/changefeed?event_types=DELETE")).await;
    assert_eq!(sequences(&page), [6], "ThemisDB's parameter name and type");
    let page = get_json(&server.url("/changefeed?op=insert&table=items&limit=5")).await;
    assert_eq!(sequences(&page), [5]);
    server.stop().await;
}

#[tokio::test]
async fn long_poll_returns_as_soon_as_a_matching_event_exists() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 2)).await.unwrap();

    let url = server.url("/changefeed?from_seq=2&long_poll_ms=60000&table=items");
    let waiting = tokio::spawn(async move { get(&url).await });
    // An event the poll does not want, then one it does.
    server.cf.append(&orders(3, 1)).await.unwrap();
    server
        .cf
        .append(&[plain("items", 7, Op::Update)])
        .await
        .unwrap();
    let (status, body) = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the long poll wakes for the matching event, long before its 60 s")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sequences(&page), [4]);
    assert_eq!(page["next_from_seq"], 4);

    // Nothing new: the poll ends empty at its timeout.
    let page = get_json(&server.url("/changefeed?from_seq=4&long_poll_ms=50")).await;
    assert_eq!(page["count"], 0);
    server.stop().await;
}

#[tokio::test]
async fn a_long_poll_ends_when_the_server_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let url = server.url("/changefeed?long_poll_ms=60000");
    let waiting = tokio::spawn(async move { get(&url).await });
    // The request must be in the server before it stops: poll the metric.
    let metrics_url = server.url("/metrics");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, text) = get(&metrics_url).await;
        if text.contains("freshen_changefeed_poll_requests_total 1") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the poll never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(PATIENCE, server.stop())
        .await
        .expect("shutdown does not wait for the poll's 60 s");
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A client as the seed clients are written: read a page, process it, remember the
/// last sequence, ask again from there — and keep going while the server restarts.
#[tokio::test]
async fn a_checkpointing_client_sees_every_event_exactly_once_across_restarts() {
    const TOTAL: i64 = 600;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut server = Server::start(&cfg).await;
    let base = server.url("");
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reported = progress.clone();

    let client = tokio::spawn(async move {
        let mut checkpoint = 0u64;
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while (seen.len() as i64) < TOTAL {
            assert!(
                tokio::time::Instant::now() < deadline,
                "stalled at {checkpoint}"
            );
            let url = format!("{base}/changefeed?from_seq={checkpoint}&limit=7&long_poll_ms=500");
            let request = try_send(hyper::Method::GET, &url, &[], None);
            let page = match tokio::time::timeout(Duration::from_secs(5), request).await {
                Ok(Ok((StatusCode::OK, body))) => {
                    serde_json::from_str::<serde_json::Value>(&body).unwrap()
                }
                // The server is restarting: try again shortly.
                _ => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            for e in page["events"].as_array().unwrap() {
                let seq = e["sequence"].as_u64().unwrap();
                assert_eq!(seq, checkpoint + 1, "every sequence once, in order");
                seen.push(e["key"].as_str().unwrap().to_owned());
                checkpoint = seq;
            }
            reported.store(checkpoint, std::sync::atomic::Ordering::SeqCst);
        }
        seen
    });

    for round in 0..4 {
        for b in 0..5 {
            let first = 1 + (round * 5 + b) * 30;
            server.cf.append(&orders(first, 30)).await.unwrap();
        }
        // Restart while the client is caught up and long-polling.
        let target = server.cf.latest_sequence();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while progress.load(std::sync::atomic::Ordering::SeqCst) < target {
            assert!(tokio::time::Instant::now() < deadline, "client stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server = server.restart(&cfg).await;
    }
    let seen = tokio::time::timeout(Duration::from_secs(90), client)
        .await
        .expect("client done")
        .unwrap();
    let expected: Vec<String> = (1..=TOTAL).map(|i| format!("orders:{i}")).collect();
    assert_eq!(seen, expected);
    server.stop().await;
}
