//! Stats, retention and metrics.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
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
        "snapshots": s.cf().snapshot_status(),
    }))
}

pub(crate) async fn snapshot_status(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "snapshots": s.cf().snapshot_status() }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotBody {
    tables: Option<Vec<String>>,
}

/// Starts snapshots of the named tables; answers at once with their progress.
pub(crate) async fn snapshot(
    State(s): State<AppState>,
    body: Result<Json<SnapshotBody>, JsonRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let Json(body) = body?;
    let tables = body.tables.ok_or_else(|| {
        ApiError::BadRequest(
            "give tables: the tables to snapshot, e.g. {\"tables\": [\"public.orders\"]}"
                .to_owned(),
        )
    })?;
    let progress = s.cf().request_snapshot(&tables).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "snapshots": progress })),
    ))
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
