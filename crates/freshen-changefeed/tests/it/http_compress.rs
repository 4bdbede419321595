//! Compressed responses over a real socket: long-poll pages come gzip- or
//! zstd-compressed when the client asks, and decode (with flate2 and zstd, not the
//! server's own code path) to exactly the uncompressed page; Server-Sent Events never
//! are.

use crate::support;

use std::io::Read as _;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use support::*;

/// A GET with `Accept-Encoding: accept` (none when empty): status, `Content-Encoding`,
/// body bytes as sent.
async fn raw(url: &str, accept: &str) -> (StatusCode, Option<String>, Bytes) {
    let mut req = Request::get(url);
    if !accept.is_empty() {
        req = req.header("accept-encoding", accept);
    }
    let resp = client()
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("request");
    let status = resp.status();
    let encoding = resp
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, encoding, body)
}

fn gunzip(b: &[u8]) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(b)
        .read_to_string(&mut s)
        .expect("a gzip body");
    s
}

fn unzstd(b: &[u8]) -> String {
    String::from_utf8(zstd::stream::decode_all(b).expect("a zstd body")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_compressed_on_request_and_decode_to_the_same_page() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.http.max_limit = 1000;
    let server = Server::start(&config).await;
    server.cf.append(&orders(1, 300)).await.unwrap();
    let url = server.url("/changefeed?from_seq=0&limit=300");

    let (status, encoding, plain) = raw(&url, "").await;
    assert_eq!((status, encoding), (StatusCode::OK, None));
    let page: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(page["count"], 300);

    let (status, encoding, gz) = raw(&url, "gzip").await;
    assert_eq!(
        (status, encoding.as_deref()),
        (StatusCode::OK, Some("gzip"))
    );
    assert_eq!(gunzip(&gz).as_bytes(), &plain[..]);
    assert!(
        gz.len() * 4 < plain.len(),
        "{} of {}",
        gz.len(),
        plain.len()
    );

    let (status, encoding, zs) = raw(&url, "gzip;q=0.5, zstd").await;
    assert_eq!(
        (status, encoding.as_deref()),
        (StatusCode::OK, Some("zstd"))
    );
    assert_eq!(unzstd(&zs).as_bytes(), &plain[..]);
    assert!(
        zs.len() * 4 < plain.len(),
        "{} of {}",
        zs.len(),
        plain.len()
    );

    // Equally welcome: zstd.
    let (_, encoding, zs) = raw(&url, "gzip, zstd").await;
    assert_eq!(encoding.as_deref(), Some("zstd"));
    assert_eq!(unzstd(&zs).as_bytes(), &plain[..]);

    // Not asked for (or refused): as before.
    let (_, encoding, body) = raw(&url, "identity").await;
    assert_eq!((encoding, &body[..]), (None, &plain[..]));
    let (_, encoding, _) = raw(&url, "br").await;
    assert_eq!(encoding, None);

    // A long poll that waits: the page that ends the wait is compressed too.
    let waiting = server.url("/changefeed?from_seq=300&long_poll_ms=20000");
    let poll = tokio::spawn(async move { raw(&waiting, "gzip").await });
    server.cf.append(&orders(301, 1)).await.unwrap();
    let (status, encoding, gz) = poll.await.unwrap();
    assert_eq!(
        (status, encoding.as_deref()),
        (StatusCode::OK, Some("gzip"))
    );
    let page: serde_json::Value = serde_json::from_str(&gunzip(&gz)).unwrap();
    assert_eq!(sequences(&page), [301]);

    // Server-Sent Events are never compressed, even when the client accepts it.
    let resp = client()
        .request(
            Request::get(server.url("/changefeed/stream?from_seq=0"))
                .header("accept-encoding", "gzip, zstd")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().get("content-encoding").is_none());
    drop(resp);
    server.stop().await;
}
