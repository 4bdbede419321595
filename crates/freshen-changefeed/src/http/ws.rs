//! `GET /v2/cdc/stream`: WebSocket subscriptions, ThemisDB's protocol.
//!
//! Client frames (JSON text):
//! - `{"action":"subscribe","id":"s1","table":"orders"|"collection":"orders",
//!   "key_prefix":"…","event_types":["PUT"],"from_seq":N,"group_id":"g","consumer_id":"c"}`
//!   → `{"action":"subscribed","id":"s1"}`. `from_seq` is exclusive; ThemisDB's
//!   `from_sequence` (inclusive) is accepted too; without either, delivery starts at the
//!   oldest event. `collection` is the key prefix `collection:`. With `group_id` the
//!   subscription is a consumer of that group (the id defaults to `group:consumer`): the
//!   group's cursor and filter apply, and `from_seq` and the filters are ignored.
//! - `"cursors":"orders:120,items:95"` instead of `from_seq` and `table`: the named
//!   tables, each past its own cursor ([`crate::cursors`], as `?cursors=` on the long
//!   poll); each event frame then carries `"cursors"`, the list to subscribe with again
//!   to resume after it.
//! - `"tx":true` (default: the upgrade request's `?tx=1`, else the listener's
//!   `transaction_markers`): a `TRANSACTION_COMMIT` frame after the last event of each
//!   source transaction, the long poll's marker with `"sub_id"` ([`crate::txmark`]).
//!   Group subscriptions get none: a group splits transactions among its consumers.
//! - `{"action":"unsubscribe","id":"s1"}` → `{"action":"unsubscribed","id":"s1"}`.
//! - `{"action":"ack","id":"s1","sequence":N}` (or `group_id` instead of `id`):
//!   everything sent on the subscription up to N is done; no reply.
//!
//! Server frames: each event's JSON with `"sub_id"` (and `"deliveries"` for group
//! subscriptions); `{"action":"error","message":…}` for a bad frame;
//! `{"action":"gap","id":"s1","after":a,"before":b}` when events after the
//! subscription's position were deleted before it received them (every sequence
//! between a and b), with `"table"` for a per-table cursor.
//!
//! Flow control: each subscription has a bounded window of events queued or sent but
//! not acknowledged; when it is full, delivery pauses until acks arrive, and frames are
//! written one after another as the socket takes them, so a slow reader slows delivery
//! down instead of piling frames up. A frame's ack timer starts when it has been
//! written to the socket, not when it was queued. Unacknowledged events are sent again
//! (from the oldest, go-back-N) only when the client has acknowledged nothing for the
//! ack timeout since the oldest of them was written: a reader that is slow but keeps
//! acknowledging is never sent duplicates. Group subscriptions rely on the group's lease
//! timeout instead; a group subscription leases new events only once everything it
//! leased before has been written. Markers do not count in the window; a marker's
//! `sequence` is its transaction's last event's, so an ack of that sequence (or a later
//! one) acknowledges it with the events before it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use serde::Deserialize;
use tokio::time::Instant;

use super::error::{ApiError, parse_flag};
use super::{AppState, MAX_SCAN, with_markers};
use crate::cursors::{Cursors, Reader};
use crate::metrics;
use crate::record::{self, RecordRef};
use crate::txmark::Framing;
use crate::{Error, Filter};

const MAX_SUBSCRIPTIONS: usize = 64;
const MAX_FRAME: usize = 64 * 1024;

/// The upgrade request's query: `tx=1` turns transaction markers on for the
/// connection's subscriptions (each may still say `"tx":false`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct UpgradeParams {
    tx: Option<String>,
}

pub(crate) async fn upgrade(
    State(s): State<AppState>,
    q: Result<Query<UpgradeParams>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let tx = q
        .map_err(ApiError::from)
        .and_then(|Query(q)| parse_flag("tx", q.tx.as_deref()));
    let tx = match tx {
        Ok(tx) => tx.unwrap_or(s.config().transaction_markers),
        Err(e) => {
            metrics::inc(&s.cf().core.metrics().http_bad_requests);
            return Err(e);
        }
    };
    Ok(ws
        .max_message_size(MAX_FRAME)
        .on_upgrade(move |socket| run(socket, s, tx)))
}

