//! The served API refuses what a hostile web page would send: a forged `Host` (DNS
//! rebinding) and cross-origin WebSocket upgrades or state-changing requests; pages
//! from the API's own origin or a configured CORS origin are served.

use crate::support;

use hyper::{Method, StatusCode};
use support::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// The status of a WebSocket handshake sent with `origin`.
async fn ws_status(server: &Server, origin: Option<&str>) -> u16 {
    let mut req = server
        .ws_url("/v2/cdc/stream")
        .into_client_request()
        .unwrap();
    if let Some(o) = origin {
        req.headers_mut()
            .insert("origin", HeaderValue::from_str(o).unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((_, response)) => response.status().as_u16(),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("handshake: {e}"),
    }
}

#[tokio::test]
async fn a_forged_host_is_refused_everywhere_admin_included() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let evil = [("host", "rebind.evil.example:8089")];
    for (method, path) in [
        (Method::GET, "/changefeed"),
        (Method::GET, "/changefeed/stats"),
        (Method::POST, "/changefeed/retention"),
        (Method::GET, "/healthz"),
    ] {
        let (status, body) = send(method, &server.url(path), &evil, None).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{path}: {body}");
        assert!(body.contains("DNS rebinding"), "{body}");
    }
    let local = format!("localhost:{}", server.addr.port());
    let (status, _) = send(
        Method::GET,
        &server.url("/changefeed"),
        &[("host", &local)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn configured_hosts_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.http.allowed_hosts = vec!["feed.internal".into()];
    let server = Server::start(&c).await;
    let (status, _) = send(
        Method::GET,
        &server.url("/healthz"),
        &[("host", "feed.internal:8089")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn websocket_upgrades_from_foreign_origins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.http.cors_allow_origins = vec!["https://app.example.com".into()];
    let server = Server::start(&c).await;
    assert_eq!(ws_status(&server, Some("https://evil.example")).await, 403);
    assert_eq!(ws_status(&server, Some("null")).await, 403);
    let own = format!("http://{}", server.addr);
    assert_eq!(ws_status(&server, Some(&own)).await, 101, "same origin");
    assert_eq!(
        ws_status(&server, Some("https://app.example.com")).await,
        101,
        "a CORS origin"
    );
    assert_eq!(
        ws_status(&server, None).await,
        101,
        "a program sends no Origin"
    );
    server.stop().await;
}

#[tokio::test]
async fn state_changing_requests_from_foreign_origins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path())).await;
    let body = serde_json::json!({"name": "g"});
    let foreign = [("origin", "https://evil.example")];
    let (status, text) = send(
        Method::POST,
        &server.url("/changefeed/groups"),
        &foreign,
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    let (status, _) = send(
        Method::DELETE,
        &server.url("/changefeed/groups/g"),
        &foreign,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let own = format!("http://{}", server.addr);
    let (status, text) = send(
        Method::POST,
        &server.url("/changefeed/groups"),
        &[("origin", &own)],
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{text}");
    server.stop().await;
}
