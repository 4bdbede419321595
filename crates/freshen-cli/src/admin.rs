//! `/admin`: steer a running pipeline over the metrics listener — start a view's sweep,
//! list and re-admit quarantined keys, rebuild given keys now, acknowledge a view's
//! unhealed gaps, reload the configuration, start a sink's snapshot of some tables.
//!
//! Who may: with `[http] admin_token` set, requests must present it as a bearer token;
//! without one the endpoints are open on a loopback listener (the Host allow-list and
//! the Origin check of `freshen-http` keep browsers' cross-site requests out) and off on
//! any other.
//!
//! A key in a request body is JSON: a string for a one-column scope (`"dev-1"`), an
//! array for a composite one, `null` for a NULL part (`["eu", null]`).

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use freshen::Key;
use serde::{Deserialize, Serialize};

use crate::config::AdminToken;
use crate::readout::Readout;

/// Who may use the endpoints.
#[derive(Debug, Clone)]
pub enum Access {
    /// Anyone who reaches the listener (a loopback listener without a token).
    Open,
    /// Requests that present this bearer token.
    Token(AdminToken),
    /// Nobody: the listener is reachable beyond loopback and no token is configured.
    Off,
}

impl Access {
    /// The access a listener on `listen` with `token` gives.
    pub fn of(listen: std::net::SocketAddr, token: Option<AdminToken>) -> Access {
        match token {
            Some(t) => Access::Token(t),
            None if listen.ip().is_loopback() => Access::Open,
            None => Access::Off,
        }
    }
}

/// Every failure of an admin request, as the response it is.
#[derive(Debug)]
pub enum AdminError {
    /// No or a wrong bearer token.
    Unauthorized,
    /// The endpoints are off on this listener.
    Off,
    /// No view of that name.
    NoView(String),
    /// The view has no reconcile sweep to start.
    NoSweep(String),
    /// The body is not what the endpoint takes.
    BadKey(String),
    /// The new configuration was refused; the running one goes on.
    Reload(String),
    /// This process cannot reload (not started from a file).
    NoReload,
    /// No sink of that index takes snapshots.
    NoSink(usize),
    /// What the request needs cannot be reached now (the database); retry.
    Unavailable(String),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (code, message) = match self {
            AdminError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "a valid `Authorization: Bearer <[http] admin_token>` is required".to_owned(),
            ),
            AdminError::Off => (
                StatusCode::FORBIDDEN,
                "the admin endpoints are off on a listener beyond loopback without \
                 `[http] admin_token`"
                    .to_owned(),
            ),
            AdminError::NoView(v) => (StatusCode::NOT_FOUND, format!("no view named `{v}`")),
            AdminError::NoSweep(v) => (
                StatusCode::CONFLICT,
                format!("view `{v}` has no `reconcile`, so there is no sweep to start"),
            ),
            AdminError::BadKey(why) => (StatusCode::BAD_REQUEST, why),
            AdminError::Reload(why) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the configuration was not reloaded (the running one goes on): {why}"),
            ),
            AdminError::NoSink(i) => (
                StatusCode::NOT_FOUND,
                format!(
                    "sink {i} takes no snapshots (sinks are numbered from 0 in [[sinks]] order; snapshots need a PostgreSQL source)"
                ),
            ),
            AdminError::NoReload => (
                StatusCode::CONFLICT,
                "this process has no configuration file to reload".to_owned(),
            ),
            AdminError::Unavailable(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                freshen::redact_text(&format!("{why}; nothing changed, try again")),
            ),
        };
        let mut r = (code, Json(serde_json::json!({ "error": message }))).into_response();
        if code == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

type Shared = (Arc<dyn Readout>, Arc<Access>);

async fn guard(
    State((_, access)): State<Shared>,
    req: Request,
    next: Next,
) -> Result<Response, AdminError> {
    match &*access {
        Access::Open => {}
        Access::Off => return Err(AdminError::Off),
        Access::Token(t) => match freshen_http::bearer(req.headers()) {
            Some(p) if freshen_http::same_secret(p.as_bytes(), t.expose().as_bytes()) => {}
            _ => return Err(AdminError::Unauthorized),
        },
    }
    Ok(next.run(req).await)
}

