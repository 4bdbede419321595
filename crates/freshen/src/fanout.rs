//! `fanout`: one source feeding several consumers (views, a changefeed, a sink), with a
//! batch acknowledged upstream only when every consumer has acknowledged it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use crate::{Ack, Batch, BoxFuture, Capabilities, Source, SourceError};

struct Start {
    source: Box<dyn Source>,
    senders: Vec<mpsc::Sender<Result<Batch, SourceError>>>,
}

struct Shared {
    /// Taken by the first branch to read, which starts the pump.
    start: Mutex<Option<Start>>,
    open: AtomicUsize,
    all_closed: Notify,
}

/// One consumer's view of a [`fanout`] source.
pub struct Branch {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    shared: Arc<Shared>,
    capabilities: Capabilities,
    closed: bool,
}

impl std::fmt::Debug for Branch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Branch").finish_non_exhaustive()
    }
}

/// Splits `source` into `branches` sources that each see every batch.
///
/// Each branch acknowledges independently; the upstream batch is acknowledged once all
/// branches have. Because every branch acknowledges in order, so does the fan-out. A
/// slow branch slows the others (bounded buffers, no unbounded queue). Undecodable
/// messages are reported on every branch; a fatal source error reaches every branch.
/// The source is closed when the last branch closes.
pub fn fanout(source: impl Source, branches: usize) -> Vec<Branch> {
    let capabilities = source.capabilities();
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..branches).map(|_| mpsc::channel(4)).unzip();
    let shared = Arc::new(Shared {
        start: Mutex::new(Some(Start {
            source: Box::new(source),
            senders,
        })),
        open: AtomicUsize::new(branches),
        all_closed: Notify::new(),
    });
    receivers
        .into_iter()
        .map(|rx| Branch {
            rx,
            shared: shared.clone(),
            capabilities,
            closed: false,
        })
        .collect()
}

fn split(batch: Batch, n: usize) -> Vec<Batch> {
    let marks = batch.marks().to_vec();
    let gaps = batch.gaps().to_vec();
    let changes = batch.schema_changes().to_vec();
    let keys = batch.keys().to_vec();
    let committed = batch.committed_through();
    let (events, skipped, ack) = batch.into_parts();
    let remaining = Arc::new(AtomicUsize::new(n));
    let upstream = Arc::new(Mutex::new(Some(ack)));
    (0..n)
        .map(|_| {
            let remaining = remaining.clone();
            let upstream = upstream.clone();
            let ack = Ack::new(move || {
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let ack = upstream.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(ack) = ack {
                        ack.ack();
                    }
                }
            });
            skipped.iter().fold(
                Batch::shared(events.clone(), ack)
                    .with_marks(marks.clone())
                    .with_gaps(gaps.clone())
                    .with_schema_changes(changes.clone())
                    .with_keys(keys.clone())
                    .with_committed_through(committed),
                |b, e| b.with_skipped(e.to_string()),
            )
        })
        .collect()
}

async fn pump(start: Start, shared: Arc<Shared>) {
    let Start {
        mut source,
        senders,
    } = start;
    let closed = shared.all_closed.notified();
    tokio::pin!(closed);
    loop {
        let item = tokio::select! {
            _ = &mut closed => break,
            item = source.next_batch() => item,
        };
        let Some(item) = item else { break };
        let fatal = item.is_err();
        let items: Vec<Result<Batch, SourceError>> = match item {
            Ok(batch) => split(batch, senders.len()).into_iter().map(Ok).collect(),
            Err(e) => senders.iter().map(|_| Err(e.clone())).collect(),
        };
        for (tx, item) in senders.iter().zip(items) {
            // A branch that stopped reading drops its share; the others go on.
            let _ = tx.send(item).await;
        }
        if fatal {
            break;
        }
    }
    drop(senders);
    closed.await;
    source.close().await;
}

impl Source for Branch {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        let start = self
            .shared
            .start
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(start) = start {
            tokio::spawn(pump(start, self.shared.clone()));
        }
        Box::pin(self.rx.recv())
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        if !self.closed {
            self.closed = true;
            self.rx.close();
            if self.shared.open.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.shared.all_closed.notify_one();
            }
        }
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamMark;

    #[tokio::test]
    async fn every_branch_gets_the_stream_marks_and_the_transactions_end() {
        let (feed, source) = crate::channel(2);
        let mut branches = fanout(source, 2);
        let mark = StreamMark {
            at: 0,
            prefix: "p".into(),
            content: b"c"[..].into(),
            position: 9,
        };
        feed.send(
            Batch::new(Vec::new(), Ack::none())
                .with_marks(vec![mark.clone()])
                .with_committed_through(Some(7)),
        )
        .await
        .unwrap();
        for b in &mut branches {
            let got = b.next_batch().await.unwrap().unwrap();
            assert_eq!(got.marks(), std::slice::from_ref(&mark));
            assert_eq!(got.committed_through(), Some(7));
        }
    }
}
