//! `FanOutStage`: a view's key fan-outs (a table that does not carry the view's key
//! maps its changed rows' keys to view keys by a query), run as a second debounced
//! stage off the receive path. Not [`crate::fanout`](mod@crate::fanout), which hands batches to several
//! consumers.
//!
//! A parent key is marked staged ([`Key::staged`]) and debounced like any key; when it
//! falls due a fan-out call maps it to view keys, which stream back tagged with the call.
//! Acks chain: each call's view keys take over the oldest batch its parent keys held
//! (`expanding`) before the call's own holds are released, so a transaction is confirmed
//! only once its fan-out and every rebuild it caused are done.

use std::collections::HashMap;
use std::future::Future;

use tokio::sync::mpsc;

use super::jobs::JobOutput;
use super::whole::LargeFanOut;
use crate::ack::BatchId;
use crate::parts::FanOut;
use crate::rebuild::{Due, KeySink};
use crate::{BoxError, Key, Retry, RowEvent};

/// How many fanned keys wait between a fan-out call and the loop: a large fan-out
/// streams through this and never sits in memory whole.
const FANNED_BUFFER: usize = 4096;

/// Keys waiting for a rebuild above which fanned keys are no longer taken in: a fan-out
/// to millions of keys then waits (its query pauses between pages) while rebuilds drain
/// the dirty set, so memory stays bounded whatever the fan-out's size.
pub(super) const FANNED_QUEUE_LIMIT: usize = 65_536;

/// Whether fanned keys are taken in now: while the dirty set is below
/// [`FANNED_QUEUE_LIMIT`], and always when every worker runs a fan-out (none is left
/// to drain the dirty set: waiting would never end).
pub(super) fn takes_fanned(queued: usize, fanning: usize, capacity: usize) -> bool {
    queued < FANNED_QUEUE_LIMIT || fanning >= capacity
}

/// The fan-outs, the channel their calls send view keys on, and the holds those keys
/// take over.
pub(super) struct FanOutStage {
    fanouts: Vec<FanOut>,
    /// Keys sent by running fan-out calls, tagged with the call.
    fanned_tx: mpsc::Sender<(u64, Key)>,
    fanned_rx: mpsc::Receiver<(u64, Key)>,
    /// For each running fan-out call, the oldest batch its parent keys held: the keys it
    /// sends take that hold over before the call's own holds are released.
    expanding: HashMap<u64, Option<BatchId>>,
}

impl FanOutStage {
    pub(super) fn new(fanouts: Vec<FanOut>) -> FanOutStage {
        let (fanned_tx, fanned_rx) = mpsc::channel(FANNED_BUFFER);
        FanOutStage {
            fanouts,
            fanned_tx,
            fanned_rx,
            expanding: HashMap::new(),
        }
    }

    /// How many fan-outs the view has.
    pub(super) fn stages(&self) -> usize {
        self.fanouts.len()
    }

    /// Adds the parent keys `event` dirties in fan-out `stage` to `keys`.
    pub(super) fn scope(&self, stage: usize, event: &RowEvent, keys: &mut Vec<Key>) {
        (self.fanouts[stage].scope)(event, keys);
    }

    /// How many parent keys one call of fan-out `stage` takes.
    pub(super) fn max_batch(&self, stage: usize) -> usize {
        self.fanouts
            .get(stage)
            .map_or(1, |f| f.expand.max_batch().max(1))
    }

