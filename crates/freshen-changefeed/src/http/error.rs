//! The API's one error type and its response: `{"error": true, "message": …,
//! "status_code": …}`, ThemisDB's error body.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Error;

/// Why a request failed, as the client sees it.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The request is malformed: the message says what to fix.
    BadRequest(String),
    /// No token, or an unknown one.
    Unauthorized,
    /// A token without the scope the route needs.
    Forbidden(&'static str),
    NotFound(String),
    Conflict(String),
    /// The changefeed stopped (closed, or after a store failure).
    Unavailable(String),
    /// Anything else: details stay on the server.
    Internal,
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        match e {
            Error::UnknownGroup(_) | Error::UnknownDeadLetter { .. } => {
                ApiError::NotFound(e.to_string())
            }
            Error::GroupExists(_) => ApiError::Conflict(e.to_string()),
            Error::Invalid(m) => ApiError::BadRequest(m),
            Error::Closed { .. } => ApiError::Unavailable(e.to_string()),
            Error::Open { .. } | Error::Store(_) | Error::Format(_) => {
                // The client learns only that it failed; the details go to the log.
                tracing::error!(error = %e, "changefeed request failed");
                ApiError::Internal
            }
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> ApiError {
        ApiError::BadRequest(format!("bad query string: {}", e.body_text()))
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> ApiError {
        ApiError::BadRequest(format!("bad JSON body: {}", e.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> ApiError {
        ApiError::BadRequest(format!("bad path: {}", e.body_text()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "missing or unknown bearer token".to_owned(),
            ),
            ApiError::Forbidden(scope) => (
                StatusCode::FORBIDDEN,
                format!("this token does not have the {scope} scope"),
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error in the changefeed store".to_owned(),
            ),
        };
        let body = serde_json::json!({
            "error": true,
            "message": message,
            "status_code": status.as_u16(),
        });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A positive integer parameter, with a message naming it when it is not one.
/// A flag parameter: `1`/`true` or `0`/`false`; absent or empty is `None`.
pub(crate) fn parse_flag(name: &str, value: Option<&str>) -> Result<Option<bool>, ApiError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some("1" | "true") => Ok(Some(true)),
        Some("0" | "false") => Ok(Some(false)),
        Some(v) => Err(ApiError::BadRequest(format!(
            "{name}: expected 1, true, 0 or false, got {v:?}"
        ))),
    }
}

pub(crate) fn parse_u64(name: &str, value: Option<&str>) -> Result<Option<u64>, ApiError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::BadRequest(format!(
                "{name}: expected a non-negative integer, got {v:?}"
            ))
        }),
    }
}
