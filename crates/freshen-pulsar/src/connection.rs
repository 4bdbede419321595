//! `Connection`: one TCP connection to a broker — the handshake, requests matched to
//! their answers by request id, pings answered, everything else handed to the owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::Error;
use crate::frame::{self, Frame};
use crate::proto::{self, BaseCommand, CommandConnect, kind};

/// How long a request may wait for its answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<BaseCommand>>>>;

/// What the broker sends unasked.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A MESSAGE frame (an entry: one message or a batch).
    Message(Box<Frame>),
    /// A SEND_RECEIPT or SEND_ERROR for a producer.
    Send(Box<BaseCommand>),
    /// The broker made a failover consumer active or standby.
    ActiveChange(bool),
    /// The broker closed a consumer or producer (topic moved, unloaded): subscribe again.
    Closed(String),
}

/// A cloneable way to send frames on a connection (acknowledgements, flow permits).
#[derive(Debug, Clone)]
pub(crate) struct Sender(mpsc::UnboundedSender<Bytes>);

impl Sender {
    /// Queues `cmd`; false when the connection is gone.
    pub(crate) fn send(&self, cmd: &BaseCommand) -> bool {
        self.0.send(frame::encode(cmd)).is_ok()
    }

    /// Queues an already-encoded frame.
    pub(crate) fn send_frame(&self, frame: Bytes) -> bool {
        self.0.send(frame).is_ok()
    }
}

