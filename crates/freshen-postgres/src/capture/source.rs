//! `PgSource`: the PostgreSQL logical replication source, its builder and its handle.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{
    Ack, Backoff, Batch, BeforeImage, BoxFuture, Capabilities, Gap, Source, SourceError,
    SourceHealth, SourceProbe, SourceProblem,
};
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::admin::PgAdmin;
use crate::admin::membership::Membership;
use crate::capture::durable::{DurableConfig, Standbys, standby_slots};
use crate::capture::reader::{self, ReaderSetup, Shared};
use crate::capture::stall::{Observation, StallWatch, Stalled};
use crate::error::ErrorKind;
use crate::{
    ConnectionConfig, Lsn, PgError, PgSourceConfig, PublicationMode, SlotInfo, SlotMode, SslMode,
    StartPosition, TableName, tls,
};

/// A snapshot of the source's health, from [`PgHandle::health`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The reader thread is alive (it ends on stop or on a fatal error).
    pub running: bool,
    /// A replication session is streaming right now.
    pub streaming: bool,
    /// The session reads with the socket's wake-up threshold raised while the stream is
    /// busy (a loopback TCP connection on Linux; see [`PgSourceConfig::read_gap`]).
    pub wake_threshold: bool,
    /// The last error (a broken connection, a failed reconnect), if any.
    pub last_error: Option<String>,
    /// Furthest position received from the server.
    pub received_lsn: Lsn,
    /// Server's WAL end from its latest keepalive.
    pub server_lsn: Lsn,
    /// Position released for confirmation upstream (reported within `status_interval`).
    pub confirmed_lsn: Lsn,
    /// Position the acknowledgements allow confirming. Ahead of `confirmed_lsn` while
    /// the standbys that keep the slot through a failover have not yet flushed the
    /// rebuilds behind it (`synchronized_standby_slots`, or the source standby itself).
    pub acknowledged_lsn: Lsn,
    /// Row events handed over.
    pub events: u64,
    /// Batches handed over.
    pub batches: u64,
    /// Messages skipped because they could not be decoded.
    pub skipped: u64,
    /// Reconnects after a broken session.
    pub reconnects: u64,
    /// Events handed over but not yet taken by the consumer.
    pub queued_events: u64,
    /// The most events ever waiting between reader and consumer, counted until the
    /// consumer has taken them (so `queue_batches` + 1 batches at most; a batch under
    /// construction adds at most `batch_size`): memory stays bounded by this.
    pub peak_queued_events: u64,
    /// Commit time of the oldest transaction handed over and not yet acknowledged: the
    /// slot retains WAL since about then. `None` when everything handed over is acked.
    pub oldest_unconfirmed: Option<std::time::SystemTime>,
}

/// A cloneable view of a running [`PgSource`]: health, lag, and the
/// [`SourceProbe`] every source offers.
#[derive(Clone)]
pub struct PgHandle {
    shared: Arc<Shared>,
    admin: PgAdmin,
    slot: String,
    publication: String,
    /// The tables the publication must cover (empty: whatever it holds).
    tables: Vec<TableName>,
    sampled: Arc<Mutex<Sampled>>,
    gaps: Arc<PendingGaps>,
}

/// Gaps found apart from the stream (a watched table back in the publication), waiting
/// to be handed over as a batch of their own.
#[derive(Debug, Default)]
struct PendingGaps {
    gaps: Mutex<Vec<Gap>>,
    ready: Notify,
}

impl PendingGaps {
    fn push(&self, gaps: impl IntoIterator<Item = Gap>) {
        let mut g = self.gaps.lock().unwrap_or_else(|p| p.into_inner());
        g.extend(gaps);
        if !g.is_empty() {
            self.ready.notify_one();
        }
    }

