//! The Host allow-list and the Origin check: pure decisions over a request's method and
//! headers, then the middleware that applies them.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ListenerConfig;

/// What the guard decided about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Pass,
    /// Its `Host` is not served here (`421`): the message says why.
    WrongHost(String),
    /// Its `Origin` may not make this request (`403`).
    ForeignOrigin(String),
}

/// The Host and Origin rules of one listener.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Whether `Host` is checked (loopback listeners, or `allowed_hosts` set).
    check_host: bool,
    /// Lower-case names, without port.
    hosts: Vec<String>,
    /// Lower-case origins without a trailing `/`; `*` allows any.
    origins: Vec<String>,
}

impl Guard {
    /// The rules for a listener on `loopback` (or not) with `settings`.
    pub fn new(settings: &ListenerConfig, loopback: bool) -> Guard {
        Guard {
            check_host: loopback || !settings.allowed_hosts.is_empty(),
            hosts: settings
                .allowed_hosts
                .iter()
                .map(|h| host_without_port(h).to_ascii_lowercase())
                .collect(),
            origins: settings
                .allowed_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        }
    }

    /// The decision for a request.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Verdict {
        // An absolute-form target (`GET http://x/ HTTP/1.1`) names the host the client
        // meant; otherwise the Host header does.
        let host = match uri.authority() {
            Some(a) => Some(a.as_str()),
            None => headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        };
        if self.check_host {
            match host {
                None => {
                    return Verdict::WrongHost("the request has no Host header".to_owned());
                }
                Some(h) if !self.host_allowed(h) => {
                    return Verdict::WrongHost(format!(
                        "Host {h:?} is not served here (protection against DNS rebinding); \
                         add the name to allowed_hosts to serve it"
                    ));
                }
                Some(_) => {}
            }
        }
        if !needs_origin_check(method, headers) {
            return Verdict::Pass;
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Verdict::Pass;
        };
        let origin = origin.to_str().unwrap_or("(not text)");
        if self.origin_allowed(origin, host) {
            Verdict::Pass
        } else {
            Verdict::ForeignOrigin(format!(
                "requests from origin {origin:?} are not allowed here; \
                 list it in the server's allowed origins (cors_allow_origins) to allow it"
            ))
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let name = host_without_port(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        // An address cannot be re-pointed by DNS: a page that reached us by address
        // came from that address.
        name == "localhost"
            || parse_ip(name).is_some()
            || self.hosts.iter().any(|h| h.trim_end_matches('.') == name)
    }

    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if self.origins.iter().any(|o| o == "*" || *o == origin) {
            return true;
        }
        // Same origin: the page was served by this server, under the name it used.
        let Some(host) = host else { return false };
        let Some(rest) = origin.strip_prefix("http://") else {
            return false;
        };
        with_port(rest, 80) == with_port(&host.to_ascii_lowercase(), 80)
    }
}

/// WebSocket upgrades, methods other than GET and HEAD, and bodies a form cannot send:
/// what a browser would not send cross-site without asking, or what changes state.
fn needs_origin_check(method: &Method, headers: &HeaderMap) -> bool {
    if headers
        .get(header::UPGRADE)
        .and_then(|u| u.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
    {
        return true;
    }
    if method != Method::GET && method != Method::HEAD {
        return true;
    }
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| !is_simple_content_type(ct.to_str().unwrap_or("")))
}

fn is_simple_content_type(ct: &str) -> bool {
    let essence = ct.split(';').next().unwrap_or("").trim();
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "text/plain",
    ]
    .iter()
    .any(|s| s.eq_ignore_ascii_case(essence))
}

