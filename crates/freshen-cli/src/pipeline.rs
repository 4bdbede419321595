//! One configuration, assembled: a source fanned out to one refresher per view, each
//! sink and the changefeed; the SQL that rebuilds and lists keys; and the health the HTTP
//! endpoints report.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use freshen::plug::{Target, ViewTarget};
use freshen::{Branch, Expand, Rebuild, Refresher, Report, SourceProbe, fanout};
use freshen_changefeed::{AppState, Changefeed};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{Config, Sink, View};
use crate::http::Observe;
use crate::metrics::{SourceStatus, ViewStats};
use crate::role::Role;
use crate::scope::ViewScope;

/// How often the slot's lag is sampled from the server (and the views' freshness, for
/// the recent window).
const LAG_SAMPLE: Duration = Duration::from_secs(5);

/// The window of the recent freshness figures.
pub const RECENT: Duration = Duration::from_secs(60);

/// A sink's run, started with its branch of the source and the shutdown signal.
pub(crate) type SinkRun = Box<
    dyn FnOnce(
            Branch,
            freshen::BoxFuture<'static, ()>,
        ) -> freshen::BoxFuture<'static, anyhow::Result<()>>
        + Send,
>;

/// Sets up `sink` (connects its producer) and returns how to run it, with its snapshot
/// driver (a PostgreSQL source only).
#[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
fn sink_run(
    cfg: &Config,
    sink: &Sink,
) -> anyhow::Result<(SinkRun, Option<crate::sink_snapshot::Driver>)> {
    match *sink {
        #[cfg(feature = "kafka")]
        Sink::Kafka(ref k, ref snapshot) => {
            let s = freshen_kafka::KafkaSink::new(k).context("cannot set up the Kafka sink")?;
            let driver = crate::sink_snapshot::driver(cfg, &k.topic, snapshot)?;
            let splice = driver
                .as_ref()
                .map(|d| crate::sink_snapshot::splice(d.snapshots.clone()));
            let run: SinkRun = Box::new(move |branch, stop| {
                Box::pin(async move {
                    match splice {
                        Some(splice) => s.run_interleaved(branch, splice, stop).await,
                        None => s.run(branch, stop).await,
                    }
                    .map_err(Into::into)
                })
            });
            Ok((run, driver))
        }
    }
}

struct ViewRun {
    name: String,
    stale_after: Option<Duration>,
    refresher: Refresher,
    scope: Arc<ViewScope>,
}

/// A started pipeline: the source is connected (slot and publication exist), statements
/// are prepared, and [`Pipeline::run`] drives it.
pub struct Pipeline {
    views: Vec<ViewRun>,
    sinks: Vec<(SinkRun, Branch)>,
    /// The sinks' snapshot drivers.
    sink_drivers: Vec<crate::sink_snapshot::Driver>,
    changefeed: Option<(Changefeed, Branch, tokio::net::TcpListener, AppState)>,
    /// Where the changefeed's snapshots read from (a PostgreSQL source only).
    snapshots: Option<freshen_changefeed::SnapshotSource>,
    observer: Arc<Observer>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field(
                "views",
                &self.views.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .field("sinks", &self.sinks.len())
            .field("changefeed", &self.changefeed.is_some())
            .finish_non_exhaustive()
    }
}

/// The views' handles and the source's health, for `/metrics`, `/status` and the demo.
pub struct Observer {
    /// Per view: name, handle, scope, and how long a change may wait before the view
    /// counts as stale.
    views: Vec<(String, freshen::Handle, Arc<ViewScope>, Option<Duration>)>,
    source: Arc<dyn SourceProbe>,
    /// The changefeed, for its snapshot progress.
    changefeed: Option<Changefeed>,
    /// The sinks' snapshots, by sink index.
    sink_snapshots: Vec<(usize, freshen_postgres::SinkSnapshots)>,
    running: AtomicBool,
    /// Per view, freshness snapshots of the last [`RECENT`] (oldest first).
    windows: std::sync::Mutex<
        Vec<std::collections::VecDeque<(std::time::Instant, freshen::HistogramSnapshot)>>,
    >,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    /// Records each view's freshness now, keeping what the recent window needs.
    fn sample_windows(&self) {
        let now = std::time::Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for ((_, h, _, _), w) in self.views.iter().zip(windows.iter_mut()) {
            w.push_back((now, h.stats().freshness));
            // Keep one snapshot at or before the window's start.
            while w.len() > 2 && w[1].0 + RECENT <= now {
                w.pop_front();
            }
        }
    }

