//! The consumer's callbacks: rebalances and commit results update the offset tracker.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use crate::fence::Fences;
use crate::offsets::{Offsets, Tp};
use crate::stats::{SourceCounters, SourceStats, add};

/// State shared by the consumer's callbacks, the source and the acknowledgements.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) offsets: Mutex<Offsets>,
    pub(crate) counters: SourceCounters,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    pub(crate) fn offsets(&self) -> MutexGuard<'_, Offsets> {
        // A panic elsewhere while holding the lock leaves plain data behind; go on.
        self.offsets.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn last_error(&self) -> MutexGuard<'_, Option<String>> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn snapshot(&self) -> SourceStats {
        let mut s = self.counters.snapshot();
        s.last_error = self.last_error().clone();
        s
    }
}

#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) shared: Arc<Shared>,
    /// A key stream worker's fence: revoked partitions stop their rebuilds first.
    pub(crate) fencing: Option<Arc<Fencing>>,
}

/// A key stream worker's fence and how long a revocation waits on it.
#[derive(Debug)]
pub(crate) struct Fencing {
    pub(crate) fences: Fences,
    pub(crate) topic: String,
    pub(crate) revoke_timeout: Duration,
}

impl Fencing {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }

    /// Before revoked partitions go: no rebuild of their keys starts any more, and the
    /// running ones are waited for (up to the revoke timeout), so that the next owner
    /// never rebuilds a key while this instance still does.
    fn revoke(&self, tpl: &TopicPartitionList, shared: &Shared) {
        let parts = self.partitions(tpl);
        self.fences.lock().revoke(parts.iter().copied());
        if self.fences.lock().running(&parts) == 0 {
            return;
        }
        add(&shared.counters.revoke_waits, 1);
        let wait = || self.fences.wait_idle(&parts, self.revoke_timeout);
        // The callback runs on the task polling the consumer: on a multi-threaded
        // runtime, hand that worker's other tasks (the rebuilds among them) away first.
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let left = if multi {
            tokio::task::block_in_place(wait)
        } else {
            wait()
        };
        if left > 0 {
            add(&shared.counters.revoke_timeouts, 1);
            *shared.last_error() = Some(format!(
                "{left} rebuild(s) of revoked partitions {parts:?} still ran after revoke_timeout_ms; their new owner may start the same keys"
            ));
        }
    }
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let revoked = match rebalance {
            Rebalance::Revoke(tpl) => {
                if let Some(f) = &self.fencing {
                    f.revoke(tpl, &self.shared);
                }
                self.shared.offsets().revoke(tps(tpl))
            }
            // The assignment is lost (session expired): commits would be refused anyway.
            Rebalance::Error(_) => {
                if let Some(f) = &self.fencing {
                    f.fences.lock().revoke_all();
                }
                let _ = self.shared.offsets().revoke_all();
                return;
            }
            Rebalance::Assign(_) => return,
        };
        add(&self.shared.counters.rebalances, 1);
        if revoked.is_empty() {
            return;
        }
        // Commit what was acknowledged before the partitions go: the next owner starts
        // there. Synchronous: this is the last moment the commit is ours to make.
        let tpl = to_tpl(&revoked);
        add(&self.shared.counters.commits, 1);
        if consumer.commit(&tpl, CommitMode::Sync).is_err() {
            add(&self.shared.counters.commit_failures, 1);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            add(&self.shared.counters.rebalances, 1);
            self.shared.offsets().assign(tps(tpl));
            if let Some(f) = &self.fencing {
                f.fences.lock().assign(f.partitions(tpl));
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if result.is_err() {
            add(&self.shared.counters.commit_failures, 1);
            let mut o = self.shared.offsets();
            for e in offsets.elements() {
                if let Offset::Offset(next) = e.offset() {
                    o.failed(&(Arc::from(e.topic()), e.partition()), next);
                }
            }
        }
    }
}

fn tps(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (Arc::from(e.topic()), e.partition()))
        .collect()
}

/// A partition list to commit `(partition, next offset)` pairs.
pub(crate) fn to_tpl(commits: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(commits.len());
    for ((topic, partition), next) in commits {
        // Only fails for an invalid offset, which an acknowledged position never is.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
    }
    tpl
}
