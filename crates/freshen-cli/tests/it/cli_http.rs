//! The binary's `/metrics`, `/healthz`, `/status` listener on a real socket: the Host
//! allow-list, the Origin check, the header timeout; and the source's last error shown
//! without the password it may quote.

use std::sync::Arc;
use std::time::Duration;

use freshen_cli::Readout;
use freshen_cli::admin::Access;
use freshen_cli::http::serve;
use freshen_cli::{SourceStatus, ViewStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(20);

struct Down;

impl Readout for Down {
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
    fn sinks(&self) -> Vec<freshen_cli::SinkStatus> {
        Vec::new()
    }
    fn redactions(&self) -> Vec<freshen_cli::Redacted> {
        Vec::new()
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
    let mut settings = freshen_http::ListenerConfig::new("metrics");
    settings.header_timeout = Duration::from_secs(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        Arc::new(Down),
        settings,
        Access::Open,
        async {
            let _ = stopped.await;
        },
    ));
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

/// Who may use `/admin`: open on loopback without a token, the token when one is set,
/// nobody beyond loopback without one. (No views here: an allowed request finds none.)
#[tokio::test]
async fn admin_endpoints_take_the_token_and_are_off_beyond_loopback_without_one() {
    let token = || {
        freshen_cli::config::parse(
            "[source]\nkind = \"postgres\"\nurl = \"postgres://a@h/d\"\n[http]\nadmin_token = \"0123456789abcdef0123\"\n[[views]]\nname = \"v\"\nwatch = [{ table = \"t\", key = [\"k\"] }]\nrebuild = [\"SELECT $1\"]\n",
            "t.toml",
            &|_| None,
            freshen_cli::kinds(),
        )
        .map(|c| c.http.unwrap().admin_token.unwrap())
    };
    let token = token().expect("a config with a token");
    let cases: [(Access, Option<&str>, u16); 5] = [
        (Access::Open, None, 404),
        (Access::Token(token.clone()), None, 401),
        (
            Access::Token(token.clone()),
            Some("0123456789abcdef0124"),
            401,
        ),
        (Access::Token(token), Some("0123456789abcdef0123"), 404),
        (Access::Off, Some("0123456789abcdef0123"), 403),
    ];
    for (access, presented, want) in cases {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let label = format!("{access:?} with {presented:?}");
        let server = tokio::spawn(serve(
            listener,
            Arc::new(Down),
            freshen_http::ListenerConfig::new("metrics"),
            access,
            async {
                let _ = stopped.await;
            },
        ));
        let (code, body) = freshen_cli::status::request(
            &base,
            "POST",
            "/admin/views/nope/sweep",
            presented,
            Some("{}"),
        )
        .await
        .unwrap();
        assert_eq!(code, want, "{label}: {body}");
        assert!(!body.contains("0123456789abcdef0123"), "{body}");
        // The rest of the listener never needs the token.
        let (code, _) = freshen_cli::status::get(&base, "/status").await.unwrap();
        assert_eq!(code, 200, "{label}");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
