//! `Marking`: the keys one batch dirties, gathered so that the scheduler marks them in
//! one `DirtySet::mark_many` (which overlaps their index probes) before the run loop
//! holds each key's batch and records its transaction.

use crate::Key;
use crate::ack::BatchId;

/// Keys in the order they were dirtied, each with the batch whose acknowledgement it
/// holds and the transaction that dirtied it. Kept apart so that the keys form the
/// one slice `mark_many` takes; the run loop reuses one `Marking`, so its vectors
/// allocate once.
#[derive(Debug, Default)]
pub(super) struct Marking {
    keys: Vec<Key>,
    holds: Vec<Option<BatchId>>,
    txids: Vec<Option<u64>>,
}

impl Marking {
    /// `key` was dirtied by transaction `txid`, holding `hold` until it is rebuilt.
    pub(super) fn push(&mut self, key: Key, hold: Option<BatchId>, txid: Option<u64>) {
        self.keys.push(key);
        self.holds.push(hold);
        self.txids.push(txid);
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The keys, in the order they were pushed.
    pub(super) fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Takes every key with its hold and transaction, in order, leaving it empty.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (Key, Option<BatchId>, Option<u64>)> {
        let holds = self.holds.drain(..);
        let txids = self.txids.drain(..);
        self.keys
            .drain(..)
            .zip(holds)
            .zip(txids)
            .map(|((key, hold), txid)| (key, hold, txid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_every_key_with_its_own_hold_and_transaction_in_order() {
        let mut m = Marking::default();
        m.push(Key::from("a"), Some(1), None);
        m.push(Key::from("b"), None, Some(7));
        m.push(Key::from("a"), Some(2), Some(8));
        assert_eq!(m.len(), 3);
        assert_eq!(m.keys(), [Key::from("a"), Key::from("b"), Key::from("a")]);
        let got: Vec<_> = m.drain().collect();
        assert_eq!(
            got,
            [
                (Key::from("a"), Some(1), None),
                (Key::from("b"), None, Some(7)),
                (Key::from("a"), Some(2), Some(8)),
            ]
        );
        assert_eq!(m.len(), 0);
        assert!(m.keys().is_empty());
    }
}
