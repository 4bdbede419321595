//! The HTTP API: `app` builds the router, `serve` runs it on a bound listener.
//!
//! | method, path | scope | what |
//! |---|---|---|
//! | `GET /changefeed` | read | long-poll: `from_seq` (exclusive) or `cursors` (`table:seq,…`), `limit`, `long_poll_ms`, `tx`, filters |
//! | `GET /changefeed/stream` | read | Server-Sent Events from `from_seq`, `cursors` or `Last-Event-ID` |
//! | `GET /v2/cdc/stream` | read | WebSocket: subscribe (`cursors`, `tx`), unsubscribe, ack; `?tx=1` |
//! | `GET /changefeed/stats` | admin | `total_events`, `latest_sequence`, `oldest_sequence`, `total_size_bytes` |
//! | `POST /changefeed/retention` | admin | `{"before_sequence": N}` deletes everything before N |
//! | `GET /changefeed/snapshot` | read | each table's snapshot progress |
//! | `POST /changefeed/snapshot` | admin | `{"tables": ["public.orders"]}` snapshots them (202) |
//! | `GET /changefeed/groups` | read | consumer groups |
//! | `POST /changefeed/groups` | admin | create a group |
//! | `GET /changefeed/groups/{g}` | read | offset, lag, in flight, dead letters |
//! | `DELETE /changefeed/groups/{g}` | admin | delete a group |
//! | `POST /changefeed/groups/{g}/receive` | read | lease up to N events |
//! | `POST /changefeed/groups/{g}/ack` | read | acknowledge |
//! | `POST /changefeed/groups/{g}/nack` | read | deliver again later (or dead-letter) |
//! | `GET /changefeed/groups/{g}/dead-letters` | read | list dead letters |
//! | `POST /changefeed/groups/{g}/dead-letters/{seq}/replay` | admin | deliver one again |
//! | `DELETE /changefeed/groups/{g}/dead-letters/{seq}` | admin | delete one |
//! | `DELETE /changefeed/groups/{g}/dead-letters` | admin | delete all (drain) |
//! | `GET /metrics` | read | Prometheus text |
//! | `GET /healthz` | — | `ok` |
//!
//! Filters on the read endpoints: `key_prefix`, `table` (names or `schema.table`,
//! comma-separated), `op` (`insert`, `update`, `delete`, `truncate`, or ThemisDB's `PUT`
//! and `DELETE`; comma-separated; `event_types` is accepted as ThemisDB's name for it).

mod admin;
mod auth;
mod error;
mod groups;
mod poll;
mod sse;
mod txread;
mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post};
use freshen_http::with_request_timeout;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};

use self::error::ApiError;
use self::txread::with_markers;
use crate::{Changefeed, Error, Filter, HttpConfig, Scope};

/// Per-table cursors name the tables and their positions: another position or table
/// list beside them would be ambiguous.
pub(crate) const CURSORS_ALONE: &str =
    "cursors: the list names the tables and their positions; leave out from_seq and table";

/// Events examined per read step: bounds the time a filtered read holds a thread.
pub(crate) const MAX_SCAN: usize = 10_000;

/// What every handler shares: the changefeed and the resolved HTTP settings.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("tokens", &self.inner.tokens.len())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) cf: Changefeed,
    pub(crate) config: HttpConfig,
    /// Resolved tokens (from the config or the environment) and their scopes.
    pub(crate) tokens: Vec<(String, Scope)>,
    pub(crate) query_token: bool,
    /// Turns true when the server shuts down: streams and long polls end.
    pub(crate) closing: watch::Sender<bool>,
}

impl AppState {
    /// The state for serving `cf` with `config`: validates the settings and resolves
    /// tokens given as environment variables.
    pub fn new(cf: Changefeed, config: &HttpConfig) -> Result<AppState, Error> {
        let mut problems = Vec::new();
        let mut probe = crate::ChangefeedConfig::new("-");
        probe.http = config.clone();
        problems.extend(probe.problems());
        let mut tokens = Vec::new();
        for t in &config.tokens {
            let value = match (&t.token, &t.token_env) {
                (Some(v), None) => Some(v.trim().to_owned()),
                (None, Some(var)) => std::env::var(var).ok().map(|v| v.trim().to_owned()),
                _ => None,
            };
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                tokens.push((v, t.scope));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Invalid(problems.join("; ")));
        }
        Ok(AppState {
            inner: Arc::new(Inner {
                cf,
                config: config.clone(),
                tokens,
                query_token: config.query_token,
                closing: watch::Sender::new(false),
            }),
        })
    }

    pub(crate) fn cf(&self) -> &Changefeed {
        &self.inner.cf
    }

    pub(crate) fn config(&self) -> &HttpConfig {
        &self.inner.config
    }

    /// Resolves when the server shuts down or the changefeed closes.
    pub(crate) fn ending(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut closing = self.inner.closing.subscribe();
        let mut stop = self.inner.cf.core.stopping();
        async move {
            tokio::select! {
                _ = closing.wait_for(|c| *c) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    }
}

/// The filter parameters shared by the read endpoints.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilterParams {
    key_prefix: Option<String>,
    table: Option<String>,
    op: Option<String>,
    /// ThemisDB's name for `op`.
    event_types: Option<String>,
}

