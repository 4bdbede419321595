//! Shared test support: row events, an in-process server that can restart on the same
//! port, a small HTTP client and a Server-Sent Events reader.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use freshen::{Op, Row, RowEvent, Tx, Value};
use freshen_changefeed::{AppState, Changefeed, ChangefeedConfig, Error, app, serve};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A deadline for conditions polled in tests: generous, since CI shares 2 cores.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn config(dir: &Path) -> ChangefeedConfig {
    ChangefeedConfig::new(dir.join("feed.redb"))
}

/// An INSERT into `public.orders` with primary key `id`, at source position
/// (`commit`, `index`).
pub fn order(id: i64, commit: u64, index: u32) -> RowEvent {
    RowEvent::new("public", "orders", Op::Insert)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::Int(id)),
            ("note", Value::text(format!("order {id}"))),
        ]))
        .with_tx(Tx {
            id: 1000 + commit,
            commit,
            index,
        })
}

/// An event without a source position, of `table`.
pub fn plain(table: &str, id: i64, op: Op) -> RowEvent {
    let row = Row::from_pairs([("id", Value::Int(id))]);
    let e = RowEvent::new("public", table, op).with_pk(["id"]);
    if op == Op::Delete {
        e.with_old(row)
    } else {
        e.with_new(row)
    }
}

/// `n` orders with ids `first..first+n`, one transaction each, commits after `first`.
pub fn orders(first: i64, n: i64) -> Vec<RowEvent> {
    (first..first + n)
        .map(|i| order(i, 100 + i as u64, 0))
        .collect()
}

pub async fn open(config: &ChangefeedConfig) -> Changefeed {
    // A restarted server's previous handle may still be dropping on another thread:
    // wait (bounded) for the store file's lock rather than fail at once.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match Changefeed::open(config).await {
            Ok(cf) => return cf,
            Err(Error::Open {
                source: redb::DatabaseError::DatabaseAlreadyOpen,
                ..
            }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("opening the changefeed: {e}"),
        }
    }
}

/// A changefeed and its HTTP server on a loopback port.
pub struct Server {
    pub addr: SocketAddr,
    pub cf: Changefeed,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    pub async fn start(config: &ChangefeedConfig) -> Server {
        Server::start_at(config, "127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_at(config: &ChangefeedConfig, addr: SocketAddr) -> Server {
        Server::start_redacted(config, addr, freshen_codec::Redactor::default()).await
    }

    /// A server whose changefeed applies `redactor`.
    pub async fn start_redacted(
        config: &ChangefeedConfig,
        addr: SocketAddr,
        redactor: freshen_codec::Redactor,
    ) -> Server {
        let cf = open(config).await.with_redactor(redactor);
        let state = AppState::new(cf.clone(), &config.http).expect("valid HTTP settings");
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            serve(listener, state, async {
                let _ = stopped.await;
            })
            .await
            .expect("server runs");
        });
        Server {
            addr,
            cf,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server (streams end), closes the changefeed.
    pub async fn stop(mut self) -> SocketAddr {
        self.shutdown().await;
        self.addr
    }

    async fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(PATIENCE, t)
                .await
                .expect("the server stops within the deadline")
                .expect("server task");
        }
        self.cf.close().await;
    }

    /// Stops, then starts again on the same port with the same store.
    pub async fn restart(self, config: &ChangefeedConfig) -> Server {
        let addr = self.stop().await;
        Server::start_at(config, addr).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }
}

/// Binds `addr`, retrying briefly while a just-closed listener still holds it.
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("binding {addr}: {e}"),
        }
    }
}

