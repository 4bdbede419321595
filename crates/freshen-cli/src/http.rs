//! `/metrics` (Prometheus), `/healthz`, `/status` (JSON) and the status page for a
//! running pipeline, over what its [`Readout`] shows.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::net::TcpListener;

use crate::metrics::render;
use crate::readout::{Activity, Readout, Status, problems, status};

type Shared = Arc<dyn Readout>;

async fn metrics(State(o): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut text = render(&o.views(), &o.source());
            text.push_str(&crate::metrics::render_outputs(&o.sinks(), &o.redactions()));
            let active = u8::from(o.activity() == Activity::Active);
            let name = crate::metrics::names::ACTIVE;
            text.push_str(&format!(
                "# HELP {name} 1 while this process is the active one (0: standby or starting).\n# TYPE {name} gauge\n{name} {active}\n"
            ));
            text
        },
    )
        .into_response()
}

async fn healthz(State(o): State<Shared>) -> Response {
    let problems = problems(&*o);
    if problems.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let mut body = String::from("unavailable:\n");
        for p in problems {
            body.push_str("  ");
            body.push_str(&p);
            body.push('\n');
        }
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn status_json(State(o): State<Shared>) -> Json<Status> {
    Json(status(&*o))
}

/// The status page: one self-contained file (no CDN, no build step) that polls
/// `/status` and `/healthz` and draws the last minutes.
const PAGE: &str = include_str!("page/status.html");

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page's own inline script and style, requests to this instance, nothing else.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}

/// The router, testable without binding a port.
pub fn app(o: Shared, admin: crate::admin::Access) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/status", get(status_json))
        .with_state(o.clone())
        .merge(crate::admin::routes(o, admin))
}

/// Serves `app` on an already-bound listener until `shutdown` completes, through
/// [`freshen_http::serve`]: Host and Origin checks, header and request timeouts, a
/// connection limit, as `settings` say.
pub async fn serve(
    listener: TcpListener,
    o: Shared,
    settings: freshen_http::ListenerConfig,
    admin: crate::admin::Access,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    freshen_http::serve(listener, app(o, admin), settings, shutdown).await
}
