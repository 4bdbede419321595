//! A key → slot hash index that stores 8 bytes per bucket.
//!
//! `DirtySet` keeps its per-key state in a slab; this index finds a key's slot. A std
//! `HashMap<Key, u32>` would store a second copy of every key (16 bytes) plus padding
//! per bucket; here a bucket is the slot number and 32 bits of the key's hash, and the
//! key itself is read from the slab. That is what keeps the scheduler under 100 bytes
//! per dirty key. Linear probing, backward-shift deletion, growth at 3/4 load; the hash
//! is `hash.rs`'s keyed fold hash of the key's text. Keys whose runs ended are removed
//! in sorted batches ([`Index::remove_sorted`]), walking the table in order.

use crate::Key;
use crate::hash::KeyHasher;

const EMPTY: u64 = 0;

/// The hash fragment kept in a bucket; it also picks the bucket, so growing the table
/// never rehashes a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hash32(u32);

impl Hash32 {
    pub(crate) fn bits(self) -> u32 {
        self.0
    }
}

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
    hasher: KeyHasher,
}

impl Index {
    pub(crate) fn new() -> Index {
        Index {
            buckets: vec![EMPTY; 16],
            len: 0,
            hasher: KeyHasher::random(),
        }
    }

    pub(crate) fn hash(&self, key: &Key) -> Hash32 {
        let h = self.hasher.hash(key.encoded_bytes());
        Hash32((h ^ (h >> 32)) as u32)
    }

    /// Asks the CPU to start loading the cache line of `hash`'s home bucket, so that a
    /// [`find`](Self::find) a few keys later does not wait for memory: a batch of marks
    /// hashes ahead and prefetches (`DirtySet::mark_many`). Only a hint: it changes no
    /// state, and a table that grows meanwhile merely wastes it.
    #[inline]
    pub(crate) fn prefetch(&self, hash: Hash32) {
        prefetch_read(self.buckets.as_ptr().wrapping_add(self.home(hash)));
    }

    /// Buckets in use, forgotten ones waiting for [`remove_sorted`](Self::remove_sorted)
    /// included.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    fn home(&self, hash: Hash32) -> usize {
        hash.0 as usize & self.mask()
    }

    /// Where `key` is: `Found { slot, bucket }`, or `Vacant(bucket)` — the empty bucket
    /// ending its probe run, where an insert may put it. `key_at` reads a slot's key;
    /// `None` is a slot whose key was forgotten and whose bucket waits for
    /// [`remove_sorted`](Self::remove_sorted): it matches no key.
    pub(crate) fn find<'k>(
        &self,
        key: &Key,
        hash: Hash32,
        key_at: impl Fn(u32) -> Option<&'k Key>,
    ) -> Probe {
        let mut i = self.home(hash);
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return Probe::Vacant(i);
            }
            if (b >> 32) as u32 == hash.0 {
                let slot = (b as u32) - 1;
                if key_at(slot) == Some(key) {
                    return Probe::Found { slot, bucket: i };
                }
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The bucket recording `slot` (whose key hashed to `hash`): a probe that compares
    /// bucket words only, never a key, for a caller that already knows the slot.
    #[cfg(test)]
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

    /// Whether one more insert would grow the table.
    pub(crate) fn full(&self) -> bool {
        (self.len + 1) * 4 > self.buckets.len() * 3
    }

    /// Empties the buckets of many slots at once. `batch` holds `(hash << 32) | slot`
    /// words, one per slot, each in the index; it is left sorted by home bucket.
    ///
    /// Removing one key is a random access into the bucket array, a cache miss once
    /// the table outgrows the cache. Sorted by home bucket, a large batch walks the
    /// array front to back instead, touching each cache line once, in the order the
    /// hardware prefetcher expects. A bucket is found by its slot number alone (slot
    /// numbers are unique in the index), so neither the slot nor its key is read.
    pub(crate) fn remove_sorted(&mut self, batch: &mut [u64]) {
        let mask = self.mask() as u64;
        for w in batch.iter_mut() {
            *w = ((*w >> 32) & mask) << 32 | (*w & 0xffff_ffff);
        }
        batch.sort_unstable();
        for &w in batch.iter() {
            let want = (w & 0xffff_ffff) + 1;
            let mut i = (w >> 32) as usize;
            while self.buckets[i] & 0xffff_ffff != want {
                debug_assert_ne!(self.buckets[i], EMPTY, "a batched slot is in the index");
                i = (i + 1) & self.mask();
            }
            self.remove(i);
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

/// Starts loading the cache line at `p` into every cache level (x86-64's `prefetcht0`;
/// elsewhere nothing: the probe then simply waits for memory, as without a batch).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults and reads nothing into the program,
    // whatever the address; SSE, which the intrinsic is declared under, is part of the
    // x86-64 baseline, so every x86-64 CPU has the instruction.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((0u8..5, 0u16..300), 0..2000)) {
            let mut index = Index::new();
            let mut slab: Vec<Option<Key>> = Vec::new();
            let mut model: HashMap<Key, u32> = HashMap::new();
            // Slots whose key was forgotten, their buckets not yet removed.
            let mut batch: Vec<u64> = Vec::new();
            for (op, k) in ops {
                let key = Key::from(k.to_string());
                let h = index.hash(&key);
                let probe = index.find(&key, h, |s| slab[s as usize].as_ref());
                prop_assert_eq!(probe.slot(), model.get(&key).copied());
                match (op, probe) {
                    (0 | 1, Probe::Vacant(at)) if !index.full() || batch.is_empty() => {
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
                    (3, Probe::Found { slot, .. }) => {
                        // Forgotten now, removed later in a batch.
                        slab[slot as usize] = None;
                        model.remove(&key);
                        batch.push(((h.0 as u64) << 32) | slot as u64);
                    }
                    (0 | 1 | 4, _) => {
                        index.remove_sorted(&mut batch);
                        for w in batch.drain(..) {
                            let slot = w as u32;
                            let probe = index.locate(Hash32((w >> 32) as u32), slot);
                            prop_assert_eq!(probe, None, "slot {} still indexed", slot);
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(index.len, model.len() + batch.len());
            }
            for (key, slot) in &model {
                let h = index.hash(key);
                prop_assert_eq!(index.find(key, h, |s| slab[s as usize].as_ref()).slot(), Some(*slot));
            }
        }
    }
}
