//! The binlog reader: its own thread and current-thread runtime, one replication
//! session at a time (reconnecting with backoff), row images decoded as they arrive and
//! handed to the source in bounded batches.
//!
//! Acknowledgement rule. A batch holding the commit of a transaction whose rows were
//! delivered carries an [`Ack`] for the position after that commit; acks arrive in batch
//! order, so the newest acked position is safe. When nothing is pending — no open
//! transaction, nothing gathered, every handed-out commit acked — the position after the
//! last transaction seen (filtered out, or the position table's own writes) is safe too,
//! so a source watching quiet tables still moves on. The store task persists the safe
//! position.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use freshen::{Ack, Batch, BoxError, Op, RowEvent, SourceError, Tx};
use futures_util::{FutureExt, StreamExt};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, GnoInterval, Opts, Sid};
use tokio::sync::{Notify, broadcast, mpsc, oneshot, watch};

use crate::binlog::{
    self, Charsets, DdlKind, MariaGtid, MySqlGtid, QueryEvent, Statement, TableMap, event_type,
};
use crate::config::TablePattern;
use crate::error::ErrorKind;
use crate::schema::{Broken, SchemaChange};
use crate::server::{self, ServerInfo};
use crate::store::Store;
use crate::{Checkpoint, FilePos, Gtids, MySqlError, MySqlSourceConfig};

/// How long a partly filled batch waits for more rows once the wire goes quiet.
const LINGER: Duration = Duration::from_millis(1);

/// A resume point, numbered in the order the reader saw it, with how many transactions
/// other than the position table's own writes lie behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) cp: Checkpoint,
    pub(crate) serial: u64,
    pub(crate) foreign: u64,
}

/// State shared by the reader, the store task, the source, its handles and the acks.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) running: AtomicBool,
    pub(crate) streaming: AtomicBool,
    pub(crate) events: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) schema_changes: AtomicU64,
    pub(crate) truncates: AtomicU64,
    pub(crate) queued_events: AtomicU64,
    pub(crate) peak_queued_events: AtomicU64,
    pub(crate) stores: AtomicU64,
    pub(crate) store_failures: AtomicU64,
    /// Server timestamp (seconds) of the newest event received.
    pub(crate) last_event_ts: AtomicU64,
    /// Whether the newest thing received was a heartbeat (caught up).
    pub(crate) caught_up: AtomicBool,
    pub(crate) last_error: Mutex<Option<String>>,
    pub(crate) received: Mutex<Option<FilePos>>,
    /// The server's binlog end, from its latest heartbeat.
    pub(crate) server_end: Mutex<Option<FilePos>>,
    /// Highest acknowledged commit batch: its sequence number and mark.
    acked: Mutex<(u64, Option<Arc<Mark>>)>,
    pub(crate) ack_notify: Notify,
    /// The position that is safe to resume from; the store task persists it.
    pub(crate) safe: Mutex<Option<Arc<Mark>>>,
    pub(crate) stored: Mutex<Option<Checkpoint>>,
    /// `(serial, foreign)` of the stored mark.
    stored_mark: Mutex<Option<(u64, u64)>>,
    pub(crate) store_notify: Notify,
}

