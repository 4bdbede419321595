//! A key → slot hash index that stores 8 bytes per bucket.
//!
//! `DirtySet` keeps its per-key state in a slab; this index finds a key's slot. A std
//! `HashMap<Key, u32>` would store a second copy of every key (16 bytes) plus padding
//! per bucket; here a bucket is the slot number and 32 bits of the key's hash, and the
//! key itself is read from the slab. That is what keeps the scheduler under 100 bytes
//! per dirty key. Linear probing, backward-shift deletion, growth at 3/4 load.

use std::hash::BuildHasher;

use crate::Key;

const EMPTY: u64 = 0;

/// The hash fragment kept in a bucket; it also picks the bucket, so growing the table
/// never rehashes a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hash32(u32);

/// The outcome of [`Index::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The key is in `slot`, recorded at `bucket`.
    Found { slot: u32, bucket: usize },
    /// The key is absent; this empty bucket ends its probe run.
    Vacant(usize),
}

#[cfg(test)]
impl Probe {
    pub(crate) fn slot(self) -> Option<u32> {
        match self {
            Probe::Found { slot, .. } => Some(slot),
            Probe::Vacant(_) => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Index {
    /// `(hash << 32) | (slot + 1)`; 0 is empty.
    buckets: Vec<u64>,
    len: usize,
    hasher: std::collections::hash_map::RandomState,
}

impl Index {
    pub(crate) fn new() -> Index {
        Index {
            buckets: vec![EMPTY; 16],
            len: 0,
            hasher: Default::default(),
        }
    }

    pub(crate) fn hash(&self, key: &Key) -> Hash32 {
        let h = self.hasher.hash_one(key);
        Hash32((h ^ (h >> 32)) as u32)
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    fn home(&self, hash: Hash32) -> usize {
        hash.0 as usize & self.mask()
    }

    /// Where `key` is: `Found { slot, bucket }`, or `Vacant(bucket)` — the empty bucket
    /// ending its probe run, where an insert may put it. `key_at` reads a slot's key.
    pub(crate) fn find<'k>(
        &self,
        key: &Key,
        hash: Hash32,
        key_at: impl Fn(u32) -> &'k Key,
    ) -> Probe {
        let mut i = self.home(hash);
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return Probe::Vacant(i);
            }
            if (b >> 32) as u32 == hash.0 {
                let slot = (b as u32) - 1;
                if key_at(slot) == key {
                    return Probe::Found { slot, bucket: i };
                }
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The bucket recording `slot` (whose key hashed to `hash`): a probe that compares
    /// bucket words only, never a key, for a caller that already knows the slot.
    pub(crate) fn locate(&self, hash: Hash32, slot: u32) -> Option<usize> {
        let want = ((hash.0 as u64) << 32) | (slot as u64 + 1);
        let mut i = self.home(hash);
        loop {
            match self.buckets[i] {
                EMPTY => return None,
                b if b == want => return Some(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    /// Records that `slot` holds a key with `hash`, at `vacant` from a [`find`](Self::find)
    /// that found nothing (no other change in between).
    pub(crate) fn insert(&mut self, hash: Hash32, slot: u32, vacant: usize) {
        let bucket = ((hash.0 as u64) << 32) | (slot as u64 + 1);
        self.len += 1;
        if self.len * 4 > self.buckets.len() * 3 {
            self.grow();
            self.place(bucket);
        } else {
            debug_assert_eq!(self.buckets[vacant], EMPTY);
            self.buckets[vacant] = bucket;
        }
    }

    fn place(&mut self, bucket: u64) {
        let mut i = self.home(Hash32((bucket >> 32) as u32));
        while self.buckets[i] != EMPTY {
            i = (i + 1) & self.mask();
        }
        self.buckets[i] = bucket;
    }

    fn grow(&mut self) {
        let doubled = vec![EMPTY; self.buckets.len() * 2];
        let old = std::mem::replace(&mut self.buckets, doubled);
        for b in old.into_iter().filter(|&b| b != EMPTY) {
            self.place(b);
        }
    }

    /// Empties `bucket` (from a [`find`](Self::find) that found its key).
    pub(crate) fn remove(&mut self, bucket: usize) {
        let mask = self.mask();
        let i = bucket;
        // Backward-shift: pull later members of the probe run into the hole so that
        // lookups never stop early at it.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            let home = self.home(Hash32((b >> 32) as u32));
            // `b` may move into the hole only if its home is not in (hole, j].
            let dist_home = j.wrapping_sub(home) & mask;
            let dist_hole = j.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.buckets[hole] = b;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.buckets[hole] = EMPTY;
        self.len -= 1;
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((0u8..3, 0u16..300), 0..2000)) {
            let mut index = Index::new();
            let mut slab: Vec<Option<Key>> = Vec::new();
            let mut model: HashMap<Key, u32> = HashMap::new();
            for (op, k) in ops {
                let key = Key::from(k.to_string());
                let h = index.hash(&key);
                let probe = index.find(&key, h, |s| slab[s as usize].as_ref().unwrap());
                prop_assert_eq!(probe.slot(), model.get(&key).copied());
                match (op, probe) {
                    (0 | 1, Probe::Vacant(at)) => {
                        let slot = slab.len() as u32;
                        slab.push(Some(key.clone()));
                        index.insert(h, slot, at);
                        model.insert(key, slot);
                    }
                    (2, Probe::Found { slot, bucket }) => {
                        prop_assert_eq!(index.locate(h, slot), Some(bucket));
                        index.remove(bucket);
                        slab[slot as usize] = None;
                        model.remove(&key);
                    }
                    _ => {}
                }
                prop_assert_eq!(index.len, model.len());
            }
            for (key, slot) in &model {
                let h = index.hash(key);
                prop_assert_eq!(index.find(key, h, |s| slab[s as usize].as_ref().unwrap()).slot(), Some(*slot));
            }
        }
    }
}