    /// The gaps waiting, as a batch without rows (nothing to acknowledge: the views
    /// over their tables sweep, or say that they cannot).
    fn take(&self) -> Option<Batch> {
        let gaps = std::mem::take(&mut *self.gaps.lock().unwrap_or_else(|p| p.into_inner()));
        (!gaps.is_empty()).then(|| Batch::new(Vec::new(), Ack::none()).with_gaps(gaps))
    }
}

/// The gap of `table`, out of publication `publication` for a while: why, and that
/// nothing in the stream will carry its changes of that window.
fn publication_gap(table: &TableName, publication: &str, how: &str) -> Gap {
    Gap::new(
        table.schema.clone(),
        table.name.clone(),
        format!(
            "{table} {how} publication {publication}: its changes while it was not in the publication were never streamed"
        ),
    )
}

/// What [`SourceProbe::sample`] last learnt from the server.
#[derive(Debug)]
struct Sampled {
    lag: Option<Result<SlotInfo, String>>,
    problems: Vec<SourceProblem>,
    /// Compares the reader with the server's WAL, read here on the admin connection.
    watch: StallWatch,
    /// The stall the last sample showed, if any.
    stalled: Option<Stalled>,
    /// How the publication covered the watched tables at the last look (`None`: unknown).
    members: Option<Membership>,
}

impl Sampled {
    fn new(stall_after: Duration) -> Sampled {
        Sampled {
            lag: None,
            problems: Vec::new(),
            watch: StallWatch::new(stall_after),
            stalled: None,
            members: None,
        }
    }
}

impl fmt::Debug for PgHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgHandle")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl PgHandle {
    /// The current health snapshot.
    pub fn health(&self) -> Health {
        let s = &self.shared;
        Health {
            running: s.running.load(Ordering::SeqCst),
            streaming: s.streaming.load(Ordering::SeqCst),
            wake_threshold: s.wake_threshold.load(Ordering::Relaxed),
            last_error: s
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            received_lsn: reader::lsn(&s.received_lsn),
            server_lsn: reader::lsn(&s.server_lsn),
            confirmed_lsn: reader::lsn(&s.confirmed_lsn),
            acknowledged_lsn: reader::lsn(&s.acknowledged_lsn),
            events: s.events.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            skipped: s.skipped.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
            queued_events: s.queued_events.load(Ordering::Relaxed),
            peak_queued_events: s.peak_queued_events.load(Ordering::Relaxed),
            oldest_unconfirmed: reader::oldest_unconfirmed(s),
        }
    }

    /// The slot as the server sees it: bytes behind (`lag_bytes`), `wal_status`,
    /// confirmed position. A missing or invalidated slot is an error saying what to do.
    pub async fn lag(&self) -> Result<SlotInfo, PgError> {
        match self.admin.slot(&self.slot).await? {
            None => Err(crate::admin::slot_missing(&self.slot)),
            Some(info) if info.is_lost() => Err(crate::admin::slot_lost(&self.slot)),
            Some(info) => Ok(info),
        }
    }

    /// The admin connection pool this source uses.
    pub fn admin(&self) -> &PgAdmin {
        &self.admin
    }

    /// What the publication lacks now for the watched tables: a table dropped from it
    /// while running would otherwise stop its changes silently.
    async fn publication_problems(&self) -> Option<Vec<SourceProblem>> {
        let name = &self.publication;
        let whole = |message: String| SourceProblem {
            table: None,
            message,
        };
        let problems = match self.admin.coverage(name, &self.tables).await {
            // Unreachable: the replication session reports its own connection problems.
            Err(_) => return None,
            Ok(None) => vec![whole(format!(
                "publication {name} was dropped while running: no change arrives (recreate it, or restart to have it created)"
            ))],
            Ok(Some(c)) => {
                let mut out: Vec<SourceProblem> = c
                    .missing_tables
                    .iter()
                    .map(|t| SourceProblem {
                        table: Some((t.schema.clone(), t.name.clone())),
                        message: format!(
                            "publication {name} no longer includes {t}: none of its changes arrive (ALTER PUBLICATION {} ADD TABLE {t})",
                            crate::quote_ident(name)
                        ),
                    })
                    .collect();
                if !c.missing_operations.is_empty() {
                    out.push(whole(format!(
                        "publication {name} no longer publishes {}: those changes do not arrive",
                        c.missing_operations.join(", ")
                    )));
                }
                out
            }
        };
        Some(problems)
    }
}