#[derive(Debug, Deserialize)]
struct Frame {
    action: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    table: Option<String>,
    #[serde(default)]
    collection: Option<String>,
    #[serde(default)]
    key_prefix: Option<String>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default)]
    from_seq: Option<u64>,
    #[serde(default)]
    from_sequence: Option<u64>,
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    consumer_id: Option<String>,
    #[serde(default)]
    sequence: Option<u64>,
    /// Transaction markers for this subscription.
    #[serde(default)]
    tx: Option<bool>,
    /// `table:seq,…`: these tables, each after its own sequence.
    #[serde(default)]
    cursors: Option<String>,
}

struct Pending {
    seq: u64,
    /// When the frame was last written to the socket; `None` while it waits to be.
    sent: Option<Instant>,
    frame: Utf8Bytes,
    /// A transaction marker (not counted in the window).
    marker: bool,
}

struct Sub {
    reader: Reader,
    /// Transaction markers after each source transaction.
    tx: bool,
    /// Where the next read starts.
    cursor: u64,
    /// The last sequence the last read examined: the log has more to read when the
    /// latest sequence is past it.
    examined: u64,
    /// With markers: the latest sequence and the source's complete-through position
    /// when a read last reached the log's end, so that nothing is read again (and no
    /// held-back transaction scanned again) until one of them moves.
    idle: Option<(u64, u64)>,
    pending: VecDeque<Pending>,
    /// (group, consumer) for a consumer-group subscription.
    group: Option<(String, String)>,
    full: bool,
    /// When an ack last moved the window (or the subscription started).
    progress: Instant,
}

impl Sub {
    /// When the window is due to be sent again: the ack timeout after the later of the
    /// oldest frame's write and the last ack that made progress.
    fn redelivery_due(&self, ack_timeout: Duration) -> Option<Instant> {
        let sent = self.pending.front()?.sent?;
        Some(sent.max(self.progress) + ack_timeout)
    }

    fn has_unsent(&self) -> bool {
        self.pending.iter().any(|p| p.sent.is_none())
    }

    /// Events queued or sent but not acknowledged: what the window bounds.
    fn events_pending(&self) -> usize {
        self.pending.iter().filter(|p| !p.marker).count()
    }
}

fn gap_frame(id: &str, after: u64, before: u64) -> Utf8Bytes {
    serde_json::json!({"action": "gap", "id": id, "after": after, "before": before})
        .to_string()
        .into()
}

/// A per-table cursor older than retention: that table's gap.
fn table_gap_frame(id: &str, table: &str, after: u64, before: u64) -> Utf8Bytes {
    serde_json::json!({"action": "gap", "id": id, "after": after, "before": before, "table": table})
        .to_string()
        .into()
}

fn error_frame(message: impl std::fmt::Display) -> Message {
    Message::Text(
        serde_json::json!({"action": "error", "message": message.to_string()})
            .to_string()
            .into(),
    )
}

fn reply(action: &str, id: &str) -> Message {
    Message::Text(
        serde_json::json!({"action": action, "id": id})
            .to_string()
            .into(),
    )
}

/// The entry's JSON with `"sub_id"` added before the closing brace, and `"cursors"`
/// (the list to resume with after it) when the subscription reads per-table cursors.
fn frame_of(json: &[u8], sub_id: &str, resume: Option<&[u8]>) -> Utf8Bytes {
    let mut out = Vec::with_capacity(json.len() + sub_id.len() + 16);
    out.extend_from_slice(json.strip_suffix(b"}").unwrap_or(json));
    out.extend_from_slice(b",\"sub_id\":");
    record::json_str(sub_id, &mut out);
    if let Some(list) = resume {
        out.extend_from_slice(b",\"cursors\":");
        record::json_str(&String::from_utf8_lossy(list), &mut out);
    }
    out.push(b'}');
    // Our own JSON, UTF-8 throughout: the fallback never runs.
    String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        .into()
}

