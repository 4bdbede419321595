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
use crate::gap_keeping::GapKeeper;
use crate::metrics::{Redacted, SinkStatus, SourceStatus, ViewStats};
use crate::parts::{Part, SinkRun, Stop};
use crate::readout::{Readout, SinkSnapshotStatus, SinkSnapshots};
use crate::role::Role;
use crate::scope::ViewScope;

/// How often the slot's lag is sampled from the server (and the views' freshness, for
/// the recent window).
const LAG_SAMPLE: Duration = Duration::from_secs(5);

/// The window of the recent freshness figures.
pub(crate) const RECENT: Duration = Duration::from_secs(60);

/// A sink set up: how to run it, its snapshots (a source that can take them) and
/// what reads its deliveries for `/metrics` (a kind that reports them).
type SinkParts = (
    SinkRun,
    Option<SinkSnapshots>,
    Option<Arc<dyn freshen::plug::SinkProbe>>,
);

/// Sets up `sink` (connects its producer) and returns how to run it.
fn sink_run(cfg: &Config, sink: &Sink) -> anyhow::Result<SinkParts> {
    // With `[[redact]]`, a sink opens with the rules or refuses to start: never one
    // that publishes clear values.
    let redact = (!cfg.redact.is_empty())
        .then(|| Arc::new(cfg.redact.clone()) as Arc<dyn freshen::plug::Redact>);
    let (s, probe) = sink
        .plug
        .open_probed(redact)
        .map_err(anyhow::Error::from_boxed)
        .with_context(|| format!("cannot set up the {} sink", sink.plug.name()))?;
    let snapshots = crate::sink_snapshot::open(cfg, &sink.plug.identity(), &sink.snapshot)?;
    let splice = snapshots.as_ref().map(|s| s.splice());
    let run: SinkRun = Box::new(move |branch, stop| {
        Box::pin(async move {
            s(branch, splice, stop)
                .await
                .map_err(anyhow::Error::from_boxed)
        })
    });
    Ok((run, snapshots, probe))
}

/// Each sink's `sink` label: where it publishes (its identity, `kafka:<topic>`), made
/// unique by its place in `[[sinks]]` when two share one.
fn sink_labels(cfg: &Config) -> Vec<String> {
    let ids: Vec<String> = cfg.sinks.iter().map(|s| s.plug.identity()).collect();
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            if ids.iter().filter(|other| *other == id).count() > 1 {
                format!("{id}#{i}")
            } else {
                id.clone()
            }
        })
        .collect()
}

/// A consumer of the source: views, sinks, the key publisher and the changefeed alike.
/// Each takes one branch of the source's fan-out (a transaction is confirmed upstream
/// only once every consumer confirmed it) and becomes the parts that run.
trait Consumer: Send {
    /// Takes `branch` and adds this consumer's parts (and what `/status` shows of it).
    fn attach(self: Box<Self>, branch: Branch, topology: &mut Topology) -> anyhow::Result<()>;
}

/// What the consumers became: the parts to run, and what the observer shows of them.
#[derive(Default)]
struct Topology {
    parts: Vec<Part>,
    /// Per view: name, handle, scope, and how long a change may wait before the view
    /// counts as stale.
    views: Vec<ObservedView>,
    /// The changefeed, for its snapshot progress.
    changefeed: Option<Changefeed>,
    /// The sinks' snapshots, by sink index.
    sink_snapshots: Vec<(usize, SinkSnapshots)>,
    /// The sinks that report their deliveries, by label.
    sinks: Vec<ObservedSink>,
    /// The redaction rules, counting what they redact.
    redact: freshen_codec::Redactor,
}

