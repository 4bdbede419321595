//! One configuration, assembled: a source fanned out to one refresher per view, each
//! sink and the changefeed; the SQL that rebuilds and lists keys; and the health the HTTP
//! endpoints report.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use freshen::{Branch, Refresher, Report, SourceProbe, fanout};
use freshen_changefeed::{AppState, Changefeed};
use freshen_kafka::{KafkaSink, KafkaSource};
use freshen_postgres::{
    ConnectionConfig, PgAdmin, PgHandle, PgSource, Pool, PublicationMode as PgPublicationMode,
    SlotMode as PgSlotMode, SqlEnumerate, SqlFanOut, SqlRebuild, Visibility,
};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{
    Config, PgSource as PgSourceConfig, PublicationMode, Sink, SlotMode, Source, View,
};
use crate::http::Observe;
use crate::metrics::{SourceStatus, ViewStats};
use crate::scope::ViewScope;

/// How often the slot's lag is sampled from the server.
const LAG_SAMPLE: Duration = Duration::from_secs(5);

struct ViewRun {
    name: String,
    refresher: Refresher,
    scope: Arc<ViewScope>,
}

/// A started pipeline: the source is connected (slot and publication exist), statements
/// are prepared, and [`Pipeline::run`] drives it.
pub struct Pipeline {
    views: Vec<ViewRun>,
    sinks: Vec<(KafkaSink, Branch)>,
    changefeed: Option<(Changefeed, Branch, tokio::net::TcpListener, AppState)>,
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
    views: Vec<(String, freshen::Handle, Arc<ViewScope>)>,
    source: Arc<dyn SourceProbe>,
    /// The PostgreSQL source's own handle, for what only it has (the demo's lag).
    postgres: Option<PgHandle>,
    running: AtomicBool,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    /// The PostgreSQL source's handle (health, lag), when the source is PostgreSQL.
    pub fn postgres(&self) -> Option<&PgHandle> {
        self.postgres.as_ref()
    }
}

impl Observe for Observer {
    fn views(&self) -> Vec<ViewStats> {
        self.views
            .iter()
            .map(|(name, h, scope)| ViewStats {
                name: name.clone(),
                stats: h.stats(),
                unscoped: scope.unscoped(),
                quarantined: h
                    .quarantined()
                    .into_iter()
                    .take(crate::metrics::QUARANTINE_SHOWN)
                    .collect(),
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
            slot_status: h.retention,
            reconnects: h.reconnects,
            events: h.events,
            last_error: h.last_error,
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
                            .filter(|(_, _, scope)| scope.watches(&t))
                            .map(|(n, _, _)| n.as_str())
                            .collect();
                        format!("{} (views: {})", p.message, views.join(", "))
                    }
                    None => p.message,
                })
                .collect(),
        }
    }
}

fn connection(url: &str, what: &str) -> anyhow::Result<ConnectionConfig> {
    ConnectionConfig::from_url(url).with_context(|| format!("the {what} URL is not usable"))
}

/// How rebuilds prove they see the changes that dirtied their keys: transaction ids
/// are the source cluster's, so they are checked in the rebuild's snapshot only where
/// the target is that cluster (or a physical standby of it: same system identifier),
/// and on the source otherwise. Broker sources carry no ids of the target's.
async fn visibility(cfg: &Config, target: &Pool) -> anyhow::Result<Visibility> {
    let Source::Postgres(pg) = &cfg.source else {
        return Ok(Visibility::Off);
    };
    if pg.url.expose() == cfg.target.url.expose() {
        return Ok(Visibility::InSnapshot);
    }
    let source = freshen_postgres::connect_pool(&connection(pg.url.expose(), "source")?, 2)
        .context("cannot set up the source connection pool")?;
    let (a, b) = (
        PgAdmin::from_pool(source.clone()).system_identifier().await,
        PgAdmin::from_pool(target.clone()).system_identifier().await,
    );
    Ok(match (a, b) {
        (Ok(a), Ok(b)) if a == b => Visibility::InSnapshot,
        (a, b) => {
            tracing::info!(
                same_cluster = false,
                source = ?a.ok(),
                target = ?b.ok(),
                "the target is another cluster: rebuilds check on the source that the changes are visible before they run"
            );
            Visibility::OnSource(source)
        }
    })
}

