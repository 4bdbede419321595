//! `MySqlSource`: the binlog source, its handle and its health.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::{
    Batch, BeforeImage, BoxFuture, Capabilities, Source, SourceError, SourceHealth, SourceProbe,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, Pool};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::error::ErrorKind;
use crate::position::Start;
use crate::reader::{self, ReaderSetup, Shared, lock};
use crate::schema::SchemaChange;
use crate::server::{self, ServerInfo};
use crate::store::Store;
use crate::{Checkpoint, FilePos, MySqlError, MySqlSourceConfig, ResumeBy};

/// A snapshot of the source's health, from [`MySqlHandle::health`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The reader thread is alive (it ends on stop or on a fatal error).
    pub running: bool,
    /// A binlog session is streaming right now.
    pub streaming: bool,
    /// The last error (a broken connection, a failed store), if any.
    pub last_error: Option<String>,
    /// Furthest binlog position received.
    pub received: Option<FilePos>,
    /// The server's binlog end, from its latest heartbeat.
    pub server_end: Option<FilePos>,
    /// The position that is safe to resume from (acknowledged, or passed with nothing
    /// pending); stored within `position_interval_ms`.
    pub confirmed: Option<Checkpoint>,
    /// The position last stored.
    pub stored: Option<Checkpoint>,
    /// Bytes between what was received and the server's end, when both are in one
    /// file (0 when caught up). [`MySqlHandle::lag`] measures across files.
    pub lag_bytes: Option<u64>,
    /// Seconds between the newest event's commit time and now (0 when caught up).
    pub seconds_behind: u64,
    /// Row (and truncate) events handed over.
    pub events: u64,
    /// Batches handed over.
    pub batches: u64,
    /// Events skipped because they could not be decoded.
    pub skipped: u64,
    /// Reconnects after a broken session.
    pub reconnects: u64,
    /// Schema changes seen on watched tables.
    pub schema_changes: u64,
    /// Truncates (and drops) of watched tables seen.
    pub truncates: u64,
    /// Events handed over but not yet taken by the consumer.
    pub queued_events: u64,
    /// The most events ever waiting between reader and consumer: memory stays bounded
    /// by this (plus one batch being gathered), whatever a transaction's size.
    pub peak_queued_events: u64,
    /// Positions stored.
    pub stores: u64,
    /// Failed attempts to store the position (retried).
    pub store_failures: u64,
}

/// A cloneable view of a running [`MySqlSource`]: health, lag, schema changes. Also the
/// uniform [`SourceProbe`] every source offers (kind `mysql`; positions as
/// `file index << 32 | offset`).
#[derive(Clone)]
pub struct MySqlHandle {
    shared: Arc<Shared>,
    schema_tx: broadcast::Sender<SchemaChange>,
    opts: Opts,
    name: String,
    /// The last [`MySqlHandle::lag`] sample, for [`SourceProbe::health`].
    sampled: Arc<std::sync::Mutex<Option<Result<Lag, String>>>>,
}

impl fmt::Debug for MySqlHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlHandle")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Bytes behind the server's binlog end, measured across files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// Binlog bytes the server has written past what was received.
    pub bytes: u64,
    /// Binlog bytes past the confirmed (safe) position: what a restart would replay.
    pub unconfirmed_bytes: u64,
}