    /// Each view's freshness since the oldest snapshot of the window.
    fn recent(
        &self,
        i: usize,
        now: &freshen::HistogramSnapshot,
    ) -> Option<freshen::HistogramSnapshot> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (_, oldest) = windows.get(i)?.front()?;
        Some(now.since(oldest))
    }

    /// The source's health handle.
    pub fn source_probe(&self) -> Arc<dyn SourceProbe> {
        self.source.clone()
    }
}

impl Observe for Observer {
    fn handle(&self, view: &str) -> Option<freshen::Handle> {
        self.views
            .iter()
            .find(|(name, ..)| name == view)
            .map(|(_, h, ..)| h.clone())
    }

    fn snapshots(&self) -> Vec<freshen_changefeed::SnapshotProgress> {
        self.changefeed
            .as_ref()
            .map(Changefeed::snapshot_status)
            .unwrap_or_default()
    }

    fn sink_snapshots(&self) -> Vec<crate::sink_snapshot::SinkSnapshotStatus> {
        crate::sink_snapshot::status(&self.sink_snapshots)
    }

    fn sink(&self, index: usize) -> Option<freshen_postgres::SinkSnapshots> {
        self.sink_snapshots
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| s.clone())
    }

    fn views(&self) -> Vec<ViewStats> {
        self.views
            .iter()
            .enumerate()
            .map(|(i, (name, h, scope, stale_after))| {
                let stats = h.stats();
                ViewStats {
                    name: name.clone(),
                    recent: self.recent(i, &stats.freshness),
                    stats,
                    events: scope.events(),
                    stale_after: *stale_after,
                    unscoped: scope.unscoped(),
                    quarantined: h
                        .quarantined()
                        .into_iter()
                        .take(crate::metrics::QUARANTINE_SHOWN)
                        .collect(),
                }
            })
            .collect()
    }

    fn source(&self) -> SourceStatus {
        let h = self.source.health();
        let running = self.running.load(Ordering::Relaxed);
        SourceStatus {
            kind: self.source.kind().into(),
            streaming: h.streaming && running,
            received_lsn: h.received,
            confirmed_lsn: h.confirmed,
            server_lsn: h.head,
            lag_bytes: h.lag_bytes,
            lag_seconds: h.lag_seconds,
            stalled_seconds: h.stalled_for.map(|d| d.as_secs_f64()),
            slot_status: h.retention,
            reconnects: h.reconnects,
            events: h.events,
            last_error: h.last_error,
            partitions: h.partitions,
            problems: h
                .problems
                .into_iter()
                .map(|p| match &p.table {
                    // Name the views that lost the table.
                    Some((schema, table)) => {
                        let t = freshen_postgres::TableName::new(schema, table);
                        let views: Vec<&str> = self
                            .views
                            .iter()
                            .filter(|(_, _, scope, _)| scope.watches(&t))
                            .map(|(n, _, _, _)| n.as_str())
                            .collect();
                        format!("{} (views: {})", p.message, views.join(", "))
                    }
                    None => p.message,
                })
                .collect(),
            discovered: h
                .discovered
                .iter()
                .map(|(schema, table)| format!("{schema}.{table}"))
                .collect(),
        }
    }
}

/// A view's connections to its target, its rebuild and its fan-outs, prepared.
type Prepared = (Box<dyn ViewTarget>, Box<dyn Rebuild>, Vec<Box<dyn Expand>>);

/// `view`'s own connections to `target`.
fn view_target(
    target: &dyn Target,
    view: &View,
    cfg: &Config,
) -> anyhow::Result<Box<dyn ViewTarget>> {
    target
        .view(&crate::targets::spec(view, cfg.target.pool_size))
        .map_err(anyhow::Error::from_boxed)
}