impl SourceProbe for PgHandle {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn health(&self) -> SourceHealth {
        let h = PgHandle::health(self);
        let sampled = self.sampled.lock().unwrap_or_else(|p| p.into_inner());
        let (lag_bytes, retention, lag_error) = match &sampled.lag {
            Some(Ok(info)) => (info.lag_bytes, info.wal_status.clone(), None),
            Some(Err(e)) => (None, None, Some(e.clone())),
            None => (None, None, None),
        };
        let mut out = SourceHealth::default();
        out.streaming = h.streaming;
        out.last_error = h.last_error.or(lag_error);
        out.problems = sampled.problems.clone();
        out.stalled_for = Some(sampled.stalled.map_or(Duration::ZERO, |s| s.for_));
        if let Some(s) = sampled.stalled {
            out.problems.push(SourceProblem {
                table: None,
                message: stall_message(&s, self.shared.waiting_consumer.load(Ordering::Relaxed)),
            });
        }
        out.reconnects = h.reconnects;
        out.events = h.events;
        out.skipped = h.skipped;
        out.received = Some(h.received_lsn.0);
        out.confirmed = Some(h.confirmed_lsn.0);
        // The server's position as read apart from the stream, when known: the stream's
        // own figure stops with the stream.
        let sampled_head = match &sampled.lag {
            Some(Ok(info)) => info.server_lsn,
            _ => None,
        };
        out.head = Some(sampled_head.map_or(h.server_lsn.0, |l| l.0.max(h.server_lsn.0)));
        out.lag_bytes = lag_bytes;
        out.lag_seconds = h
            .oldest_unconfirmed
            .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
            .map(|d| d.as_secs_f64());
        out.retention = retention;
        out.discovered = self
            .shared
            .discovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|t| (t.schema.clone(), t.name.clone()))
            .collect();
        out
    }

    fn sample(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let lag = self.lag().await.map_err(|e| e.to_string());
            let problems = self.publication_problems().await;
            let members = match self.admin.membership(&self.publication, &self.tables).await {
                Ok(Some(m)) => Some(m),
                // Gone: no table is covered (one created again is a return for each).
                Ok(None) => Some(Membership(
                    self.tables.iter().map(|t| (t.clone(), None)).collect(),
                )),
                Err(_) => None,
            };
            // The reader's figures are read after the server's, so they are at least as
            // new: a reader keeping up is never seen behind a newer server position.
            let h = PgHandle::health(self);
            let observation = lag
                .as_ref()
                .ok()
                .and_then(|info| info.server_lsn)
                .map(|server| Observation {
                    streaming: h.streaming,
                    server: server.0,
                    reader: h.received_lsn.0.max(h.server_lsn.0),
                    messages: self.shared.messages.load(Ordering::Relaxed),
                });
            let mut sampled = self.sampled.lock().unwrap_or_else(|p| p.into_inner());
            let was = sampled.stalled.is_some();
            sampled.stalled = match observation {
                Some(o) => sampled.watch.observe(std::time::Instant::now(), o),
                // The server is out of reach: the session reports that itself.
                None => None,
            };
            if let Some(s) = sampled.stalled.filter(|_| !was) {
                let waiting = self.shared.waiting_consumer.load(Ordering::Relaxed);
                tracing::error!(slot = %self.slot, "{}", stall_message(&s, waiting));
            } else if was && sampled.stalled.is_none() {
                tracing::info!(slot = %self.slot, "freshen-postgres: the replication reader reads again");
            }
            sampled.lag = Some(lag);
            if let Some(now) = members {
                if let Some(before) = &sampled.members {
                    let back = before.regained(&now);
                    for t in &back {
                        tracing::error!(
                            publication = %self.publication,
                            "freshen-postgres: {t} is back in publication {}; its changes while it was out never reached the stream: the views over it sweep, or, without a reconcile, report the gap until a person acts",
                            self.publication
                        );
                    }
                    self.gaps.push(
                        back.iter()
                            .map(|t| publication_gap(t, &self.publication, "came back into")),
                    );
                }
                sampled.members = Some(now);
            }
            if let Some(problems) = problems {
                for p in problems.iter().filter(|p| !sampled.problems.contains(p)) {
                    tracing::error!("{}", p.message);
                }
                sampled.problems = problems;
            }
        })
    }
}

