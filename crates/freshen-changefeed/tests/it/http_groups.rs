//! Consumer groups over HTTP: leases, acks, redelivery after the visibility timeout,
//! nacks, dead letters after `max_deliveries`, replay — all across server restarts.

use crate::support;

use hyper::StatusCode;
use serde_json::json;
use support::*;

async fn receive(
    server: &Server,
    group: &str,
    consumer: &str,
    max: u64,
    wait_ms: u64,
) -> Vec<(u64, u64)> {
    let (status, body) = post(
        &server.url(&format!("/changefeed/groups/{group}/receive")),
        json!({"consumer_id": consumer, "max_events": max, "wait_ms": wait_ms}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["count"].as_u64().unwrap() as usize,
        body["events"].as_array().unwrap().len()
    );
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["sequence"].as_u64().unwrap(),
                e["deliveries"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Receives until `want` shows up (leases expire on the wall clock), within PATIENCE.
async fn receive_until(
    server: &Server,
    group: &str,
    consumer: &str,
    want: &[u64],
) -> Vec<(u64, u64)> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut got: Vec<(u64, u64)> = Vec::new();
    while !want.iter().all(|w| got.iter().any(|(s, _)| s == w)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never redelivered {want:?}; got {got:?}"
        );
        got.extend(receive(server, group, consumer, 10, 200).await);
    }
    got
}

async fn info(server: &Server, group: &str) -> serde_json::Value {
    get_json(&server.url(&format!("/changefeed/groups/{group}"))).await
}

#[tokio::test]
async fn leases_acks_redelivery_nacks_dead_letters_and_replay_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 4)).await.unwrap();

    let (status, g) = post(
        &server.url("/changefeed/groups"),
        json!({"name": "billing", "visibility_timeout_ms": 300, "max_deliveries": 2, "table": "orders"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{g}");
    assert_eq!(
        (g["committed_offset"].as_u64(), g["lag"].as_u64()),
        (Some(0), Some(4))
    );

    // Two consumers share the work: no event goes to both.
    let a = receive(&server, "billing", "a", 2, 0).await;
    let b = receive(&server, "billing", "b", 2, 0).await;
    assert_eq!(a, [(1, 1), (2, 1)]);
    assert_eq!(b, [(3, 1), (4, 1)]);

    // Leases survive a restart: nothing is handed out twice before its timeout.
    server = server.restart(&cfg).await;
    let (status, s) = post(
        &server.url("/changefeed/groups/billing/ack"),
        json!({"sequences": [1, 2, 99]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(
        (
            s["acked"].as_u64(),
            s["unknown"].as_u64(),
            s["committed_offset"].as_u64()
        ),
        (Some(2), Some(1), Some(2))
    );
    let (_, s) = post(
        &server.url("/changefeed/groups/billing/nack"),
        json!({"sequence": 3, "reason": "downstream 503"}),
    )
    .await;
    assert_eq!(s["requeued"], 1);
    let i = info(&server, "billing").await;
    assert_eq!(
        (i["committed_offset"].as_u64(), i["cursor"].as_u64()),
        (Some(2), Some(4))
    );

    // The nacked event comes back at once; 4 comes back when its lease expires.
    let got = receive_until(&server, "billing", "c", &[3, 4]).await;
    assert!(got.contains(&(3, 2)) && got.contains(&(4, 2)), "{got:?}");
    server = server.restart(&cfg).await;

    // Not acknowledged again: after max_deliveries (2) they are dead letters.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let dead = loop {
        let d = get_json(&server.url("/changefeed/groups/billing/dead-letters")).await;
        if d["count"] == 2 {
            break d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never dead-lettered: {d}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let letters = dead["dead_letters"].as_array().unwrap();
    assert_eq!(letters[0]["sequence"], 3);
    assert_eq!(letters[0]["reason"], "downstream 503");
    assert_eq!(letters[0]["attempts"], 2);
    assert_eq!(letters[0]["event"]["key"], "orders:3");
    assert!(
        letters[1]["reason"]
            .as_str()
            .unwrap()
            .contains("visibility timeout")
    );
    // Dead letters count as done for the offset.
    let i = info(&server, "billing").await;
    assert_eq!(
        (
            i["committed_offset"].as_u64(),
            i["dead_letters"].as_u64(),
            i["in_flight"].as_u64()
        ),
        (Some(4), Some(2), Some(0))
    );

    // Replay one: delivered again with a fresh count; then acknowledged.
    let (status, _) = post(
        &server.url("/changefeed/groups/billing/dead-letters/3/replay"),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    server = server.restart(&cfg).await;
    let got = receive(&server, "billing", "a", 1, 0).await;
    assert_eq!(got, [(3, 1)]);
    let (_, s) = post(
        &server.url("/changefeed/groups/billing/ack"),
        json!({"sequence": 3}),
    )
    .await;
    assert_eq!(s["acked"], 1);
    let (status, _) = post(
        &server.url("/changefeed/groups/billing/dead-letters/3/replay"),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no longer a dead letter");

    // Delete one, then drain the rest.
    server.cf.append(&orders(5, 2)).await.unwrap();
    let (status, _) = delete(&server.url("/changefeed/groups/billing/dead-letters/4")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info(&server, "billing").await["dead_letters"], 0);
    let got = receive(&server, "billing", "a", 10, 0).await;
    assert_eq!(got, [(5, 1), (6, 1)]);
    let (_, s) = post(
        &server.url("/changefeed/groups/billing/nack"),
        json!({"sequences": [5, 6], "delay_ms": 0}),
    )
    .await;
    assert_eq!(s["requeued"], 2);
    let got = receive(&server, "billing", "a", 10, 0).await;
    assert_eq!(got, [(5, 2), (6, 2)]);
    let (_, s) = post(
        &server.url("/changefeed/groups/billing/nack"),
        json!({"sequences": [5, 6]}),
    )
    .await;
    assert_eq!(
        s["dead_lettered"], 2,
        "second nack of 2 deliveries dead-letters at once"
    );
    let (status, d) = delete(&server.url("/changefeed/groups/billing/dead-letters")).await;
    assert_eq!((status, d["drained"].as_u64()), (StatusCode::OK, Some(2)));
    server = server.restart(&cfg).await;
    let i = info(&server, "billing").await;
    assert_eq!(
        (
            i["committed_offset"].as_u64(),
            i["lag"].as_u64(),
            i["dead_letters"].as_u64()
        ),
        (Some(6), Some(0), Some(0))
    );

    // A receive with wait_ms returns as soon as an event is appended.
    let url = server.url("/changefeed/groups/billing/receive");
    let waiting =
        tokio::spawn(
            async move { post(&url, json!({"consumer_id": "a", "wait_ms": 60000})).await },
        );
    server.cf.append(&orders(7, 1)).await.unwrap();
    let (status, body) = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("woken by the append")
        .unwrap();
    assert_eq!(
        (status, body["events"][0]["sequence"].as_u64()),
        (StatusCode::OK, Some(7))
    );
    server.stop().await;
}

#[tokio::test]
async fn group_admin_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    server.cf.append(&orders(1, 3)).await.unwrap();
    let url = |p: &str| server.url(p);

    let (status, _) = post(
        &url("/changefeed/groups"),
        json!({"name": "g1", "start": "latest"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, g) = post(
        &url("/changefeed/groups"),
        json!({"name": "g1", "start": "latest"}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "same definition: the existing group"
    );
    assert_eq!(g["committed_offset"], 3, "start latest");
    let (status, e) = post(
        &url("/changefeed/groups"),
        json!({"name": "g1", "max_deliveries": 9}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{e}");
    let (status, g) = post(
        &url("/changefeed/groups"),
        json!({"name": "g2", "start": 1}),
    )
    .await;
    assert_eq!(
        (status, g["cursor"].as_u64()),
        (StatusCode::CREATED, Some(1))
    );
    let list = get_json(&url("/changefeed/groups")).await;
    assert_eq!(list["count"], 2);

    for (body, needle) in [
        (json!({"name": "bad name"}), "invalid group name"),
        (json!({"name": "g3", "start": "middle"}), "start"),
        (json!({"name": "g3", "max_deliveries": 0}), "max_deliveries"),
        (json!({"name": "g3", "op": "upsert"}), "upsert"),
        (json!({"name": "g3", "colour": "red"}), "colour"),
        (json!({}), "name"),
    ] {
        let (status, e) = post(&url("/changefeed/groups"), body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert_eq!(e["error"], true);
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e}"
        );
    }
    for (body, needle) in [
        (json!({}), "consumer_id"),
        (json!({"consumer_id": "c", "max_events": 0}), "max_events"),
        (
            json!({"consumer_id": "c", "visibility_timeout_ms": 0}),
            "visibility_timeout_ms",
        ),
    ] {
        let (status, e) = post(&url("/changefeed/groups/g2/receive"), body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body}: {e}"
        );
    }
    let (status, e) = post(&url("/changefeed/groups/g2/ack"), json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let (status, _) = send(
        hyper::Method::POST,
        &url("/changefeed/groups/g2/ack"),
        &[("content-type", "application/json")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an empty body");
    let (status, _) = post(
        &url("/changefeed/groups/g2/dead-letters/x/replay"),
        json!({}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a sequence that is not a number"
    );

    for (method, path) in [
        (hyper::Method::GET, "/changefeed/groups/nope"),
        (hyper::Method::POST, "/changefeed/groups/nope/receive"),
        (hyper::Method::POST, "/changefeed/groups/nope/ack"),
        (hyper::Method::POST, "/changefeed/groups/nope/nack"),
        (hyper::Method::GET, "/changefeed/groups/nope/dead-letters"),
        (hyper::Method::DELETE, "/changefeed/groups/nope"),
        (
            hyper::Method::DELETE,
            "/changefeed/groups/nope/dead-letters",
        ),
        (
            hyper::Method::DELETE,
            "/changefeed/groups/g2/dead-letters/7",
        ),
        (hyper::Method::GET, "/no/such/endpoint"),
    ] {
        let body = match path.rsplit('/').next() {
            Some("receive") => Some(json!({"consumer_id": "c"})),
            Some("ack" | "nack") => Some(json!({"sequence": 1})),
            _ => None,
        };
        let (status, text) = send(method.clone(), &url(path), &[], body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {text}");
        let e: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["status_code"], 404);
    }
    let (status, _) = delete(&url("/changefeed/groups/g1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(get_json(&url("/changefeed/groups")).await["count"], 1);
    server.stop().await;
}
