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
//! - `{"action":"unsubscribe","id":"s1"}` → `{"action":"unsubscribed","id":"s1"}`.
//! - `{"action":"ack","id":"s1","sequence":N}` (or `group_id` instead of `id`):
//!   everything sent on the subscription up to N is done; no reply.
//!
//! Server frames: each event's JSON with `"sub_id"` (and `"deliveries"` for group
//! subscriptions); `{"action":"error","message":…}` for a bad frame;
//! `{"action":"gap","id":"s1","after":a,"before":b}` when events after the
//! subscription's position were deleted before it received them (every sequence
//! between a and b).
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
//! leased before has been written.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use serde::Deserialize;
use tokio::time::Instant;

use super::{AppState, MAX_SCAN};
use crate::metrics;
use crate::record::{self, RecordRef};
use crate::{Error, Filter};

const MAX_SUBSCRIPTIONS: usize = 64;
const MAX_FRAME: usize = 64 * 1024;

pub(crate) async fn upgrade(State(s): State<AppState>, ws: WebSocketUpgrade) -> Response {
    ws.max_message_size(MAX_FRAME)
        .on_upgrade(move |socket| run(socket, s))
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
}

struct Pending {
    seq: u64,
    /// When the frame was last written to the socket; `None` while it waits to be.
    sent: Option<Instant>,
    frame: Utf8Bytes,
}

struct Sub {
    filter: Filter,
    cursor: u64,
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
}

fn gap_frame(id: &str, after: u64, before: u64) -> Utf8Bytes {
    serde_json::json!({"action": "gap", "id": id, "after": after, "before": before})
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

/// The event's JSON with `"sub_id"` added before the closing brace.
fn frame_of(json: &[u8], sub_id: &str) -> Utf8Bytes {
    let mut out = String::with_capacity(json.len() + sub_id.len() + 12);
    let body = std::str::from_utf8(json).unwrap_or("{}");
    out.push_str(body.strip_suffix('}').unwrap_or(body));
    out.push_str(",\"sub_id\":");
    out.push_str(&serde_json::Value::String(sub_id.to_owned()).to_string());
    out.push('}');
    out.into()
}

struct Conn {
    s: AppState,
    subs: BTreeMap<String, Sub>,
    window: usize,
    ack_timeout: Duration,
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
        let cursor = match (f.from_seq, f.from_sequence) {
            (Some(s), _) => s,
            (None, Some(s)) => s.saturating_sub(1),
            (None, None) => 0,
        };
        self.subs.insert(
            id.clone(),
            Sub {
                filter,
                cursor,
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
        if sub.pending.len() < self.window {
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

    /// Queues what is due: new events within each window, and redeliveries. Frames
    /// are written (and their timers started) by [`Conn::write`].
    async fn pull(&mut self) -> Result<(), Error> {
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
                        frame: frame_of(&d.json, id),
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
                metrics::add(&core.metrics().ws_redelivered, sub.pending.len() as u64);
            }
            if sub.cursor + 1 < front {
                self.control.push(gap_frame(id, sub.cursor, front));
                sub.cursor = front - 1;
            }
            let room = self.window.saturating_sub(sub.pending.len());
            if room == 0 {
                if !sub.full {
                    sub.full = true;
                    metrics::inc(&core.metrics().ws_window_full);
                }
                continue;
            }
            let pending = &mut sub.pending;
            sub.cursor = core.read_json(
                sub.cursor,
                room,
                MAX_SCAN,
                &sub.filter,
                |seq, r: &RecordRef<'_>| {
                    let mut json = Vec::with_capacity(r.body.len() + 24);
                    r.write_json(seq, &mut json);
                    pending.push_back(Pending {
                        seq,
                        sent: None,
                        frame: frame_of(&json, id),
                    });
                },
            )?;
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
        let mut n = 0;
        for sub in self.subs.values_mut() {
            for p in sub.pending.iter_mut().filter(|p| p.sent.is_none()) {
                if socket.send(Message::Text(p.frame.clone())).await.is_err() {
                    return false;
                }
                p.sent = Some(Instant::now());
                n += 1;
            }
        }
        metrics::add(&self.s.cf().core.metrics().ws_events, n);
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
                if sub.cursor < latest && sub.pending.len() < self.window {
                    at(now);
                }
            }
        }
        wake
    }
}

async fn run(mut socket: WebSocket, s: AppState) {
    let core = s.cf().core.clone();
    metrics::inc(&core.metrics().ws_connections);
    metrics::inc(&core.metrics().ws_open);
    let mut latest = core.watch_latest();
    let ending = s.ending();
    tokio::pin!(ending);
    let mut conn = Conn {
        window: s.config().ws_pending_window,
        ack_timeout: Duration::from_millis(s.config().ws_ack_timeout_ms),
        s,
        subs: BTreeMap::new(),
        control: Vec::new(),
    };
    loop {
        if let Err(e) = conn.pull().await {
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
            () = crate::log::newer_than(&mut latest, seen) => {}
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