    /// Call `call` of fan-out `stage` on the staged parent keys `due`; the view keys it
    /// sends take over `hold` (the oldest batch its parent keys held) until it ends.
    /// With a `limit`, a fan-out that estimates it would send that many keys or more
    /// sends none and answers [`LargeFanOut`]: the whole table is recomputed instead.
    pub(super) fn call(
        &mut self,
        call: u64,
        stage: usize,
        hold: Option<BatchId>,
        due: Vec<Due>,
        limit: Option<u64>,
    ) -> impl Future<Output = JobOutput> + Send + 'static {
        let i = stage;
        let expand = self.fanouts.get(i).map(|f| f.expand.clone());
        self.expanding.insert(call, hold);
        let sink = KeySink::expansion(self.fanned_tx.clone(), call);
        async move {
            let parents: Vec<Due> = due
                .iter()
                .map(|d| Due {
                    key: d.key.stage().map_or_else(|| d.key.clone(), |(_, k)| k),
                    txids: d.txids.clone(),
                })
                .collect();
            if let (Some(limit), Some(e)) = (limit, &expand)
                // An estimate that fails is no answer: the fan-out expands as usual.
                && let Ok(Some(keys)) = e.estimate(&parents).await
                && keys >= limit
            {
                return (due, Err(Box::new(LargeFanOut { keys }) as BoxError));
            }
            let result = match expand {
                Some(e) => e.expand(&parents, &sink).await,
                None => Err(format!("no fan-out {i} in this refresher").into()),
            };
            (due, result)
        }
    }

    /// The hold a key sent by `call` takes over. A call that already finished left no
    /// entry: it failed or was abandoned, and its parent keys kept their holds, so its
    /// stragglers need none.
    pub(super) fn hold(&self, call: u64) -> Option<BatchId> {
        self.expanding.get(&call).copied().flatten()
    }

    /// Waits for keys sent by fan-out calls (up to 1024 into `buf`).
    pub(super) async fn recv(&mut self, buf: &mut Vec<(u64, Key)>) -> usize {
        self.fanned_rx.recv_many(buf, 1024).await
    }

    /// A key already sent, if any, without waiting.
    pub(super) fn try_recv(&mut self) -> Option<(u64, Key)> {
        self.fanned_rx.try_recv().ok()
    }

    /// `call` ended: the keys it sent hold nothing more.
    pub(super) fn finished(&mut self, call: u64) {
        self.expanding.remove(&call);
    }

    /// Whose fault a failed call of fan-out `stage` was; `None` when there is no such
    /// fan-out.
    pub(super) fn classify(&self, stage: usize, error: &BoxError) -> Option<Retry> {
        self.fanouts.get(stage).map(|f| f.expand.classify(error))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ack::AckTracker;
    use crate::rebuild::Expand;
    use crate::{BoxFuture, Op};

    /// Sends `<parent>/a` and `<parent>/b` for each parent.
    struct TwoEach;

    impl Expand for TwoEach {
        fn expand<'a>(
            &'a self,
            due: &'a [Due],
            sink: &'a KeySink,
        ) -> BoxFuture<'a, Result<(), BoxError>> {
            Box::pin(async move {
                for d in due {
                    for leaf in ["a", "b"] {
                        let parent = d.key.as_str().unwrap_or_default();
                        sink.send(Key::new(format!("{parent}/{leaf}"))).await?;
                    }
                }
                Ok(())
            })
        }

        fn max_batch(&self) -> usize {
            7
        }

        fn classify(&self, _: &BoxError) -> Retry {
            Retry::Path
        }
    }

    fn stage() -> FanOutStage {
        FanOutStage::new(vec![FanOut {
            scope: Arc::new(|e: &RowEvent, keys: &mut Vec<Key>| {
                keys.push(Key::new(format!("parent-of-{}", e.table)));
            }),
            expand: Arc::new(TwoEach),
        }])
    }

    fn due(stage: usize, parent: &str, txids: Vec<u64>) -> Due {
        Due {
            key: Key::staged(stage, &Key::new(parent)),
            txids,
        }
    }

    #[test]
    fn fanned_keys_wait_while_the_queue_is_full_unless_every_worker_fans_out() {
        assert!(takes_fanned(0, 0, 4));
        assert!(takes_fanned(FANNED_QUEUE_LIMIT - 1, 0, 4));
        assert!(!takes_fanned(FANNED_QUEUE_LIMIT, 3, 4));
        assert!(takes_fanned(FANNED_QUEUE_LIMIT, 4, 4));
        // Paused (no capacity): nothing could drain the queue either.
        assert!(takes_fanned(FANNED_QUEUE_LIMIT, 0, 0));
    }

    #[test]
    fn scope_and_batch_are_the_fan_outs_own() {
        let f = stage();
        assert_eq!(f.stages(), 1);
        let event = RowEvent::new("public", "dim", Op::Insert);
        let mut keys = Vec::new();
        f.scope(0, &event, &mut keys);
        assert_eq!(keys, vec![Key::new("parent-of-dim")]);
        assert_eq!(f.max_batch(0), 7);
        assert_eq!(f.max_batch(1), 1, "no such fan-out: one key a call");
        assert_eq!(f.classify(0, &"x".into()), Some(Retry::Path));
        assert_eq!(f.classify(1, &"x".into()), None);
    }

    #[tokio::test]
    async fn a_calls_keys_take_over_its_hold_until_it_ends() {
        let mut tracker = AckTracker::new();
        let (older, newer) = (tracker.receive(()), tracker.receive(()));
        let mut f = stage();
        let hold = [newer, older].into_iter().min();
        let call = f.call(5, 0, hold, vec![due(0, "p", vec![9])], None);
        assert_eq!(f.hold(5), Some(older));
        assert_eq!(f.hold(6), None, "not a running call");
        let (dues, result) = call.await;
        assert!(result.is_ok());
        assert_eq!(
            dues,
            vec![due(0, "p", vec![9])],
            "the staged keys come back"
        );
        let mut buf = Vec::new();
        assert_eq!(f.recv(&mut buf).await, 2);
        assert_eq!(
            buf,
            vec![(5, Key::new("p/a")), (5, Key::new("p/b"))],
            "sent with the parent key, tagged with the call"
        );
        f.finished(5);
        assert_eq!(
            f.hold(5),
            None,
            "a straggler of an ended call holds nothing"
        );
        assert_eq!(f.try_recv(), None);
    }

    #[tokio::test]
    async fn a_call_of_a_missing_fan_out_fails() {
        let mut f = stage();
        let (_, result) = f
            .call(0, 3, None, vec![due(3, "p", Vec::new())], None)
            .await;
        assert_eq!(
            result.expect_err("no fan-out 3").to_string(),
            "no fan-out 3 in this refresher"
        );
        assert_eq!(f.hold(0), None);
    }
}