/// What a stalled reader's problem says.
fn stall_message(s: &Stalled, waiting_consumer: bool) -> String {
    let why = if waiting_consumer {
        "it waits for the pipeline to take a batch"
    } else {
        "the session is connected but not read"
    };
    format!(
        "the replication reader has read nothing for {:.0}s while the server's WAL is ahead of it (server at {}, reader at {}; {why}): no change arrives; restart freshen if it persists",
        s.for_.as_secs_f64(),
        Lsn(s.server),
        Lsn(s.reader),
    )
}

/// The PostgreSQL logical replication source.
///
/// Built by [`PgSource::builder`] (or [`PgSource::start`] from a [`PgSourceConfig`]):
/// checks `wal_level` and privileges, creates or validates the publication and the
/// slot, then streams on its own thread. Hand it to
/// [`freshen::Refresher::builder`]`.source(…)`.
pub struct PgSource {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    handle: PgHandle,
    capabilities: Capabilities,
    stop: watch::Sender<bool>,
    done: Option<oneshot::Receiver<()>>,
}

impl fmt::Debug for PgSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSource")
            .field("slot", &self.handle.slot)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

/// Which standbys a confirmation waits for (`durable.rs`): on a standby source, the
/// source itself, with WAL positions read on `primary`; on a primary of PostgreSQL 17,
/// the physical slots of `synchronized_standby_slots`. `None` where neither applies.
async fn durable_gate(
    admin: &PgAdmin,
    config: &PgSourceConfig,
) -> Result<Option<DurableConfig>, PgError> {
    if admin.in_recovery().await? {
        return Ok(match &config.primary {
            Some(primary) => Some(DurableConfig {
                primary: primary.clone(),
                standbys: Standbys::Source(Box::new(config.connection.clone())),
            }),
            None => {
                tracing::warn!(
                    "freshen-postgres: decoding on a standby without [source] primary_url: the slot is confirmed as soon as rebuilds commit on the primary, so a promotion of this standby can lose a rebuild it had not yet received"
                );
                None
            }
        });
    }
    if admin.server_version_num().await? < crate::admin::standby::FAILOVER_SLOTS_SINCE {
        return Ok(None);
    }
    let slots = standby_slots(&admin.setting("synchronized_standby_slots").await?);
    Ok((!slots.is_empty()).then(|| {
        tracing::info!(standbys = %slots.join(", "), "freshen-postgres: the slot is confirmed once these standbys have flushed the rebuilds behind it");
        DurableConfig {
            primary: config.connection.clone(),
            standbys: Standbys::Synchronized,
        }
    }))
}

impl PgSource {
    /// A builder.
    pub fn builder() -> PgSourceBuilder {
        PgSourceBuilder::default()
    }

