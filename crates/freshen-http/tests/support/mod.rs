//! A server on a loopback port and raw-socket clients, for the serving tests.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long any awaited condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub async fn start(router: Router, settings: freshen_http::ListenerConfig) -> Server {
        Server::start_on("127.0.0.1:0", router, settings).await
    }

    pub async fn start_on(
        bind: &str,
        router: Router,
        settings: freshen_http::ListenerConfig,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(freshen_http::serve(listener, router, settings, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server stops")
            .expect("server task")
            .expect("serve");
    }
}

/// Routes that exercise every rule: a plain GET, a POST, a WebSocket, a slow handler and
/// a slow streamed body.
pub fn router() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/change", post(|| async { "changed" }))
        .route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move { ws.on_upgrade(|_socket| async {}) }),
        )
        .route(
            "/ws-hold",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move { while socket.recv().await.is_some() {} })
            }),
        )
        .route(
            "/stuck",
            get(|| async {
                std::future::pending::<()>().await;
                "never"
            }),
        )
        .route(
            "/stream",
            get(|| async {
                // Three chunks, the last well after a 1 s request timeout.
                let chunks = futures_util::stream::unfold(0u8, |n| async move {
                    if n == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    Some((Ok::<_, std::io::Error>(format!("chunk{n}\n")), n + 1))
                });
                axum::body::Body::from_stream(chunks)
            }),
        )
}

/// Sends `request` as written and returns everything read until the server closes
/// the connection or `PATIENCE` passes.
pub async fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the response to `request` (which should say `Connection: close`
/// unless it upgrades).
pub async fn status(addr: SocketAddr, request: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut chunk))
            .await
            .expect("a response within the deadline")
            .expect("read");
        assert!(n > 0, "the server closed without answering");
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {line}"))
}

pub fn get_req(path: &str, host: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
}

pub fn ws_req(host: &str, origin: Option<&str>) -> String {
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    format!(
        "GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{origin}\r\n"
    )
}

/// This process's open file descriptors.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd (Linux)")
        .count()
}

/// Polls `f` until it holds, failing with `what` after `PATIENCE` (the workspace's one
/// poll-until helper, with this crate's patience).
pub async fn eventually(what: &str, f: impl FnMut() -> bool) {
    freshen_testenv::refresher::until_within(what, PATIENCE, f).await;
}