/// A connected, handshaken broker connection. Dropping it closes it.
#[derive(Debug)]
pub(crate) struct Connection {
    sender: Sender,
    pending: Pending,
    next_request: AtomicU64,
    inbound: mpsc::UnboundedReceiver<Inbound>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `host:port` of a `pulsar://host:port` URL (one of a comma-separated list).
pub(crate) fn addresses(url: &str) -> Result<Vec<String>, String> {
    let rest = url.strip_prefix("pulsar://").ok_or_else(|| {
        format!("{url:?} is not a pulsar:// URL (TLS, pulsar+ssl://, is not supported)")
    })?;
    let rest = rest.trim_end_matches('/');
    let hosts: Vec<String> = rest
        .split(',')
        .map(|h| {
            if h.contains(':') {
                h.to_owned()
            } else {
                format!("{h}:6650")
            }
        })
        .filter(|h| !h.starts_with(':'))
        .collect();
    if hosts.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    Ok(hosts)
}

impl Connection {
    /// Connects to `addr` (`host:port`) and completes the handshake, sending `token`
    /// (if any) as the `token` authentication.
    pub(crate) async fn open(addr: &str, token: Option<&str>) -> Result<Connection, Error> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Timeout("the TCP connect"))??;
        stream.set_nodelay(true)?;
        let (mut read, mut write) = stream.into_split();
        let connect = BaseCommand {
            connect: Some(CommandConnect {
                client_version: concat!("freshen-pulsar-", env!("CARGO_PKG_VERSION")).into(),
                protocol_version: Some(proto::PROTOCOL_VERSION),
                auth_method_name: token.map(|_| "token".to_owned()),
                auth_data: token.map(|t| t.as_bytes().to_vec()),
            }),
            ..BaseCommand::of(kind::CONNECT)
        };
        write.write_all(&frame::encode(&connect)).await?;
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let first = tokio::time::timeout(REQUEST_TIMEOUT, read_frame(&mut read, &mut buf))
            .await
            .map_err(|_| Error::Timeout("the handshake"))??;
        match first.command.r#type {
            kind::CONNECTED => {}
            kind::ERROR => {
                let e = first.command.error.unwrap_or_default();
                return Err(Error::Server {
                    code: e.error,
                    message: e.message,
                });
            }
            other => {
                return Err(Error::Protocol(format!(
                    "expected CONNECTED, got command {other}"
                )));
            }
        }

        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Bytes>();
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::default();
        let writer = tokio::spawn(async move {
            while let Some(frame) = out_rx.recv().await {
                if write.write_all(&frame).await.is_err() {
                    break;
                }
            }
        });
        let reader = tokio::spawn(read_loop(
            read,
            buf,
            Sender(out_tx.clone()),
            pending.clone(),
            in_tx,
        ));
        Ok(Connection {
            sender: Sender(out_tx),
            pending,
            next_request: AtomicU64::new(1),
            inbound: in_rx,
            tasks: [reader, writer],
        })
    }

    /// A handle for sending frames.
    pub(crate) fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// Sends the command `build(request_id)` and waits for its answer; a broker ERROR
    /// becomes [`Error::Server`].
    pub(crate) async fn request(
        &self,
        build: impl FnOnce(u64) -> BaseCommand,
    ) -> Result<BaseCommand, Error> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if !self.sender.send(&build(id)) {
            lock(&self.pending).remove(&id);
            return Err(Error::Protocol("the connection is closed".into()));
        }
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, rx).await;
        lock(&self.pending).remove(&id);
        let answer = answer
            .map_err(|_| Error::Timeout("a request"))?
            .map_err(|_| Error::Protocol("the connection closed before the answer".into()))?;
        if answer.r#type == kind::ERROR {
            let e = answer.error.unwrap_or_default();
            return Err(Error::Server {
                code: e.error,
                message: e.message,
            });
        }
        Ok(answer)
    }

    /// The next unasked frame; `Inbound::Closed` once the connection is gone.
    pub(crate) async fn next(&mut self) -> Inbound {
        self.inbound
            .recv()
            .await
            .unwrap_or_else(|| Inbound::Closed("the connection closed".into()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn read_frame(
    read: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
) -> Result<Frame, Error> {
    loop {
        if let Some(f) = frame::decode(buf).map_err(|e| Error::Protocol(e.to_string()))? {
            return Ok(f);
        }
        if read.read_buf(buf).await? == 0 {
            return Err(Error::Protocol("the broker closed the connection".into()));
        }
    }
}

/// The request id an answer refers to.
fn answer_to(cmd: &BaseCommand) -> Option<u64> {
    match cmd.r#type {
        kind::SUCCESS => cmd.success.as_ref().map(|c| c.request_id),
        kind::ERROR => cmd.error.as_ref().map(|c| c.request_id),
        kind::PRODUCER_SUCCESS => cmd.producer_success.as_ref().map(|c| c.request_id),
        kind::LOOKUP_RESPONSE => cmd.lookup_topic_response.as_ref().map(|c| c.request_id),
        _ => None,
    }
}

async fn read_loop(
    mut read: tokio::net::tcp::OwnedReadHalf,
    mut buf: BytesMut,
    sender: Sender,
    pending: Pending,
    inbound: mpsc::UnboundedSender<Inbound>,
) {
    let reason = loop {
        let frame = match read_frame(&mut read, &mut buf).await {
            Ok(f) => f,
            Err(e) => break e.to_string(),
        };
        let cmd = &frame.command;
        if let Some(id) = answer_to(cmd) {
            if let Some(tx) = lock(&pending).remove(&id) {
                let _ = tx.send(frame.command);
            }
            continue;
        }
        let event = match cmd.r#type {
            kind::PING => {
                sender.send(&pong());
                continue;
            }
            kind::MESSAGE => Inbound::Message(Box::new(frame)),
            kind::SEND_RECEIPT | kind::SEND_ERROR => Inbound::Send(Box::new(frame.command)),
            kind::ACTIVE_CONSUMER_CHANGE => Inbound::ActiveChange(
                cmd.active_consumer_change
                    .as_ref()
                    .and_then(|c| c.is_active)
                    .unwrap_or(false),
            ),
            kind::CLOSE_CONSUMER => Inbound::Closed("the broker closed the consumer".into()),
            kind::CLOSE_PRODUCER => Inbound::Closed("the broker closed the producer".into()),
            _ => continue,
        };
        if inbound.send(event).is_err() {
            return;
        }
    };
    // Requests waiting for answers fail now (their senders drop with the map entries).
    lock(&pending).clear();
    let _ = inbound.send(Inbound::Closed(reason));
}

/// The answer to a broker's PING. The (empty) pong body must be present on the wire:
/// brokers drop a connection whose PONG lacks it.
fn pong() -> BaseCommand {
    BaseCommand {
        pong: Some(crate::proto::CommandPong {}),
        ..BaseCommand::of(kind::PONG)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls() {
        assert_eq!(
            addresses("pulsar://127.0.0.1:6650").unwrap(),
            ["127.0.0.1:6650"]
        );
        assert_eq!(
            addresses("pulsar://a,b:7000/").unwrap(),
            ["a:6650", "b:7000"]
        );
        assert!(addresses("pulsar+ssl://a:6651").is_err());
        assert!(addresses("http://a").is_err());
        assert!(addresses("pulsar://").is_err());
    }

    #[test]
    fn a_pong_keeps_its_empty_body_on_the_wire() {
        use prost::Message as _;
        let bytes = pong().encode_to_vec();
        let back = BaseCommand::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.r#type, kind::PONG);
        assert!(back.pong.is_some(), "the pong field must survive encoding");
        let bare =
            BaseCommand::decode(BaseCommand::of(kind::PONG).encode_to_vec().as_slice()).unwrap();
        assert!(
            bare.pong.is_none(),
            "without it the broker sees no pong body"
        );
    }
}