fn handle(o: &dyn Readout, view: &str) -> Result<freshen::Handle, AdminError> {
    o.handle(view)
        .ok_or_else(|| AdminError::NoView(view.to_owned()))
}

/// A key as JSON: a string, or an array of strings and nulls.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KeyJson {
    One(String),
    Parts(Vec<Option<String>>),
}

impl KeyJson {
    fn key(self) -> Result<Key, AdminError> {
        match self {
            KeyJson::One(s) => Ok(Key::new(s)),
            KeyJson::Parts(p) if p.is_empty() => {
                Err(AdminError::BadKey("a key needs at least one part".into()))
            }
            KeyJson::Parts(p) => Ok(Key::from_parts(p)),
        }
    }
}

fn key_json(k: &Key) -> serde_json::Value {
    let parts: Vec<Option<&str>> = k.parts().collect();
    match parts.as_slice() {
        [Some(one)] => serde_json::Value::from(*one),
        _ => serde_json::Value::from(
            parts
                .iter()
                .map(|p| p.map_or(serde_json::Value::Null, serde_json::Value::from))
                .collect::<Vec<_>>(),
        ),
    }
}

fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], shape: &str) -> Result<T, AdminError> {
    serde_json::from_slice(bytes).map_err(|e| AdminError::BadKey(format!("expected {shape}: {e}")))
}

/// A quarantined key in `GET /admin/views/{view}/quarantined`.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct QuarantinedKey {
    /// The key as JSON (a string, or an array for a composite key).
    pub key: serde_json::Value,
    /// The key as text, as logs and `/status` show it.
    pub text: String,
    /// Seconds since it was quarantined.
    pub since_s: f64,
    /// Failed rebuilds in a row that blamed it.
    pub failures: u32,
    /// The last error.
    pub error: String,
    /// Whether it holds its transactions unconfirmed.
    pub holding: bool,
}

async fn quarantined(
    State((o, _)): State<Shared>,
    Path(view): Path<String>,
) -> Result<Json<Vec<QuarantinedKey>>, AdminError> {
    let crate::readout::AdminView {
        handle: h, scope, ..
    } = o
        .view(&view)
        .ok_or_else(|| AdminError::NoView(view.clone()))?;
    let now = std::time::SystemTime::now();
    Ok(Json(
        h.quarantined()
            .into_iter()
            .map(|q| (scope.show(&q.key), q))
            .map(|(shown, q)| QuarantinedKey {
                key: key_json(&shown),
                text: shown.to_string(),
                since_s: now.duration_since(q.since).map_or(0.0, |d| d.as_secs_f64()),
                failures: q.failures,
                error: freshen::redact_text(&q.error),
                holding: q.holding,
            })
            .collect(),
    ))
}

async fn sweep(
    State((o, _)): State<Shared>,
    Path(view): Path<String>,
) -> Result<Response, AdminError> {
    if !handle(&*o, &view)?.reconcile_now() {
        return Err(AdminError::NoSweep(view));
    }
    tracing::info!(view = %view, "sweep requested over /admin");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "view": view, "sweep": "requested" })),
    )
        .into_response())
}

