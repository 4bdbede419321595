//! `GET /changefeed/stream`: Server-Sent Events, for as long as the client stays.
//!
//! Each stream reads the durable log itself, one frame (up to `max_events` events) at
//! a time, and only when the connection has taken the previous frame: a slow client
//! reads at its own pace and never loses events, and the server keeps no queue for it.
//!
//! When events after the client's position were deleted before it read them, the
//! stream says so with a named event, `event: gap` and `data: {"after":a,"before":b}`
//! (every sequence between a and b is gone): `EventSource.onmessage` does not see it,
//! `addEventListener("gap", …)` does.
//!
//! With `tx=1` (or `transaction_markers` in the listener's settings), each source
//! transaction ends with `event: transaction` and the marker as `data` (no `id`, so
//! `Last-Event-ID` stays the last event's sequence): `addEventListener("transaction", …)`.
//!
//! With `cursors=orders:120,items:95` ([`crate::cursors`]) each event's `id` is the list
//! to resume with (`orders:130,items:130`), which a reconnecting `EventSource` sends
//! back as `Last-Event-ID`; a gap names its table (`"table":"orders"`).

use std::io::Write as _;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::{ApiError, parse_flag, parse_u64};
use super::{AppState, FilterParams, MAX_SCAN, with_markers};
use crate::Filter;
use crate::cursors::{Cursors, Reader};
use crate::filter::Selection;
use crate::metrics;
use crate::record;
use crate::shared::Core;
use crate::txmark::Framing;

/// ThemisDB's one-shot mode (`keep_alive=false`) sends at most this many events.
const ONE_SHOT_LIMIT: usize = 1000;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamParams {
    from_seq: Option<String>,
    heartbeat_ms: Option<String>,
    retry_ms: Option<String>,
    max_events: Option<String>,
    max_seconds: Option<String>,
    keep_alive: Option<String>,
    tx: Option<String>,
    cursors: Option<String>,
    #[serde(flatten)]
    filter: FilterParams,
}

/// One stream's parameters, resolved from its query, headers and the listener's config.
struct StreamConfig {
    from: u64,
    heartbeat: Duration,
    retry_ms: u64,
    max_events: usize,
    max_time: Option<Duration>,
    keep_alive: bool,
    /// Transaction markers.
    tx: bool,
    filter: Reader,
}

fn settings(s: &AppState, headers: &HeaderMap, q: &StreamParams) -> Result<StreamConfig, ApiError> {
    let config = s.config();
    // A reconnecting EventSource repeats its URL and adds Last-Event-ID: that wins.
    let last_id = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::BadRequest("Last-Event-ID: not text".to_owned()))?,
        ),
        None => None,
    };
    let filter = q.filter.filter()?;
    let (from, filter) = match &q.cursors {
        None => {
            let from = match last_id {
                Some(id) => parse_u64("Last-Event-ID", Some(id))?,
                None => None,
            };
            let from = match from {
                Some(id) => id,
                None => parse_u64("from_seq", q.from_seq.as_deref())?.unwrap_or(0),
            };
            (from, Reader::All(filter))
        }
        Some(list) => {
            if q.from_seq.is_some() || q.filter.has_tables() {
                return Err(ApiError::BadRequest(super::CURSORS_ALONE.to_owned()));
            }
            let mut cursors = Cursors::parse(list, filter).map_err(ApiError::BadRequest)?;
            // The id of the last event this client got: a list like `cursors`, or a
            // sequence (from a stream without cursors).
            match last_id.map(str::trim).filter(|id| !id.is_empty()) {
                None => {}
                Some(id) => match id.parse::<u64>() {
                    Ok(seq) => cursors.resume_all(seq),
                    Err(_) => {
                        let resumed = Cursors::parse(id, Filter::default()).map_err(|m| {
                            ApiError::BadRequest(format!(
                                "Last-Event-ID: expected a sequence or a cursor list: {m}"
                            ))
                        })?;
                        cursors.resume_from(&resumed);
                    }
                },
            }
            (cursors.start(), Reader::Tables(cursors))
        }
    };
    let heartbeat_ms = parse_u64("heartbeat_ms", q.heartbeat_ms.as_deref())?
        .unwrap_or(config.heartbeat_ms)
        .clamp(100, 300_000);
    let retry_ms = parse_u64("retry_ms", q.retry_ms.as_deref())?
        .unwrap_or(config.retry_ms)
        .clamp(100, 120_000);
    let max_events = match parse_u64("max_events", q.max_events.as_deref())? {
        Some(0) => {
            return Err(ApiError::BadRequest(
                "max_events: must be at least 1".to_owned(),
            ));
        }
        Some(n) => usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(config.max_events_per_frame),
        None => config.max_events_per_frame,
    };
    let max_time = match parse_u64("max_seconds", q.max_seconds.as_deref())? {
        Some(0) => {
            return Err(ApiError::BadRequest(
                "max_seconds: must be at least 1".to_owned(),
            ));
        }
        other => other.map(Duration::from_secs),
    };
    let keep_alive = match q.keep_alive.as_deref().map(str::trim) {
        None | Some("true" | "1" | "") => true,
        Some("false" | "0") => false,
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "keep_alive: expected true or false, got {v:?}"
            )));
        }
    };
    Ok(StreamConfig {
        from,
        heartbeat: Duration::from_millis(heartbeat_ms),
        retry_ms,
        max_events,
        max_time,
        keep_alive,
        tx: parse_flag("tx", q.tx.as_deref())?.unwrap_or(config.transaction_markers),
        filter,
    })
}