impl MySqlHandle {
    /// The current health snapshot.
    pub fn health(&self) -> Health {
        let s = &self.shared;
        let received = lock(&s.received).clone();
        let server_end = lock(&s.server_end).clone();
        let caught_up = s.caught_up.load(Ordering::Relaxed);
        let lag_bytes = match (&received, &server_end) {
            _ if caught_up => Some(0),
            (Some(r), Some(e)) if r.file == e.file => Some(e.pos.saturating_sub(r.pos)),
            _ => None,
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let ts = s.last_event_ts.load(Ordering::Relaxed);
        Health {
            running: s.running.load(Ordering::SeqCst),
            streaming: s.streaming.load(Ordering::SeqCst),
            last_error: lock(&s.last_error).clone(),
            received,
            server_end,
            confirmed: lock(&s.safe).as_ref().map(|m| m.cp.clone()),
            stored: lock(&s.stored).clone(),
            lag_bytes,
            seconds_behind: if caught_up || ts == 0 {
                0
            } else {
                now.saturating_sub(ts)
            },
            events: s.events.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            skipped: s.skipped.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
            schema_changes: s.schema_changes.load(Ordering::Relaxed),
            truncates: s.truncates.load(Ordering::Relaxed),
            queued_events: s.queued_events.load(Ordering::Relaxed),
            peak_queued_events: s.peak_queued_events.load(Ordering::Relaxed),
            stores: s.stores.load(Ordering::Relaxed),
            store_failures: s.store_failures.load(Ordering::Relaxed),
        }
    }

    /// Subscribes to schema changes on watched tables (each is also logged and counted).
    pub fn schema_changes(&self) -> broadcast::Receiver<SchemaChange> {
        self.schema_tx.subscribe()
    }

    /// How far behind the server's binlog end the source is, across files (asks the
    /// server: `SHOW BINARY LOGS`, which needs REPLICATION CLIENT or BINLOG MONITOR).
    pub async fn lag(&self) -> Result<Lag, MySqlError> {
        let mut c = server::connect(&self.opts, "the lag").await?;
        let logs: Vec<mysql_async::Row> = c
            .query("SHOW BINARY LOGS")
            .await
            .map_err(|e| MySqlError::driver("cannot list the binary logs", e))?;
        let logs: Vec<(String, u64)> = logs
            .into_iter()
            .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
            .collect();
        let behind = |p: Option<FilePos>| -> u64 {
            let Some(p) = p else { return 0 };
            let mut total = 0u64;
            let mut after = false;
            for (name, size) in &logs {
                if after {
                    total += size;
                } else if *name == p.file {
                    after = true;
                    total += size.saturating_sub(p.pos);
                }
            }
            total
        };
        let h = self.health();
        Ok(Lag {
            bytes: behind(h.received),
            unconfirmed_bytes: behind(h.confirmed.map(|c| c.file_pos)),
        })
    }
}

impl SourceProbe for MySqlHandle {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    fn health(&self) -> SourceHealth {
        let h = MySqlHandle::health(self);
        let sampled = lock(&self.sampled).clone();
        let token = |p: Option<&FilePos>| p.and_then(FilePos::token);
        let mut out = SourceHealth::default();
        out.streaming = h.streaming;
        out.last_error = h
            .last_error
            .clone()
            .or_else(|| sampled.as_ref().and_then(|s| s.as_ref().err().cloned()));
        out.reconnects = h.reconnects;
        out.events = h.events;
        out.skipped = h.skipped;
        out.received = token(h.received.as_ref());
        out.confirmed = token(h.confirmed.as_ref().map(|c| &c.file_pos));
        out.head = token(h.server_end.as_ref());
        // What a restart would replay (the server keeps it), as sampled; else what the
        // heartbeat says within one file.
        out.lag_bytes = match sampled {
            Some(Ok(lag)) => Some(lag.unconfirmed_bytes),
            _ => h.lag_bytes,
        };
        out
    }

    fn sample(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let lag = self.lag().await.map_err(|e| e.to_string());
            *lock(&self.sampled) = Some(lag);
        })
    }
}

/// The MySQL/MariaDB binlog source.
///
/// Built by [`MySqlSource::start`]: checks the server's binlog settings, creates the
/// position table if needed, resumes from the stored position (or starts where
/// `start` says), then streams on its own thread. Hand it to
/// [`freshen::Refresher::builder`]`.source(…)`.
pub struct MySqlSource {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    handle: MySqlHandle,
    capabilities: Capabilities,
    stop: watch::Sender<bool>,
    done: Option<oneshot::Receiver<()>>,
}

impl fmt::Debug for MySqlSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlSource")
            .field("name", &self.handle.name)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

