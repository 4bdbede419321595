//! The consumer's callbacks: rebalances and commit results update the offset tracker.

use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

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
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let revoked = match rebalance {
            Rebalance::Revoke(tpl) => self.shared.offsets().revoke(tps(tpl)),
            // The assignment is lost (session expired): commits would be refused anyway.
            Rebalance::Error(_) => {
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