impl Shared {
    pub(crate) fn set_error(&self, e: &dyn std::fmt::Display) {
        *lock(&self.last_error) = Some(e.to_string());
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the reader needs to run.
pub(crate) struct ReaderSetup {
    pub(crate) config: Arc<MySqlSourceConfig>,
    pub(crate) opts: Opts,
    pub(crate) info: ServerInfo,
    pub(crate) start: Checkpoint,
    pub(crate) by_gtid: bool,
    pub(crate) patterns: Vec<TablePattern>,
    pub(crate) store: Store,
    pub(crate) shared: Arc<Shared>,
    pub(crate) schema_tx: broadcast::Sender<SchemaChange>,
    pub(crate) tx: mpsc::Sender<Result<Batch, SourceError>>,
    pub(crate) stop: watch::Receiver<bool>,
}

/// Starts the reader thread.
pub(crate) fn spawn(
    setup: ReaderSetup,
    ready: oneshot::Sender<Result<(), MySqlError>>,
    done: oneshot::Sender<()>,
) -> Result<(), MySqlError> {
    std::thread::Builder::new()
        .name("freshen-mysql-binlog".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(MySqlError::new(
                        ErrorKind::Connection,
                        format!("cannot start the binlog reader's runtime: {e}"),
                    )));
                    return;
                }
            };
            let shared = Arc::clone(&setup.shared);
            shared.running.store(true, Ordering::SeqCst);
            let inner = Arc::clone(&shared);
            rt.block_on(async move {
                let shared = inner;
                let store = setup.store.clone();
                let interval = Duration::from_millis(setup.config.position_interval_ms);
                let task = tokio::spawn(store_loop(store.clone(), Arc::clone(&shared), interval));
                Reader::new(setup).run(ready).await;
                task.abort();
                let _ = task.await;
                // The last safe position, stored before the reader reports it ended.
                persist(&store, &shared).await;
            });
            shared.running.store(false, Ordering::SeqCst);
            shared.streaming.store(false, Ordering::SeqCst);
            let _ = done.send(());
        })
        .map_err(|e| {
            MySqlError::new(
                ErrorKind::Connection,
                format!("cannot start the binlog reader thread: {e}"),
            )
        })?;
    Ok(())
}

/// Persists the safe position every `interval` while the reader runs.
async fn store_loop(store: Store, shared: Arc<Shared>, interval: Duration) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.store_notify.notified() => {}
        }
        persist(&store, &shared).await;
        tokio::time::sleep(interval).await;
    }
}

/// Stores the safe position when it moved past a transaction other than the position
/// table's own writes (which the binlog carries too: storing after each of them would
/// write forever).
async fn persist(store: &Store, shared: &Shared) {
    let Some(m) = lock(&shared.safe).clone() else {
        return;
    };
    let moved = match *lock(&shared.stored_mark) {
        None => true,
        Some((serial, foreign)) => m.serial > serial && m.foreign > foreign,
    };
    if !moved {
        return;
    }
    match store.save(&m.cp).await {
        Ok(()) => {
            *lock(&shared.stored_mark) = Some((m.serial, m.foreign));
            shared.stores.fetch_add(1, Ordering::Relaxed);
            *lock(&shared.stored) = Some(m.cp.clone());
        }
        Err(e) => {
            shared.store_failures.fetch_add(1, Ordering::Relaxed);
            shared.set_error(&e);
            tracing::warn!(error = %e, "freshen-mysql: storing the resume position failed; retrying");
        }
    }
}

/// A table id's map, as far as this reader cares.
struct TableEntry {
    raw: Vec<u8>,
    /// `None`: not watched.
    map: Option<Arc<TableMap>>,
    /// The position table.
    is_self: bool,
}

/// How a session ended.
enum Ended {
    Stopped,
    ConsumerGone,
}

enum Wake {
    Stop,
    Acked,
    Quiet,
    Event(Option<Result<mysql_async::binlog::events::Event, mysql_async::Error>>),
    Panicked,
}

/// A failed session: the error, whether streaming had begun, whether it is final.
struct Failure {
    error: MySqlError,
    streamed: bool,
    fatal: bool,
}

impl Failure {
    fn retry(error: MySqlError, streamed: bool) -> Failure {
        let fatal = matches!(
            error.kind(),
            ErrorKind::Auth
                | ErrorKind::Setup
                | ErrorKind::Position
                | ErrorKind::Refused
                | ErrorKind::Config
        );
        Failure {
            error,
            streamed,
            fatal,
        }
    }
}