    /// Validates `config`, sets up the slot and publication, and starts streaming.
    /// Returns once the first replication session streams (retryable failures are
    /// retried within `reconnect_deadline`; others are returned at once).
    pub async fn start(config: PgSourceConfig) -> Result<PgSource, PgError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(PgError::config(&problems));
        }
        let tls = match config.connection.sslmode {
            SslMode::Disable => None,
            _ => Some(tls::client_config(&config.connection)?),
        };
        let admin = PgAdmin::connect(&config.connection).await?;
        if let Some(why) = admin.standby_source_problem().await? {
            return Err(PgError::new(ErrorKind::Setup, why));
        }
        admin.require_logical_wal().await?;
        admin.require_replication_privilege().await?;
        let mut identities = Vec::new();
        for t in &config.tables {
            identities.push(admin.replica_identity(t).await?);
        }
        let patterns = config.selection();
        // A slot that exists already resumes where it was confirmed: a table the
        // publication gains now had its changes since then filtered out.
        let resumes =
            config.slot_mode != SlotMode::Temporary && admin.slot(&config.slot).await?.is_some();
        let added = admin
            .ensure_publication(
                &config.publication,
                &config.tables,
                &patterns,
                config.publication_mode,
            )
            .await?;
        let selected = admin.selected_tables(&patterns).await?;
        if !patterns.is_empty() {
            tracing::info!(
                patterns = %patterns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                tables = %selected.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                "freshen-postgres: [source] tables patterns select these tables now; later ones are discovered"
            );
        }
        for t in selected {
            if !config.tables.contains(&t) {
                identities.push(admin.replica_identity(&t).await?);
            }
        }
        if config.tables.is_empty() && patterns.is_empty() {
            // Every table of the publication is delivered.
            let p = admin.publication(&config.publication).await?;
            for t in p.map(|p| p.tables).unwrap_or_default() {
                identities.push(admin.replica_identity(&t).await?);
            }
        }
        admin
            .ensure_slot_on(
                &config.slot,
                config.slot_mode,
                &config.connection.dbname,
                config.primary.as_ref(),
                config.failover,
            )
            .await?;
        let before_image = identities
            .iter()
            .map(|i| i.before_image())
            .min_by_key(|b| match b {
                BeforeImage::None => 0,
                BeforeImage::KeyOnly => 1,
                BeforeImage::Full => 2,
            })
            .unwrap_or(BeforeImage::KeyOnly);
        let capabilities = Capabilities {
            before_image,
            ..capabilities(config.slot_mode)
        };
        let primary_keys = identities
            .iter()
            .filter(|i| i.identity == crate::ReplicaIdentity::Full)
            .map(|i| (i.table.clone(), i.primary_key.clone()))
            .collect();
        // What a later Relation message is compared with: the catalog now, since the
        // stream describes a table only before its first change.
        let mut shapes = Vec::new();
        for i in &identities {
            if let Some((oid, columns)) = admin.shape(&i.table).await? {
                shapes.push((oid, i.table.clone(), columns));
            }
        }
        let watched: Option<HashSet<TableName>> = (!config.tables.is_empty()
            || !patterns.is_empty())
        .then(|| config.tables.iter().cloned().collect());
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(config.queue_batches);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let slot = config.slot.clone();
        let publication = config.publication.clone();
        let tables = config.tables.clone();
        let mut sampled = Sampled::new(config.stall_after);
        // Compared with at the first sample: a table dropped from the publication and
        // added back before then is a gap too.
        sampled.members = admin
            .membership(&config.publication, &config.tables)
            .await
            .ok()
            .flatten();
        let sampled = Arc::new(Mutex::new(sampled));
        let gaps = Arc::new(PendingGaps::default());
        if resumes {
            for t in &added {
                tracing::error!(
                    slot = %config.slot,
                    "freshen-postgres: {t} was added to publication {} at start while slot {} already existed: its changes before now never reached the slot; the views over it sweep, or, without a reconcile, report the gap until a person acts",
                    config.publication, config.slot
                );
            }
            gaps.push(
                added
                    .iter()
                    .map(|t| publication_gap(t, &config.publication, "was added at start to")),
            );
        }
        // Streaming in-progress transactions needs pgoutput protocol 2 (PostgreSQL 14).
        let stream_in_progress =
            config.stream_in_progress && admin.server_version_num().await? >= 140_000;
        let durable = durable_gate(&admin, &config).await?;
        reader::spawn(
            ReaderSetup {
                stream_in_progress,
                durable,
                config: Arc::new(config),
                tls,
                watched,
                patterns,
                primary_keys,
                shapes,
                shared: Arc::clone(&shared),
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
                return Err(PgError::new(
                    ErrorKind::Connection,
                    "the replication thread ended before streaming",
                ));
            }
        }
        Ok(PgSource {
            rx,
            handle: PgHandle {
                shared,
                admin,
                slot,
                publication,
                tables,
                sampled,
                gaps,
            },
            capabilities,
            stop,
            done: Some(done_rx),
        })
    }

    /// A cloneable handle for health and lag.
    pub fn handle(&self) -> PgHandle {
        self.handle.clone()
    }

    /// The current health snapshot.
    pub fn health(&self) -> Health {
        self.handle.health()
    }

    /// Stops streaming (sending final feedback) and waits for the reader to end.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), done).await;
        }
    }

    /// Stops streaming and drops the replication slot (the server then keeps no WAL
    /// for it; changes made meanwhile are not captured).
    pub async fn drop_slot(mut self) -> Result<bool, PgError> {
        self.shutdown().await;
        let slot = self.handle.slot.clone();
        self.handle.admin.drop_slot(&slot).await
    }
}