/// An event frame of `reader`'s subscription: per-table cursors add the list to resume
/// with after the event at `seq`.
fn event_frame(json: &[u8], sub_id: &str, reader: &Reader, seq: u64) -> Utf8Bytes {
    match reader {
        Reader::All(_) => frame_of(json, sub_id, None),
        Reader::Tables(c) => {
            let mut list = Vec::new();
            c.write_list(seq, &mut list);
            frame_of(json, sub_id, Some(&list))
        }
    }
}

struct Conn {
    s: AppState,
    subs: BTreeMap<String, Sub>,
    window: usize,
    ack_timeout: Duration,
    /// Transaction markers for subscriptions that do not say (`?tx=1` on the upgrade,
    /// or the listener's `transaction_markers`).
    tx: bool,
    /// Frames that are not events (gaps), written before the next events.
    control: Vec<Utf8Bytes>,
}

impl Conn {
    fn subscribe(&mut self, f: Frame) -> Result<Message, String> {
        let id = match (&f.id, &f.group_id) {
            (Some(id), _) if !id.is_empty() => id.clone(),
            (_, Some(g)) => format!("{g}:{}", f.consumer_id.as_deref().unwrap_or("")),
            _ => return Err("subscribe requires 'id' or 'group_id'".to_owned()),
        };
        if id.len() > 256 {
            return Err("subscription id: at most 256 characters".to_owned());
        }
        if !self.subs.contains_key(&id) && self.subs.len() >= MAX_SUBSCRIPTIONS {
            return Err(format!(
                "at most {MAX_SUBSCRIPTIONS} subscriptions per connection"
            ));
        }
        let mut filter = Filter::default();
        if let Some(c) = &f.collection {
            filter = filter.key_prefix(format!("{c}:"));
        }
        if let Some(p) = &f.key_prefix {
            filter = filter.key_prefix(p.clone());
        }
        if let Some(t) = &f.table {
            filter = filter.parse_tables(t);
        }
        for t in f.event_types.iter().flatten() {
            filter = filter.parse_ops(t)?;
        }
        if f.group_id.is_some() {
            // A group leases events one by one to competing consumers: one transaction's
            // events may go to several of them, and its position is the group's own.
            if f.tx == Some(true) {
                return Err(
                    "tx: a consumer group has no transaction markers: its consumers \
                     share each transaction's events; subscribe without group_id for markers"
                        .to_owned(),
                );
            }
            if f.cursors.is_some() {
                return Err(
                    "cursors: a consumer group keeps one committed position of its \
                     own; subscribe without group_id to read with per-table cursors"
                        .to_owned(),
                );
            }
        }
        let tx = f.group_id.is_none() && f.tx.unwrap_or(self.tx);
        let (reader, cursor) = match &f.cursors {
            None => {
                let cursor = match (f.from_seq, f.from_sequence) {
                    (Some(s), _) => s,
                    (None, Some(s)) => s.saturating_sub(1),
                    (None, None) => 0,
                };
                (Reader::All(filter), cursor)
            }
            Some(list) => {
                // Each table has its position in the list: another position, or a table
                // filter beside the tables named, would be ambiguous.
                let tables = f.table.as_deref().is_some_and(|t| !t.trim().is_empty());
                if f.from_seq.is_some() || f.from_sequence.is_some() || tables {
                    return Err(super::CURSORS_ALONE.to_owned());
                }
                let cursors = Cursors::parse(list, filter)?;
                metrics::inc(&self.s.cf().core.metrics().cursor_polls);
                let start = cursors.start();
                (Reader::Tables(cursors), start)
            }
        };
        let group = match &f.group_id {
            Some(g) => {
                self.s.cf().groups.info(g).map_err(|e| e.to_string())?;
                Some((
                    g.clone(),
                    f.consumer_id
                        .clone()
                        .filter(|c| !c.is_empty())
                        .unwrap_or_else(|| id.clone()),
                ))
            }
            None => None,
        };
        self.subs.insert(
            id.clone(),
            Sub {
                reader,
                tx,
                cursor,
                examined: cursor,
                idle: None,
                pending: VecDeque::new(),
                group,
                full: false,
                progress: Instant::now(),
            },
        );
        Ok(reply("subscribed", &id))
    }

