//! How freshen serves HTTP: one accept loop and its guards, shared by the binary's
//! `/metrics`, `/healthz`, `/status` listener and the changefeed's API.
//!
//! # Concepts
//!
//! - [`serve`] runs an axum `Router` on an already-bound listener until a shutdown
//!   future completes, then waits for open connections to finish (streams end when the
//!   application ends them).
//! - **Host allow-list** (DNS rebinding): on a loopback listener a request is served only
//!   when its `Host` is `localhost`, an IP address, or one of
//!   [`ListenerConfig::allowed_hosts`]; others get `421 Misdirected Request`. A page on
//!   `http://evil.example` whose name the attacker re-points at 127.0.0.1 still sends
//!   `Host: evil.example`, so it is refused. On other listeners the check applies only
//!   when `allowed_hosts` is set.
//! - **Origin check** (cross-site requests): a WebSocket upgrade, a request with any
//!   method but `GET`/`HEAD`, and a request with a body type an HTML form cannot send are
//!   refused (`403`) when they carry an `Origin` that is neither the server's own nor in
//!   [`ListenerConfig::allowed_origins`]. Requests without `Origin` (curl, Prometheus, other
//!   programs) are not browsers' and pass.
//! - **Timeouts**: a connection has [`ListenerConfig::header_timeout`] to send each request's
//!   headers; the same clock runs while a kept-alive connection waits for its next
//!   request, so it is the idle timeout too. [`with_request_timeout`] bounds how long a
//!   handler may take to produce its response (reading the body included) — streaming
//!   bodies (Server-Sent Events) and upgraded WebSockets are not cut, since their
//!   handlers return at once.
//! - **Connection limit**: at most [`ListenerConfig::max_connections`] connections are served
//!   at once (an upgraded WebSocket counts until it closes), plus the one just accepted.
//!   At the limit a new connection takes the place of the oldest connection that has
//!   not sent a whole request head, so a flood of half-open connections (silent, or
//!   sending part of a request) cannot keep a health probe waiting. When every
//!   connection has sent a request the server stops accepting, so further connections
//!   wait in the kernel's listen queue and hold no descriptor of this process. One
//!   warning says so (at most once a minute). [`bind`] makes that queue 4096 long, so a
//!   flood of a few thousand connections does not make the kernel drop a probe's SYN
//!   (retried only after a second).
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use axum::{Router, routing::get};
//! let app = Router::new().route("/healthz", get(|| async { "ok" }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! freshen_http::serve(listener, app, freshen_http::ListenerConfig::new("example"), std::future::pending()).await
//! # }
//! ```

mod bearer;
mod config;
mod guard;
mod lineup;
mod serve;
mod timeout;

pub use bearer::{bearer, same_secret};
pub use config::{ListenerConfig, host_problem, limits};
pub use guard::{Guard, Verdict};
pub use serve::{BACKLOG, bind, serve};

/// The name [`ListenerConfig`] had before the workspace settled on one meaning of
/// `…Config` (what a part is built with) and `…Settings` (a file table still to be
/// resolved into a `…Config`).
#[deprecated(since = "0.1.0", note = "renamed `ListenerConfig`")]
pub type Settings = ListenerConfig;
pub use timeout::with_request_timeout;