/// The in-process router, for tests that need no socket.
pub fn router(cf: &Changefeed, config: &ChangefeedConfig) -> axum::Router {
    app(AppState::new(cf.clone(), &config.http).expect("valid HTTP settings"))
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> (StatusCode, String) {
    try_send(method, url, headers, body).await.expect("request")
}

/// A request that may fail to connect (a server restarting).
pub async fn try_send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Result<(StatusCode, String), String> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = match body {
        Some(j) => {
            req = req.header("content-type", "application/json");
            Full::new(Bytes::from(j.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let resp = client()
        .request(req.body(body).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

pub async fn get(url: &str) -> (StatusCode, String) {
    send(Method::GET, url, &[], None).await
}

/// GET that must succeed, as JSON.
pub async fn get_json(url: &str) -> serde_json::Value {
    let (status, body) = get(url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

pub async fn post(url: &str, body: serde_json::Value) -> (StatusCode, serde_json::Value) {
    let (status, text) = send(Method::POST, url, &[], Some(body)).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub async fn delete(url: &str) -> (StatusCode, serde_json::Value) {
    let (status, text) = send(Method::DELETE, url, &[], None).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// Sequences of the events in a `{"events": [...]}` response.
pub fn sequences(page: &serde_json::Value) -> Vec<u64> {
    page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect()
}

/// One item of a Server-Sent Events stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sse {
    Retry(u64),
    Comment(String),
    Event {
        id: Option<u64>,
        data: String,
    },
    /// An event whose `id` is not a sequence (a per-table cursor list).
    Listed {
        id: String,
        data: String,
    },
    /// An event with an `event:` name (`gap`).
    Named {
        event: String,
        data: String,
    },
}

/// Reads a Server-Sent Events response as it arrives.
pub struct SseReader {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    body: Incoming,
    buf: String,
}

impl SseReader {
    pub async fn open(url: &str, headers: &[(&str, &str)]) -> SseReader {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(url)
            .header("accept", "text/event-stream");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = client()
            .request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .expect("request");
        let status = resp.status();
        let headers = resp.headers().clone();
        SseReader {
            status,
            headers,
            body: resp.into_body(),
            buf: String::new(),
        }
    }

    /// The next item, or `None` when the stream ended; panics when nothing comes
    /// within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Sse> {
        match self.try_next(wait).await {
            Ok(item) => item,
            Err(()) => panic!("nothing on the stream within {wait:?}"),
        }
    }

    /// The next item (`Ok(None)`: the stream ended), or `Err` when nothing came in
    /// `wait`.
    pub async fn try_next(&mut self, wait: Duration) -> Result<Option<Sse>, ()> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Ok(Some(parse_block(block.trim_end_matches('\n'))));
            }
            match tokio::time::timeout(wait, self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                Ok(Some(Err(_)) | None) => return Ok(None),
                Err(_) => return Err(()),
            }
        }
    }

    /// The next named event (skipping everything else), within `wait`.
    pub async fn next_named(&mut self, wait: Duration) -> Option<(String, serde_json::Value)> {
        loop {
            if let Sse::Named { event, data } = self.next(wait).await? {
                return Some((event, serde_json::from_str(&data).expect("event JSON")));
            }
        }
    }

    /// The next event (skipping comments and `retry:`), within `wait`.
    pub async fn next_event(&mut self, wait: Duration) -> Option<(u64, serde_json::Value)> {
        loop {
            match self.next(wait).await? {
                Sse::Event { id, data } => {
                    let json: serde_json::Value = serde_json::from_str(&data).expect("event JSON");
                    return Some((id.expect("every event has an id"), json));
                }
                _ => continue,
            }
        }
    }
}

fn parse_block(block: &str) -> Sse {
    if let Some(c) = block.strip_prefix(':') {
        return Sse::Comment(c.trim().to_owned());
    }
    if let Some(r) = block.strip_prefix("retry:") {
        return Sse::Retry(r.trim().parse().expect("retry is a number"));
    }
    let mut id = None;
    let mut listed = None;
    let mut data = String::new();
    let mut event = None;
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("id:") {
            match v.trim().parse() {
                Ok(seq) => id = Some(seq),
                Err(_) => listed = Some(v.trim().to_owned()),
            }
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    match (event, listed) {
        (Some(event), _) => Sse::Named { event, data },
        (None, Some(id)) => Sse::Listed { id, data },
        (None, None) => Sse::Event { id, data },
    }
}

/// Applies the whole log by key, as an event-sourcing client does: a PUT sets the
/// key's row (its `value`), a DELETE removes the key, a TRUNCATE every key of its
/// table. Returns the rows by key, and the events read.
pub fn replay_by_key(
    cf: &Changefeed,
) -> (
    std::collections::BTreeMap<String, serde_json::Value>,
    Vec<serde_json::Value>,
) {
    let mut state = std::collections::BTreeMap::new();
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = cf
            .read(after, 1000, &freshen_changefeed::Filter::default())
            .unwrap();
        let Some(last) = page.last() else {
            return (state, events);
        };
        after = last.sequence;
        for e in page {
            let j: serde_json::Value = serde_json::from_str(&e.json).unwrap();
            let key = j["key"].as_str().unwrap().to_owned();
            match (j["type"].as_str().unwrap(), j["op"].as_str().unwrap()) {
                ("PUT", _) => {
                    let row = serde_json::from_str(j["value"].as_str().unwrap()).unwrap();
                    state.insert(key, row);
                }
                ("DELETE", "truncate") => state.retain(|k: &String, _| !k.starts_with(&key)),
                ("DELETE", _) => {
                    state.remove(&key);
                }
                other => panic!("unexpected event type {other:?}"),
            }
            events.push(j);
        }
    }
}

/// A client of `pg`, its connection driven on a task of its own.
pub async fn sql(pg: &freshen_testenv::PgServer) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The PostgreSQL source of `pg` on slot and publication `name` (both created when
/// missing), capturing `tables`, confirming every 100 ms; `tune` changes the rest.
pub async fn pg_source(
    pg: &freshen_testenv::PgServer,
    name: &str,
    tables: &[&str],
    tune: impl FnOnce(&mut freshen_postgres::PgSourceConfig),
) -> freshen_postgres::PgSource {
    use freshen_postgres::{ConnectionConfig, PgSourceConfig, PublicationMode, SlotMode};
    let mut config = PgSourceConfig {
        connection: ConnectionConfig::from_url(&pg.url()).unwrap(),
        slot: name.into(),
        slot_mode: SlotMode::CreateIfMissing,
        publication: name.into(),
        publication_mode: PublicationMode::CreateIfMissing,
        tables: tables.iter().map(|t| t.parse().unwrap()).collect(),
        status_interval: Duration::from_millis(100),
        ..PgSourceConfig::default()
    };
    tune(&mut config);
    freshen_postgres::PgSource::start(config)
        .await
        .expect("the PostgreSQL source")
}

/// Runs `cf`'s capture of `source` on a task until the sender is used (or dropped).
pub fn capture_until_stopped(
    cf: &Changefeed,
    source: freshen_postgres::PgSource,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = cf.clone();
    let task = tokio::spawn(async move {
        runner
            .capture(source, async {
                let _ = stopped.await;
            })
            .await
            .expect("capture runs");
    });
    (stop, task)
}

/// PostgreSQL's chunk reader over `pool`, as the source's plug hands it to snapshots.
pub fn reader(pool: freshen_postgres::Pool) -> std::sync::Arc<dyn freshen::plug::ChunkReader> {
    std::sync::Arc::new(freshen_postgres::PgChunkReader::new(pool))
}

/// A table as snapshots name it: `(schema, table)`.
pub fn pair(t: &freshen_postgres::TableName) -> (String, String) {
    (t.schema.clone(), t.name.clone())
}
