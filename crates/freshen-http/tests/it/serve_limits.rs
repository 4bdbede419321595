//! Timeouts and the connection limit on a real listener: slowloris connections are
//! closed and their descriptors come back; at the limit a connection that sent no
//! request makes room for a new one, connections over a limit of requests wait, and the
//! server says so once.

use crate::support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen_http::ListenerConfig;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Log lines, captured for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches(needle)
            .count()
    }
}

/// The tests of this file run one at a time: two of them count this process's
/// descriptors, which every test's sockets and runtime change.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A WebSocket on `/ws-hold`, open once its `101` is read (so its request was read).
async fn open_websocket(a: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(a).await.unwrap();
    s.write_all(
        ws_req(&a.to_string(), None)
            .replace("/ws ", "/ws-hold ")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");
    s
}

/// Waits for the server to close `s` (connection `i`) having sent it nothing.
async fn closed_unserved(s: &mut TcpStream, i: usize) {
    let mut end = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut end))
        .await
        .unwrap_or_else(|_| panic!("connection {i} is closed to make room"))
        .ok();
    assert!(end.is_empty(), "nothing was served to connection {i}");
}

fn capture_logs() -> Captured {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_and_descriptors_come_back() {
    let _serial = SERIAL.lock().await;
    let mut settings = ListenerConfig::new("test");
    settings.header_timeout = Duration::from_secs(1);
    let server = Server::start(router(), settings).await;
    let a = server.addr;
    let before = open_fds();
    const N: usize = 200;
    let mut clients = Vec::new();
    for _ in 0..N {
        let mut s = TcpStream::connect(a).await.expect("connect");
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .await
            .unwrap();
        clients.push(tokio::spawn(async move {
            // The server closes the connection; the client sees the end.
            let mut buf = Vec::new();
            tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf))
                .await
                .expect("the server closes a connection that never finishes its headers")
                .ok();
        }));
    }
    // Client and server ends both count while the connections are open.
    eventually("the server holds the slow connections", || {
        open_fds() >= before + N
    })
    .await;
    for c in clients {
        c.await.unwrap();
    }
    eventually("descriptors come back", || open_fds() <= before + 2).await;
    // The server still serves.
    assert_eq!(status(a, &get_req("/hello", "127.0.0.1", "")).await, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_wait_and_the_server_says_so_once() {
    let _serial = SERIAL.lock().await;
    let logs = capture_logs();
    let mut settings = ListenerConfig::new("limited");
    settings.max_connections = 4;
    settings.header_timeout = Duration::from_secs(60);
    settings.request_timeout = None;
    let server = Server::start(router(), settings).await;
    let a = server.addr;
    let before = open_fds();
    // Open WebSockets: their requests were read, so none may be closed to make room.
    let mut busy = Vec::new();
    for _ in 0..4 {
        busy.push(open_websocket(a).await);
    }
    let mut extra = Vec::new();
    for _ in 0..10 {
        let mut s = TcpStream::connect(a).await.expect("the kernel queues it");
        s.write_all(get_req("/hello", "127.0.0.1", "").as_bytes())
            .await
            .unwrap();
        extra.push(s);
    }
    eventually("the limit is reported", || {
        logs.count("connection limit reached") == 1
    })
    .await;
    assert_eq!(
        logs.count("wait in the listen queue"),
        1,
        "no connection could be closed"
    );
    let waited =
        tokio::time::timeout(Duration::from_millis(300), extra[0].read(&mut [0u8; 64])).await;
    assert!(
        waited.is_err(),
        "a connection over the limit is not served while the limit is held"
    );
    // 4 server ends and the one accepted beyond them at most, plus the 14 clients: the
    // queued ones hold no server descriptor.
    assert!(
        open_fds() <= before + 5 + 14,
        "{} fds, {before} before",
        open_fds()
    );
    drop(busy);
    for mut s in extra {
        let mut out = Vec::new();
        tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
            .await
            .expect("served once connections close")
            .unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    }
    assert_eq!(
        logs.count("connection limit reached"),
        1,
        "once a minute at most"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_sent_no_request_make_room_oldest_first() {
    let _serial = SERIAL.lock().await;
    let mut settings = ListenerConfig::new("limited");
    settings.max_connections = 4;
    settings.header_timeout = Duration::from_secs(60);
    let server = Server::start(router(), settings).await;
    let a = server.addr;
    // The limit's four places: an open WebSocket, one connection that sent part of a
    // request head, then two that sent nothing.
    let _ws = open_websocket(a).await;
    let mut partial = TcpStream::connect(a).await.unwrap();
    partial
        .write_all(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(a).await.unwrap());
    }
    // Each new connection takes the place of the oldest connection that sent no whole
    // request head, which is closed; the WebSocket is never chosen.
    let mut newer = Vec::new();
    for (i, old) in std::iter::once(&mut partial)
        .chain(silent.iter_mut())
        .enumerate()
    {
        newer.push(TcpStream::connect(a).await.unwrap());
        closed_unserved(old, i).await;
    }
    // A request is served although the places are taken, in the oldest one's place.
    assert_eq!(status(a, &get_req("/hello", "127.0.0.1", "")).await, 200);
    closed_unserved(&mut newer[0], 3).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_websocket_still_counts_against_the_limit() {
    let _serial = SERIAL.lock().await;
    let mut settings = ListenerConfig::new("limited");
    settings.max_connections = 2;
    let server = Server::start(router(), settings).await;
    let a = server.addr;
    let mut sockets = Vec::new();
    for _ in 0..2 {
        sockets.push(open_websocket(a).await);
    }
    let mut extra = TcpStream::connect(a).await.unwrap();
    extra
        .write_all(get_req("/hello", "127.0.0.1", "").as_bytes())
        .await
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), extra.read(&mut [0u8; 64])).await;
    assert!(waited.is_err(), "two open WebSockets hold the limit of two");
    drop(sockets.pop());
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, extra.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_time_out_and_streams_do_not() {
    let _serial = SERIAL.lock().await;
    let mut settings = ListenerConfig::new("test");
    settings.request_timeout = Some(Duration::from_secs(1));
    let server = Server::start(router(), settings).await;
    let a = server.addr;
    let stuck = exchange(a, &get_req("/stuck", "127.0.0.1", "")).await;
    assert!(stuck.starts_with("HTTP/1.1 503"), "{stuck}");
    assert!(stuck.contains("abandoned"), "{stuck}");
    let streamed = exchange(a, &get_req("/stream", "127.0.0.1", "")).await;
    assert!(
        streamed.contains("chunk0") && streamed.contains("chunk2"),
        "a 2 s stream outlives a 1 s request timeout: {streamed}"
    );
    server.stop().await;
}