/// A sink as `/metrics` labels it (`sink`, `kind`), and what reads its deliveries.
type ObservedSink = (String, &'static str, Arc<dyn freshen::plug::SinkProbe>);

type ObservedView = (
    String,
    freshen::Handle,
    Arc<ViewScope>,
    Option<Duration>,
    Option<Arc<GapKeeper>>,
);

/// A view, prepared on its target: it becomes a refresher over whichever source it is
/// given (a branch of the source, or a worker's share of the key stream).
struct ViewConsumer {
    view: View,
    /// The `[[redact]]` rules: a key read from a column they hide is shown redacted.
    redact: freshen_codec::Redactor,
    /// Where its unhealed gaps are kept across restarts, and those kept from before
    /// (a view without a reconcile sweep, on a target that keeps them).
    gaps: Option<(Arc<GapKeeper>, Vec<freshen::Gap>)>,
    prepared: Prepared,
    ack: freshen::AckPolicy,
    /// Whether it sweeps at start (not after a reload that left it unchanged).
    sweep: bool,
}

impl ViewConsumer {
    fn new(view: &View, cfg: &Config, unchanged: &[String], prepared: Prepared) -> ViewConsumer {
        ViewConsumer {
            view: view.clone(),
            redact: cfg.redact.clone(),
            gaps: None,
            prepared,
            ack: cfg.ack,
            sweep: !unchanged.contains(&view.name),
        }
    }

    fn run_on(
        self,
        source: Box<dyn freshen::Source>,
        topology: &mut Topology,
    ) -> anyhow::Result<()> {
        let scope = ViewScope::redacted(&self.view, &self.redact);
        let keeper = self.gaps.as_ref().map(|(k, _)| k.clone());
        let source = match self.gaps {
            Some((keeper, kept)) => keeper.source(source, kept),
            None => source,
        };
        let refresher = refresher(
            &self.view,
            &scope,
            self.prepared,
            source,
            self.ack,
            self.sweep,
        )?;
        topology.views.push((
            self.view.name.clone(),
            refresher.handle(),
            scope,
            self.view.timing.stale_after,
            keeper,
        ));
        topology.parts.push(Part::new(
            format!("view {}", self.view.name),
            move |stop| async move { refresher.run(stop).await.map_err(Into::into) },
        ));
        Ok(())
    }
}

impl Consumer for ViewConsumer {
    fn attach(self: Box<Self>, branch: Branch, topology: &mut Topology) -> anyhow::Result<()> {
        self.run_on(Box::new(branch), topology)
    }
}

/// A sink (or the capture role's key publisher), with its snapshots.
struct SinkConsumer {
    /// Its place in `[[sinks]]` (`None`: the key publisher, which has no snapshots).
    index: Option<usize>,
    run: SinkRun,
    snapshots: Option<SinkSnapshots>,
    /// Its `/metrics` labels and probe, for a kind that reports its deliveries.
    observed: Option<ObservedSink>,
}

impl Consumer for SinkConsumer {
    fn attach(self: Box<Self>, branch: Branch, topology: &mut Topology) -> anyhow::Result<()> {
        let name = match self.index {
            Some(i) => format!("sink {i}"),
            None => "key publisher".to_owned(),
        };
        let run = self.run;
        topology
            .parts
            .push(Part::new(name.clone(), move |stop| run(branch, stop)));
        topology.sinks.extend(self.observed);
        if let Some(snapshots) = self.snapshots {
            if let Some(i) = self.index {
                topology.sink_snapshots.push((i, snapshots.clone()));
            }
            topology
                .parts
                .push(Part::new(format!("{name} snapshots"), move |stop| async move {
                    snapshots.run(stop).await.map_err(anyhow::Error::from_boxed)
                }));
        }
        Ok(())
    }
}

/// The changefeed: its writer on the branch, its HTTP listener and its snapshots.
struct ChangefeedConsumer {
    changefeed: Changefeed,
    listener: tokio::net::TcpListener,
    state: AppState,
    /// Where its snapshots read from (a source that can snapshot).
    snapshots: Option<freshen_changefeed::SnapshotSource>,
}

impl Consumer for ChangefeedConsumer {
    fn attach(self: Box<Self>, branch: Branch, topology: &mut Topology) -> anyhow::Result<()> {
        let ChangefeedConsumer {
            changefeed: cf,
            listener,
            state,
            snapshots,
        } = *self;
        topology.changefeed = Some(cf.clone());
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(addr = %addr, "serving the changefeed");
        }
        topology
            .parts
            .push(Part::new("changefeed http", move |stop| async move {
                freshen_changefeed::serve(listener, state, stop)
                    .await
                    .map_err(Into::into)
            }));
        if let Some(source) = snapshots {
            let cf = cf.clone();
            topology
                .parts
                .push(Part::new("changefeed snapshots", move |stop| async move {
                    cf.run_snapshots(source, stop).await.map_err(Into::into)
                }));
        }
        topology
            .parts
            .push(Part::new("changefeed", move |stop| async move {
                let r = cf.capture(branch, stop).await;
                cf.close().await;
                r.map(|_| ()).map_err(Into::into)
            }));
        Ok(())
    }
}