/// Prepares a view's fan-out statements, one per watch entry with `keys`.
async fn prepare_fanouts(
    view: &View,
    pool: &Pool,
    visibility: &Visibility,
) -> anyhow::Result<Vec<SqlFanOut>> {
    let mut out = Vec::new();
    for w in view.fanouts() {
        let sql = w.keys.clone().unwrap_or_default();
        let fanout = SqlFanOut::builder(pool.clone(), sql)
            .arity(view.arity())
            .parent_arity(w.key.len())
            .visibility(visibility.clone())
            .build()
            .await
            .with_context(|| {
                format!(
                    "view {}: the `keys` statement of {} is not usable",
                    view.name,
                    w.qualified()
                )
            })?;
        out.push(fanout);
    }
    Ok(out)
}

/// Prepares a view's rebuild statements (before anything starts streaming).
async fn prepare(view: &View, pool: &Pool, visibility: &Visibility) -> anyhow::Result<SqlRebuild> {
    let mut rebuild = SqlRebuild::builder(pool.clone())
        .statements(view.rebuild.iter().cloned())
        .visibility(visibility.clone())
        .keys_per_transaction(view.keys_per_transaction);
    if let Some(n) = view.rebuild_batch {
        rebuild = rebuild.batch(n);
    }
    rebuild
        .build()
        .await
        .with_context(|| format!("view {}: the rebuild statements are not usable", view.name))
}

fn refresher(
    view: &View,
    (rebuild, fanouts): (SqlRebuild, Vec<SqlFanOut>),
    source: Branch,
    pool: &Pool,
    ack: freshen::AckPolicy,
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
        .ack(ack)
        .on_error(move |r: &Report<'_>| match r {
            Report::Poisoned { .. }
            | Report::TruncateIgnored { .. }
            | Report::Stalled { .. }
            | Report::QuarantineReleased { .. } => {
                tracing::error!(view = %name, "{r}")
            }
            Report::Recovered { .. } | Report::Revived { .. } => {
                tracing::info!(view = %name, "{r}")
            }
            _ => tracing::warn!(view = %name, "{r}"),
        });
    for (i, fanout) in fanouts.into_iter().enumerate() {
        let s = scope.clone();
        b = b.fan_out(move |e| s.parent_keys(i, e), fanout);
    }
    if let Some(rec) = &view.reconcile {
        b = b.reconcile_with(rec.every, SqlEnumerate::new(pool.clone(), rec.keys.clone()));
    }
    if let Some(d) = t.release_quarantined_after {
        b = b.release_quarantined_after(d);
    }
    let refresher = b
        .build()
        .map_err(|e| anyhow::anyhow!("view {}: {e}", view.name))?;
    Ok(ViewRun {
        name: view.name.clone(),
        refresher,
        scope,
    })
}

/// Starts the PostgreSQL source: warns about weak replica identity, creates or validates
/// the publication (marking one it creates as freshen's) and the slot.
async fn start_postgres(cfg: &Config, pg: &PgSourceConfig) -> anyhow::Result<PgSource> {
    let slot_mode = match pg.slot_mode {
        SlotMode::Create => PgSlotMode::CreateIfMissing,
        SlotMode::Existing => PgSlotMode::MustExist,
        SlotMode::Temporary => PgSlotMode::Temporary,
    };
    let publication_mode = match pg.publication_mode {
        PublicationMode::Create => PgPublicationMode::CreateIfMissing,
        PublicationMode::Existing => PgPublicationMode::MustExist,
    };
    let source_conn = connection(pg.url.expose(), "source")?;
    let admin = PgAdmin::connect(&source_conn)
        .await
        .context("cannot connect to the source database")?;
    for view in &cfg.views {
        for w in &view.watch {
            let table = freshen_postgres::TableName::new(&w.schema, &w.table);
            let cols: Vec<&str> = w.key.iter().map(String::as_str).collect();
            match admin.check_replica_identity(&table, &cols).await {
                Ok(c) if !c.carries_old_scope => {
                    tracing::warn!(view = %view.name, "{}", c.advice.unwrap_or_default())
                }
                Ok(_) => {}
                Err(e) => anyhow::bail!("view {}: {e}", view.name),
            }
        }
    }
    let mut builder = PgSource::builder()
        .connection(source_conn)
        .slot(pg.slot.clone(), slot_mode)
        .publication(pg.publication.clone(), publication_mode)
        .status_interval(pg.status_interval);
    for (schema, table) in cfg.watched_tables() {
        builder = builder.table_name(freshen_postgres::TableName::new(&schema, &table));
    }
    let source = builder
        .start()
        .await
        .context("cannot start the PostgreSQL source")?;
    Ok(source)
}