/// A person healed the view's unhealed gaps (rebuilt what they touched): the view stops
/// reporting them. Answers with the lines acknowledged.
async fn acknowledge_gaps(
    State((o, _)): State<Shared>,
    Path(view): Path<String>,
) -> Result<Response, AdminError> {
    let v = o
        .view(&view)
        .ok_or_else(|| AdminError::NoView(view.clone()))?;
    // Forgotten where they are kept first: a failure there leaves the view reporting
    // them, never a restart bringing back what the view no longer shows.
    if let Some(keeper) = &v.gaps {
        let seen = v.handle.stats().unhealed_gaps;
        // Kept gaps the refresher has not taken in are not acknowledged yet (it reports
        // none meanwhile): this only lets the keeper stop showing them once it has.
        keeper.unhealed(seen.clone());
        keeper
            .forget(&seen)
            .await
            .map_err(|e| AdminError::Unavailable(format!("cannot forget the kept gaps: {e}")))?;
    }
    let acknowledged = v.handle.acknowledge_gaps();
    tracing::warn!(view = %view, gaps = ?acknowledged, "unhealed gaps acknowledged over /admin");
    Ok(Json(serde_json::json!({ "view": view, "acknowledged": acknowledged })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Readmit {
    #[serde(default)]
    key: Option<KeyJson>,
    #[serde(default)]
    all: bool,
}

async fn readmit(
    State((o, _)): State<Shared>,
    Path(view): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, AdminError> {
    let crate::readout::AdminView {
        handle: h, scope, ..
    } = o
        .view(&view)
        .ok_or_else(|| AdminError::NoView(view.clone()))?;
    let r: Readmit = body(&bytes, r#"{"key": KEY} or {"all": true}"#)?;
    let quarantined = h.quarantined().into_iter().map(|q| q.key);
    let keys: Vec<freshen::Key> = match (r.key, r.all) {
        // A key as given, or as the quarantine list showed it (redacted).
        (Some(k), false) => {
            let k = k.key()?;
            let listed = quarantined
                .filter(|q| scope.show(q) == k)
                .collect::<Vec<_>>();
            if listed.is_empty() { vec![k] } else { listed }
        }
        (None, true) => quarantined.collect(),
        _ => {
            return Err(AdminError::BadKey(
                r#"expected {"key": KEY} or {"all": true}"#.into(),
            ));
        }
    };
    let readmitted: Vec<serde_json::Value> = keys
        .iter()
        .filter(|k| h.readmit(k))
        .map(|k| key_json(&scope.show(k)))
        .collect();
    tracing::info!(view = %view, keys = readmitted.len(), "quarantined keys re-admitted over /admin");
    Ok(Json(
        serde_json::json!({ "view": view, "readmitted": readmitted }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rebuild {
    keys: Vec<KeyJson>,
}

async fn rebuild(
    State((o, _)): State<Shared>,
    Path(view): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Response, AdminError> {
    let h = handle(&*o, &view)?;
    let r: Rebuild = body(&bytes, r#"{"keys": [KEY, ...]}"#)?;
    let keys = r
        .keys
        .into_iter()
        .map(KeyJson::key)
        .collect::<Result<Vec<_>, _>>()?;
    for k in &keys {
        h.rebuild(k);
    }
    tracing::info!(view = %view, keys = keys.len(), "rebuild requested over /admin");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "view": view, "rebuilding": keys.len() })),
    )
        .into_response())
}

async fn reload(State((o, _)): State<Shared>) -> Result<Json<serde_json::Value>, AdminError> {
    match o.reload() {
        None => Err(AdminError::NoReload),
        Some(Err(e)) => Err(AdminError::Reload(freshen::redact_text(&e.0))),
        Some(Ok(change)) => Ok(Json(serde_json::json!({
            "reloaded": !change.is_empty(),
            "change": change,
        }))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotRequest {
    tables: Vec<String>,
}

/// Starts snapshots of the named tables into sink `sink` (its index in `[[sinks]]`);
/// answers at once with their progress.
async fn sink_snapshot(
    State((o, _)): State<Shared>,
    Path(sink): Path<usize>,
    body: Result<Json<SnapshotRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    let Json(req) = body.map_err(|e| {
        AdminError::BadKey(format!(
            "give tables: the tables to snapshot, e.g. {{\"tables\": [\"public.orders\"]}} ({e})"
        ))
    })?;
    let snapshots = o.sink(sink).ok_or(AdminError::NoSink(sink))?;
    let progress: Vec<freshen_codec::SnapshotProgress> = snapshots
        .request(&req.tables)
        .await
        .map_err(|e| AdminError::BadKey(e.to_string()))?
        .into_iter()
        .map(Into::into)
        .collect();
    tracing::info!(sink, tables = ?req.tables, "sink snapshot requested over /admin");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "sink": sink, "snapshots": progress })),
    )
        .into_response())
}

/// The `/admin` routes, guarded by `access`.
pub fn routes(o: Arc<dyn Readout>, access: Access) -> Router {
    let state: Shared = (o, Arc::new(access));
    Router::new()
        .route("/admin/views/{view}/sweep", post(sweep))
        .route("/admin/views/{view}/quarantined", get(quarantined))
        .route("/admin/views/{view}/readmit", post(readmit))
        .route("/admin/views/{view}/rebuild", post(rebuild))
        .route(
            "/admin/views/{view}/gaps/acknowledge",
            post(acknowledge_gaps),
        )
        .route("/admin/reload", post(reload))
        .route("/admin/sinks/{sink}/snapshot", post(sink_snapshot))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}
