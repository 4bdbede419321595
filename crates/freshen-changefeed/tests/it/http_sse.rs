//! `GET /changefeed/stream`: format, resume, heartbeats, a slow reader, limits.

use crate::support;

use std::time::Duration;

use freshen::Op;
use hyper::StatusCode;
use support::*;

#[tokio::test]
async fn streams_retry_then_events_with_ids_and_anti_buffering_headers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    server.cf.append(&orders(1, 2)).await.unwrap();

    let mut sse = SseReader::open(&server.url("/changefeed/stream?retry_ms=250"), &[]).await;
    assert_eq!(sse.status, StatusCode::OK);
    assert_eq!(sse.headers["content-type"], "text/event-stream");
    assert_eq!(sse.headers["x-accel-buffering"], "no");
    assert!(
        sse.headers["cache-control"]
            .to_str()
            .unwrap()
            .contains("no-cache")
    );
    assert_eq!(
        sse.next(PATIENCE).await,
        Some(Sse::Retry(250)),
        "retry: comes first"
    );
    let (id, e) = sse.next_event(PATIENCE).await.unwrap();
    assert_eq!(
        (id, e["sequence"].as_u64(), e["key"].as_str()),
        (1, Some(1), Some("orders:1"))
    );
    assert_eq!(sse.next_event(PATIENCE).await.unwrap().0, 2);
    // Live: appended after the stream caught up.
    server
        .cf
        .append(&[plain("items", 5, Op::Delete)])
        .await
        .unwrap();
    let (id, e) = sse.next_event(PATIENCE).await.unwrap();
    assert_eq!((id, e["type"].as_str()), (3, Some("DELETE")));
    server.stop().await;
}

#[tokio::test]
async fn last_event_id_resumes_exclusively_and_wins_over_from_seq() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    server.cf.append(&orders(1, 6)).await.unwrap();
    let mut sse = SseReader::open(
        &server.url("/changefeed/stream?from_seq=1"),
        &[("last-event-id", "4")],
    )
    .await;
    assert_eq!(sse.next_event(PATIENCE).await.unwrap().0, 5);
    assert_eq!(sse.next_event(PATIENCE).await.unwrap().0, 6);
    let mut sse = SseReader::open(&server.url("/changefeed/stream?from_seq=5"), &[]).await;
    assert_eq!(
        sse.next_event(PATIENCE).await.unwrap().0,
        6,
        "from_seq is exclusive too"
    );
    let bad = SseReader::open(
        &server.url("/changefeed/stream"),
        &[("last-event-id", "x1")],
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

#[tokio::test]
async fn heartbeats_arrive_while_idle() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let mut sse = SseReader::open(&server.url("/changefeed/stream?heartbeat_ms=100"), &[]).await;
    assert!(matches!(sse.next(PATIENCE).await, Some(Sse::Retry(_))));
    for _ in 0..3 {
        assert_eq!(
            sse.next(PATIENCE).await,
            Some(Sse::Comment("heartbeat".into()))
        );
    }
    server.cf.append(&orders(1, 1)).await.unwrap();
    loop {
        match sse.next(PATIENCE).await.expect("the event") {
            Sse::Event { id, .. } => break assert_eq!(id, Some(1)),
            Sse::Comment(c) => assert_eq!(c, "heartbeat"),
            other => panic!("unexpected {other:?}"),
        }
    }
    server.stop().await;
}

/// A reader that does not read for a while and then reads slowly, while the log grows
/// far beyond any socket buffer: it still receives every event, once, in order.
#[tokio::test]
async fn a_slow_reader_receives_every_event() {
    const TOTAL: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.durability = freshen_changefeed::Durability::None;
    let server = Server::start(&cfg).await;
    let mut sse = SseReader::open(
        &server.url("/changefeed/stream?max_events=50&table=orders"),
        &[],
    )
    .await;
    let cf = server.cf.clone();
    let producer = tokio::spawn(async move {
        for b in 0..(TOTAL / 500) as i64 {
            cf.append(&orders(1 + b * 500, 500)).await.unwrap();
            // Unrelated events the filter skips.
            cf.append(&[plain("items", b, Op::Insert)]).await.unwrap();
        }
    });
    // Read nothing until the producer is done: the server must hold no queue for us.
    producer.await.unwrap();
    let mut expected_id = 1u64;
    let mut n = 0u64;
    while n < TOTAL {
        let (_, e) = sse.next_event(PATIENCE).await.expect("no event lost");
        let key = e["key"].as_str().unwrap().to_owned();
        n += 1;
        assert_eq!(key, format!("orders:{n}"));
        let seq = e["sequence"].as_u64().unwrap();
        assert!(seq >= expected_id, "in order");
        expected_id = seq + 1;
        if n.is_multiple_of(1000) {
            // Slow: the stream waits for us.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn one_shot_and_time_limited_streams_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    server.cf.append(&orders(1, 3)).await.unwrap();
    // ThemisDB's keep_alive=false: what is there, then the end.
    let (status, body) = get(&server.url("/changefeed/stream?keep_alive=false&from_seq=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("retry: "), "{body}");
    assert_eq!(
        body.matches("\nid: ").count() + usize::from(body.starts_with("id: ")),
        2,
        "{body}"
    );
    let (_, body) = get(&server.url("/changefeed/stream?keep_alive=false&from_seq=3")).await;
    assert!(
        body.contains(": heartbeat"),
        "an empty one-shot says it is alive: {body}"
    );
    // max_seconds: the stream ends by itself.
    let mut sse = SseReader::open(
        &server.url("/changefeed/stream?from_seq=3&max_seconds=1&heartbeat_ms=100000"),
        &[],
    )
    .await;
    assert!(matches!(sse.next(PATIENCE).await, Some(Sse::Retry(_))));
    assert_eq!(sse.next(PATIENCE).await, None, "ended within the deadline");
    server.stop().await;
}