/// `name` of `name:port`, `[v6]:port`, `[v6]` or a bare name.
fn host_without_port(host: &str) -> &str {
    if let Some(v6) = host.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

fn parse_ip(name: &str) -> Option<IpAddr> {
    name.parse().ok()
}

/// `host:port` with the default port made explicit.
fn with_port(authority: &str, default: u16) -> String {
    let name = host_without_port(authority);
    let port = authority
        .strip_prefix('[')
        .and_then(|v6| v6.split_once("]:").map(|(_, p)| p))
        .or_else(|| {
            authority
                .rsplit_once(':')
                .filter(|(n, _)| !n.contains(':') && !authority.starts_with('['))
                .map(|(_, p)| p)
        });
    format!("{name}:{}", port.unwrap_or(&default.to_string()))
}

/// The middleware: refuses what the guard refuses, with a plain-text reason.
pub(crate) async fn enforce(guard: Arc<Guard>, req: Request, next: Next) -> Response {
    match guard.check(req.method(), req.uri(), req.headers()) {
        Verdict::Pass => next.run(req).await,
        Verdict::WrongHost(why) => {
            (StatusCode::MISDIRECTED_REQUEST, format!("{why}\n")).into_response()
        }
        Verdict::ForeignOrigin(why) => (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn loopback(origins: &[&str]) -> Guard {
        let mut s = ListenerConfig::new("t");
        s.allowed_hosts = vec!["feed.internal".into()];
        s.allowed_origins = origins.iter().map(|o| o.to_string()).collect();
        Guard::new(&s, true)
    }

    fn get(g: &Guard, h: &[(&'static str, &str)]) -> Verdict {
        g.check(&Method::GET, &Uri::from_static("/x"), &headers(h))
    }

    #[test]
    fn loopback_serves_local_names_and_addresses_only() {
        let g = loopback(&[]);
        for host in [
            "localhost",
            "LOCALHOST:8089",
            "127.0.0.1",
            "127.0.0.1:9187",
            "[::1]",
            "[::1]:8089",
            "feed.internal:80",
            "feed.internal.",
        ] {
            assert_eq!(get(&g, &[("host", host)]), Verdict::Pass, "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8089",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(
                matches!(get(&g, &[("host", host)]), Verdict::WrongHost(_)),
                "{host}"
            );
        }
        assert!(matches!(get(&g, &[]), Verdict::WrongHost(_)));
        let absolute = g.check(
            &Method::GET,
            &Uri::from_static("http://evil.example/x"),
            &headers(&[("host", "localhost")]),
        );
        assert!(matches!(absolute, Verdict::WrongHost(_)));
    }

    #[test]
    fn other_listeners_check_hosts_only_when_told() {
        let open = Guard::new(&ListenerConfig::new("t"), false);
        assert_eq!(get(&open, &[("host", "anything.example")]), Verdict::Pass);
    }

    #[test]
    fn origins_are_checked_on_upgrades_and_unsafe_requests() {
        let g = loopback(&["https://app.example.com"]);
        let local = ("host", "127.0.0.1:8089");
        // A simple GET from anywhere: the browser's CORS rules keep the answer from the page.
        assert_eq!(
            get(&g, &[local, ("origin", "https://evil.example")]),
            Verdict::Pass
        );
        let ws = [
            local,
            ("upgrade", "websocket"),
            ("origin", "https://evil.example"),
        ];
        assert!(matches!(get(&g, &ws), Verdict::ForeignOrigin(_)));
        let ws_same = [
            local,
            ("upgrade", "websocket"),
            ("origin", "http://127.0.0.1:8089"),
        ];
        assert_eq!(get(&g, &ws_same), Verdict::Pass);
        let ws_allowed = [
            local,
            ("upgrade", "websocket"),
            ("origin", "https://app.example.com/"),
        ];
        assert_eq!(get(&g, &ws_allowed), Verdict::Pass);
        let ws_null = [local, ("upgrade", "WebSocket"), ("origin", "null")];
        assert!(matches!(get(&g, &ws_null), Verdict::ForeignOrigin(_)));
        let post = |o: &str| {
            g.check(
                &Method::POST,
                &Uri::from_static("/x"),
                &headers(&[local, ("origin", o)]),
            )
        };
        assert!(matches!(
            post("https://evil.example"),
            Verdict::ForeignOrigin(_)
        ));
        assert_eq!(post("http://127.0.0.1:8089"), Verdict::Pass);
        let no_origin = g.check(&Method::DELETE, &Uri::from_static("/x"), &headers(&[local]));
        assert_eq!(no_origin, Verdict::Pass, "programs send no Origin");
        let json_get = [
            local,
            ("content-type", "application/json"),
            ("origin", "https://evil.example"),
        ];
        assert!(matches!(get(&g, &json_get), Verdict::ForeignOrigin(_)));
        let any = loopback(&["*"]);
        assert_eq!(get(&any, &ws), Verdict::Pass);
    }

    #[test]
    fn same_origin_compares_default_ports() {
        let g = loopback(&[]);
        let ws = |host: &'static str, origin: &'static str| {
            get(
                &g,
                &[("host", host), ("upgrade", "websocket"), ("origin", origin)],
            )
        };
        assert_eq!(ws("localhost", "http://localhost:80"), Verdict::Pass);
        assert_eq!(ws("[::1]:8089", "http://[::1]:8089"), Verdict::Pass);
        assert!(matches!(
            ws("localhost:8089", "http://localhost:9999"),
            Verdict::ForeignOrigin(_)
        ));
        assert!(matches!(
            ws("localhost:8089", "https://localhost:8089"),
            Verdict::ForeignOrigin(_)
        ));
    }
}
