//! A bound on how long a handler may take to produce its response.

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn};
use axum::response::IntoResponse;

/// `router` with every route (present when called) answering `503` when its handler has
/// not produced a response within `limit`. Reading the request body counts; a streamed
/// response body (Server-Sent Events) or an upgraded WebSocket does not, since their
/// handlers return at once. A route that waits on purpose (a long poll) takes a limit
/// above its own wait bound.
pub fn with_request_timeout<S>(router: Router<S>, limit: Duration) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.route_layer(from_fn(move |req: Request, next: Next| async move {
        match tokio::time::timeout(limit, next.run(req)).await {
            Ok(response) => response,
            Err(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the request took longer than {} ms and was abandoned\n",
                    limit.as_millis()
                ),
            )
                .into_response(),
        }
    }))
}
