//! `GET /v2/cdc/stream`: subscribe, the pending-ack window, ack, redelivery,
//! unsubscribe, bad frames, and consumer-group subscriptions across a restart.

use crate::support;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(server: &Server) -> Ws {
    connect_at(server, "/v2/cdc/stream").await
}

/// A WebSocket connection to `path` (`/v2/cdc/stream` with a query).
pub(crate) async fn connect_at(server: &Server, path: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(server.ws_url(path))
        .await
        .expect("connect");
    ws
}

pub(crate) async fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .expect("send");
}

/// The next JSON frame from the server.
pub(crate) async fn recv(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame within the deadline")
            .expect("the connection is open")
            .expect("a frame");
        if let Message::Text(t) = msg {
            return serde_json::from_str(t.as_str()).expect("JSON frame");
        }
    }
}

/// Asks the server something it answers with an error: every frame the server meant to
/// send before handling it arrives first, so what comes before the answer is all of it.
pub(crate) async fn drain_until_probe(ws: &mut Ws) -> Vec<Value> {
    send(ws, json!({"action": "probe"})).await;
    let mut before = Vec::new();
    loop {
        let f = recv(ws).await;
        if f["action"] == "error" && f["message"].as_str().unwrap().contains("probe") {
            return before;
        }
        before.push(f);
    }
}

fn seqs(frames: &[Value]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f["sequence"].as_u64().expect("an event frame"))
        .collect()
}

#[tokio::test]
async fn subscribe_window_ack_redelivery_and_unsubscribe() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.ws_pending_window = 3;
    // Long enough that the steps before the redelivery (drain, ack, drain: a few round
    // trips) cannot outlast it on a loaded machine, where 300 ms did: events 3, 4 and 5
    // were then sent again before the test expected them.
    cfg.http.ws_ack_timeout_ms = 2000;
    let server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 10)).await.unwrap();
    server
        .cf
        .append(&[plain("items", 1, freshen::Op::Insert)])
        .await
        .unwrap();

    let mut ws = connect(&server).await;
    send(
        &mut ws,
        json!({"action": "subscribe", "id": "s1", "table": "orders", "from_seq": 0}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await,
        json!({"action": "subscribed", "id": "s1"})
    );
    let first = drain_until_probe(&mut ws).await;
    assert_eq!(
        seqs(&first),
        [1, 2, 3],
        "the window holds three unacknowledged events"
    );
    assert_eq!(first[0]["sub_id"], "s1");
    assert_eq!(first[0]["key"], "orders:1");

    send(&mut ws, json!({"action": "ack", "id": "s1", "sequence": 2})).await;
    let next = drain_until_probe(&mut ws).await;
    assert_eq!(seqs(&next), [4, 5], "acks open the window");

    // Not acknowledged within the timeout: 3, 4, 5 are sent again.
    let mut again = Vec::new();
    while again.len() < 3 {
        again.push(recv(&mut ws).await);
    }
    assert_eq!(seqs(&again), [3, 4, 5]);
    send(
        &mut ws,
        json!({"action": "ack", "id": "s1", "sequence": 10}),
    )
    .await;
    let rest = drain_until_probe(&mut ws).await;
    assert_eq!(seqs(&rest), [6, 7, 8]);

    send(&mut ws, json!({"action": "unsubscribe", "id": "s1"})).await;
    // Redeliveries may precede the reply.
    while recv(&mut ws).await["action"] != "unsubscribed" {}
    server.cf.append(&orders(20, 2)).await.unwrap();
    let after = drain_until_probe(&mut ws).await;
    assert!(after.is_empty(), "nothing after unsubscribe: {after:?}");

    // ThemisDB's spellings: collection (a key prefix), from_sequence (inclusive),
    // event_types.
    send(&mut ws, json!({"action": "subscribe", "id": "s2", "collection": "items", "from_sequence": 11, "event_types": ["PUT"]})).await;
    assert_eq!(recv(&mut ws).await["action"], "subscribed");
    let items = drain_until_probe(&mut ws).await;
    assert_eq!(seqs(&items), [11]);
    server.stop().await;
}