/// What logical replication through pgoutput guarantees: deletes, truncates,
/// transaction boundaries and schema changes (seen with the next change to the table)
/// always; the former row as the table's replica identity
/// allows (whole with FULL); a replay after a restart unless the slot is temporary.
pub(crate) fn capabilities(slot_mode: SlotMode) -> Capabilities {
    Capabilities {
        before_image: BeforeImage::Full,
        before_image_per_table: true,
        deletes: true,
        truncates: true,
        recoverable: slot_mode != SlotMode::Temporary,
        transactions: true,
        // A changed Relation message is compared with the table's shape at start.
        schema_changes: true,
        // Existing rows in primary-key chunks read with SQL on this database, between
        // watermarks written into the WAL this stream reads (DBLog): the changefeed's
        // and the sinks' snapshots.
        snapshot: true,
        ..Capabilities::NONE
    }
}

impl Drop for PgSource {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Source for PgSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(async move {
            loop {
                if let Some(gaps) = self.handle.gaps.take() {
                    return Some(Ok(gaps));
                }
                tokio::select! {
                    biased;
                    () = self.handle.gaps.ready.notified() => {}
                    item = self.rx.recv() => {
                        let item = item?;
                        if let Ok(b) = &item {
                            reader::taken(&self.handle.shared, b.events().len());
                        }
                        return Some(item);
                    }
                }
            }
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
}

/// Builds a [`PgSource`]; every setter fills a field of [`PgSourceConfig`].
#[derive(Debug, Clone, Default)]
pub struct PgSourceBuilder {
    config: PgSourceConfig,
    problems: Vec<String>,
}

impl PgSourceBuilder {
    /// Starts from a whole configuration.
    pub fn config(mut self, config: PgSourceConfig) -> Self {
        self.config = config;
        self
    }

    /// Where to connect.
    pub fn connection(mut self, connection: ConnectionConfig) -> Self {
        self.config.connection = connection;
        self
    }

    /// Where to connect, as a `postgres://` URL.
    pub fn url(mut self, url: &str) -> Self {
        match ConnectionConfig::from_url(url) {
            Ok(c) => self.config.connection = c,
            Err(e) => self.problems.push(e.to_string()),
        }
        self
    }

    /// The replication slot and what to do about it.
    pub fn slot(mut self, name: impl Into<String>, mode: SlotMode) -> Self {
        self.config.slot = name.into();
        self.config.slot_mode = mode;
        self
    }

    /// The publication and what to do about it.
    pub fn publication(mut self, name: impl Into<String>, mode: PublicationMode) -> Self {
        self.config.publication = name.into();
        self.config.publication_mode = mode;
        self
    }

    /// Watches a table (`table` or `schema.table`).
    pub fn table(mut self, name: &str) -> Self {
        match name.parse() {
            Ok(t) => self.config.tables.push(t),
            Err(e) => self.problems.push(e),
        }
        self
    }

    /// Captures every table of `schema`, present and future (see
    /// [`PgSourceConfig::schemas`]).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.config.schemas.push(schema.into());
        self
    }

    /// Captures every table `pattern` selects, present and future (see
    /// [`PgSourceConfig::patterns`]).
    pub fn pattern(mut self, pattern: crate::TablePattern) -> Self {
        self.config.patterns.push(pattern);
        self
    }

    /// A table to capture, already parsed.
    pub fn table_name(mut self, table: TableName) -> Self {
        self.config.tables.push(table);
        self
    }

    /// Where streaming starts.
    pub fn start_at(mut self, start: StartPosition) -> Self {
        self.config.start = start;
        self
    }

    /// Most events per batch.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.config.batch_size = n;
        self
    }

