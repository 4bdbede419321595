//! `freshen status`: fetch a running instance's `/status` and print it readably.

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::readout::Status;

/// The base URL that reaches a listener bound to `listen` from this host: a wildcard
/// address (`0.0.0.0`, `::`) answers on loopback too.
pub fn local_url(listen: std::net::SocketAddr) -> String {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{addr}")
}

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
    let role = match &s.standby_for {
        Some(who) => format!(" STANDBY (waiting for {who})"),
        None if s.role != "active" => format!(" {}", s.role.to_uppercase()),
        None => String::new(),
    };
    let mut out = format!(
        "freshen {}{role}\nsource {}: {}  received {}  confirmed {}  lag {} bytes {} s  slot {}  reconnects {}  events {}\n",
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
    if let Some(parts) = &src.partitions {
        out.push_str(&crate::role::partitions_line(parts));
    }
    if let Some(e) = &src.last_error {
        out.push_str(&format!("last error: {e}\n"));
    }
    if !src.discovered.is_empty() {
        out.push_str(&format!("discovered: {}\n", src.discovered.join(", ")));
    }
    out.push_str(&format!(
        "\n{:<24} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>9}\n",
        "view",
        "events",
        "rebuilds",
        "by sweep",
        "failed",
        "dirty",
        "wait s",
        "running",
        "poisoned",
        "p99 ms",
        "1m p50 ms",
        "1m p99 ms"
    ));
    let mut notes = Vec::new();
    for v in &s.views {
        out.push_str(&format!(
            "{:<24} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>7} {:>8} {:>9} {:>9} {:>9}\n",
            v.name,
            v.events,
            v.rebuilds_ok,
            v.sweep_rebuilds,
            v.rebuilds_failed,
            v.dirty,
            opt(v.oldest_waiting_s.map(|s| format!("{s:.1}"))),
            v.in_flight,
            v.poisoned,
            opt(v.freshness_p99_ms.map(|m| format!("{m:.1}"))),
            opt(v.recent_p50_ms.map(|m| format!("{m:.1}"))),
            opt(v.recent_p99_ms.map(|m| format!("{m:.1}"))),
        ));
        if let Some(t) = v.oldest_in_flight_s.filter(|t| *t >= 1.0) {
            notes.push(format!("{}: a rebuild has run {t:.1} s", v.name));
        }
        if let Some(t) = v.sweep_for_s {
            notes.push(format!(
                "{}: sweep listing for {t:.1} s, {} keys so far",
                v.name, v.sweep_listed
            ));
        }
        if v.unscoped > 0 {
            notes.push(format!(
                "{}: {} changes carried no key (see docs/views.md, replica identity)",
                v.name, v.unscoped
            ));
        }
        for why in &v.paused {
            notes.push(format!(
                "{}: PAUSED (no rebuilds, changes held): {why}",
                v.name
            ));
        }
        for gap in &v.unhealed_gaps {
            notes.push(format!(
                "{}: UNHEALED GAP (no reconcile; rebuild, then acknowledge): {gap}",
                v.name
            ));
        }
        if let Some(r) = &v.paths.running {
            notes.push(format!(
                "{}: recomputing the whole table ({}, {}) for {:.1} s, covering {} keys",
                v.name, r.reason, r.way, r.for_s, r.keys
            ));
        }
        if let Some(e) = &v.paths.build_failed {
            notes.push(format!(
                "{}: FIRST BUILD FAILED (the table holds only the keys rebuilt since): {e}",
                v.name
            ));
        }
        if v.gaps > 0 {
            notes.push(format!(
                "{}: {} changes arrived without their rows (each answered by a sweep)",
                v.name, v.gaps
            ));
        }
        if let (Some(t), Some(e)) = (v.stalled_for_s, &v.stall_error) {
            notes.push(format!("{}: STALLED for {t:.0} s: {e}", v.name));
        }
        for q in &v.quarantined {
            notes.push(format!(
                "{}: key {} quarantined {:.0} s ago{}: {}",
                v.name,
                q.key,
                q.since_s,
                if q.holding {
                    " (holding its transactions)"
                } else {
                    ""
                },
                q.error
            ));
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&n);
            out.push('\n');
        }
    }
    out
}

/// An LSN in PostgreSQL's `X/Y` form.
pub fn lsn(v: u64) -> String {
    format!("{:X}/{:X}", v >> 32, v & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_says_what_is_going_on_beside_the_table() {
        let s: Status = serde_json::from_value(serde_json::json!({
            "version": "0.1.0",
            "role": "standby",
            "standby_for": "freshen (slot s) on h1 from 10.0.0.1 (backend pid 7)",
            "source": {"kind": "postgres", "streaming": false, "reconnects": 0, "events": 0},
            "views": [{
                "name": "totals", "events": 10, "skipped": 0, "keys_marked": 12,
                "unscoped": 2, "rebuilds_ok": 9, "sweep_rebuilds": 4, "rebuilds_failed": 1,
                "reconciles": 1, "dirty": 3, "poisoned": 1, "in_flight": 1,
                "unacked_batches": 0, "freshness_p50_ms": 12.0, "freshness_p99_ms": 40.0,
                "oldest_in_flight_s": 3.5, "sweep_for_s": 1.25, "sweep_listed": 700,
                "oldest_waiting_s": 0.5, "last_rebuild_age_s": 1.0,
                "paused": ["public.readings: column device dropped"], "gaps": 3,
                "quarantined": [{"key": "k9", "since_s": 30.0, "error": "22012", "holding": true}]
            }]
        }))
        .unwrap();
        let text = render(&s);
        for needle in [
            "STANDBY (waiting for freshen (slot s) on h1",
            "by sweep",
            "totals: a rebuild has run 3.5 s",
            "totals: sweep listing for 1.2 s, 700 keys so far",
            "totals: 2 changes carried no key",
            "totals: PAUSED (no rebuilds, changes held): public.readings: column device dropped",
            "totals: 3 changes arrived without their rows",
            "totals: key k9 quarantined 30 s ago (holding its transactions): 22012",
        ] {
            assert!(text.contains(needle), "no {needle:?} in:\n{text}");
        }
        let row = text.lines().find(|l| l.starts_with("totals ")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            &cells[..9],
            ["totals", "10", "9", "4", "1", "3", "0.5", "1", "1"]
        );
    }
}