fn refresher(
    view: &View,
    (target, rebuild, fanouts): Prepared,
    source: Box<dyn freshen::Source>,
    ack: freshen::AckPolicy,
    sweep_at_start: bool,
) -> anyhow::Result<ViewRun> {
    let scope = ViewScope::new(view);
    let t = &view.timing;
    let name = view.name.clone();
    let s = scope.clone();
    let mut b = Refresher::builder()
        .source(source)
        .scope(move |e| s.keys(e))
        .rebuild_with(rebuild)
        .coalesce(t.coalesce)
        .max_wait(t.max_wait)
        .workers(t.workers)
        .poison_after(t.poison_after)
        .backoff(t.backoff_base, t.backoff_max)
        .shutdown_grace(t.shutdown_grace)
        .sweep_at_start(sweep_at_start)
        .ack(ack)
        .on_error(move |r: &Report<'_>| match r {
            Report::Poisoned { .. }
            | Report::TruncateIgnored { .. }
            | Report::Stalled { .. }
            | Report::Paused { .. }
            | Report::QuarantineReleased { .. } => {
                tracing::error!(view = %name, "{r}")
            }
            Report::Recovered { .. }
            | Report::Revived { .. }
            | Report::SweepStarted
            | Report::SweepProgress { .. }
            | Report::Swept { .. }
            | Report::Resumed { .. }
            | Report::SchemaChanged { .. } => {
                tracing::info!(view = %name, "{r}")
            }
            _ => tracing::warn!(view = %name, "{r}"),
        });
    b = crate::scope::declare(view, b);
    for (i, fanout) in fanouts.into_iter().enumerate() {
        let s = scope.clone();
        b = b.fan_out(move |e| s.parent_keys(i, e), fanout);
    }
    if let Some(rec) = &view.reconcile {
        b = b.reconcile_with(rec.every, target.enumerate(&rec.keys));
    }
    if let Some(d) = t.release_quarantined_after {
        b = b.release_quarantined_after(d);
    }
    let refresher = b
        .build()
        .map_err(|e| anyhow::anyhow!("view {}: {e}", view.name))?;
    Ok(ViewRun {
        name: view.name.clone(),
        stale_after: view.timing.stale_after,
        refresher,
        scope,
    })
}

impl Pipeline {
    /// Connects, creates or validates what the source needs, prepares every statement.
    pub async fn start(cfg: &Config) -> anyhow::Result<Pipeline> {
        Pipeline::start_keeping(cfg, &[]).await
    }

    /// Like [`start`](Self::start), after a reload: the views named in `unchanged` were
    /// right when the previous pipeline stopped, so they skip the start-up sweep.
    pub async fn start_keeping(cfg: &Config, unchanged: &[String]) -> anyhow::Result<Pipeline> {
        Pipeline::start_as(cfg, unchanged, None).await
    }

