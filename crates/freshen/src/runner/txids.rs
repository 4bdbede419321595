//! `Txids`: the transaction ids behind each dirty key, for the rebuild's visibility
//! check (a rebuild proves it sees every transaction that dirtied its key).

use std::collections::HashMap;

use crate::Key;

#[derive(Default)]
pub(super) struct Txids(HashMap<Key, Vec<u64>>);

impl Txids {
    /// Transaction `txid` dirtied `key` (a run of one transaction's rows counts once).
    pub(super) fn add(&mut self, key: Key, txid: u64) {
        let ids = self.0.entry(key).or_default();
        if ids.last() != Some(&txid) {
            ids.push(txid);
        }
    }

    /// `key`'s ids, taken by the rebuild that starts.
    pub(super) fn take(&mut self, key: &Key) -> Vec<u64> {
        self.0.remove(key).unwrap_or_default()
    }

    /// `key` will not be rebuilt for its changes so far: its ids go.
    pub(super) fn forget(&mut self, key: &Key) {
        self.0.remove(key);
    }

    /// A failed rebuild's ids come back, before those that arrived meanwhile.
    pub(super) fn restore(&mut self, key: &Key, mut older: Vec<u64>) {
        if let Some(newer) = self.0.remove(key) {
            older.extend(newer);
        }
        if !older.is_empty() {
            self.0.insert(key.clone(), older);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_one_transaction_counts_once() {
        let mut t = Txids::default();
        let k = Key::new("k");
        for id in [1, 1, 2, 2, 1] {
            t.add(k.clone(), id);
        }
        assert_eq!(t.take(&k), vec![1, 2, 1]);
        assert_eq!(t.take(&k), Vec::<u64>::new(), "taken once");
    }

    #[test]
    fn a_failed_rebuilds_ids_come_back_before_newer_ones() {
        let mut t = Txids::default();
        let k = Key::new("k");
        t.add(k.clone(), 5);
        let running = t.take(&k);
        t.add(k.clone(), 7);
        t.restore(&k, running);
        assert_eq!(t.take(&k), vec![5, 7]);
        t.restore(&k, Vec::new());
        assert_eq!(t.0.get(&k), None, "nothing to restore keeps no entry");
        t.add(k.clone(), 9);
        t.forget(&k);
        assert_eq!(t.take(&k), Vec::<u64>::new());
    }
}
