//! `freshen run`: the listener first (a standby answers too), then the wait for the
//! active role, then the pipeline — restarted in place by each accepted reload — until
//! a stop signal or a takeover.

use std::process::ExitCode;

use crate::config;
use crate::http;
use crate::readout::Readout;
use crate::role::Role;
use crate::supervisor::{AfterFailure, Restarts};
use crate::{logging, pipeline, standby};

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `freshen run -c path [--role capture|worker]`: until SIGINT/SIGTERM, or until
/// another process takes over.
pub async fn run(path: &std::path::Path, role: Option<Role>) -> anyhow::Result<ExitCode> {
    let cfg = match config::load(path, crate::kinds::builtin()) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    let role = match crate::role::resolve(&cfg, role) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return Ok(ExitCode::from(2));
        }
    };
    logging::init(cfg.log, "info");
    // A rule that matches nothing hides nothing: said once, loudly, but not refused
    // (docs/sources.md, "Redacting columns": why).
    for u in cfg.unmatched_redactions() {
        let line = u.line.map_or_else(String::new, |l| format!(":{l}"));
        tracing::warn!("{}{line}: {}", path.display(), u.message);
    }
    // One stop signal for every phase: waiting as a standby, starting, running.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // The listener serves from the start: a standby answers too.
    let process = std::sync::Arc::new(standby::Process::new(cfg.source.kind()));
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = match &cfg.http {
        Some(h) => {
            let addr = h.listen;
            let listener = freshen_http::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /status, / (status page)");
            let admin = crate::admin::Access::of(addr, h.admin_token.clone());
            if matches!(admin, crate::admin::Access::Off) {
                tracing::info!(
                    "the /admin endpoints are off: the listener is beyond loopback and [http] admin_token is not set"
                );
            }
            let observer: std::sync::Arc<dyn Readout> = process.clone();
            Some(tokio::spawn(http::serve(
                listener,
                observer,
                h.serving.clone(),
                admin,
                async {
                    let _ = http_stopped.await;
                },
            )))
        }
        None => None,
    };
    // SIGHUP and POST /admin/reload re-read the file.
    let (reloader, reloads) =
        crate::reload::Reloader::new(path.to_owned(), cfg.clone(), crate::kinds::builtin());
    let reloader = std::sync::Arc::new(reloader);
    process.set_reloader(reloader.clone());
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match reloader.reload() {
                Ok(c) if c.is_empty() => tracing::info!("reload (SIGHUP): nothing changed"),
                Ok(c) => tracing::info!("reload (SIGHUP) accepted: {c}"),
                Err(e) => tracing::error!(
                    "reload (SIGHUP) refused, the running configuration goes on: {}",
                    freshen::redact_text(&e.0)
                ),
            }
        }
    });
    let target = cfg.target.clone();
    let result = lead_and_run(cfg, role, &process, reloads, stop_rx.clone(), stop(stop_rx)).await;
    let _ = stop_http.send(());
    if let Some(s) = server {
        let _ = s.await;
    }
    // Rebuilds abandoned at shutdown cancel their statements on the server: let those
    // requests go out before the runtime ends.
    if let Ok(kind) = target.kind() {
        kind.settled(std::time::Duration::from_secs(5)).await;
    }
    let Some(observer) = result? else {
        tracing::info!("stopped while standby");
        return Ok(ExitCode::SUCCESS);
    };
    let abandoned: u64 = observer.views().iter().map(|v| v.stats.abandoned).sum();
    if abandoned == 0 {
        tracing::info!("stopped cleanly");
    } else {
        tracing::warn!(
            abandoned,
            "stopped: rebuilds still running after the shutdown grace were cancelled; their changes stay unconfirmed and are replayed after a restart"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits to be the active process, then runs the pipeline until `shutdown` — or until
/// another process took the lease over — restarting it with each accepted reload
/// ([`Restarts`] decides what starts next). `None`: stopped while standby.
async fn lead_and_run(
    cfg: config::Config,
    role: Option<Role>,
    process: &standby::Process,
    mut reloads: tokio::sync::mpsc::UnboundedReceiver<(config::Config, crate::readout::Change)>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<Option<std::sync::Arc<pipeline::Observer>>> {
    // Workers share the work through their consumer group: none waits for another.
    let lease = if role == Some(Role::Worker) {
        Some(None)
    } else {
        standby::lead(&*cfg.source, process, stop_rx)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
    };
    let Some(lease) = lease else {
        return Ok(None);
    };
    let mut restarts = Restarts::new(cfg);
    // Reloads accepted while waiting as a standby: the latest file wins.
    while let Ok((c, _)) = reloads.try_recv() {
        restarts.reloaded_before_start(c);
    }
    let source = restarts.config().source.clone();
    let (taken_tx, mut taken) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        if let Some(lost) = lease {
            let _ = taken_tx.send(standby::keep(source, lost).await);
        } else {
            // No arbiter: never taken over; keep the sender so `taken` never resolves.
            let _keep = taken_tx;
            std::future::pending::<()>().await;
        }
    });
    tokio::pin!(shutdown);
    let mut last: Option<std::sync::Arc<pipeline::Observer>> = None;
    loop {
        // A start can wait long (a slot created on a standby waits for the primary's
        // next standby snapshot): a shutdown ends it, and dropping it cancels what the
        // server was doing for it.
        let started = tokio::select! {
            started = pipeline::Pipeline::start_as(restarts.config(), restarts.unchanged(), role) => started,
            _ = &mut shutdown => {
                tracing::info!("shut down while starting");
                return Ok(last.take());
            }
        };
        let p = match started {
            Ok(p) => {
                restarts.started();
                p
            }
            Err(e) => match restarts.failed() {
                // A reloaded file that validates but cannot start (a statement that does
                // not prepare, a table that is missing): back to the last one that ran.
                AfterFailure::RollBack => {
                    tracing::error!(
                        "reload: the new configuration cannot start, going back to the previous one: {e:#}"
                    );
                    continue;
                }
                // What ran before cannot start again: the database (or a broker) is most
                // likely unreachable. An outage may delay rebuilds, never end the
                // process: wait and try again, the newest accepted configuration first.
                // Nothing was confirmed past what was rebuilt, so the source replays the
                // rest.
                AfterFailure::Wait(delay) => {
                    tracing::error!(
                        "cannot start the pipeline again (trying again in {} s): {e:#}",
                        delay.as_secs()
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = &mut shutdown => return Ok(last.take()),
                        who = &mut taken => match who {
                            Ok(who) => anyhow::bail!("another process took over this configuration ({who})"),
                            Err(_) => return Ok(last.take()),
                        },
                    }
                    restarts.waited();
                    continue;
                }
                AfterFailure::GiveUp => return Err(e),
            },
        };
        let observer = p.observer();
        last = Some(observer.clone());
        process.activate(observer.clone());
        let views: Vec<String> = restarts
            .config()
            .views
            .iter()
            .map(|v| v.name.clone())
            .collect();
        tracing::info!(views = ?views, "running");
        enum Why {
            Shutdown,
            Taken(String),
            Reload(Box<config::Config>, crate::readout::Change),
        }
        let (why_tx, why_rx) = tokio::sync::oneshot::channel::<Why>();
        let stopping = async {
            let why = tokio::select! {
                _ = &mut shutdown => Why::Shutdown,
                who = &mut taken => match who {
                    Ok(who) => Why::Taken(who),
                    Err(_) => Why::Shutdown,
                },
                Some((c, change)) = reloads.recv() => Why::Reload(Box::new(c), change),
            };
            let _ = why_tx.send(why);
        };
        p.run(stopping).await?;
        match why_rx.await {
            Ok(Why::Reload(new, change)) => {
                tracing::info!("reload applied: {change}; restarting the pipeline");
                restarts.reloaded(*new, change.unchanged);
            }
            Ok(Why::Taken(who)) => {
                tracing::error!(active = %who, "another process took over this configuration: stopped");
                anyhow::bail!("another process took over this configuration ({who})");
            }
            Ok(Why::Shutdown) | Err(_) => return Ok(Some(observer)),
        }
    }
}
