//! Consumer groups and their dead letters over HTTP.

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::time::Instant;

use super::AppState;
use super::error::{ApiError, parse_u64};
use crate::groups::{GroupSpec, Start};
use crate::record;

/// Most events one receive leases.
const MAX_RECEIVE: usize = 1000;
/// Longest a receive waits for events, in milliseconds.
pub(crate) const MAX_WAIT_MS: u64 = 60_000;
use crate::config::limits::MAX_VISIBILITY_MS;

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    Ok(body?.0)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    name: String,
    /// `"earliest"` (default), `"latest"`, or a sequence to start after.
    #[serde(default)]
    start: Option<serde_json::Value>,
    /// Tables, comma-separated.
    #[serde(default)]
    table: Option<String>,
    #[serde(default)]
    key_prefix: Option<String>,
    /// Operations, comma-separated.
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    visibility_timeout_ms: Option<u64>,
    #[serde(default)]
    max_deliveries: Option<u32>,
}

pub(crate) async fn create(
    State(s): State<AppState>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(body)?;
    let groups = &s.cf().groups;
    let start = match &b.start {
        None => Start::Earliest,
        Some(serde_json::Value::String(w)) if w == "earliest" => Start::Earliest,
        Some(serde_json::Value::String(w)) if w == "latest" => Start::Latest,
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => {
            Start::After(n.as_u64().unwrap_or(0))
        }
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "start: expected \"earliest\", \"latest\" or a sequence, got {other}"
            )));
        }
    };
    let mut spec = GroupSpec::new(groups.defaults());
    if let Some(t) = &b.table {
        spec.tables = t
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect();
    }
    spec.key_prefix = b.key_prefix.filter(|p| !p.is_empty());
    spec.ops = b.op.filter(|o| !o.trim().is_empty());
    if let Some(v) = b.visibility_timeout_ms {
        spec.visibility_timeout_ms = v;
    }
    if let Some(m) = b.max_deliveries {
        spec.max_deliveries = m;
    }
    let (info, created) = groups.create(&b.name, spec, start).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(info)).into_response())
}

fn group_name(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    Ok(p?.0)
}

pub(crate) async fn list(State(s): State<AppState>) -> Json<serde_json::Value> {
    let groups = s.cf().groups.list();
    Json(serde_json::json!({"groups": groups, "count": groups.len()}))
}

pub(crate) async fn info(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    Ok(Json(s.cf().groups.info(&name)?).into_response())
}