impl MySqlSource {
    /// Validates `config`, checks the server, loads the stored position and starts
    /// streaming. Returns once the first binlog session streams; a server that cannot
    /// serve (settings, grants, a purged position) is an error at once.
    pub async fn start(config: MySqlSourceConfig) -> Result<MySqlSource, MySqlError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(MySqlError::config("MySQL source configuration", &problems));
        }
        let opts = server::opts(config.url.expose())?;
        let database = opts.db_name().unwrap_or_default().to_string();
        let mut conn = server::connect(&opts, "the source's setup").await?;
        let info = server::inspect(&mut conn).await?;
        let _ = conn.disconnect().await;
        let blocking = info.blocking_problems();
        if !blocking.is_empty() {
            return Err(MySqlError::setup(&blocking));
        }
        let store = match &config.position_file {
            Some(path) => Store::file(path.clone(), &config.name),
            None => {
                let pool = Pool::new(mysql_async::OptsBuilder::from_opts(opts.clone()).pool_opts(
                    mysql_async::PoolOpts::default().with_constraints(
                        mysql_async::PoolConstraints::new(0, 2).unwrap_or_default(),
                    ),
                ));
                Store::table(pool, &database, &config.position_table, &config.name)
            }
        };
        store.prepare().await?;
        let stored = store.load(info.mariadb).await?;
        let first_run = stored.is_none();
        let (start, by_gtid) = resume_point(&config, &info, stored)?;
        if first_run {
            // Stored before anything streams: a process killed before its first store
            // must resume here, not at a later "current" position.
            store.save(&start).await?;
        }
        let before_image = match info.row_image.to_ascii_uppercase().as_str() {
            "FULL" | "NOBLOB" => BeforeImage::Full,
            _ => BeforeImage::KeyOnly,
        };
        let capabilities = Capabilities {
            before_image,
            ..capabilities()
        };
        let shared = Arc::new(Shared::default());
        let (schema_tx, _) = broadcast::channel(64);
        let (tx, rx) = mpsc::channel(config.queue_batches);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let name = config.name.clone();
        let patterns = config.patterns();
        reader::spawn(
            ReaderSetup {
                config: Arc::new(config),
                opts: opts.clone(),
                start,
                by_gtid,
                patterns,
                store,
                shared: Arc::clone(&shared),
                schema_tx: schema_tx.clone(),
                tx,
                stop: stop_rx,
            },
            ready_tx,
            done_tx,
        )?;
        match ready_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(MySqlError::new(
                    ErrorKind::Connection,
                    "the binlog reader ended before streaming",
                ));
            }
        }
        Ok(MySqlSource {
            rx,
            handle: MySqlHandle {
                shared,
                schema_tx,
                opts,
                name,
                sampled: Arc::default(),
            },
            capabilities,
            stop,
            done: Some(done_rx),
        })
    }

    /// A cloneable handle for health, lag and schema changes.
    pub fn handle(&self) -> MySqlHandle {
        self.handle.clone()
    }

    /// The current health snapshot.
    pub fn health(&self) -> Health {
        self.handle.health()
    }

    /// Stops streaming, stores the last safe position and waits for the reader to end.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), done).await;
        }
    }
}

/// Where to start, and whether by GTID: the stored position wins; without one,
/// `start` decides.
fn resume_point(
    config: &MySqlSourceConfig,
    info: &ServerInfo,
    stored: Option<Checkpoint>,
) -> Result<(Checkpoint, bool), MySqlError> {
    let start: Start = config
        .start
        .parse()
        .map_err(|e: String| MySqlError::config("MySQL source configuration", &[e]))?;
    let want_gtid = match config.resume_by {
        ResumeBy::File => false,
        ResumeBy::Gtid => {
            if !info.has_gtids() {
                return Err(MySqlError::setup(&[
                    "resume_by = \"gtid\" but the server's gtid_mode is not ON".into(),
                ]));
            }
            true
        }
        ResumeBy::Auto => info.has_gtids(),
    };
    let here = info.position.clone().ok_or_else(|| {
        MySqlError::setup(&["binary logging is off: start the server with log_bin".into()])
    })?;
    if let Some(cp) = stored {
        let by_gtid = want_gtid && cp.gtids.as_ref().is_some_and(|g| !g.to_string().is_empty());
        return Ok((cp, by_gtid));
    }
    Ok(match start {
        Start::Current => {
            let gtids = if want_gtid {
                info.current_gtids()?
            } else {
                None
            };
            let by_gtid = gtids.as_ref().is_some_and(|g| !g.to_string().is_empty());
            // A server without any GTID yet starts by file; GTIDs are tracked from here.
            let gtids = if want_gtid { gtids } else { None };
            (
                Checkpoint {
                    file_pos: here,
                    gtids,
                },
                by_gtid,
            )
        }
        Start::FilePos(fp) => (
            Checkpoint {
                file_pos: fp,
                gtids: None,
            },
            false,
        ),
        Start::Gtid(text) => {
            if !info.has_gtids() {
                return Err(MySqlError::setup(&[
                    "start names a GTID position but the server's gtid_mode is not ON".into(),
                ]));
            }
            let gtids = crate::Gtids::parse(&text, info.mariadb).map_err(|e| {
                MySqlError::config("MySQL source configuration", &[format!("start: {e}")])
            })?;
            (
                Checkpoint {
                    file_pos: here,
                    gtids: Some(gtids),
                },
                true,
            )
        }
    })
}

/// What the row-based binlog guarantees: whole former rows (with
/// `binlog_row_image=FULL`, which `check` verifies), deletes, TRUNCATE and other DDL of
/// watched tables, transaction boundaries (XID), and a stored resume position.
pub(crate) fn capabilities() -> Capabilities {
    Capabilities {
        before_image: BeforeImage::Full,
        deletes: true,
        truncates: true,
        recoverable: true,
        transactions: true,
        schema_changes: true,
        ..Capabilities::NONE
    }
}

impl Drop for MySqlSource {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Source for MySqlSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(async move {
            let item = self.rx.recv().await?;
            if let Ok(b) = &item {
                reader::taken(&self.handle.shared, b.events().len());
            }
            Some(item)
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
}