    /// Batches queued between reader and consumer.
    pub fn queue_batches(mut self, n: usize) -> Self {
        self.config.queue_batches = n;
        self
    }

    /// Wire messages buffered by the replication client.
    pub fn wire_buffer(mut self, n: usize) -> Self {
        self.config.wire_buffer = n;
        self
    }

    /// Pause before reading again while changes keep arriving
    /// ([`PgSourceConfig::read_gap`]).
    pub fn read_gap(mut self, d: Duration) -> Self {
        self.config.read_gap = d;
        self
    }

    /// Standby status update interval.
    pub fn status_interval(mut self, d: Duration) -> Self {
        self.config.status_interval = d;
        self
    }

    /// How long a streaming reader may take nothing while the server's WAL is ahead
    /// before it is reported stalled ([`PgSourceConfig::stall_after`]).
    pub fn stall_after(mut self, d: Duration) -> Self {
        self.config.stall_after = d;
        self
    }

    /// Whether to ask for large in-progress transactions as they run
    /// ([`PgSourceConfig::stream_in_progress`]).
    pub fn stream_in_progress(mut self, on: bool) -> Self {
        self.config.stream_in_progress = on;
        self
    }

    /// Bytes of streamed transactions held in memory before the largest goes to a
    /// temporary file ([`PgSourceConfig::stream_memory`]).
    pub fn stream_memory(mut self, bytes: usize) -> Self {
        self.config.stream_memory = bytes;
        self
    }

    /// Whether a slot freshen creates is a failover slot ([`PgSourceConfig::failover`]).
    pub fn failover(mut self, on: bool) -> Self {
        self.config.failover = Some(on);
        self
    }

    /// The primary of a standby source ([`PgSourceConfig::primary`]).
    pub fn primary(mut self, primary: ConnectionConfig) -> Self {
        self.config.primary = Some(primary);
        self
    }

    /// Where a streamed transaction past `stream_memory` is held
    /// ([`PgSourceConfig::stream_spill_dir`]).
    pub fn stream_spill_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.stream_spill_dir = Some(dir.into());
        self
    }

    /// Reconnect backoff and how long reconnecting may go on.
    pub fn reconnect(mut self, backoff: Backoff, deadline: Duration) -> Self {
        self.config.reconnect = backoff;
        self.config.reconnect_deadline = deadline;
        self
    }

    /// The configuration built so far.
    pub fn as_config(&self) -> &PgSourceConfig {
        &self.config
    }

    /// Validates and starts the source ([`PgSource::start`]).
    pub async fn start(self) -> Result<PgSource, PgError> {
        if !self.problems.is_empty() {
            let mut all = self.problems;
            all.extend(self.config.problems());
            return Err(PgError::config(&all));
        }
        PgSource::start(self.config).await
    }
}