pub(crate) async fn delete(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    s.cf().groups.delete(&name).await?;
    Ok(Json(serde_json::json!({"deleted": name})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReceiveBody {
    consumer_id: String,
    #[serde(default)]
    max_events: Option<usize>,
    #[serde(default)]
    visibility_timeout_ms: Option<u64>,
    /// Wait up to this long for an event when none is ready.
    #[serde(default)]
    wait_ms: Option<u64>,
}

pub(crate) async fn receive(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<ReceiveBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    let b = json_body(body)?;
    if b.consumer_id.is_empty() || b.consumer_id.len() > 256 {
        return Err(ApiError::BadRequest(
            "consumer_id: 1 to 256 characters".to_owned(),
        ));
    }
    let max = match b.max_events {
        Some(0) => {
            return Err(ApiError::BadRequest(
                "max_events: must be at least 1".to_owned(),
            ));
        }
        Some(n) => n.min(MAX_RECEIVE),
        None => 1,
    };
    if b.visibility_timeout_ms
        .is_some_and(|v| !(1..=MAX_VISIBILITY_MS).contains(&v))
    {
        return Err(ApiError::BadRequest(format!(
            "visibility_timeout_ms: between 1 and {MAX_VISIBILITY_MS} (12 hours)"
        )));
    }
    let groups = &s.cf().groups;
    let core = &s.cf().core;
    let deadline = Instant::now() + Duration::from_millis(b.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let mut latest = core.watch_latest();
    let ending = s.ending();
    tokio::pin!(ending);
    loop {
        let seen = core.latest();
        let got = groups
            .receive(&name, &b.consumer_id, max, b.visibility_timeout_ms)
            .await?;
        if !got.deliveries.is_empty() || got.gap.is_some() || Instant::now() >= deadline {
            return Ok(received(&got));
        }
        // Wake for a new event, a lease coming due, the deadline or shutdown.
        let due = groups.next_due_ms(&name).map(|due_ms| {
            let now_ms = record::unix_ms(SystemTime::now());
            Instant::now() + Duration::from_millis(due_ms.saturating_sub(now_ms))
        });
        let wake = due.map_or(deadline, |d| d.min(deadline));
        tokio::select! {
            () = crate::shared::newer_than(&mut latest, seen) => {}
            () = tokio::time::sleep_until(wake) => {}
            () = &mut ending => return Ok(received(&got)),
        }
    }
}

fn received(got: &crate::groups::Received) -> Response {
    let mut body = Vec::with_capacity(
        256 + got
            .deliveries
            .iter()
            .map(|d| d.json.len() + 1)
            .sum::<usize>(),
    );
    body.extend_from_slice(b"{\"events\":[");
    for (i, d) in got.deliveries.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&d.json);
    }
    let _ = write!(
        body,
        "],\"count\":{},\"lease_expires_ms\":{}",
        got.deliveries.len(),
        got.lease_expires_ms
    );
    if let Some(gap) = got.gap {
        let _ = write!(
            body,
            ",\"gap\":{{\"after\":{},\"before\":{}}}",
            gap.after, gap.before
        );
    }
    body.push(b'}');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckBody {
    #[serde(default)]
    sequences: Vec<u64>,
    #[serde(default)]
    sequence: Option<u64>,
    /// Informational: who acknowledges.
    #[serde(default)]
    #[allow(dead_code)]
    consumer_id: Option<String>,
}

fn sequences(list: Vec<u64>, one: Option<u64>) -> Result<Vec<u64>, ApiError> {
    let mut v = list;
    v.extend(one);
    if v.is_empty() {
        return Err(ApiError::BadRequest(
            "give sequences (a list) or sequence".to_owned(),
        ));
    }
    if v.len() > 10_000 {
        return Err(ApiError::BadRequest(
            "at most 10000 sequences per request".to_owned(),
        ));
    }
    Ok(v)
}

pub(crate) async fn ack(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<AckBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    let b = json_body(body)?;
    let seqs = sequences(b.sequences, b.sequence)?;
    let settled = s.cf().groups.ack(&name, &seqs, None).await?;
    Ok(Json(settled).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NackBody {
    #[serde(default)]
    sequences: Vec<u64>,
    #[serde(default)]
    sequence: Option<u64>,
    #[serde(default)]
    reason: Option<String>,
    /// Deliver again after this long (default: at once).
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    consumer_id: Option<String>,
}

pub(crate) async fn nack(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<NackBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    let b = json_body(body)?;
    let seqs = sequences(b.sequences, b.sequence)?;
    let reason = b.reason.map(|r| r.chars().take(1000).collect());
    let settled = s
        .cf()
        .groups
        .nack(
            &name,
            &seqs,
            reason,
            b.delay_ms.unwrap_or(0).min(86_400_000),
        )
        .await?;
    Ok(Json(settled).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeadParams {
    after: Option<String>,
    limit: Option<String>,
}

pub(crate) async fn dead_letters(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<DeadParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    let Query(q) = q?;
    let after = parse_u64("after", q.after.as_deref())?.unwrap_or(0);
    let limit = match parse_u64("limit", q.limit.as_deref())? {
        Some(0) => return Err(ApiError::BadRequest("limit: must be at least 1".to_owned())),
        Some(l) => usize::try_from(l)
            .unwrap_or(usize::MAX)
            .min(s.config().max_limit),
        None => s.config().default_limit,
    };
    let list = s.cf().groups.dead_letters(&name, after, limit)?;
    let mut body = Vec::new();
    body.extend_from_slice(b"{\"dead_letters\":[");
    for (i, d) in list.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        let _ = write!(
            body,
            "{{\"sequence\":{},\"reason\":{},\"attempts\":{},\"dead_at_ms\":{},\"event\":{}}}",
            d.sequence,
            serde_json::Value::String(d.reason.clone()),
            d.attempts,
            d.dead_at_ms,
            if d.json.is_empty() { "null" } else { &d.json },
        );
    }
    let _ = write!(body, "],\"count\":{}}}", list.len());
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

pub(crate) async fn replay(
    State(s): State<AppState>,
    p: Result<Path<(String, u64)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (name, seq) = p?.0;
    s.cf().groups.replay(&name, seq).await?;
    Ok(Json(serde_json::json!({"replayed": seq})).into_response())
}

pub(crate) async fn delete_dead(
    State(s): State<AppState>,
    p: Result<Path<(String, u64)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (name, seq) = p?.0;
    s.cf().groups.delete_dead(&name, seq).await?;
    Ok(Json(serde_json::json!({"deleted": seq})).into_response())
}

pub(crate) async fn drain(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = group_name(p)?;
    let n = s.cf().groups.drain(&name).await?;
    Ok(Json(serde_json::json!({"drained": n})).into_response())
}