impl FilterParams {
    /// A `table` filter was given (non-empty).
    pub(crate) fn has_tables(&self) -> bool {
        self.table.as_deref().is_some_and(|t| !t.trim().is_empty())
    }

    pub(crate) fn filter(&self) -> Result<Filter, ApiError> {
        let mut f = Filter::default();
        if let Some(p) = &self.key_prefix {
            f = f.key_prefix(p.clone());
        }
        if let Some(t) = &self.table {
            f = f.parse_tables(t);
        }
        for list in [&self.op, &self.event_types].into_iter().flatten() {
            f = f
                .parse_ops(list)
                .map_err(|m| ApiError::BadRequest(format!("op: {m}")))?;
        }
        Ok(f)
    }
}

/// The API router. Every route that needs a token checks it; CORS applies when
/// origins are configured. Each request is answered within `request_timeout_ms`, long
/// polls and group receives within that plus their longest wait.
pub fn app(state: AppState) -> Router {
    let quick = Duration::from_millis(state.inner.config.request_timeout_ms);
    let waiting =
        quick + Duration::from_millis(groups::MAX_WAIT_MS.max(state.inner.config.max_long_poll_ms));
    let read_waiting = Router::new()
        .route("/changefeed", get(poll::poll))
        .route("/changefeed/groups/{group}/receive", post(groups::receive));
    let read = Router::new()
        .route("/changefeed/stream", get(sse::stream))
        .route("/v2/cdc/stream", get(ws::upgrade))
        .route("/changefeed/groups", get(groups::list))
        .route("/changefeed/groups/{group}", get(groups::info))
        .route("/changefeed/groups/{group}/ack", post(groups::ack))
        .route("/changefeed/groups/{group}/nack", post(groups::nack))
        .route(
            "/changefeed/groups/{group}/dead-letters",
            get(groups::dead_letters),
        )
        .route("/metrics", get(admin::metrics));
    // Pages of events and the snapshot progress: compressed when the client asks.
    let read_waiting = with_request_timeout(read_waiting, waiting).layer(compression());
    let read_compressed = Router::new()
        .route("/changefeed/snapshot", get(admin::snapshot_status))
        .layer(compression());
    let read = with_request_timeout(read.merge(read_compressed), quick)
        .merge(read_waiting)
        .route_layer(from_fn_with_state(state.clone(), auth::require_read));
    let admin = Router::new()
        .route("/changefeed/stats", get(admin::stats))
        .route("/changefeed/retention", post(admin::retention))
        .route("/changefeed/snapshot", post(admin::snapshot))
        .route("/changefeed/groups", post(groups::create))
        .route("/changefeed/groups/{group}", delete(groups::delete))
        .route(
            "/changefeed/groups/{group}/dead-letters/{seq}/replay",
            post(groups::replay),
        )
        .route(
            "/changefeed/groups/{group}/dead-letters/{seq}",
            delete(groups::delete_dead),
        )
        .route(
            "/changefeed/groups/{group}/dead-letters",
            delete(groups::drain),
        );
    let admin = with_request_timeout(admin, quick)
        .route_layer(from_fn_with_state(state.clone(), auth::require_admin));
    let mut router = Router::new()
        .merge(read)
        .merge(admin)
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { ApiError::NotFound("no such endpoint".to_owned()) });
    if let Some(cors) = cors(&state.inner.config.cors_allow_origins) {
        router = router.layer(cors);
    }
    router.with_state(state)
}

/// gzip or zstd, as the request's `Accept-Encoding` prefers (zstd first at equal
/// weight), for bodies of 32 bytes and more. Server-Sent Events are never compressed:
/// a compressor holds frames until its block fills, and proxies that see
/// `Content-Encoding` buffer the stream, so events would arrive late or in bursts.
/// Only the routes that serve whole pages get the layer.
fn compression() -> CompressionLayer {
    CompressionLayer::new()
        .gzip(true)
        .zstd(true)
        .quality(tower_http::CompressionLevel::Fastest)
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("last-event-id"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

/// Why `serve` refused or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listener is not on a loopback address, no tokens are configured, and
    /// `allow_unauthenticated_remote` is not set.
    #[error(
        "refusing to serve the changefeed on {0} without tokens: configure changefeed.http.tokens, \
         bind a loopback address, or set allow_unauthenticated_remote = true"
    )]
    Unprotected(SocketAddr),
    /// The listener failed.
    #[error("changefeed HTTP server: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves the API on `listener` until `shutdown` completes; open streams and long polls
/// end then, and the call returns once every connection has closed.
///
/// Refuses a non-loopback listener without tokens unless the configuration allows it.
/// Serving goes through [`freshen_http::serve`]: on loopback only `localhost`, IP
/// addresses and `allowed_hosts` are served (DNS rebinding); WebSocket upgrades and
/// non-simple requests from a browser must come from the API's own origin or one of
/// `cors_allow_origins`; slow or idle connections are closed after
/// `header_timeout_ms`; at most `max_connections` are served at once.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    let inner = &state.inner;
    if !addr.ip().is_loopback()
        && inner.tokens.is_empty()
        && !inner.config.allow_unauthenticated_remote
    {
        return Err(ServeError::Unprotected(addr));
    }
    let settings = inner.config.serving();
    let closing = state.clone();
    freshen_http::serve(listener, app(state), settings, async move {
        shutdown.await;
        closing.inner.closing.send_replace(true);
    })
    .await?;
    Ok(())
}