#[tokio::test]
async fn bad_frames_get_error_replies() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let mut ws = connect(&server).await;
    for (frame, needle) in [
        ("not json".to_owned(), "invalid frame"),
        (json!({"id": "x"}).to_string(), "missing 'action'"),
        (json!({"action": "fly"}).to_string(), "unknown action"),
        (json!({"action": "subscribe"}).to_string(), "requires 'id'"),
        (
            json!({"action": "subscribe", "id": "g", "group_id": "nope"}).to_string(),
            "no consumer group",
        ),
        (
            json!({"action": "subscribe", "id": "s", "event_types": ["UPSERT"]}).to_string(),
            "UPSERT",
        ),
        (json!({"action": "ack", "id": "s"}).to_string(), "sequence"),
        (
            json!({"action": "ack", "sequence": 1}).to_string(),
            "requires 'id'",
        ),
    ] {
        ws.send(Message::Text(frame.clone().into())).await.unwrap();
        let reply = recv(&mut ws).await;
        assert_eq!(reply["action"], "error", "{frame}");
        assert!(
            reply["message"].as_str().unwrap().contains(needle),
            "{frame}: {reply}"
        );
    }
    ws.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    assert!(
        recv(&mut ws).await["message"]
            .as_str()
            .unwrap()
            .contains("JSON text")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_group_subscription_commits_the_group_offset_and_resumes_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.ws_pending_window = 4;
    let mut server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 6)).await.unwrap();
    let (status, _) = post(
        &server.url("/changefeed/groups"),
        // Long enough that no lease runs out between the first delivery and the restart
        // on a loaded machine (500 ms did, about one run in fifteen under stress).
        json!({"name": "ui", "visibility_timeout_ms": 3000}),
    )
    .await;
    assert_eq!(status, hyper::StatusCode::CREATED);

    let mut ws = connect(&server).await;
    send(
        &mut ws,
        json!({"action": "subscribe", "group_id": "ui", "consumer_id": "tab-1"}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await,
        json!({"action": "subscribed", "id": "ui:tab-1"})
    );
    let got = drain_until_probe(&mut ws).await;
    assert_eq!(seqs(&got), [1, 2, 3, 4]);
    assert_eq!(got[0]["deliveries"], 1);
    send(
        &mut ws,
        json!({"action": "ack", "group_id": "ui", "sequence": 2}),
    )
    .await;
    let more = drain_until_probe(&mut ws).await;
    assert_eq!(seqs(&more), [5, 6]);
    let info = get_json(&server.url("/changefeed/groups/ui")).await;
    assert_eq!(info["committed_offset"], 2);

    drop(ws);
    server = server.restart(&cfg).await;
    // A new connection of the same consumer: 3..6 were leased and never acknowledged,
    // so they come again once their leases expire.
    let mut ws = connect(&server).await;
    send(
        &mut ws,
        json!({"action": "subscribe", "group_id": "ui", "consumer_id": "tab-1"}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["action"], "subscribed");
    let mut again = Vec::new();
    while again.len() < 4 {
        again.push(recv(&mut ws).await);
    }
    assert_eq!(seqs(&again), [3, 4, 5, 6]);
    assert!(again.iter().all(|f| f["deliveries"] == 2), "{again:?}");
    send(
        &mut ws,
        json!({"action": "ack", "id": "ui:tab-1", "sequence": 6}),
    )
    .await;
    let _ = drain_until_probe(&mut ws).await;
    let info = get_json(&server.url("/changefeed/groups/ui")).await;
    assert_eq!(
        (
            info["committed_offset"].as_u64(),
            info["in_flight"].as_u64()
        ),
        (Some(6), Some(0))
    );
    server.stop().await;
}

#[tokio::test]
async fn a_slow_reader_that_keeps_acknowledging_gets_no_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.ws_pending_window = 2;
    // Times scaled so that a scheduling delay of up to 350 ms on a loaded machine
    // cannot make an acknowledgement late (130 ms against 200 ms failed one run in three).
    cfg.http.ws_ack_timeout_ms = 1000;
    let server = Server::start(&cfg).await;
    server.cf.append(&orders(1, 8)).await.unwrap();
    let mut ws = connect(&server).await;
    send(
        &mut ws,
        json!({"action": "subscribe", "id": "s", "from_seq": 0}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["action"], "subscribed");
    // Each event waits two handling times (1300 ms) in the window, longer than the ack
    // timeout, but the reader acknowledges one every 650 ms: it is paced by the window,
    // never sent an event twice.
    let mut got = Vec::new();
    while got.len() < 8 {
        let f = recv(&mut ws).await;
        let seq = f["sequence"].as_u64().expect("an event");
        got.push(seq);
        tokio::time::sleep(std::time::Duration::from_millis(650)).await;
        send(
            &mut ws,
            json!({"action": "ack", "id": "s", "sequence": seq}),
        )
        .await;
    }
    assert_eq!(got, (1..=8).collect::<Vec<_>>());
    assert!(drain_until_probe(&mut ws).await.is_empty());
    assert!(
        server
            .cf
            .metrics_text()
            .contains("freshen_changefeed_ws_redelivered_total 0")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_transaction_is_sent_with_its_marker_once_the_source_says_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let (feed, source) = freshen::channel(8);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cf = server.cf.clone();
    let capture = tokio::spawn(async move {
        cf.capture(source, async {
            let _ = stopped.await;
        })
        .await
        .expect("capture runs");
    });
    let mut ws = connect_at(&server, "/v2/cdc/stream?tx=1").await;
    send(
        &mut ws,
        json!({"action": "subscribe", "id": "s", "from_seq": 0}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["action"], "subscribed");

    // A transaction the source has not said is complete: its events wait for its end.
    let batch = freshen::Batch::new(
        vec![order(1, 100, 0), order(2, 100, 1)],
        freshen::Ack::none(),
    );
    feed.send(batch).await.unwrap();
    freshen_testenv::refresher::eventually(20, "the events stored", || async {
        (server.cf.stats().total_events == 2).then_some(())
    })
    .await;
    assert!(drain_until_probe(&mut ws).await.is_empty(), "held back");

    // Only the source's word that commit 100 is complete: no new event, no client frame.
    let end = freshen::Batch::new(vec![], freshen::Ack::none()).with_committed_through(Some(100));
    feed.send(end).await.unwrap();
    let frames = [
        recv(&mut ws).await,
        recv(&mut ws).await,
        recv(&mut ws).await,
    ];
    assert_eq!(seqs(&frames[..2]), [1, 2]);
    assert_eq!(frames[2]["type"], "TRANSACTION_COMMIT");
    assert_eq!(
        (
            frames[2]["sequence"].as_u64(),
            frames[2]["event_count"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(frames[2]["sub_id"], "s");
    let _ = stop.send(());
    capture.await.unwrap();
    server.stop().await;
}
