//! `freshen status`: fetch a running instance's `/status` and print it readably.

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::Status;

/// GETs `{base}{path}` over plain HTTP/1.1 and returns the status code and body. The
/// endpoints are local and tiny; a client library would be a heavy dependency for this.
pub async fn get(base: &str, path: &str) -> anyhow::Result<(u16, String)> {
    request(base, "GET", path, None, None).await
}

/// Sends `method {base}{path}` with an optional bearer token and JSON body; returns the
/// status code and body.
pub async fn request(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    json: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let rest = base
        .strip_prefix("http://")
        .with_context(|| format!("{base}: only http:// URLs are supported"))?;
    let authority = rest.trim_end_matches('/');
    let mut stream = TcpStream::connect(authority).await.with_context(|| {
        format!(
            "cannot connect to {authority} (is `freshen run` running with [http] listen there?)"
        )
    })?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    if let Some(t) = token {
        request.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = json.unwrap_or("");
    if json.is_some() || method != "GET" {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw).context("the response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP status line")?;
    Ok((code, body.to_string()))
}

/// Fetches and decodes `/status`.
pub async fn fetch(base: &str) -> anyhow::Result<Status> {
    let (code, body) = get(base, "/status").await?;
    if code != 200 {
        bail!("{base}/status answered {code}: {body}");
    }
    serde_json::from_str(&body).context("cannot read the /status document")
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".into(), |v| v.to_string())
}

/// The status as a human reads it.
pub fn render(s: &Status) -> String {
    let src = &s.source;
    let mut out = format!(
        "freshen {}\nsource {}: {}  received {}  confirmed {}  lag {} bytes {} s  slot {}  reconnects {}  events {}\n",
        s.version,
        src.kind,
        if src.streaming {
            "streaming"
        } else {
            "NOT STREAMING"
        },
        opt(src.received_lsn.map(lsn)),
        opt(src.confirmed_lsn.map(lsn)),
        opt(src.lag_bytes),
        opt(src.lag_seconds.map(|s| format!("{s:.1}"))),
        opt(src.slot_status.as_deref()),
        src.reconnects,
        src.events,
    );
    if let Some(e) = &src.last_error {
        out.push_str(&format!("last error: {e}\n"));
    }
    out.push_str(&format!(
        "\n{:<24} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10}\n",
        "view",
        "events",
        "rebuilds",
        "failed",
        "dirty",
        "poisoned",
        "p50 ms",
        "p99 ms",
        "1m p99 ms"
    ));
    for v in &s.views {
        out.push_str(&format!(
            "{:<24} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10}\n",
            v.name,
            v.events,
            v.rebuilds_ok,
            v.rebuilds_failed,
            v.dirty,
            v.poisoned,
            opt(v.freshness_p50_ms.map(|m| format!("{m:.1}"))),
            opt(v.freshness_p99_ms.map(|m| format!("{m:.1}"))),
            opt(v.recent_p99_ms.map(|m| format!("{m:.1}"))),
        ));
    }
    out
}

/// An LSN in PostgreSQL's `X/Y` form.
pub fn lsn(v: u64) -> String {
    format!("{:X}/{:X}", v >> 32, v & 0xffff_ffff)
}
