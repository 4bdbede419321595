//! The accept loop: a connection limit that makes room by closing the oldest connection
//! that sent no request (see `lineup`), hyper's header timeout, the guard, graceful shutdown.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

use crate::guard::{Guard, enforce};
use crate::lineup::Lineup;
use crate::{ListenerConfig, with_request_timeout};

/// The shortest pause between two "connection limit reached" warnings.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The connections that may be closed to make room, each with what closes it.
type Waiting = Arc<Mutex<Lineup<oneshot::Sender<()>>>>;

fn lock(w: &Waiting) -> std::sync::MutexGuard<'_, Lineup<oneshot::Sender<()>>> {
    // The lineup is consistent after every call, so a panic elsewhere leaves it usable.
    w.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The listen queue [`bind`] asks for; the kernel caps it at `net.core.somaxconn`
/// (4096 by default since Linux 5.4).
pub const BACKLOG: u32 = 4096;

/// A listener on `addr` (address reuse on, as [`TcpListener::bind`]) with a listen queue
/// of [`BACKLOG`], not tokio's 1024: a connection that finds the queue full has its SYN
/// dropped and retries only after a second, so a flood of a few thousand connections
/// must fit in the queue for a probe to be answered within one. Inside a runtime.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Serves `router` on `listener` with `settings` until `shutdown` completes, then stops
/// accepting, asks every open connection to close after its current request, and
/// returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ListenerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let loopback = listener.local_addr()?.ip().is_loopback();
    let guard = Arc::new(Guard::new(&settings, loopback));
    let mut router = router;
    if let Some(limit) = settings.request_timeout {
        router = with_request_timeout(router, limit);
    }
    let router = router.layer(axum::middleware::from_fn(move |req: Request, next| {
        enforce(guard.clone(), req, next)
    }));
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let waiting: Waiting = Arc::default();
    // Dropped senders tell connections to wind down; dropped receivers show they have.
    let (stop_tx, stop_rx) = watch::channel(());
    let (done_tx, done_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    let mut last_warning: Option<Instant> = None;
    loop {
        // Accept first, then find the connection a place: at the limit, the one accepted
        // here is the only descriptor beyond it, and it takes the place of a connection
        // that sent no request, so a flood of those never keeps a probe waiting.
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(&settings, &e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let mut permit = permits.clone().try_acquire_owned();
        if permit.is_err() {
            // Connections accepted just before may have their request heads waiting
            // unread: let their tasks read them, so they leave the lineup first.
            tokio::task::yield_now().await;
            permit = permits.clone().try_acquire_owned();
        }
        let permit = match permit {
            Ok(p) => p,
            Err(_) => {
                let closed = lock(&waiting).pick().map(|close| close.send(()));
                if last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    last_warning = Some(Instant::now());
                    if closed.is_some() {
                        tracing::warn!(
                            server = settings.name,
                            limit = settings.max_connections,
                            "HTTP connection limit reached: closing the oldest connections that have sent no request to serve new ones"
                        );
                    } else {
                        tracing::warn!(
                            server = settings.name,
                            limit = settings.max_connections,
                            "HTTP connection limit reached: new connections wait in the listen queue until one closes"
                        );
                    }
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let (close_tx, close_rx) = oneshot::channel();
        let id = lock(&waiting).join(close_tx);
        // The permit lives with the socket, so an upgraded WebSocket, which outlives
        // its HTTP connection, still counts against the limit.
        let stream = Counted {
            io: stream,
            _permit: permit,
        };
        // axum's router takes hyper's body as it is; a request head read takes the
        // connection out of the lineup for good.
        let tower = TowerToHyperService::new(router.clone());
        let served = waiting.clone();
        let service = hyper::service::service_fn(move |req| {
            lock(&served).leave(id);
            hyper::service::Service::call(&tower, req)
        });
        let mut stop = stop_rx.clone();
        let done = done_rx.clone();
        let header_timeout = settings.header_timeout;
        let gone = waiting.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            let mut conn = pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                // Chosen to make room: dropping the connection closes its socket.
                Ok(()) = close_rx => {}
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            lock(&gone).leave(id);
            drop(done);
        });
    }
    drop(listener);
    drop(stop_tx);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// A connection's socket and its place under the connection limit.
struct Counted {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Errors from `accept` are about one connection or a passing shortage (descriptors):
/// log and go on, pausing when the process is out of descriptors so as not to spin.
async fn accept_failed(settings: &ListenerConfig, e: &io::Error) {
    use io::ErrorKind::*;
    if matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        return;
    }
    tracing::warn!(server = settings.name, error = %e, "accepting an HTTP connection failed; retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
