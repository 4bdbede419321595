//! `fanout`: one source feeding several consumers (views, a changefeed, a sink), with a
//! batch acknowledged upstream only when every consumer has acknowledged it. Several
//! consumers are fed by one [`pump`](crate::pump) task; a single consumer reads the
//! source itself, with no task or channel between them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use crate::pump::{Outlet, pump};
use crate::{Batch, BoxFuture, Capabilities, Source, SourceError};

struct Start {
    source: Box<dyn Source>,
    outlets: Vec<Outlet>,
}

struct Shared {
    /// Taken by the first branch to read, which starts the pump.
    start: Mutex<Option<Start>>,
    open: AtomicUsize,
    all_closed: Notify,
}

/// How a branch reads.
enum Feed {
    /// The only consumer: the source itself.
    Alone(Box<dyn Source>),
    /// One of several: its channel from the pump.
    Pumped {
        rx: mpsc::Receiver<Result<Batch, SourceError>>,
        shared: Arc<Shared>,
        closed: bool,
    },
}

/// One consumer's view of a [`fanout`] source.
pub struct Branch {
    feed: Feed,
    capabilities: Capabilities,
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
/// messages are reported on every branch; a source error reaches every branch (after a
/// [`Retry::Path`](crate::Retry) one the source is read on). The source is closed when
/// the last branch closes. One branch is the source itself.
pub fn fanout(source: impl Source, branches: usize) -> Vec<Branch> {
    let capabilities = source.capabilities();
    if branches == 1 {
        return vec![Branch {
            feed: Feed::Alone(Box::new(source)),
            capabilities,
        }];
    }
    let (outlets, receivers): (Vec<_>, Vec<_>) = (0..branches).map(|_| mpsc::channel(4)).unzip();
    let shared = Arc::new(Shared {
        start: Mutex::new(Some(Start {
            source: Box::new(source),
            outlets,
        })),
        open: AtomicUsize::new(branches),
        all_closed: Notify::new(),
    });
    receivers
        .into_iter()
        .map(|rx| Branch {
            feed: Feed::Pumped {
                rx,
                shared: shared.clone(),
                closed: false,
            },
            capabilities,
        })
        .collect()
}

impl Source for Branch {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        match &mut self.feed {
            Feed::Alone(source) => source.next_batch(),
            Feed::Pumped { rx, shared, .. } => {
                let start = shared
                    .start
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(Start { source, outlets }) = start {
                    let shared = shared.clone();
                    tokio::spawn(pump(source, outlets, async move {
                        shared.all_closed.notified().await;
                    }));
                }
                Box::pin(rx.recv())
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        match &mut self.feed {
            Feed::Alone(source) => source.close(),
            Feed::Pumped { rx, shared, closed } => {
                if !*closed {
                    *closed = true;
                    rx.close();
                    if shared.open.fetch_sub(1, Ordering::AcqRel) == 1 {
                        shared.all_closed.notify_one();
                    }
                }
                Box::pin(async {})
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ack, StreamMark};

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

    #[tokio::test]
    async fn a_single_branch_reads_the_source_itself() {
        let (feed, source) = crate::channel(2);
        let mut branches = fanout(source, 1);
        assert!(
            matches!(branches[0].feed, Feed::Alone(_)),
            "no pump for one consumer"
        );
        feed.send(Batch::new(Vec::new(), Ack::none()).with_committed_through(Some(3)))
            .await
            .unwrap();
        let got = branches[0].next_batch().await.unwrap().unwrap();
        assert_eq!(got.committed_through(), Some(3));
    }

    #[tokio::test]
    async fn an_outage_reaches_every_branch_and_they_read_on() {
        let (feed, source) = crate::channel(2);
        let mut branches = fanout(source, 2);
        let outage = SourceError::msg("down").with_retry(crate::Retry::Path);
        feed.fail(outage).await.unwrap();
        feed.send(Batch::new(Vec::new(), Ack::none()))
            .await
            .unwrap();
        for b in &mut branches {
            let e = b.next_batch().await.unwrap().unwrap_err();
            assert!(!e.is_final());
            assert!(b.next_batch().await.unwrap().is_ok());
        }
    }
}
