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
//! subscriptions); `{"action":"error","message":…}` for a bad frame.
//!
//! Each subscription has a bounded window of events sent but not acknowledged: when it
//! is full, delivery pauses until acks arrive. Unacknowledged events are sent again
//! after the ack timeout (group subscriptions rely on the group's lease timeout).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
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
    sent: Instant,
    frame: String,
}

struct Sub {
    filter: Filter,
    cursor: u64,
    pending: VecDeque<Pending>,
    /// (group, consumer) for a consumer-group subscription.
    group: Option<(String, String)>,
    full: bool,
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
fn frame_of(json: &[u8], sub_id: &str) -> String {
    let mut out = String::with_capacity(json.len() + sub_id.len() + 12);
    let body = std::str::from_utf8(json).unwrap_or("{}");
    out.push_str(body.strip_suffix('}').unwrap_or(body));
    out.push_str(",\"sub_id\":");
    out.push_str(&serde_json::Value::String(sub_id.to_owned()).to_string());
    out.push('}');
    out
}

struct Conn {
    s: AppState,
    subs: BTreeMap<String, Sub>,
    window: usize,
    ack_timeout: Duration,
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
        while sub.pending.front().is_some_and(|p| p.seq <= seq) {
            sub.pending.pop_front();
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

    /// Frames to send now: new events within each window, and redeliveries.
    async fn outgoing(&mut self) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        let core = self.s.cf().core.clone();
        let now = Instant::now();
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
                    .is_some_and(|p| now.duration_since(p.sent) >= lease)
                {
                    sub.pending.pop_front();
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
                for d in got.deliveries {
                    let frame = frame_of(&d.json, id);
                    sub.pending.push_back(Pending {
                        seq: d.sequence,
                        sent: now,
                        frame: frame.clone(),
                    });
                    out.push(frame);
                }
                continue;
            }
            if sub
                .pending
                .front()
                .is_some_and(|p| now.duration_since(p.sent) >= self.ack_timeout)
            {
                for p in &mut sub.pending {
                    p.sent = now;
                    out.push(p.frame.clone());
                }
                metrics::add(&core.metrics().ws_redelivered, sub.pending.len() as u64);
            }
            let room = self.window.saturating_sub(sub.pending.len());
            if room == 0 {
                if !sub.full {
                    sub.full = true;
                    metrics::inc(&core.metrics().ws_window_full);
                }
                continue;
            }
            let mut fresh = Vec::new();
            sub.cursor = core.read_json(
                sub.cursor,
                room,
                MAX_SCAN,
                &sub.filter,
                |seq, r: &RecordRef<'_>| {
                    let mut json = Vec::with_capacity(r.body.len() + 24);
                    r.write_json(seq, &mut json);
                    fresh.push((seq, frame_of(&json, id)));
                },
            )?;
            for (seq, frame) in fresh {
                sub.pending.push_back(Pending {
                    seq,
                    sent: now,
                    frame: frame.clone(),
                });
                out.push(frame);
            }
        }
        metrics::add(&core.metrics().ws_events, out.len() as u64);
        Ok(out)
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
                if let Some(p) = sub.pending.front()
                    && let Ok(i) = self.s.cf().groups.info(group)
                {
                    at(p.sent + Duration::from_millis(i.spec.visibility_timeout_ms));
                }
            } else {
                if let Some(p) = sub.pending.front() {
                    at(p.sent + self.ack_timeout);
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
    };
    'conn: loop {
        match conn.outgoing().await {
            Ok(frames) => {
                for f in frames {
                    if socket.send(Message::Text(f.into())).await.is_err() {
                        break 'conn;
                    }
                }
            }
            Err(e) => {
                let _ = socket.send(error_frame(e)).await;
                break;
            }
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