impl Pipeline {
    /// Connects, creates or validates what the source needs, prepares every statement.
    pub async fn start(cfg: &Config) -> anyhow::Result<Pipeline> {
        let pool = if cfg.views.is_empty() {
            None
        } else {
            let target = connection(cfg.target.url.expose(), "target")?;
            Some(
                freshen_postgres::connect_pool(&target, cfg.target.pool_size)
                    .context("cannot set up the target connection pool")?,
            )
        };
        let mut rebuilds = Vec::new();
        if let Some(pool) = &pool {
            let visibility = visibility(cfg, pool).await?;
            for view in &cfg.views {
                rebuilds.push((
                    prepare(view, pool, &visibility).await?,
                    prepare_fanouts(view, pool, &visibility).await?,
                ));
            }
        }
        let mut sinks = Vec::new();
        for Sink::Kafka(k) in &cfg.sinks {
            sinks.push(KafkaSink::new(k).context("cannot set up the Kafka sink")?);
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
        let (source, probe, postgres): (Box<dyn freshen::Source>, Arc<dyn SourceProbe>, _) =
            match &cfg.source {
                Source::Postgres(pg) => {
                    let s = start_postgres(cfg, pg).await?;
                    let h = s.handle();
                    (Box::new(s), Arc::new(h.clone()), Some(h))
                }
                Source::Kafka(k) => {
                    let s = KafkaSource::new(k).context("cannot start the Kafka source")?;
                    let h = s.stats_handle();
                    (Box::new(s), Arc::new(h), None)
                }
                Source::Pulsar(p) => {
                    let s = freshen_pulsar::PulsarSource::new((**p).clone())
                        .context("cannot start the Pulsar source")?;
                    let h = s.stats_handle();
                    (Box::new(s), Arc::new(h), None)
                }
            };
        let mut branches = fanout(source, cfg.consumers()).into_iter();
        let mut views = Vec::new();
        for (view, rebuild) in cfg.views.iter().zip(rebuilds) {
            let branch = branches.next().expect("one branch per consumer");
            views.push(refresher(
                view,
                rebuild,
                branch,
                pool.as_ref().expect("pool"),
                cfg.ack,
            )?);
        }
        let sinks = sinks
            .into_iter()
            .map(|s| (s, branches.next().expect("one branch per consumer")))
            .collect();
        let changefeed = changefeed.map(|(cf, listener, state)| {
            let branch = branches.next().expect("one branch per consumer");
            (cf, branch, listener, state)
        });
        let observer = Arc::new(Observer {
            views: views
                .iter()
                .map(|v| (v.name.clone(), v.refresher.handle(), v.scope.clone()))
                .collect(),
            source: probe,
            postgres,
            running: AtomicBool::new(true),
        });
        Ok(Pipeline {
            views,
            sinks,
            changefeed,
            observer,
        })
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
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                let r = sink.run(branch, stop).await;
                (format!("sink {i}"), r.map_err(Into::into))
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
            let stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                let r = cf.capture(branch, stop).await;
                cf.close().await;
                ("changefeed".to_string(), r.map(|_| ()).map_err(Into::into))
            });
        }
        let probe = self.observer.source.clone();
        let mut lag_rx = stop_rx.clone();
        let sampler = tokio::spawn(async move {
            loop {
                probe.sample().await;
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
