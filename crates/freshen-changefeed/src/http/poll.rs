//! `GET /changefeed`: a page of events after `from_seq`, waiting up to `long_poll_ms`
//! for the first matching one.

use std::io::Write as _;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::time::Instant;

use super::error::{ApiError, parse_flag, parse_u64};
use super::{AppState, FilterParams, MAX_SCAN, with_markers};
use crate::metrics;
use crate::txmark::Framing;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct PollParams {
    from_seq: Option<String>,
    limit: Option<String>,
    long_poll_ms: Option<String>,
    /// `1`: a `TRANSACTION_COMMIT` marker after each source transaction.
    tx: Option<String>,
    #[serde(flatten)]
    filter: FilterParams,
}

pub(crate) async fn poll(
    State(s): State<AppState>,
    q: Result<Query<PollParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return Err(bad(&s, e.into())),
    };
    let config = s.config();
    let parsed = (|| {
        let from = parse_u64("from_seq", q.from_seq.as_deref())?.unwrap_or(0);
        let limit = match parse_u64("limit", q.limit.as_deref())? {
            Some(0) => return Err(ApiError::BadRequest("limit: must be at least 1".to_owned())),
            Some(l) => usize::try_from(l)
                .unwrap_or(usize::MAX)
                .min(config.max_limit),
            None => config.default_limit,
        };
        let wait = parse_u64("long_poll_ms", q.long_poll_ms.as_deref())?
            .unwrap_or(0)
            .min(config.max_long_poll_ms);
        let tx = parse_flag("tx", q.tx.as_deref())?.unwrap_or(config.transaction_markers);
        Ok((from, limit, wait, tx, q.filter.filter()?))
    })();
    let (from, limit, wait, tx, filter) = parsed.map_err(|e| bad(&s, e))?;
    let core = &s.cf().core;
    metrics::inc(&core.metrics().poll_requests);
    let deadline = Instant::now() + Duration::from_millis(wait);
    let mut latest = core.watch_latest();
    let ending = s.ending();
    tokio::pin!(ending);
    // Events deleted from the front of the log that this reader had not read yet.
    let front = core.truncated();
    let gap = (from + 1 < front).then_some((from, front));
    let mut after = from;
    let mut ended = false;
    let mut events = Vec::with_capacity(1024);
    if tx {
        let mut complete = core.watch_tx_complete();
        loop {
            // Read before the events: the value never covers events not yet visible.
            let through = *complete.borrow_and_update();
            latest.borrow_and_update();
            events.clear();
            let read = with_markers(
                core,
                after,
                limit,
                through,
                &filter,
                &mut events,
                Framing::Json,
            )?;
            after = read.next;
            let n = read.entries;
            if n > 0 || wait == 0 || ended || Instant::now() >= deadline {
                metrics::add(&core.metrics().poll_events, read.events as u64);
                metrics::add(&core.metrics().tx_markers, read.markers as u64);
                return Ok(page(&events, n, core.latest(), after, gap));
            }
            if !read.at_end {
                tokio::task::yield_now().await;
                continue;
            }
            // Wait for more events, or for the held-back transaction's end.
            tokio::select! {
                r = latest.changed() => if r.is_err() { ended = true },
                r = complete.changed() => if r.is_err() { ended = true },
                () = tokio::time::sleep_until(deadline) => {}
                () = &mut ending => ended = true,
            }
        }
    }
    loop {
        let mut n = 0usize;
        after = core.read_json(after, limit, MAX_SCAN, &filter, |seq, r| {
            if n > 0 {
                events.push(b',');
            }
            r.write_json(seq, &mut events);
            n += 1;
        })?;
        if n > 0 || wait == 0 || ended || Instant::now() >= deadline {
            metrics::add(&core.metrics().poll_events, n as u64);
            return Ok(page(&events, n, core.latest(), after, gap));
        }
        if after < core.latest() {
            // Filtered-out events remain to be examined: no need to wait, but let other
            // tasks run between steps of a long scan.
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            () = crate::log::newer_than(&mut latest, after) => {}
            () = tokio::time::sleep_until(deadline) => {}
            () = &mut ending => ended = true,
        }
    }
}

fn bad(s: &AppState, e: ApiError) -> ApiError {
    metrics::inc(&s.cf().core.metrics().http_bad_requests);
    e
}

/// `{"events":[…],"count":n,"latest_sequence":s,"next_from_seq":x}` — ThemisDB's
/// response plus `next_from_seq`, where the next poll should start (past events a
/// filter skipped), and `"gap":{"after":a,"before":b}` when events after `from_seq`
/// were deleted before this reader got them (every sequence between a and b).
fn page(events: &[u8], count: usize, latest: u64, next: u64, gap: Option<(u64, u64)>) -> Response {
    let mut body = Vec::with_capacity(events.len() + 96);
    body.extend_from_slice(b"{\"events\":[");
    body.extend_from_slice(events);
    let _ = write!(
        body,
        "],\"count\":{count},\"latest_sequence\":{latest},\"next_from_seq\":{next}"
    );
    if let Some((after, before)) = gap {
        let _ = write!(body, ",\"gap\":{{\"after\":{after},\"before\":{before}}}");
    }
    body.push(b'}');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
