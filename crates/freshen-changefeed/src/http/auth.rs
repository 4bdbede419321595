//! Bearer-token authentication with `read` and `admin` scopes.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::Scope;
use crate::metrics;

/// Paths where a browser may pass the token as `access_token` in the query string
/// (when the configuration allows it): `EventSource` and `WebSocket` send no headers.
const QUERY_TOKEN_PATHS: &[&str] = &["/changefeed", "/changefeed/stream", "/v2/cdc/stream"];

fn presented(state: &AppState, req: &Request) -> Option<String> {
    if req.headers().contains_key(header::AUTHORIZATION) {
        return freshen_http::bearer(req.headers()).map(str::to_owned);
    }
    if state.inner.query_token && QUERY_TOKEN_PATHS.contains(&req.uri().path()) {
        let query = req.uri().query()?;
        return query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == "access_token").then(|| percent_decode(v))
        });
    }
    None
}

fn percent_decode(s: &str) -> String {
    fn hex(c: u8) -> Option<u8> {
        (c as char).to_digit(16).map(|d| d as u8)
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn check(state: &AppState, req: &Request, need: Scope) -> Result<(), ApiError> {
    if state.inner.tokens.is_empty() {
        return Ok(());
    }
    let Some(token) = presented(state, req) else {
        metrics::inc(&state.inner.cf.core.metrics().auth_failures);
        return Err(ApiError::Unauthorized);
    };
    let scope = state
        .inner
        .tokens
        .iter()
        .filter(|(t, _)| freshen_http::same_secret(token.as_bytes(), t.as_bytes()))
        .map(|(_, s)| *s)
        .max();
    match scope {
        None => {
            metrics::inc(&state.inner.cf.core.metrics().auth_failures);
            Err(ApiError::Unauthorized)
        }
        Some(s) if s < need => {
            metrics::inc(&state.inner.cf.core.metrics().auth_failures);
            Err(ApiError::Forbidden(match need {
                Scope::Read => "read",
                Scope::Admin => "admin",
            }))
        }
        Some(_) => Ok(()),
    }
}

pub(crate) async fn require_read(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    match check(&state, &req, Scope::Read) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    match check(&state, &req, Scope::Admin) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values() {
        assert_eq!(percent_decode("a%2Bb+c%zz%4"), "a+b c%zz%4");
    }
}
