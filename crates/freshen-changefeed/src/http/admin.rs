//! Stats, retention and metrics.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;

pub(crate) async fn stats(State(s): State<AppState>) -> Json<serde_json::Value> {
    let st = s.cf().stats();
    Json(serde_json::json!({
        "total_events": st.total_events,
        "latest_sequence": st.latest_sequence,
        "oldest_sequence": st.oldest_sequence,
        "total_size_bytes": st.total_size_bytes,
    }))
}

#[derive(Debug, Deserialize)]
pub(crate) struct RetentionBody {
    before_sequence: Option<u64>,
}

pub(crate) async fn retention(
    State(s): State<AppState>,
    body: Result<Json<RetentionBody>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(body) = body?;
    let before = body.before_sequence.ok_or_else(|| {
        ApiError::BadRequest("give before_sequence: events before it are deleted".to_owned())
    })?;
    let deleted = s.cf().delete_before(before).await?;
    Ok(Json(
        serde_json::json!({"deleted": deleted, "before_sequence": before}),
    ))
}

pub(crate) async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.cf().metrics_text(),
    )
}
