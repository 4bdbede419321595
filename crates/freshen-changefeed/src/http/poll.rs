//! `GET /changefeed`: a page of events after `from_seq`, waiting up to `long_poll_ms`
//! for the first matching one. With `cursors=orders:120,items:95` instead of `from_seq`,
//! the named tables' events each past its own cursor ([`crate::cursors`]), and each
//! table's next cursor in the page.

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
use crate::cursors::Cursors;
use crate::filter::Selection;
use crate::txmark::Framing;
use crate::{Filter, metrics, record};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct PollParams {
    from_seq: Option<String>,
    limit: Option<String>,
    long_poll_ms: Option<String>,
    /// `1`: a `TRANSACTION_COMMIT` marker after each source transaction.
    tx: Option<String>,
    /// `table:seq,…`: these tables, each after its own sequence.
    cursors: Option<String>,
    #[serde(flatten)]
    filter: FilterParams,
}

/// What one page reads: every event after a position that a filter matches, or the
/// named tables each past its cursor.
enum Reading {
    From(u64, Filter),
    Cursors(Cursors),
}

impl PollParams {
    fn reading(&self) -> Result<Reading, ApiError> {
        let filter = self.filter.filter()?;
        let Some(list) = &self.cursors else {
            let from = parse_u64("from_seq", self.from_seq.as_deref())?.unwrap_or(0);
            return Ok(Reading::From(from, filter));
        };
        // Each table has its position in the list: a second one, or a table filter
        // beside the tables named, would be ambiguous.
        if self.from_seq.is_some() || self.filter.has_tables() {
            return Err(ApiError::BadRequest(super::CURSORS_ALONE.to_owned()));
        }
        Ok(Reading::Cursors(
            Cursors::parse(list, filter).map_err(ApiError::BadRequest)?,
        ))
    }
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
        let reading = q.reading()?;
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
        Ok((reading, limit, wait, tx))
    })();
    let (reading, limit, wait, tx) = parsed.map_err(|e| bad(&s, e))?;
    let core = &s.cf().core;
    metrics::inc(&core.metrics().poll_requests);
    // Events deleted from the front of the log that this reader had not read yet.
    let front = core.truncated();
    match reading {
        Reading::From(from, filter) => {
            let gap = (from + 1 < front).then_some((from, front));
            let read = read(&s, from, limit, wait, tx, &filter).await?;
            let mut tail = Vec::new();
            if let Some((after, before)) = gap {
                let _ = write!(tail, ",\"gap\":{{\"after\":{after},\"before\":{before}}}");
            }
            Ok(page(&read, core.latest(), &tail))
        }
        Reading::Cursors(mut cursors) => {
            metrics::inc(&core.metrics().cursor_polls);
            let gaps = cursors.gaps(front);
            let mut tail = Vec::new();
            if !gaps.is_empty() {
                metrics::add(&core.metrics().cursor_gaps, gaps.len() as u64);
                tail.extend_from_slice(b",\"gaps\":{");
                for (i, (name, after)) in gaps.iter().enumerate() {
                    if i > 0 {
                        tail.push(b',');
                    }
                    record::json_str(name, &mut tail);
                    let _ = write!(tail, ":{{\"after\":{after},\"before\":{front}}}");
                }
                tail.push(b'}');
                // Reported once: the deleted range is behind every cursor from now on.
                cursors.advance(front - 1);
            }
            let read = read(&s, cursors.start(), limit, wait, tx, &cursors).await?;
            cursors.advance(read.next);
            tail.extend_from_slice(b",\"cursors\":");
            cursors.write_json(&mut tail);
            Ok(page(&read, core.latest(), &tail))
        }
    }
}

/// A page's events (JSON, comma-separated), how many entries, and where the next read
/// starts.
struct Read {
    events: Vec<u8>,
    count: usize,
    next: u64,
}

/// Reads up to `limit` events after `from` that `selection` delivers, waiting up to
/// `wait` ms for the first.
async fn read(
    s: &AppState,
    from: u64,
    limit: usize,
    wait: u64,
    tx: bool,
    selection: &(impl Selection + Sync),
) -> Result<Read, ApiError> {
    let core = &s.cf().core;
    let deadline = Instant::now() + Duration::from_millis(wait);
    let mut latest = core.watch_latest();
    let ending = s.ending();
    tokio::pin!(ending);
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
                selection,
                &mut events,
                Framing::Json,
            )?;
            after = read.next;
            let n = read.entries;
            if n > 0 || wait == 0 || ended || Instant::now() >= deadline {
                metrics::add(&core.metrics().poll_events, read.events as u64);
                metrics::add(&core.metrics().tx_markers, read.markers as u64);
                return Ok(Read {
                    events,
                    count: n,
                    next: after,
                });
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
        after = core.read_json(after, limit, MAX_SCAN, selection, |seq, r| {
            if n > 0 {
                events.push(b',');
            }
            r.write_json(seq, &mut events);
            n += 1;
        })?;
        if n > 0 || wait == 0 || ended || Instant::now() >= deadline {
            metrics::add(&core.metrics().poll_events, n as u64);
            return Ok(Read {
                events,
                count: n,
                next: after,
            });
        }
        if after < core.latest() {
            // Filtered-out events remain to be examined: no need to wait, but let other
            // tasks run between steps of a long scan.
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            () = crate::shared::newer_than(&mut latest, after) => {}
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
/// filter skipped), then `tail`: `"gap":{"after":a,"before":b}` when events after
/// `from_seq` were deleted before this reader got them (every sequence between a and
/// b); with per-table cursors, `"cursors":{"orders":x,…}` and a `gap` per table in
/// `"gaps"`.
fn page(read: &Read, latest: u64, tail: &[u8]) -> Response {
    let Read {
        events,
        count,
        next,
    } = read;
    let mut body = Vec::with_capacity(events.len() + 96 + tail.len());
    body.extend_from_slice(b"{\"events\":[");
    body.extend_from_slice(events);
    let _ = write!(
        body,
        "],\"count\":{count},\"latest_sequence\":{latest},\"next_from_seq\":{next}"
    );
    body.extend_from_slice(tail);
    body.push(b'}');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
