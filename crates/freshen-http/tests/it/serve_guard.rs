//! Host and Origin rules on a real listener: DNS rebinding and cross-site requests.

use crate::support;

use freshen_http::ListenerConfig;
use support::*;

fn settings() -> ListenerConfig {
    let mut s = ListenerConfig::new("test");
    s.allowed_hosts = vec!["feed.internal".into()];
    s.allowed_origins = vec!["https://app.example.com".into()];
    s
}

#[tokio::test]
async fn a_forged_host_is_refused_on_loopback() {
    let server = Server::start(router(), settings()).await;
    let a = server.addr;
    for host in [
        a.to_string(),
        "localhost".into(),
        format!("localhost:{}", a.port()),
        "feed.internal".into(),
    ] {
        assert_eq!(
            status(a, &get_req("/hello", &host, "")).await,
            200,
            "{host}"
        );
    }
    let refused = exchange(a, &get_req("/hello", "evil.example", "")).await;
    assert!(refused.starts_with("HTTP/1.1 421"), "{refused}");
    assert!(
        refused.contains("DNS rebinding"),
        "the body says why: {refused}"
    );
    let bare = exchange(a, "GET /hello HTTP/1.0\r\n\r\n").await;
    assert!(
        bare.starts_with("HTTP/1.0 421") || bare.starts_with("HTTP/1.1 421"),
        "{bare}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_non_loopback_listener_serves_any_host_unless_told() {
    // 0.0.0.0 is not loopback; clients still connect over 127.0.0.1.
    let server = Server::start_on("0.0.0.0:0", router(), ListenerConfig::new("test")).await;
    let a = std::net::SocketAddr::from(([127, 0, 0, 1], server.addr.port()));
    assert_eq!(
        status(a, &get_req("/hello", "feed.example.com", "")).await,
        200
    );
    server.stop().await;
    let server = Server::start_on("0.0.0.0:0", router(), settings()).await;
    let a = std::net::SocketAddr::from(([127, 0, 0, 1], server.addr.port()));
    assert_eq!(
        status(a, &get_req("/hello", "feed.example.com", "")).await,
        421
    );
    assert_eq!(
        status(a, &get_req("/hello", "feed.internal:80", "")).await,
        200
    );
    server.stop().await;
}

#[tokio::test]
async fn cross_origin_websocket_upgrades_are_refused() {
    let server = Server::start(router(), settings()).await;
    let a = server.addr;
    let host = a.to_string();
    assert_eq!(
        status(a, &ws_req(&host, Some("https://evil.example"))).await,
        403
    );
    assert_eq!(status(a, &ws_req(&host, Some("null"))).await, 403);
    assert_eq!(
        status(a, &ws_req(&host, Some(&format!("http://{host}")))).await,
        101,
        "same origin"
    );
    assert_eq!(
        status(a, &ws_req(&host, Some("https://app.example.com"))).await,
        101,
        "allowed origin"
    );
    assert_eq!(
        status(a, &ws_req(&host, None)).await,
        101,
        "a program, not a browser"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_post_from_a_foreign_origin_is_refused() {
    let server = Server::start(router(), settings()).await;
    let a = server.addr;
    let post = |origin: &str| {
        format!(
            "POST /change HTTP/1.1\r\nHost: {a}\r\nOrigin: {origin}\r\nContent-Type: text/plain\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\nhi"
        )
    };
    let refused = exchange(a, &post("https://evil.example")).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        refused.contains("evil.example"),
        "the body names the origin: {refused}"
    );
    assert_eq!(status(a, &post(&format!("http://{a}"))).await, 200);
    // A simple GET is answered (the browser keeps the answer from a foreign page).
    assert_eq!(
        status(
            a,
            &get_req("/hello", &a.to_string(), "Origin: https://evil.example\r\n")
        )
        .await,
        200
    );
    server.stop().await;
}