    async fn ack(&mut self, f: Frame) -> Result<(), String> {
        let seq = f.sequence.ok_or("ack requires 'sequence'")?;
        let id = match (&f.id, &f.group_id) {
            (Some(id), _) if !id.is_empty() => id.clone(),
            (_, Some(g)) => self
                .subs
                .iter()
                .find(|(_, s)| s.group.as_ref().is_some_and(|(sg, _)| sg == g))
                .map(|(k, _)| k.clone())
                .ok_or_else(|| format!("no subscription of group {g:?}"))?,
            _ => return Err("ack requires 'id' or 'group_id'".to_owned()),
        };
        let Some(sub) = self.subs.get_mut(&id) else {
            return Err(format!("no subscription {id:?}"));
        };
        let before = sub.pending.len();
        while sub.pending.front().is_some_and(|p| p.seq <= seq) {
            sub.pending.pop_front();
        }
        if sub.pending.len() < before {
            sub.progress = Instant::now();
        }
        if sub.events_pending() < self.window {
            sub.full = false;
        }
        if let Some((group, consumer)) = &sub.group {
            self.s
                .cf()
                .groups
                .ack(group, &[], Some((consumer, seq)))
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn handle(&mut self, text: &str) -> Option<Message> {
        let f: Frame = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => return Some(error_frame(format!("invalid frame: {e}"))),
        };
        match f.action.as_deref() {
            Some("subscribe") => Some(self.subscribe(f).unwrap_or_else(error_frame)),
            Some("unsubscribe") => {
                let id = match (&f.id, &f.group_id) {
                    (Some(id), _) if !id.is_empty() => id.clone(),
                    (_, Some(g)) => format!("{g}:{}", f.consumer_id.as_deref().unwrap_or("")),
                    _ => return Some(error_frame("unsubscribe requires 'id' or 'group_id'")),
                };
                self.subs.remove(&id);
                Some(reply("unsubscribed", &id))
            }
            Some("ack") => self.ack(f).await.err().map(error_frame),
            Some(other) => Some(error_frame(format!("unknown action: {other}"))),
            None => Some(error_frame("missing 'action'")),
        }
    }

    /// Queues what is due: new events within each window (and their transactions'
    /// markers), and redeliveries. Frames are written (and their timers started) by
    /// [`Conn::write`]. `through`: the source's commit position through which
    /// transactions are complete, read before the events.
    async fn pull(&mut self, through: u64) -> Result<(), Error> {
        let core = self.s.cf().core.clone();
        let now = Instant::now();
        let front = core.truncated();
        for (id, sub) in &mut self.subs {
            if let Some((group, consumer)) = &sub.group {
                // Leases expired meanwhile are the group's to deliver again (perhaps to
                // another consumer): they leave this window.
                let lease = self
                    .s
                    .cf()
                    .groups
                    .info(group)
                    .map(|i| Duration::from_millis(i.spec.visibility_timeout_ms))?;
                while sub
                    .pending
                    .front()
                    .and_then(|p| p.sent)
                    .is_some_and(|sent| now.duration_since(sent) >= lease)
                {
                    sub.pending.pop_front();
                }
                // Leases run from the receive: take more only once all are written.
                if sub.has_unsent() {
                    continue;
                }
                let room = self.window.saturating_sub(sub.pending.len());
                if room == 0 {
                    if !sub.full {
                        sub.full = true;
                        metrics::inc(&core.metrics().ws_window_full);
                    }
                    continue;
                }
                let got = self
                    .s
                    .cf()
                    .groups
                    .receive(group, consumer, room, None)
                    .await?;
                if let Some(gap) = got.gap {
                    self.control.push(gap_frame(id, gap.after, gap.before));
                }
                for d in got.deliveries {
                    sub.pending.push_back(Pending {
                        seq: d.sequence,
                        sent: None,
                        frame: frame_of(&d.json, id, None),
                        marker: false,
                    });
                }
                continue;
            }
            if sub
                .redelivery_due(self.ack_timeout)
                .is_some_and(|due| now >= due)
            {
                // Nothing acknowledged for a whole timeout: go back to the oldest.
                for p in &mut sub.pending {
                    p.sent = None;
                }
                metrics::add(&core.metrics().ws_redelivered, sub.events_pending() as u64);
            }
            match &mut sub.reader {
                Reader::Tables(cursors) => {
                    // Moved up to where this subscription has read: a gap concerns only
                    // tables whose events it had not yet read.
                    cursors.advance(sub.cursor);
                    let gaps = cursors.gaps(front);
                    if !gaps.is_empty() {
                        metrics::add(&core.metrics().cursor_gaps, gaps.len() as u64);
                        for (table, after) in gaps {
                            self.control.push(table_gap_frame(id, table, after, front));
                        }
                        // Reported once: the deleted range is behind every cursor now.
                        cursors.advance(front - 1);
                        sub.cursor = sub.cursor.max(cursors.start());
                        sub.idle = None;
                    }
                }
                Reader::All(_) => {
                    if sub.cursor + 1 < front {
                        self.control.push(gap_frame(id, sub.cursor, front));
                        sub.cursor = front - 1;
                        sub.idle = None;
                    }
                }
            }
            let room = self.window.saturating_sub(sub.events_pending());
            if room == 0 {
                if !sub.full {
                    sub.full = true;
                    metrics::inc(&core.metrics().ws_window_full);
                }
                continue;
            }
            if sub.tx {
                let latest = core.latest();
                if sub.idle == Some((latest, through)) {
                    continue;
                }
                let mut buf = Vec::new();
                let read = with_markers(
                    &core,
                    sub.cursor,
                    room,
                    through,
                    &sub.reader,
                    &mut buf,
                    Framing::Frames,
                )?;
                let mut start = 0;
                for f in &read.frames {
                    let json = &buf[start..f.end];
                    start = f.end;
                    let frame = if f.marker {
                        frame_of(json, id, None)
                    } else {
                        event_frame(json, id, &sub.reader, f.seq)
                    };
                    sub.pending.push_back(Pending {
                        seq: f.seq,
                        sent: None,
                        frame,
                        marker: f.marker,
                    });
                }
                sub.cursor = read.next;
                // Read to the end: everything up to `latest` was examined, even where the
                // last records are holes (compaction).
                sub.examined = if read.at_end {
                    read.examined.max(latest)
                } else {
                    read.examined
                };
                sub.idle = read.at_end.then_some((latest, through));
                continue;
            }
            let (pending, reader) = (&mut sub.pending, &sub.reader);
            sub.cursor = core.read_json(
                sub.cursor,
                room,
                MAX_SCAN,
                reader,
                |seq, r: &RecordRef<'_>| {
                    let mut json = Vec::with_capacity(r.body.len() + 24);
                    r.write_json(seq, &mut json);
                    pending.push_back(Pending {
                        seq,
                        sent: None,
                        frame: event_frame(&json, id, reader, seq),
                        marker: false,
                    });
                },
            )?;
            sub.examined = sub.cursor;
        }
        Ok(())
    }

