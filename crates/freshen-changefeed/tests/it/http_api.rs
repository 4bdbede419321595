//! The router in-process: tokens and scopes, CORS, bad parameters, stats, retention,
//! metrics; and `serve`'s refusal of an unprotected non-loopback listener.

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use freshen_changefeed::{AppState, Scope, ServeError, TokenConfig, serve};
use http_body_util::BodyExt;
use support::*;
use tower::ServiceExt;

async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

fn token(value: &str, scope: Scope) -> TokenConfig {
    TokenConfig {
        token: Some(value.to_owned()),
        token_env: None,
        scope,
    }
}

#[tokio::test]
async fn tokens_and_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.tokens = vec![
        token("reader-secret", Scope::Read),
        // Cargo sets CARGO_PKG_NAME when it runs tests: a token from the environment.
        TokenConfig {
            token: None,
            token_env: Some("CARGO_PKG_NAME".into()),
            scope: Scope::Admin,
        },
    ];
    let cf = open(&cfg).await;
    cf.append(&orders(1, 2)).await.unwrap();
    let r = router(&cf, &cfg);
    let read = [("authorization", "Bearer reader-secret")];
    let admin = [("authorization", "Bearer freshen-changefeed")];

    let (status, headers, body) = call(&r, "GET", "/changefeed", &[], "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(headers["www-authenticate"], "Bearer");
    let (status, _, _) = call(
        &r,
        "GET",
        "/changefeed",
        &[("authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(
        &r,
        "GET",
        "/changefeed",
        &[("authorization", "Basic cmVhZGVy")],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, body) = call(&r, "GET", "/changefeed", &read, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = call(&r, "GET", "/changefeed/stats", &read, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("admin"));
    let (status, _, _) = call(&r, "POST", "/changefeed/groups", &read, r#"{"name":"g"}"#).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, body) = call(&r, "GET", "/changefeed/stats", &admin, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, _) = call(&r, "GET", "/changefeed", &admin, "").await;
    assert_eq!(status, StatusCode::OK, "admin may read");
    let (status, _, _) = call(&r, "GET", "/healthz", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    // The query-string token is off unless configured.
    let (status, _, _) = call(
        &r,
        "GET",
        "/changefeed/stream?keep_alive=false&access_token=reader-secret",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    cfg.http.query_token = true;
    let r = router(&cf, &cfg);
    let (status, _, body) = call(
        &r,
        "GET",
        "/changefeed/stream?keep_alive=false&access_token=reader-secret",
        &[],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("id: 1"));
    let (status, _, _) = call(
        &r,
        "GET",
        "/changefeed/stats?access_token=freshen-changefeed",
        &[],
        "",
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "only the streaming endpoints take it"
    );
    let metrics = call(&r, "GET", "/metrics", &read, "").await.2;
    assert!(
        metrics.contains("freshen_changefeed_auth_failures_total 7"),
        "{metrics}"
    );
    cf.close().await;
}

#[tokio::test]
async fn cors_only_for_configured_origins() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.http.cors_allow_origins = vec!["http://app.example".into()];
    let cf = open(&cfg).await;
    let r = router(&cf, &cfg);
    let (status, h, _) = call(
        &r,
        "OPTIONS",
        "/changefeed",
        &[
            ("origin", "http://app.example"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization"),
        ],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h["access-control-allow-origin"], "http://app.example");
    assert!(
        h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization")
    );
    let (_, h, _) = call(
        &r,
        "GET",
        "/changefeed",
        &[("origin", "http://app.example")],
        "",
    )
    .await;
    assert_eq!(h["access-control-allow-origin"], "http://app.example");
    let (_, h, _) = call(
        &r,
        "GET",
        "/changefeed",
        &[("origin", "http://evil.example")],
        "",
    )
    .await;
    assert!(h.get("access-control-allow-origin").is_none());
    let plain_cfg = config(dir.path());
    let (_, h, _) = call(
        &router(&cf, &plain_cfg),
        "GET",
        "/changefeed",
        &[("origin", "http://app.example")],
        "",
    )
    .await;
    assert!(
        h.get("access-control-allow-origin").is_none(),
        "no CORS unless configured"
    );
    cf.close().await;
}

#[tokio::test]
async fn bad_parameters_are_400_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cf = open(&cfg).await;
    let r = router(&cf, &cfg);
    for (method, uri, body, needle) in [
        ("GET", "/changefeed?from_seq=abc", "", "from_seq"),
        ("GET", "/changefeed?from_seq=-1", "", "from_seq"),
        ("GET", "/changefeed?limit=0", "", "limit"),
        ("GET", "/changefeed?long_poll_ms=soon", "", "long_poll_ms"),
        ("GET", "/changefeed?op=upsert", "", "upsert"),
        ("GET", "/changefeed/stream?max_events=0", "", "max_events"),
        (
            "GET",
            "/changefeed/stream?heartbeat_ms=x",
            "",
            "heartbeat_ms",
        ),
        (
            "GET",
            "/changefeed/stream?keep_alive=maybe",
            "",
            "keep_alive",
        ),
        ("GET", "/changefeed/stream?max_seconds=0", "", "max_seconds"),
        (
            "GET",
            "/changefeed/groups/g/dead-letters?limit=x",
            "",
            "limit",
        ),
        ("POST", "/changefeed/retention", "{}", "before_sequence"),
        ("POST", "/changefeed/retention", "{not json", "JSON"),
        (
            "POST",
            "/changefeed/retention",
            r#"{"before_sequence":"ten"}"#,
            "JSON",
        ),
    ] {
        let (status, _, text) = call(&r, method, uri, &[], body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {text}");
        let e: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (e["error"].as_bool(), e["status_code"].as_u64()),
            (Some(true), Some(400))
        );
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{method} {uri}: {text}"
        );
    }
    let (status, _, _) = call(
        &r,
        "GET",
        "/changefeed?unknown_param=1&keep_alive=true",
        &[],
        "",
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "unknown parameters (other clients') are ignored"
    );
    cf.close().await;
}

#[tokio::test]
async fn stats_retention_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cf = open(&cfg).await;
    cf.append(&orders(1, 10)).await.unwrap();
    let r = router(&cf, &cfg);
    let stats = |body: String| serde_json::from_str::<serde_json::Value>(&body).unwrap();
    let s = stats(call(&r, "GET", "/changefeed/stats", &[], "").await.2);
    assert_eq!(
        (
            s["total_events"].as_u64(),
            s["latest_sequence"].as_u64(),
            s["oldest_sequence"].as_u64()
        ),
        (Some(10), Some(10), Some(1))
    );
    let before = s["total_size_bytes"].as_u64().unwrap();
    let (status, _, body) = call(
        &r,
        "POST",
        "/changefeed/retention",
        &[],
        r#"{"before_sequence": 4}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        stats(body),
        serde_json::json!({"deleted": 3, "before_sequence": 4})
    );
    let s = stats(call(&r, "GET", "/changefeed/stats", &[], "").await.2);
    assert_eq!(
        (s["total_events"].as_u64(), s["oldest_sequence"].as_u64()),
        (Some(7), Some(4))
    );
    assert!(s["total_size_bytes"].as_u64().unwrap() < before);
    // Reading from before the oldest starts at the oldest.
    let page = stats(
        call(&r, "GET", "/changefeed?from_seq=0&limit=1", &[], "")
            .await
            .2,
    );
    assert_eq!(sequences(&page), [4]);
    let (_, h, m) = call(&r, "GET", "/metrics", &[], "").await;
    assert!(
        h["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    for line in [
        "freshen_changefeed_latest_sequence 10",
        "freshen_changefeed_events 7",
        "freshen_changefeed_appended_events_total 10",
        "freshen_changefeed_retention_deleted_events_total 3",
        "freshen_changefeed_poll_requests_total 1",
        "freshen_changefeed_http_bad_requests_total 0",
    ] {
        assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
    }
    cf.close().await;
}

#[tokio::test]
async fn serve_refuses_an_unprotected_remote_listener() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let cf = open(&cfg).await;
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let state = AppState::new(cf.clone(), &cfg.http).unwrap();
    let err = serve(listener, state, async {}).await.unwrap_err();
    assert!(matches!(err, ServeError::Unprotected(_)), "{err}");
    assert!(err.to_string().contains("allow_unauthenticated_remote"));

    // With a token it serves (and stops at once here).
    cfg.http.tokens = vec![token("t", Scope::Read)];
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    serve(
        listener,
        AppState::new(cf.clone(), &cfg.http).unwrap(),
        async {},
    )
    .await
    .unwrap();
    // Or when told explicitly.
    cfg.http.tokens.clear();
    cfg.http.allow_unauthenticated_remote = true;
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    serve(
        listener,
        AppState::new(cf.clone(), &cfg.http).unwrap(),
        async {},
    )
    .await
    .unwrap();
    // Invalid settings are refused when the state is built.
    cfg.http.max_long_poll_ms = 120_000;
    assert!(
        AppState::new(cf.clone(), &cfg.http)
            .unwrap_err()
            .to_string()
            .contains("max_long_poll_ms")
    );
    cf.close().await;
}