pub(crate) async fn stream(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<StreamParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let parsed = q
        .map_err(ApiError::from)
        .and_then(|Query(q)| settings(&s, &headers, &q));
    let settings = match parsed {
        Ok(st) => st,
        Err(e) => {
            metrics::inc(&s.cf().core.metrics().http_bad_requests);
            return Err(e);
        }
    };
    let core = s.cf().core.clone();
    metrics::inc(&core.metrics().sse_connections);
    metrics::inc(&core.metrics().sse_open);
    if matches!(settings.filter, Reader::Tables(_)) {
        metrics::inc(&core.metrics().cursor_polls);
    }
    let now = Instant::now();
    let state = Sse {
        latest: core.watch_latest(),
        complete: core.watch_tx_complete(),
        open: Open(core.clone()),
        core,
        after: settings.from,
        last_write: now,
        // `max_seconds` beyond what a clock can add means no deadline.
        deadline: settings.max_time.and_then(|t| now.checked_add(t)),
        ending: Box::pin(s.ending()),
        sent: 0,
        first: Some(Bytes::from(format!("retry: {}\n\n", settings.retry_ms))),
        done: false,
        settings,
    };
    let body = Body::from_stream(stream::unfold(state, |mut st| async move {
        st.next_chunk()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), st))
    }));
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    // nginx and friends buffer responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Counts an open stream while it lives.
struct Open(std::sync::Arc<Core>);

impl Drop for Open {
    fn drop(&mut self) {
        metrics::dec(&self.0.metrics().sse_open);
    }
}

struct Sse {
    core: std::sync::Arc<Core>,
    settings: StreamConfig,
    latest: watch::Receiver<u64>,
    /// The source's "complete through" position, for transaction markers.
    complete: watch::Receiver<u64>,
    after: u64,
    last_write: Instant,
    deadline: Option<Instant>,
    ending: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    sent: usize,
    first: Option<Bytes>,
    done: bool,
    #[allow(dead_code)]
    open: Open,
}