    /// Writes queued frames in order, each stamped once the socket has taken it.
    /// Returns false when the connection is gone.
    async fn write(&mut self, socket: &mut WebSocket) -> bool {
        for f in self.control.drain(..) {
            if socket.send(Message::Text(f)).await.is_err() {
                return false;
            }
        }
        let (mut events, mut markers) = (0, 0);
        let metrics = self.s.cf().core.metrics();
        for sub in self.subs.values_mut() {
            for p in sub.pending.iter_mut().filter(|p| p.sent.is_none()) {
                if socket.send(Message::Text(p.frame.clone())).await.is_err() {
                    metrics::add(&metrics.ws_events, events);
                    metrics::add(&metrics.tx_markers, markers);
                    return false;
                }
                p.sent = Some(Instant::now());
                if p.marker {
                    markers += 1;
                } else {
                    events += 1;
                }
            }
        }
        metrics::add(&metrics.ws_events, events);
        metrics::add(&metrics.tx_markers, markers);
        true
    }

    /// When something may become sendable without a new event: a redelivery, a
    /// group lease coming due, a filter scan left unfinished.
    fn next_wake(&self) -> Option<Instant> {
        let now = Instant::now();
        let latest = self.s.cf().core.latest();
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        for sub in self.subs.values() {
            if let Some((group, _)) = &sub.group {
                if let Some(due) = self.s.cf().groups.next_due_ms(group) {
                    let now_ms = record::unix_ms(SystemTime::now());
                    at(now + Duration::from_millis(due.saturating_sub(now_ms)));
                }
                if let Some(sent) = sub.pending.front().and_then(|p| p.sent)
                    && let Ok(i) = self.s.cf().groups.info(group)
                {
                    at(sent + Duration::from_millis(i.spec.visibility_timeout_ms));
                }
            } else {
                if let Some(due) = sub.redelivery_due(self.ack_timeout) {
                    at(due);
                }
                if sub.examined < latest && sub.events_pending() < self.window {
                    at(now);
                }
            }
        }
        wake
    }
}