/// A started pipeline: the source is connected (slot and publication exist), statements
/// are prepared, and [`Pipeline::run`] drives it.
pub struct Pipeline {
    parts: Vec<Part>,
    observer: Arc<Observer>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field(
                "parts",
                &self.parts.iter().map(|p| &p.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The views' handles and the source's health, for `/metrics`, `/status` and the demo.
pub struct Observer {
    /// Per view: name, handle, scope, and how long a change may wait before the view
    /// counts as stale.
    views: Vec<ObservedView>,
    source: Arc<dyn SourceProbe>,
    /// The changefeed, for its snapshot progress.
    changefeed: Option<Changefeed>,
    /// The sinks' snapshots, by sink index.
    sink_snapshots: Vec<(usize, SinkSnapshots)>,
    /// The sinks that report their deliveries.
    sinks: Vec<ObservedSink>,
    /// The redaction rules, counting what they redact.
    redact: freshen_codec::Redactor,
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
        for ((_, h, ..), w) in self.views.iter().zip(windows.iter_mut()) {
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

impl Readout for Observer {
    fn view(&self, view: &str) -> Option<crate::readout::AdminView> {
        self.views
            .iter()
            .find(|(name, ..)| name == view)
            .map(|(_, h, scope, _, gaps)| crate::readout::AdminView {
                handle: h.clone(),
                scope: scope.clone(),
                gaps: gaps.clone(),
            })
    }

    fn snapshots(&self) -> Vec<freshen_changefeed::SnapshotProgress> {
        self.changefeed
            .as_ref()
            .map(Changefeed::snapshot_status)
            .unwrap_or_default()
    }

    fn sink_snapshots(&self) -> Vec<SinkSnapshotStatus> {
        crate::sink_snapshot::status(&self.sink_snapshots)
    }

    fn sinks(&self) -> Vec<SinkStatus> {
        self.sinks
            .iter()
            .map(|(name, kind, probe)| SinkStatus {
                name: name.clone(),
                kind,
                report: probe.report(),
            })
            .collect()
    }

    fn redactions(&self) -> Vec<Redacted> {
        Redacted::from_redactor(&self.redact)
    }

    fn sink(&self, index: usize) -> Option<SinkSnapshots> {
        self.sink_snapshots
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| s.clone())
    }

    fn views(&self) -> Vec<ViewStats> {
        self.views
            .iter()
            .enumerate()
            .map(|(i, (name, h, scope, stale_after, keeper))| {
                let mut stats = h.stats();
                if let Some(keeper) = keeper {
                    stats.unhealed_gaps = keeper.unhealed(std::mem::take(&mut stats.unhealed_gaps));
                }
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
                        .map(|mut q| {
                            q.key = scope.show(&q.key);
                            q
                        })
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
                        let views: Vec<&str> = self
                            .views
                            .iter()
                            .filter(|(_, _, scope, ..)| scope.watches(schema, table))
                            .map(|(n, ..)| n.as_str())
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
        .view(&view.spec(cfg.target.pool_size))
        .map_err(anyhow::Error::from_boxed)
}

fn refresher(
    view: &View,
    scope: &Arc<ViewScope>,
    (target, rebuild, fanouts): Prepared,
    source: Box<dyn freshen::Source>,
    ack: freshen::AckPolicy,
    sweep_at_start: bool,
) -> anyhow::Result<Refresher> {
    let t = &view.timing;
    let name = view.name.clone();
    let s = scope.clone();
    let shown = scope.clone();
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
        .rebuild_by(t.rebuild_by)
        .sweep_at_start(sweep_at_start)
        .ack(ack)
        .on_error(move |r: &Report<'_>| log_report(&name, &shown, r));
    b = crate::scope::declare(view, b);
    for (i, fanout) in fanouts.into_iter().enumerate() {
        let s = scope.clone();
        b = b.fan_out(move |e| s.parent_keys(i, e), fanout);
    }
    if let (Some(rec), Some(keys)) = (&view.reconcile, view.reconcile_keys()) {
        b = b.reconcile_with(rec.every, target.enumerate(&keys));
    }
    if let Some(d) = t.release_quarantined_after {
        b = b.release_quarantined_after(d);
    }
    b.build()
        .map_err(|e| anyhow::anyhow!("view {}: {e}", view.name))
}

/// Logs a refresher's report, at its level, with its key as the view shows keys.
fn log_report(view: &str, scope: &ViewScope, r: &Report<'_>) {
    let key = match r {
        Report::RebuildFailed { key, .. }
        | Report::Poisoned { key, .. }
        | Report::Revived { key }
        | Report::QuarantineReleased { key, .. } => Some(scope.show(key)),
        _ => None,
    };
    let shown = match (r, &key) {
        (
            Report::RebuildFailed {
                failures,
                retry_in,
                retry,
                error,
                ..
            },
            Some(key),
        ) => Report::RebuildFailed {
            key,
            failures: *failures,
            retry_in: *retry_in,
            retry: *retry,
            error,
        },
        (
            Report::Poisoned {
                failures,
                holding,
                error,
                ..
            },
            Some(key),
        ) => Report::Poisoned {
            key,
            failures: *failures,
            holding: *holding,
            error,
        },
        (Report::Revived { .. }, Some(key)) => Report::Revived { key },
        (Report::QuarantineReleased { after, .. }, Some(key)) => {
            Report::QuarantineReleased { key, after: *after }
        }
        _ => return log_shown(view, r),
    };
    log_shown(view, &shown);
}

fn log_shown(name: &str, r: &Report<'_>) {
    match r {
        Report::Poisoned { .. }
        | Report::TruncateIgnored { .. }
        | Report::Stalled { .. }
        | Report::Paused { .. }
        | Report::QuarantineReleased { .. } => {
            tracing::error!(view = %name, "{r}")
        }
        Report::Recovered { .. }
        | Report::Revived { .. }
        | Report::WholeStarted { .. }
        | Report::WholeDone { .. }
        | Report::SweepStarted
        | Report::SweepProgress { .. }
        | Report::Swept { .. }
        | Report::Resumed { .. }
        | Report::SchemaChanged { .. } => {
            tracing::info!(view = %name, "{r}")
        }
        _ => tracing::warn!(view = %name, "{r}"),
    }
}

/// `view` prepared on `target`: its own connections, rebuild and fan-outs.
async fn view_consumer(
    target: &dyn Target,
    view: &View,
    cfg: &Config,
    unchanged: &[String],
) -> anyhow::Result<ViewConsumer> {
    let on = view_target(target, view, cfg)?;
    let rebuild = on.rebuild().await.map_err(anyhow::Error::from_boxed)?;
    let fanouts = on.fanouts().await.map_err(anyhow::Error::from_boxed)?;
    let mut consumer = ViewConsumer::new(view, cfg, unchanged, (on, rebuild, fanouts));
    match target.gap_ledger() {
        Some(ledger) => {
            if let Some(keeper) = GapKeeper::for_view(&ledger, view) {
                let kept = keeper
                    .load()
                    .await
                    .map_err(anyhow::Error::from_boxed)
                    .with_context(|| format!("view {}: cannot read its kept gaps", view.name))?;
                consumer.gaps = Some((keeper, kept));
            }
        }
        None if view.reconcile_keys().is_none() => tracing::warn!(
            view = %view.name,
            "this target keeps no unhealed gaps: a restart forgets one (add a reconcile sweep to heal gaps)"
        ),
        None => {}
    }
    Ok(consumer)
}

/// The changefeed opened, its listener bound, and where its snapshots read from.
async fn changefeed_consumer(
    cfg: &Config,
    c: &freshen_changefeed::ChangefeedConfig,
) -> anyhow::Result<ChangefeedConsumer> {
    let changefeed = Changefeed::open(c)
        .await
        .context("cannot open the changefeed")?;
    let changefeed = changefeed.with_redactor(cfg.redact.clone());
    let state = AppState::new(changefeed.clone(), &c.http)
        .context("the changefeed's HTTP settings are not usable")?;
    let addr = c.http.listen;
    let listener = freshen_http::bind(addr)
        .with_context(|| format!("cannot listen on {addr} for the changefeed"))?;
    Ok(ChangefeedConsumer {
        changefeed,
        listener,
        state,
        snapshots: changefeed_snapshots(cfg, c)?,
    })
}

/// Where the changefeed's snapshots read from: the source's chunk reader
/// ([`freshen::plug::SourcePlug::chunk_reader`]; PostgreSQL's replication stream has
/// one), whose stream carries the watermarks.
fn changefeed_snapshots(
    cfg: &Config,
    c: &freshen_changefeed::ChangefeedConfig,
) -> anyhow::Result<Option<freshen_changefeed::SnapshotSource>> {
    let reader = if cfg.source.capabilities().snapshot {
        cfg.source
            .chunk_reader()
            .map_err(anyhow::Error::from_boxed)?
    } else {
        None
    };
    let Some(reader) = reader else {
        if c.snapshot != freshen_changefeed::SnapshotMode::Never {
            anyhow::bail!(
                "changefeed.snapshot: a {} source cannot take snapshots (PostgreSQL's replication stream can); set snapshot = \"never\"",
                cfg.source.kind()
            );
        }
        return Ok(None);
    };
    let source = freshen_changefeed::SnapshotSource::new(reader, cfg.watched_tables());
    Ok(Some(match cfg.source.discovery() {
        Some(d) => source.discovering(d.patterns, d.every),
        None => source,
    }))
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
    /// spreads its rebuilds (see `role.rs`); `None`: everything here.
    ///
    /// The one place a pipeline is assembled: every consumer of the source is set up
    /// first (a view on its target, a sink, the key publisher, the changefeed), then the
    /// source starts with one branch per consumer.
    pub async fn start_as(
        cfg: &Config,
        unchanged: &[String],
        role: Option<Role>,
    ) -> anyhow::Result<Pipeline> {
        // Views rebuilt by `query` watch what it reads: inferred before anything uses
        // their tables (the publication, the key stream, the scopes).
        let completed;
        let cfg = if crate::infer::wanted(cfg) {
            let target = cfg.target.connect(cfg.source.database_url()).await?;
            completed = crate::infer::for_run(cfg, &*target).await?;
            &completed
        } else {
            cfg
        };
        if role == Some(Role::Worker) {
            return Pipeline::start_worker(cfg, unchanged).await;
        }
        let capture = role == Some(Role::Capture);
        let mut consumers: Vec<Box<dyn Consumer>> = Vec::new();
        // A capture instance runs no views: its publisher takes their place.
        if !capture && !cfg.views.is_empty() {
            let target = cfg.target.connect(cfg.source.database_url()).await?;
            for view in &cfg.views {
                consumers.push(Box::new(
                    view_consumer(&*target, view, cfg, unchanged).await?,
                ));
            }
        }
        if capture {
            consumers.push(Box::new(SinkConsumer {
                index: None,
                run: crate::role::publisher(cfg).await?,
                snapshots: None,
                observed: None,
            }));
        }
        let labels = sink_labels(cfg);
        for ((i, sink), label) in cfg.sinks.iter().enumerate().zip(labels) {
            let (run, snapshots, probe) = sink_run(cfg, sink)?;
            consumers.push(Box::new(SinkConsumer {
                index: Some(i),
                run,
                snapshots,
                observed: probe.map(|p| (label, sink.plug.kind(), p)),
            }));
        }
        if let Some(c) = &cfg.changefeed {
            consumers.push(Box::new(changefeed_consumer(cfg, c).await?));
        }
        let kind = cfg.source.kind();
        let freshen::plug::Started { source, probe } = cfg
            .source
            .start(&cfg.plan())
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the {kind} source: {e}"))?;
        let mut topology = Topology {
            redact: cfg.redact.clone(),
            ..Topology::default()
        };
        let branches = fanout(source, consumers.len());
        for (consumer, branch) in consumers.into_iter().zip(branches) {
            consumer.attach(branch, &mut topology)?;
        }
        Ok(Pipeline::assemble(topology, probe))
    }

    /// A worker of a spread configuration: the views' keys come from the key stream
    /// (no source, sinks or changefeed here: they run on the capture instance; nor
    /// fan-outs: their keys arrive mapped).
    async fn start_worker(cfg: &Config, unchanged: &[String]) -> anyhow::Result<Pipeline> {
        let target = cfg.target.connect(cfg.source.database_url()).await?;
        let mut targets = Vec::new();
        let mut rebuilds = Vec::new();
        for view in &cfg.views {
            let on = view_target(&*target, view, cfg)?;
            rebuilds.push(on.rebuild().await.map_err(anyhow::Error::from_boxed)?);
            targets.push(on);
        }
        // Each rebuild fenced by the ownership of its key's partition.
        let worker = crate::role::worker(cfg, rebuilds).await?;
        let mut topology = Topology::default();
        for (((view, on), rebuild), source) in cfg
            .views
            .iter()
            .zip(targets)
            .zip(worker.rebuilds)
            .zip(worker.sources)
        {
            ViewConsumer::new(view, cfg, unchanged, (on, rebuild, Vec::new()))
                .run_on(source, &mut topology)?;
        }
        Ok(Pipeline::assemble(topology, worker.probe))
    }

    fn assemble(topology: Topology, probe: Arc<dyn SourceProbe>) -> Pipeline {
        let Topology {
            parts,
            views,
            changefeed,
            sink_snapshots,
            sinks,
            redact,
        } = topology;
        let windows = vec![std::collections::VecDeque::new(); views.len()];
        let observer = Arc::new(Observer {
            views,
            source: probe,
            changefeed,
            sink_snapshots,
            sinks,
            redact,
            running: AtomicBool::new(true),
            windows: std::sync::Mutex::new(windows),
        });
        Pipeline { parts, observer }
    }

    /// What the HTTP endpoints and the demo read.
    pub fn observer(&self) -> Arc<Observer> {
        self.observer.clone()
    }

    /// Runs every part until `shutdown` completes or one of them fails; then stops
    /// the others gracefully (running rebuilds finish, earned acks are confirmed).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks: JoinSet<(String, anyhow::Result<()>)> = JoinSet::new();
        for part in self.parts {
            let stop: Stop = Box::pin(stopped(stop_rx.clone()));
            let Part { name, run } = part;
            tasks.spawn(async move { (name, run(stop).await) });
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