impl Sse {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.done {
            return None;
        }
        loop {
            let front = self.core.truncated();
            if let Reader::Tables(cursors) = &mut self.settings.filter {
                // Moved up to where this stream has read: a gap concerns only tables whose
                // events it had not yet read.
                cursors.advance(self.after);
                let gaps = cursors.gaps(front);
                if !gaps.is_empty() {
                    metrics::add(&self.core.metrics().cursor_gaps, gaps.len() as u64);
                    let mut frames = Vec::new();
                    for (table, after) in gaps {
                        let _ = write!(
                            frames,
                            "event: gap\ndata: {{\"after\":{after},\"before\":{front},\"table\":"
                        );
                        record::json_str(table, &mut frames);
                        frames.extend_from_slice(b"}\n\n");
                    }
                    cursors.advance(front - 1);
                    self.after = self.after.max(cursors.start());
                    self.last_write = Instant::now();
                    return Some(Bytes::from(frames));
                }
            }
            if self.after + 1 < front {
                let gap = format!(
                    "event: gap\ndata: {{\"after\":{},\"before\":{front}}}\n\n",
                    self.after
                );
                self.after = front - 1;
                self.last_write = Instant::now();
                return Some(Bytes::from(gap));
            }
            let limit = if self.settings.keep_alive {
                self.settings.max_events
            } else {
                self.settings.max_events.min(ONE_SHOT_LIMIT - self.sent)
            };
            if self.settings.tx {
                match self.tx_step(limit).await {
                    Step::Chunk(c) => return Some(c),
                    Step::End => return None,
                    Step::Again => continue,
                }
            }
            // Allocated at the first event: an idle stream holds no buffer.
            let mut buf = Vec::new();
            let mut n = 0;
            let read = self.core.read_json(
                self.after,
                limit,
                MAX_SCAN,
                &self.settings.filter,
                |seq, r| {
                    if buf.is_empty() {
                        buf.reserve(16 * 1024);
                    }
                    buf.extend_from_slice(b"id: ");
                    self.settings.filter.write_id(seq, &mut buf);
                    buf.extend_from_slice(b"\ndata: ");
                    r.write_json(seq, &mut buf);
                    buf.extend_from_slice(b"\n\n");
                    n += 1;
                },
            );
            // A store failure ends the stream; the client reconnects and resumes.
            self.after = read.ok()?;
            if n > 0 {
                self.sent += n;
                metrics::add(&self.core.metrics().sse_events, n as u64);
                self.last_write = Instant::now();
                if !self.settings.keep_alive
                    && (self.sent >= ONE_SHOT_LIMIT || self.after >= self.core.latest())
                {
                    self.done = true;
                }
                return Some(Bytes::from(buf));
            }
            if self.after < self.core.latest() {
                // Events the filter skipped remain: scan on, letting other tasks run.
                tokio::task::yield_now().await;
                continue;
            }
            if !self.settings.keep_alive {
                self.done = true;
                return (self.sent == 0).then(|| Bytes::from_static(b": heartbeat\n\n"));
            }
            let heartbeat_at = self.last_write + self.settings.heartbeat;
            let after = self.after;
            tokio::select! {
                () = crate::shared::newer_than(&mut self.latest, after) => {}
                () = tokio::time::sleep_until(heartbeat_at) => {
                    self.last_write = Instant::now();
                    metrics::inc(&self.core.metrics().sse_heartbeats);
                    return Some(Bytes::from_static(b": heartbeat\n\n"));
                }
                () = sleep_until_opt(self.deadline) => return None,
                () = &mut self.ending => return None,
            }
        }
    }
}

/// What one step of a stream with transaction markers gives.
enum Step {
    Chunk(Bytes),
    End,
    Again,
}

impl Sse {
    /// One read with transaction markers: a chunk of frames, or a wait (for events, or
    /// for the end of a transaction held back) and another try, or the end.
    async fn tx_step(&mut self, limit: usize) -> Step {
        // Read before the events: the value never covers events not yet visible.
        let through = *self.complete.borrow_and_update();
        self.latest.borrow_and_update();
        let mut buf = Vec::new();
        let Ok(read) = with_markers(
            &self.core,
            self.after,
            limit,
            through,
            &self.settings.filter,
            &mut buf,
            Framing::Sse,
        ) else {
            // A store failure ends the stream; the client reconnects and resumes.
            return Step::End;
        };
        self.after = read.next;
        if read.entries > 0 {
            self.sent += read.events;
            metrics::add(&self.core.metrics().sse_events, read.events as u64);
            metrics::add(&self.core.metrics().tx_markers, read.markers as u64);
            self.last_write = Instant::now();
            if !self.settings.keep_alive && (self.sent >= ONE_SHOT_LIMIT || read.at_end) {
                self.done = true;
            }
            return Step::Chunk(Bytes::from(buf));
        }
        if !read.at_end {
            tokio::task::yield_now().await;
            return Step::Again;
        }
        if !self.settings.keep_alive {
            self.done = true;
            return match self.sent {
                0 => Step::Chunk(Bytes::from_static(b": heartbeat\n\n")),
                _ => Step::End,
            };
        }
        let heartbeat_at = self.last_write + self.settings.heartbeat;
        tokio::select! {
            r = self.latest.changed() => if r.is_err() { return Step::End },
            r = self.complete.changed() => if r.is_err() { return Step::End },
            () = tokio::time::sleep_until(heartbeat_at) => {
                self.last_write = Instant::now();
                metrics::inc(&self.core.metrics().sse_heartbeats);
                return Step::Chunk(Bytes::from_static(b": heartbeat\n\n"));
            }
            () = sleep_until_opt(self.deadline) => return Step::End,
            () = &mut self.ending => return Step::End,
        }
        Step::Again
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