async fn run(mut socket: WebSocket, s: AppState, tx: bool) {
    let core = s.cf().core.clone();
    metrics::inc(&core.metrics().ws_connections);
    metrics::inc(&core.metrics().ws_open);
    let mut latest = core.watch_latest();
    // The end of a held-back transaction wakes subscriptions with markers.
    let mut complete = core.watch_tx_complete();
    let mut complete_open = true;
    let ending = s.ending();
    tokio::pin!(ending);
    let mut conn = Conn {
        window: s.config().ws_pending_window,
        ack_timeout: Duration::from_millis(s.config().ws_ack_timeout_ms),
        s,
        tx,
        subs: BTreeMap::new(),
        control: Vec::new(),
    };
    loop {
        // Read before the events: the value never covers events not yet visible.
        let through = *complete.borrow_and_update();
        if let Err(e) = conn.pull(through).await {
            let _ = socket.send(error_frame(e)).await;
            break;
        }
        if !conn.write(&mut socket).await {
            break;
        }
        let wake = conn.next_wake();
        let seen = *latest.borrow_and_update();
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(t))) => {
                    if let Some(r) = conn.handle(t.as_str()).await
                        && socket.send(r).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    if socket.send(error_frame("frames must be JSON text")).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                // Pings are answered by the library; pongs need nothing.
                Some(Ok(_)) => {}
            },
            () = crate::shared::newer_than(&mut latest, seen) => {}
            r = complete.changed(), if complete_open => complete_open = r.is_ok(),
            () = sleep_until_opt(wake) => {}
            () = &mut ending => {
                let _ = socket.send(Message::Close(None)).await;
                break;
            }
        }
    }
    metrics::dec(&core.metrics().ws_open);
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(frame: &Utf8Bytes) -> serde_json::Value {
        serde_json::from_str(frame.as_str()).expect("a JSON frame")
    }

    #[test]
    fn frames_name_the_subscription_and_the_list_to_resume_with() {
        let json = br#"{"sequence":7,"key":"orders:1"}"#;
        assert_eq!(
            parsed(&frame_of(json, "s\"1", None)),
            json!({"sequence": 7, "key": "orders:1", "sub_id": "s\"1"})
        );
        let all = Reader::All(Filter::default());
        assert_eq!(
            parsed(&event_frame(json, "s", &all, 7)).get("cursors"),
            None
        );
        // Each cursor moves up to the event, unless it is ahead already.
        let tables = Reader::Tables(Cursors::parse("orders:9,items:3", Filter::default()).unwrap());
        assert_eq!(
            parsed(&event_frame(json, "s", &tables, 7))["cursors"],
            "orders:9,items:7"
        );
    }
}