struct Reader {
    cfg: Arc<MySqlSourceConfig>,
    opts: Opts,
    info: ServerInfo,
    by_gtid: bool,
    patterns: Vec<TablePattern>,
    self_table: Option<(String, String)>,
    shared: Arc<Shared>,
    schema_tx: broadcast::Sender<SchemaChange>,
    tx: mpsc::Sender<Result<Batch, SourceError>>,
    stop: watch::Receiver<bool>,
    charsets: Charsets,
    // Position.
    resume: Arc<Mark>,
    serial: u64,
    foreign: u64,
    file: String,
    gtids: Option<Gtids>,
    // Session.
    tables: HashMap<u64, TableEntry>,
    fde_seen: bool,
    // Transaction.
    in_tx: bool,
    in_begin: bool,
    tx_token: u64,
    tx_index: u32,
    tx_self: bool,
    tx_other: bool,
    tx_delivered: bool,
    pending_maria: Option<MariaGtid>,
    pending_mysql: Option<MySqlGtid>,
    // Output.
    batch: Vec<RowEvent>,
    skipped: Vec<BoxError>,
    /// What DDL did to watched tables, for the refresher (see [`Broken`]).
    changes: Vec<freshen::SchemaChange>,
    broken: Broken,
    batch_commit: Option<Arc<Mark>>,
    handed_seq: u64,
    published: u64,
}

impl Reader {
    fn new(s: ReaderSetup) -> Reader {
        let self_table = s.store.table_name().cloned();
        let file = s.start.file_pos.file.clone();
        let gtids = if s.by_gtid {
            s.start.gtids.clone()
        } else {
            None
        };
        let resume = Arc::new(Mark {
            cp: s.start,
            serial: 0,
            foreign: 0,
        });
        Reader {
            cfg: s.config,
            opts: s.opts,
            info: s.info,
            by_gtid: s.by_gtid,
            patterns: s.patterns,
            self_table,
            shared: s.shared,
            schema_tx: s.schema_tx,
            tx: s.tx,
            stop: s.stop,
            charsets: Charsets::builtin(),
            resume,
            serial: 0,
            foreign: 0,
            file,
            gtids,
            tables: HashMap::new(),
            fde_seen: false,
            in_tx: false,
            in_begin: false,
            tx_token: 0,
            tx_index: 0,
            tx_self: false,
            tx_other: false,
            tx_delivered: false,
            pending_maria: None,
            pending_mysql: None,
            batch: Vec::new(),
            changes: Vec::new(),
            broken: Broken::default(),
            skipped: Vec::new(),
            batch_commit: None,
            handed_seq: 0,
            published: 0,
        }
    }

