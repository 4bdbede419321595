//! The binary's `/metrics`, `/healthz`, `/status` listener on a real socket: the Host
//! allow-list, the Origin check, the header timeout; and the source's last error shown
//! without the password it may quote.

use std::sync::Arc;
use std::time::Duration;

use freshen_cli::http::{Observe, serve};
use freshen_cli::metrics::{SourceStatus, ViewStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(20);

struct Down;

impl Observe for Down {
    fn views(&self) -> Vec<ViewStats> {
        Vec::new()
    }
    fn source(&self) -> SourceStatus {
        SourceStatus {
            kind: "postgres".into(),
            streaming: false,
            received_lsn: None,
            confirmed_lsn: None,
            server_lsn: None,
            lag_bytes: None,
            slot_status: None,
            reconnects: 3,
            events: 0,
            last_error: Some("cannot reach postgres://app:SEKRIT@db/app: refused".into()),
            ..SourceStatus::default()
        }
    }
}

async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("the server answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn the_metrics_listener_refuses_rebinding_and_cross_site_requests() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut settings = freshen_http::Settings::new("metrics");
    settings.header_timeout = Duration::from_secs(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, Arc::new(Down), settings, async {
        let _ = stopped.await;
    }));
    let get = |path: &str, host: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };

    let forged = exchange(addr, &get("/status", "rebind.evil.example")).await;
    assert!(forged.starts_with("HTTP/1.1 421"), "{forged}");
    let status = exchange(addr, &get("/status", &addr.to_string())).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let health = exchange(addr, &get("/healthz", "localhost")).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    for body in [&status, &health] {
        assert!(
            body.contains("postgres://app:***@db/app"),
            "the error is shown: {body}"
        );
        assert!(!body.contains("SEKRIT"), "without its password: {body}");
    }
    let post = format!(
        "POST /status HTTP/1.1\r\nHost: {addr}\r\nOrigin: https://evil.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    assert!(exchange(addr, &post).await.starts_with("HTTP/1.1 403"));
    // A connection that never finishes its headers is closed.
    let slow = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await;
    assert!(!slow.contains("200 OK"), "{slow}");

    stop.send(()).unwrap();
    tokio::time::timeout(PATIENCE, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
