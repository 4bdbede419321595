//! The pump: reads a source on a task of its own into its consumers' channels, so that
//! a slow source never stalls a consumer and no consumer ever cancels a half-read
//! batch. The refresher runs one for its source, [`fanout`](crate::fanout) one for the
//! consumers it serves; with several, each batch is split into one per consumer whose
//! acknowledgements together acknowledge it ([`split`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::{Ack, Batch, Source, SourceError};

/// Where the pump hands items over: one channel per consumer.
pub(crate) type Outlet = mpsc::Sender<Result<Batch, SourceError>>;

/// Reads `source` into `outlets` until it ends, fails for good
/// ([`SourceError::is_final`]), no consumer reads any more, or `stop` resolves. A
/// [`Retry::Path`](crate::Retry) error reaches every consumer and reading goes on. Then,
/// once `stop` resolves (the consumers have released their last acknowledgements), the
/// source is closed.
pub(crate) async fn pump(
    mut source: Box<dyn Source>,
    outlets: Vec<Outlet>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut stopped = false;
    'read: loop {
        let item = tokio::select! {
            biased;
            () = &mut stop => {
                stopped = true;
                break;
            }
            item = source.next_batch() => item,
        };
        let Some(item) = item else { break };
        let ends = item.as_ref().is_err_and(SourceError::is_final);
        let items: Vec<Result<Batch, SourceError>> = match item {
            Ok(batch) if outlets.len() == 1 => vec![Ok(batch)],
            Ok(batch) => split(batch, outlets.len()).into_iter().map(Ok).collect(),
            Err(e) => outlets.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut reading = 0;
        for (tx, item) in outlets.iter().zip(items) {
            tokio::select! {
                biased;
                () = &mut stop => {
                    stopped = true;
                    break 'read;
                }
                // A consumer that stopped reading drops its share; the others go on.
                sent = tx.send(item) => reading += usize::from(sent.is_ok()),
            }
        }
        if ends || reading == 0 {
            break;
        }
    }
    drop(outlets);
    if !stopped {
        // Close only once the consumers have released their last acks.
        stop.await;
    }
    source.close().await;
}

/// One batch for each of `n` consumers: the same events, and an acknowledgement each;
/// the upstream batch is acknowledged when all `n` are.
pub(crate) fn split(batch: Batch, n: usize) -> Vec<Batch> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BoxFuture, Capabilities, Retry};
    use std::sync::atomic::AtomicBool;

    /// A source of scripted items that records whether it was closed.
    struct Script {
        items: std::vec::IntoIter<Result<Batch, SourceError>>,
        closed: Arc<AtomicBool>,
    }

    impl Source for Script {
        fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
            let item = self.items.next();
            Box::pin(async move {
                match item {
                    Some(item) => Some(item),
                    None => std::future::pending().await,
                }
            })
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::NONE
        }
        fn close(&mut self) -> BoxFuture<'_, ()> {
            self.closed.store(true, Ordering::SeqCst);
            Box::pin(async {})
        }
    }

    fn script(items: Vec<Result<Batch, SourceError>>) -> (Box<dyn Source>, Arc<AtomicBool>) {
        let closed = Arc::new(AtomicBool::new(false));
        let source = Script {
            items: items.into_iter(),
            closed: closed.clone(),
        };
        (Box::new(source), closed)
    }

    fn empty() -> Batch {
        Batch::new(Vec::new(), Ack::none())
    }

    #[tokio::test]
    async fn a_path_error_is_handed_on_and_reading_goes_on_a_final_one_ends_it() {
        let outage = SourceError::msg("connection lost").with_retry(Retry::Path);
        let gone = SourceError::msg("slot invalidated");
        let (source, closed) = script(vec![Err(outage), Ok(empty()), Err(gone), Ok(empty())]);
        let (tx, mut rx) = mpsc::channel(8);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(pump(source, vec![tx], async {
            let _ = stop_rx.await;
        }));
        let first = rx.recv().await.unwrap().unwrap_err();
        assert_eq!(first.retry(), Retry::Path);
        assert!(rx.recv().await.unwrap().is_ok(), "read on after an outage");
        let last = rx.recv().await.unwrap().unwrap_err();
        assert!(last.is_final());
        assert!(rx.recv().await.is_none(), "nothing after a final error");
        assert!(
            !closed.load(Ordering::SeqCst),
            "closed only when told to stop"
        );
        stop_tx.send(()).unwrap();
        task.await.unwrap();
        assert!(closed.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn each_consumer_acknowledges_its_share_and_the_batch_is_acked_once_all_have() {
        let acked = Arc::new(AtomicBool::new(false));
        let a = acked.clone();
        let batch = Batch::new(
            Vec::new(),
            Ack::new(move || a.store(true, Ordering::SeqCst)),
        );
        let mut shares = split(batch, 3);
        for share in shares.drain(..2) {
            share.into_parts().2.ack();
            assert!(!acked.load(Ordering::SeqCst));
        }
        shares.pop().unwrap().into_parts().2.ack();
        assert!(acked.load(Ordering::SeqCst));
    }
}