    async fn run(mut self, ready: oneshot::Sender<Result<(), MySqlError>>) {
        // The starting point is safe by definition: store it before anything else, so a
        // crash before the first acknowledgement resumes here and not at a later
        // "current" position.
        *lock(&self.shared.safe) = Some(Arc::clone(&self.resume));
        self.shared.store_notify.notify_one();
        let mut ready = Some(ready);
        let backoff = self.cfg.reconnect();
        let deadline = Duration::from_secs(self.cfg.reconnect_deadline_s);
        let mut attempt = 0u32;
        let mut failing_since: Option<Instant> = None;
        let mut jitter = freshen::Jitter::from_clock();
        loop {
            let result = self.session(&mut ready).await;
            self.shared.streaming.store(false, Ordering::SeqCst);
            match result {
                Ok(Ended::Stopped) | Ok(Ended::ConsumerGone) => break,
                Err(f) => {
                    self.shared.set_error(&f.error);
                    tracing::warn!(error = %f.error, "freshen-mysql: binlog session ended");
                    if f.fatal || ready.is_some() {
                        // Before the first session streams, the caller of start() hears it.
                        if let Some(r) = ready.take() {
                            let _ = r.send(Err(f.error));
                        } else {
                            let _ = self.tx.send(Err(SourceError::new(f.error))).await;
                        }
                        break;
                    }
                    if f.streamed {
                        attempt = 0;
                        failing_since = None;
                    }
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= deadline {
                        let e = MySqlError::new(
                            ErrorKind::Connection,
                            format!("reconnecting failed for {deadline:?}; giving up"),
                        )
                        .with_source(f.error);
                        let _ = self.tx.send(Err(SourceError::new(e))).await;
                        break;
                    }
                    self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    let delay = backoff.delay(attempt, jitter.unit());
                    attempt = attempt.saturating_add(1);
                    let stop = &mut self.stop;
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stopped(stop) => break,
                    }
                }
            }
        }
        self.advance();
    }

    fn session_vars(&self) -> Vec<(String, Option<String>)> {
        let period_ns = self.cfg.heartbeat_ms.saturating_mul(1_000_000);
        let mut v = vec![(format!("SET @master_heartbeat_period = {period_ns}"), None)];
        if self.info.mariadb {
            // GTID events (instead of anonymous ones) and the GTID list event.
            v.push(("SET @mariadb_slave_capability = 4".into(), None));
            if self.by_gtid {
                let state = self
                    .resume
                    .cp
                    .gtids
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                v.push(("SET @slave_connect_state = ?".into(), Some(state)));
                v.push(("SET @slave_gtid_strict_mode = 0".into(), None));
                v.push(("SET @slave_gtid_ignore_duplicates = 0".into(), None));
            }
        }
        v
    }

    async fn connect(&mut self) -> Result<BinlogStream, MySqlError> {
        let mut conn = server::connect(&self.opts, "the binlog").await?;
        let info = server::inspect(&mut conn).await?;
        let problems = info.blocking_problems();
        if !problems.is_empty() {
            return Err(MySqlError::setup(&problems));
        }
        self.charsets = server::charsets(&mut conn).await;
        self.info = info;
        for (sql, param) in self.session_vars() {
            let r = match param {
                Some(p) => conn.exec_drop(sql.as_str(), (p,)).await,
                None => conn.query_drop(sql.as_str()).await,
            };
            r.map_err(|e| {
                MySqlError::driver(format!("cannot prepare the binlog session ({sql})"), e)
            })?;
        }
        let server_id = self.cfg.effective_server_id();
        let cp = &self.resume.cp;
        let file = cp.file_pos.file.clone().into_bytes();
        let request = BinlogStreamRequest::new(server_id);
        let request = match (&cp.gtids, self.by_gtid) {
            (Some(Gtids::MySql(set)), true) => {
                let sids: Vec<Sid<'static>> = set
                    .intervals()
                    .map(|(uuid, iv)| {
                        Sid::new(*uuid).with_intervals(
                            iv.iter()
                                .map(|&(a, b)| GnoInterval::new(a, b + 1))
                                .collect(),
                        )
                    })
                    .collect();
                request.with_gtid().with_gtid_set(sids)
            }
            (_, true) if self.info.mariadb => request, // @slave_connect_state decides
            _ => request.with_filename(&file).with_pos(cp.file_pos.pos),
        };
        let stream = conn.get_binlog_stream(request).await.map_err(|e| {
            let e = MySqlError::driver("the server refused the binlog dump", e);
            match e.code() {
                Some(1045 | 1227) => MySqlError::new(
                    ErrorKind::Auth,
                    "the server refused the binlog dump: the user lacks the REPLICATION SLAVE \
                     grant (a SQL login works, so the password is right): GRANT REPLICATION \
                     SLAVE ON *.* TO the user",
                )
                .with_source(e),
                Some(1236) => MySqlError::new(
                    ErrorKind::Position,
                    format!(
                        "the server cannot send the binlog from {} (purged, or a GTID it does \
                         not have): changes since then are lost to this source; remove its \
                         stored position (or set `start`) and run a reconcile sweep",
                        self.resume.cp
                    ),
                )
                .with_source(e),
                _ => e,
            }
        })?;
        Ok(stream)
    }

    async fn session(
        &mut self,
        ready: &mut Option<oneshot::Sender<Result<(), MySqlError>>>,
    ) -> Result<Ended, Failure> {
        let timeout = Duration::from_secs(30);
        let mut stream = match tokio::time::timeout(timeout, self.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Failure::retry(e, false)),
            Err(_) => {
                return Err(Failure::retry(
                    MySqlError::new(ErrorKind::Connection, "connecting for the binlog timed out"),
                    false,
                ));
            }
        };
        self.reset_session();
        self.shared.streaming.store(true, Ordering::SeqCst);
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        let result = self.stream(&mut stream).await;
        // Whatever was gathered goes out (its commits are acknowledged as usual): the
        // next session resumes after the last transaction seen.
        if !matches!(result, Ok(Ended::ConsumerGone)) && self.has_output() {
            let _ = self.flush().await;
        }
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.close()).await;
        });
        result.map_err(|e| Failure::retry(e, true))
    }

    fn reset_session(&mut self) {
        self.tables.clear();
        self.fde_seen = false;
        self.end_tx();
        self.file = self.resume.cp.file_pos.file.clone();
    }

    fn end_tx(&mut self) {
        self.in_tx = false;
        self.in_begin = false;
        self.tx_index = 0;
        self.tx_self = false;
        self.tx_other = false;
        self.tx_delivered = false;
        self.pending_maria = None;
        self.pending_mysql = None;
    }

    async fn stream(&mut self, stream: &mut BinlogStream) -> Result<Ended, MySqlError> {
        loop {
            // mysql_common parses each event header before this crate sees it and can
            // panic on a malformed one; a panic ends the session instead of the thread.
            let next = AssertUnwindSafe(stream.next()).catch_unwind();
            let wake = match next.now_or_never() {
                Some(Ok(ev)) => Wake::Event(ev),
                Some(Err(_)) => Wake::Panicked,
                None => {
                    let linger = self.has_output();
                    let stop = &mut self.stop;
                    let acks = &self.shared.ack_notify;
                    tokio::select! {
                        biased;
                        _ = stopped(stop) => Wake::Stop,
                        _ = acks.notified() => Wake::Acked,
                        ev = AssertUnwindSafe(stream.next()).catch_unwind() => match ev {
                            Ok(ev) => Wake::Event(ev),
                            Err(_) => Wake::Panicked,
                        },
                        _ = tokio::time::sleep(LINGER), if linger => Wake::Quiet,
                    }
                }
            };
            match wake {
                Wake::Stop => return Ok(Ended::Stopped),
                Wake::Acked => self.advance(),
                Wake::Quiet => {
                    if self.flush().await? {
                        return Ok(Ended::ConsumerGone);
                    }
                }
                Wake::Panicked => {
                    return Err(MySqlError::new(
                        ErrorKind::Decode,
                        "a malformed binlog event broke the client's parser",
                    ));
                }
                Wake::Event(None) => {
                    return Err(MySqlError::new(
                        ErrorKind::Connection,
                        "the binlog stream ended",
                    ));
                }
                Wake::Event(Some(Err(e))) => {
                    return Err(MySqlError::driver("the binlog stream broke", e));
                }
                Wake::Event(Some(Ok(ev))) => {
                    if self.handle(&ev)? && self.flush().await? {
                        return Ok(Ended::ConsumerGone);
                    }
                    if self.batch.len() >= self.cfg.batch_size && self.flush().await? {
                        return Ok(Ended::ConsumerGone);
                    }
                }
            }
        }
    }

    fn has_output(&self) -> bool {
        !self.batch.is_empty()
            || !self.skipped.is_empty()
            || !self.changes.is_empty()
            || self.batch_commit.is_some()
    }

    fn watched(&self, db: &str, table: &str) -> bool {
        if self.is_self(db, table) {
            return false;
        }
        if self.patterns.is_empty() {
            return !matches!(
                db,
                "mysql" | "sys" | "performance_schema" | "information_schema"
            );
        }
        self.patterns.iter().any(|p| p.matches(db, table))
    }

    fn is_self(&self, db: &str, table: &str) -> bool {
        self.self_table
            .as_ref()
            .is_some_and(|(d, t)| d == db && t == table)
    }

    fn begin_tx(&mut self, start: u64) {
        if !self.in_tx {
            self.in_tx = true;
            self.tx_token = crate::FilePos::new(self.file.clone(), start)
                .token()
                .unwrap_or(start);
        }
    }

    fn skip(&mut self, what: String) {
        self.shared.skipped.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %what, "freshen-mysql: skipped a binlog event");
        self.skipped.push(what.into());
    }

    /// Handles one event; returns whether the batch must go out now (a commit of a
    /// transaction whose earlier rows already went out in full batches).
    fn handle(&mut self, ev: &mysql_async::binlog::events::Event) -> Result<bool, MySqlError> {
        let h = ev.header();
        let t = h.event_type_raw();
        let end = u64::from(h.log_pos());
        let start = end.saturating_sub(u64::from(h.event_size()));
        let data = ev.data();
        if end > 0 {
            *lock(&self.shared.received) = Some(FilePos::new(self.file.clone(), end));
        }
        if t != event_type::HEARTBEAT && t != event_type::HEARTBEAT_V2 && h.timestamp() > 0 {
            self.shared
                .last_event_ts
                .store(u64::from(h.timestamp()), Ordering::Relaxed);
            self.shared.caught_up.store(false, Ordering::Relaxed);
        }
        if let Some(why) = binlog::refused(t) {
            return Err(MySqlError::new(ErrorKind::Refused, why));
        }
        if let Some((kind, v2)) = binlog::rows_kind(t) {
            self.rows(kind, v2, data, h.timestamp());
            return Ok(false);
        }
        match t {
            event_type::ROTATE => {
                // The first rotate of a session comes before the format description, so
                // the client has not yet stripped its checksum from the name.
                let body = if !self.fde_seen && self.info.checksum.eq_ignore_ascii_case("CRC32") {
                    &data[..data.len().saturating_sub(4)]
                } else {
                    data
                };
                match binlog::decode_rotate(body) {
                    Ok((_, name)) => self.file = name,
                    Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
                }
            }
            event_type::FORMAT_DESCRIPTION => {
                self.fde_seen = true;
                // A new file: table ids restart.
                self.tables.clear();
            }
            event_type::MARIADB_GTID => match MariaGtid::decode(data, h.server_id()) {
                Ok(g) => {
                    self.begin_tx(start);
                    self.pending_maria = Some(g);
                }
                Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
            },
            event_type::MYSQL_GTID => match MySqlGtid::decode(data) {
                Ok(g) => {
                    self.begin_tx(start);
                    self.pending_mysql = Some(g);
                }
                Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
            },
            event_type::MYSQL_ANONYMOUS_GTID => self.begin_tx(start),
            event_type::TABLE_MAP => self.table_map(data),
            event_type::XID => return Ok(self.commit(end)),
            event_type::QUERY => return self.query(data, start, end, h.timestamp()),
            event_type::HEARTBEAT | event_type::HEARTBEAT_V2 => {
                *lock(&self.shared.server_end) = Some(FilePos::new(self.file.clone(), end));
                if !self.in_tx && !self.has_output() {
                    self.shared.caught_up.store(true, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        Ok(false)
    }

    fn table_map(&mut self, data: &[u8]) {
        let id = match binlog::rows_table_id(data) {
            Ok(id) => id,
            Err(e) => return self.skip(format!("table map: {e}")),
        };
        if let Some(entry) = self.tables.get(&id)
            && entry.raw == data
        {
            return;
        }
        match TableMap::decode(data, &self.charsets) {
            Ok(map) => {
                let is_self = self.is_self(&map.schema, &map.table);
                let watched = self.watched(&map.schema, &map.table);
                if watched && !map.has_names {
                    self.skip(format!(
                        "table map of {}.{} has no column names: set binlog_row_metadata=FULL",
                        map.schema, map.table
                    ));
                }
                self.tables.insert(
                    id,
                    TableEntry {
                        raw: data.to_vec(),
                        map: watched.then(|| Arc::new(map)),
                        is_self,
                    },
                );
            }
            Err(e) => {
                self.tables.remove(&id);
                self.skip(format!("table map: {e}"));
            }
        }
    }

    fn template(&self, map: &TableMap, ts: u32) -> RowEvent {
        let mut e = RowEvent::new(Arc::clone(&map.schema), Arc::clone(&map.table), Op::Insert)
            .with_tx(Tx {
                id: self.tx_token,
                commit: self.tx_token,
                index: self.tx_index,
            });
        if ts > 0 {
            e = e.with_commit_ts(UNIX_EPOCH + Duration::from_secs(u64::from(ts)));
        }
        e.pk_names = map.primary_key.clone();
        e
    }

    fn rows(&mut self, kind: binlog::RowsKind, v2: bool, data: &[u8], ts: u32) {
        let id = match binlog::rows_table_id(data) {
            Ok(id) => id,
            Err(e) => return self.skip(format!("rows event: {e}")),
        };
        let (map, is_self) = match self.tables.get(&id) {
            Some(e) => (e.map.clone(), e.is_self),
            None => return self.skip(format!("rows event for table id {id} without a table map")),
        };
        if is_self {
            self.tx_self = true;
            return;
        }
        self.tx_other = true;
        let Some(map) = map else { return };
        let template = self.template(&map, ts);
        match binlog::decode_rows(kind, v2, data, &map, &template, &mut self.batch) {
            Ok(n) => {
                self.tx_index = self.tx_index.saturating_add(n as u32);
                self.tx_delivered = true;
            }
            Err(e) => self.skip(format!("rows event of {}.{}: {e}", map.schema, map.table)),
        }
    }

    /// A QUERY event: transaction control, TRUNCATE, DDL.
    fn query(&mut self, data: &[u8], start: u64, end: u64, ts: u32) -> Result<bool, MySqlError> {
        let q = match QueryEvent::decode(data) {
            Ok(q) => q,
            Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
        };
        let statement = binlog::classify(q.statement, q.database);
        match statement {
            Statement::Begin => {
                self.begin_tx(start);
                self.in_begin = true;
                Ok(false)
            }
            Statement::Commit | Statement::Rollback => Ok(self.commit(end)),
            Statement::Other if self.in_begin => Ok(false), // SAVEPOINT inside a transaction
            Statement::Other => {
                // A statement of its own (grants, FLUSH, …): a transaction boundary.
                self.begin_tx(start);
                Ok(self.commit(end))
            }
            Statement::Truncate((db, table)) => {
                self.begin_tx(start);
                self.tx_other = true;
                if self.watched(&db, &table) {
                    self.truncate(&db, &table, ts);
                }
                Ok(self.commit(end))
            }
            Statement::Ddl(kind, tables) => {
                self.begin_tx(start);
                self.tx_other = true;
                let position = FilePos::new(self.file.clone(), start);
                for (db, table) in &tables {
                    let watched = if table.is_empty() {
                        self.patterns.iter().any(|p| &p.database == db)
                            || (self.patterns.is_empty() && self.watched(db, "*"))
                    } else {
                        self.watched(db, table)
                    };
                    if !watched {
                        continue;
                    }
                    self.report(SchemaChange {
                        schema: db.clone(),
                        table: table.clone(),
                        kind,
                        statement: freshen::clip(q.statement, 500).to_string(),
                        position: position.clone(),
                    });
                    // Rows that vanished with the table (or under its old name) are
                    // healed by a sweep, which a truncate event triggers.
                    let vanished = matches!(kind, DdlKind::DropTable | DdlKind::DropDatabase)
                        || (kind == DdlKind::RenameTable
                            && tables
                                .iter()
                                .step_by(2)
                                .any(|t| t == &(db.clone(), table.clone())));
                    if vanished && !table.is_empty() {
                        self.truncate(db, table, ts);
                    }
                }
                let mut broken = std::mem::take(&mut self.broken);
                let changes = broken.apply(kind, &tables, q.statement, |d, t| self.watched(d, t));
                self.broken = broken;
                self.changes.extend(changes);
                // Table ids of a changed table are re-mapped by the next table map.
                Ok(self.commit(end))
            }
        }
    }

    fn truncate(&mut self, db: &str, table: &str, ts: u32) {
        let mut e = RowEvent::new(db, table, Op::Truncate).with_tx(Tx {
            id: self.tx_token,
            commit: self.tx_token,
            index: self.tx_index,
        });
        if ts > 0 {
            e = e.with_commit_ts(UNIX_EPOCH + Duration::from_secs(u64::from(ts)));
        }
        self.batch.push(e);
        self.tx_delivered = true;
        self.tx_index += 1;
        self.shared.truncates.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&mut self, change: SchemaChange) {
        self.shared.schema_changes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            schema = %change.schema,
            table = %change.table,
            kind = change.kind.as_str(),
            statement = %change.statement,
            "freshen-mysql: schema change on a watched table"
        );
        let _ = self.schema_tx.send(change);
    }

    /// The end of a transaction at `end`; returns whether the batch must go out now.
    fn commit(&mut self, end: u64) -> bool {
        if let (Some(g), Some(Gtids::MariaDb(list))) = (self.pending_maria.take(), &mut self.gtids)
        {
            list.advance(g.domain, g.server, g.seq);
        }
        if let (Some(g), Some(Gtids::MySql(set))) = (self.pending_mysql.take(), &mut self.gtids) {
            set.add(g.sid, g.gno);
        }
        // Only the position table's own writes: not progress worth storing.
        if !self.tx_self || self.tx_other {
            self.foreign += 1;
        }
        self.serial += 1;
        let mark = Arc::new(Mark {
            cp: Checkpoint {
                file_pos: FilePos::new(self.file.clone(), end),
                gtids: self.gtids.clone(),
            },
            serial: self.serial,
            foreign: self.foreign,
        });
        self.resume = Arc::clone(&mark);
        let delivered = self.tx_delivered;
        let had_output = self.has_output();
        self.end_tx();
        if delivered || had_output {
            self.batch_commit = Some(mark);
            // Rows of this transaction went out in earlier (full) batches: the commit
            // must follow them even though nothing is gathered now.
            delivered && self.batch.is_empty()
        } else {
            self.advance();
            false
        }
    }

    /// Hands the gathered batch over (waiting, and still taking acks, while the queue is
    /// full). Returns true when the consumer is gone.
    async fn flush(&mut self) -> Result<bool, MySqlError> {
        if !self.has_output() {
            return Ok(false);
        }
        // A fresh batch of the usual size: no regrowth per batch.
        let events = std::mem::replace(
            &mut self.batch,
            Vec::with_capacity(self.cfg.batch_size.min(4096)),
        );
        let skipped = std::mem::take(&mut self.skipped);
        let changes = std::mem::take(&mut self.changes);
        let n = events.len() as u64;
        let ack = match self.batch_commit.take() {
            Some(mark) => {
                self.handed_seq += 1;
                let seq = self.handed_seq;
                let shared = Arc::clone(&self.shared);
                Ack::new(move || {
                    let mut a = lock(&shared.acked);
                    if seq > a.0 {
                        *a = (seq, Some(mark));
                    }
                    drop(a);
                    shared.ack_notify.notify_one();
                })
            }
            None => Ack::none(),
        };
        let batch = skipped.into_iter().fold(
            Batch::new(events, ack).with_schema_changes(changes),
            Batch::with_skipped,
        );
        let sender = self.tx.clone();
        let permit = loop {
            let stop = &mut self.stop;
            let acks = &self.shared.ack_notify;
            let got = tokio::select! {
                biased;
                _ = stopped(stop) => None,
                _ = acks.notified() => Some(None),
                p = sender.reserve() => Some(Some(p)),
            };
            match got {
                None => return Ok(true),
                Some(None) => self.advance(),
                Some(Some(Ok(p))) => break p,
                Some(Some(Err(_))) => return Ok(true),
            }
        };
        let s = &self.shared;
        let queued = s.queued_events.fetch_add(n, Ordering::Relaxed) + n;
        s.peak_queued_events.fetch_max(queued, Ordering::Relaxed);
        s.events.fetch_add(n, Ordering::Relaxed);
        s.batches.fetch_add(1, Ordering::Relaxed);
        permit.send(Ok(batch));
        Ok(false)
    }

    fn pending(&self) -> bool {
        self.in_tx || self.has_output() || lock(&self.shared.acked).0 < self.handed_seq
    }

    /// Publishes the safe position: the newest acknowledged commit, or — when nothing is
    /// pending — the position after the last transaction seen.
    fn advance(&mut self) {
        let mut target = lock(&self.shared.acked).1.clone();
        if !self.pending()
            && target
                .as_ref()
                .is_none_or(|t| t.serial < self.resume.serial)
        {
            target = Some(Arc::clone(&self.resume));
        }
        if let Some(t) = target
            && (t.serial > self.published || self.published == 0)
        {
            self.published = t.serial;
            *lock(&self.shared.safe) = Some(t);
        }
    }
}

/// Resolves once a stop is requested (or the source is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// The source-side view of queued events (decremented as batches are taken).
pub(crate) fn taken(shared: &Shared, events: usize) {
    shared
        .queued_events
        .fetch_sub(events as u64, Ordering::Relaxed);
}
