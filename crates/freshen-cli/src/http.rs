//! `/metrics` (Prometheus), `/healthz` and `/status` (JSON) for a running pipeline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::metrics::{SourceStatus, ViewStats, render};

/// What the endpoints read: the views' stats and the source's health.
pub trait Observe: Send + Sync + 'static {
    /// Every view's stats, in configuration order.
    fn views(&self) -> Vec<ViewStats>;
    /// The source's health.
    fn source(&self) -> SourceStatus;
}

/// The `/status` document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// freshen's version.
    pub version: String,
    /// The source.
    pub source: SourceStatus,
    /// Each view.
    pub views: Vec<ViewStatus>,
}

/// One view in `/status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ViewStatus {
    /// View name.
    pub name: String,
    /// Row events received.
    pub events: u64,
    /// Messages skipped.
    pub skipped: u64,
    /// Keys marked.
    pub keys_marked: u64,
    /// Changes that carried no value for the key columns (see the README on replica identity).
    pub unscoped: u64,
    /// Successful key rebuilds.
    pub rebuilds_ok: u64,
    /// Failed key rebuilds.
    pub rebuilds_failed: u64,
    /// Reconcile sweeps completed.
    pub reconciles: u64,
    /// Dirty keys now.
    pub dirty: u64,
    /// Quarantined keys now.
    pub poisoned: u64,
    /// Rebuilds running now.
    pub in_flight: u64,
    /// Unacknowledged batches.
    pub unacked_batches: u64,
    /// Freshness-lag median, milliseconds.
    pub freshness_p50_ms: Option<f64>,
    /// Freshness-lag 99th percentile, milliseconds.
    pub freshness_p99_ms: Option<f64>,
    /// Seconds since the last rebuild.
    pub last_rebuild_age_s: Option<f64>,
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1000.0)
}

impl From<&ViewStats> for ViewStatus {
    fn from(v: &ViewStats) -> Self {
        let s = &v.stats;
        ViewStatus {
            name: v.name.clone(),
            events: s.events_received,
            skipped: s.events_skipped,
            keys_marked: s.keys_marked,
            unscoped: v.unscoped,
            rebuilds_ok: s.rebuilds_ok,
            rebuilds_failed: s.rebuilds_failed,
            reconciles: s.reconciles,
            dirty: s.dirty,
            poisoned: s.poisoned,
            in_flight: s.in_flight,
            unacked_batches: s.unacked_batches,
            freshness_p50_ms: ms(s.freshness.p50()),
            freshness_p99_ms: ms(s.freshness.p99()),
            last_rebuild_age_s: s
                .last_rebuild
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map(|d| d.as_secs_f64()),
        }
    }
}

/// The current status document.
pub fn status(o: &dyn Observe) -> Status {
    let mut source = o.source();
    source.last_error = source.last_error.map(|e| freshen::redact_text(&e));
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        source,
        views: o.views().iter().map(ViewStatus::from).collect(),
    }
}

type Shared = Arc<dyn Observe>;

async fn metrics(State(o): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&o.views(), &o.source()),
    )
        .into_response()
}

async fn healthz(State(o): State<Shared>) -> Response {
    let s = o.source();
    if s.streaming {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let why = s.last_error.map_or_else(
            || "the source is not streaming yet".into(),
            |e| freshen::redact_text(&e),
        );
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable: {why}\n"),
        )
            .into_response()
    }
}

async fn status_json(State(o): State<Shared>) -> Json<Status> {
    Json(status(&*o))
}

/// The router, testable without binding a port.
pub fn app(o: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/status", get(status_json))
        .with_state(o)
}

/// Serves `app` on an already-bound listener until `shutdown` completes, through
/// [`freshen_http::serve`]: Host and Origin checks, header and request timeouts, a
/// connection limit, as `settings` say.
pub async fn serve(
    listener: TcpListener,
    o: Shared,
    settings: freshen_http::Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    freshen_http::serve(listener, app(o), settings, shutdown).await
}