    /// Like [`start_keeping`](Self::start_keeping), for one role of a configuration that
    /// spreads its rebuilds (see [`crate::role`]); `None`: everything here.
    pub async fn start_as(
        cfg: &Config,
        unchanged: &[String],
        role: Option<Role>,
    ) -> anyhow::Result<Pipeline> {
        if role == Some(Role::Worker) {
            return Pipeline::start_worker(cfg, unchanged).await;
        }
        let capture = role == Some(Role::Capture);
        let target = if cfg.views.is_empty() || capture {
            None
        } else {
            Some(crate::targets::connect(cfg).await?)
        };
        let mut rebuilds = Vec::new();
        if let Some(target) = &target {
            for view in &cfg.views {
                let on = view_target(&**target, view, cfg)?;
                let rebuild = on.rebuild().await.map_err(anyhow::Error::from_boxed)?;
                let fanouts = on.fanouts().await.map_err(anyhow::Error::from_boxed)?;
                rebuilds.push((on, rebuild, fanouts));
            }
        }
        let mut sinks = Vec::new();
        let mut sink_drivers = Vec::new();
        let mut sink_snapshots = Vec::new();
        if capture {
            sinks.push(crate::role::publisher(cfg).await?);
        }
        for (i, sink) in cfg.sinks.iter().enumerate() {
            let (run, driver) = sink_run(cfg, sink)?;
            sinks.push(run);
            if let Some(d) = driver {
                sink_snapshots.push((i, d.snapshots.clone()));
                sink_drivers.push(d);
            }
        }
        let changefeed = match &cfg.changefeed {
            Some(c) => {
                let cf = Changefeed::open(c)
                    .await
                    .context("cannot open the changefeed")?;
                let state = AppState::new(cf.clone(), &c.http)
                    .context("the changefeed's HTTP settings are not usable")?;
                let addr = c.http.listen;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} for the changefeed"))?;
                Some((cf, listener, state))
            }
            None => None,
        };
        let kind = cfg.source.kind();
        let freshen::plug::Started { source, probe } = cfg
            .source
            .start(&crate::sources::plan(cfg))
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the {kind} source: {e}"))?;
        // A capture instance runs no views: its publisher takes their place.
        let consumers = if capture {
            sinks.len() + usize::from(cfg.changefeed.is_some())
        } else {
            cfg.consumers()
        };
        let mut branches = fanout(source, consumers).into_iter();
        let mut views = Vec::new();
        for (view, rebuild) in cfg.views.iter().zip(rebuilds) {
            let branch = branches.next().expect("one branch per consumer");
            let sweep = !unchanged.contains(&view.name);
            views.push(refresher(view, rebuild, Box::new(branch), cfg.ack, sweep)?);
        }
        let sinks = sinks
            .into_iter()
            .map(|s| (s, branches.next().expect("one branch per consumer")))
            .collect();
        // Snapshots read rows with SQL from a source that can snapshot (PostgreSQL's
        // replication stream), the one whose WAL carries their watermarks.
        let postgres_source = cfg
            .source
            .database_url()
            .filter(|_| cfg.source.capabilities().snapshot);
        let snapshots = match (postgres_source, &cfg.changefeed) {
            (Some(url), Some(_)) => {
                let conn = freshen_postgres::ConnectionConfig::from_url(url)
                    .context("the source URL is not usable")?;
                let pool = freshen_postgres::connect_pool(&conn, 1)
                    .context("cannot set up the snapshot connection")?;
                let tables = cfg
                    .watched_tables()
                    .into_iter()
                    .map(|(schema, table)| freshen_postgres::TableName::new(schema, table))
                    .collect();
                let source = freshen_changefeed::SnapshotSource::new(pool, tables);
                Some(match cfg.source.discovery() {
                    Some(d) => source.discovering(
                        d.patterns
                            .iter()
                            .filter_map(|p| freshen_postgres::TablePattern::parse(p)?.ok())
                            .collect(),
                        d.every,
                    ),
                    None => source,
                })
            }
            (_, Some(c)) if c.snapshot != freshen_changefeed::SnapshotMode::Never => {
                anyhow::bail!("changefeed.snapshot: snapshots read from a PostgreSQL source");
            }
            _ => None,
        };
        let changefeed = changefeed.map(|(cf, listener, state)| {
            let branch = branches.next().expect("one branch per consumer");
            (cf, branch, listener, state)
        });
        Ok(Pipeline::assemble(
            views,
            (sinks, sink_drivers, sink_snapshots),
            changefeed,
            snapshots,
            probe,
        ))
    }

    /// A worker of a spread configuration: the views' keys come from the key stream
    /// (no source, sinks or changefeed here: they run on the capture instance).
    async fn start_worker(cfg: &Config, unchanged: &[String]) -> anyhow::Result<Pipeline> {
        let target = crate::targets::connect(cfg).await?;
        let mut prepared = Vec::new();
        let mut rebuilds = Vec::new();
        for view in &cfg.views {
            let on = view_target(&*target, view, cfg)?;
            rebuilds.push(on.rebuild().await.map_err(anyhow::Error::from_boxed)?);
            prepared.push((on, Vec::new()));
        }
        let worker = crate::role::worker(cfg, rebuilds).await?;
        let mut views = Vec::new();
        for (((view, (on, fanouts)), rebuild), source) in cfg
            .views
            .iter()
            .zip(prepared)
            .zip(worker.rebuilds)
            .zip(worker.sources)
        {
            let sweep = !unchanged.contains(&view.name);
            views.push(refresher(
                view,
                (on, rebuild, fanouts),
                source,
                cfg.ack,
                sweep,
            )?);
        }
        Ok(Pipeline::assemble(
            views,
            (Vec::new(), Vec::new(), Vec::new()),
            None,
            None,
            worker.probe,
        ))
    }

    /// The sinks come with their snapshot drivers and those drivers' progress by sink
    /// number.
    #[allow(clippy::type_complexity)]
    fn assemble(
        views: Vec<ViewRun>,
        (sinks, sink_drivers, sink_snapshots): (
            Vec<(SinkRun, Branch)>,
            Vec<crate::sink_snapshot::Driver>,
            Vec<(usize, freshen_postgres::SinkSnapshots)>,
        ),
        changefeed: Option<(Changefeed, Branch, tokio::net::TcpListener, AppState)>,
        snapshots: Option<freshen_changefeed::SnapshotSource>,
        probe: Arc<dyn SourceProbe>,
    ) -> Pipeline {
        let observer = Arc::new(Observer {
            views: views
                .iter()
                .map(|v| {
                    (
                        v.name.clone(),
                        v.refresher.handle(),
                        v.scope.clone(),
                        v.stale_after,
                    )
                })
                .collect(),
            source: probe,
            changefeed: changefeed.as_ref().map(|(cf, ..)| cf.clone()),
            sink_snapshots,
            running: AtomicBool::new(true),
            windows: std::sync::Mutex::new(vec![std::collections::VecDeque::new(); views.len()]),
        });
        Pipeline {
            views,
            sinks,
            sink_drivers,
            changefeed,
            snapshots,
            observer,
        }
    }

    /// What the HTTP endpoints and the demo read.
    pub fn observer(&self) -> Arc<Observer> {
        self.observer.clone()
    }

    /// Runs every consumer until `shutdown` completes or one of them fails; then stops
    /// the others gracefully (running rebuilds finish, earned acks are confirmed).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks: JoinSet<(String, anyhow::Result<()>)> = JoinSet::new();
        for v in self.views {
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                let r = v.refresher.run(stop).await;
                (format!("view {}", v.name), r.map_err(Into::into))
            });
        }
        for (i, (sink, branch)) in self.sinks.into_iter().enumerate() {
            let stop = Box::pin(stopped(stop_rx.clone()));
            tasks.spawn(async move {
                let r = sink(branch, stop).await;
                (format!("sink {i}"), r)
            });
        }
        for (i, driver) in self.sink_drivers.into_iter().enumerate() {
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                let r = driver.run(stop).await;
                (format!("sink {i} snapshots"), r)
            });
        }
        if let Some((cf, branch, listener, state)) = self.changefeed {
            let stop = stopped(stop_rx.clone());
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(addr = %addr, "serving the changefeed");
            }
            tasks.spawn(async move {
                let r = freshen_changefeed::serve(listener, state, stop).await;
                ("changefeed http".to_string(), r.map_err(Into::into))
            });
            if let Some(source) = self.snapshots {
                let stop = stopped(stop_rx.clone());
                let cf = cf.clone();
                tasks.spawn(async move {
                    let r = cf.run_snapshots(source, stop).await;
                    ("changefeed snapshots".to_string(), r.map_err(Into::into))
                });
            }
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                let r = cf.capture(branch, stop).await;
                cf.close().await;
                ("changefeed".to_string(), r.map(|_| ()).map_err(Into::into))
            });
        }
        let observer = self.observer.clone();
        let mut lag_rx = stop_rx.clone();
        let sampler = tokio::spawn(async move {
            loop {
                observer.sample_windows();
                observer.source.sample().await;
                tokio::select! {
                    _ = tokio::time::sleep(LAG_SAMPLE) => {}
                    _ = lag_rx.wait_for(|s| *s) => break,
                }
            }
        });
        tokio::pin!(shutdown);
        let mut failure = None;
        loop {
            tokio::select! {
                _ = &mut shutdown, if !*stop_tx.borrow() => {
                    tracing::info!("shutting down: finishing running rebuilds");
                    let _ = stop_tx.send(true);
                }
                done = tasks.join_next() => match done {
                    None => break,
                    Some(Ok((name, Ok(())))) => tracing::info!("{name} stopped"),
                    Some(Ok((name, Err(e)))) => {
                        // A library's error may quote what it was given.
                        let e = freshen::redact_text(&format!("{e:#}"));
                        tracing::error!("{name} stopped: {e}");
                        failure.get_or_insert(anyhow::anyhow!("{name}: {e:#}"));
                        let _ = stop_tx.send(true);
                    }
                    Some(Err(e)) => {
                        failure.get_or_insert(anyhow::anyhow!("a task failed: {e}"));
                        let _ = stop_tx.send(true);
                    }
                },
            }
        }
        let _ = stop_tx.send(true);
        let _ = sampler.await;
        self.observer.running.store(false, Ordering::Relaxed);
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
