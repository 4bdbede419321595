//! A fast keyed hash of key text for the scheduler's index.
//!
//! std's `RandomState` (SipHash-1-3) is built to resist HashDoS at any cost; on the
//! scheduler's 1M-key drain it was a few percent of the time, and the index hashes
//! every mark. This is the folded-multiply construction of foldhash/wyhash: one 64×64
//! → 128-bit multiply per 16 bytes, its halves XORed.
//!
//! **HashDoS.** Keys are column values from database rows, which an attacker may
//! choose. Every multiply here takes a secret on *both* sides (the four keys of a
//! [`KeyHasher`], drawn per set from std's OS-seeded `RandomState`), so no input
//! blinds a multiply to zero without knowing them — the known seed-independent
//! collision of unkeyed multiply hashes — and the 32 bits the index keeps differ from
//! process to process. It is not a cryptographic PRF: an attacker who can time
//! probes over many requests might learn about a seed; a set lives as long as its
//! process, and the index only slows (longer probe runs), never misbehaves.

use std::hash::BuildHasher;

/// A keyed hash of byte strings (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct KeyHasher {
    keys: [u64; 4],
}

/// The folded multiply: the 128-bit product's halves XORed.
#[inline]
fn fold(x: u64, y: u64) -> u64 {
    let p = u128::from(x) * u128::from(y);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline]
fn read8(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

#[inline]
fn read4(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

impl KeyHasher {
    /// A hasher with fresh secret keys from std's OS-seeded `RandomState`.
    pub(crate) fn random() -> KeyHasher {
        let state = std::collections::hash_map::RandomState::new();
        KeyHasher::with_keys(std::array::from_fn(|i| state.hash_one(i as u64)))
    }

    /// A hasher with these keys, which must be secret and random (tests draw them).
    pub(crate) fn with_keys(keys: [u64; 4]) -> KeyHasher {
        KeyHasher { keys }
    }

    /// The hash of `bytes`.
    #[inline]
    pub(crate) fn hash(&self, bytes: &[u8]) -> u64 {
        let [k0, k1, k2, k3] = self.keys;
        let len = bytes.len();
        let mut s0 = k0 ^ (len as u64);
        let mut s1 = k1;
        if len <= 16 {
            // Two overlapping reads cover every length without a loop.
            if len >= 8 {
                s0 ^= read8(bytes, 0);
                s1 ^= read8(bytes, len - 8);
            } else if len >= 4 {
                s0 ^= read4(bytes, 0);
                s1 ^= read4(bytes, len - 4);
            } else if len > 0 {
                s0 ^= u64::from(bytes[0]);
                s1 ^= (u64::from(bytes[len - 1]) << 8) | u64::from(bytes[len / 2]);
            }
        } else {
            let mut at = 0;
            while len - at > 16 {
                s0 = fold(read8(bytes, at) ^ s0, read8(bytes, at + 8) ^ k2);
                at += 16;
            }
            s0 ^= read8(bytes, len - 16);
            s1 ^= read8(bytes, len - 8);
        }
        fold(fold(s0, s1 ^ k2), k3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Jitter;

    fn text(i: u64) -> String {
        format!("device-{i:08}")
    }

    fn drawn(seed: u64) -> KeyHasher {
        let mut rng = Jitter::new(seed);
        KeyHasher::with_keys(std::array::from_fn(|_| rng.next_u64()))
    }

    #[test]
    fn equal_bytes_hash_equal_and_every_length_is_read_whole() {
        let h = drawn(5);
        let mut rng = Jitter::new(11);
        for len in 0..80usize {
            let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            assert_eq!(h.hash(&bytes), h.hash(&bytes.clone()));
            // Changing any one byte changes the hash: no byte is skipped.
            for at in 0..len {
                let mut other = bytes.clone();
                other[at] ^= 1 + rng.below(255) as u8;
                assert_ne!(h.hash(&bytes), h.hash(&other), "len {len}, byte {at}");
            }
            // A longer string with a zero byte appended is another key.
            let mut longer = bytes.clone();
            longer.push(0);
            assert_ne!(h.hash(&bytes), h.hash(&longer), "len {len}");
        }
    }

    #[test]
    fn different_keys_hash_differently() {
        let a = drawn(1);
        let b = drawn(2);
        let same = (0..1000)
            .filter(|&i| a.hash(text(i).as_bytes()) == b.hash(text(i).as_bytes()))
            .count();
        assert_eq!(same, 0);
        let r1 = KeyHasher::random();
        let r2 = KeyHasher::random();
        assert_ne!(r1.keys, r2.keys, "each set draws its own keys");
    }

    /// Sequential keys (the benchmark's, and many real ones) must spread over the low
    /// bits the index picks its bucket from: no bucket of 4096 much above the mean.
    #[test]
    fn sequential_keys_spread_over_the_low_bits() {
        for seed in [1u64, 2, 3] {
            let h = drawn(seed);
            let mut buckets = vec![0u32; 4096];
            for i in 0..409_600u64 {
                let x = h.hash(text(i).as_bytes());
                let x32 = (x ^ (x >> 32)) as u32;
                buckets[(x32 & 4095) as usize] += 1;
            }
            // Mean 100, a binomial's deviation 10: 160 is six of them.
            let max = *buckets.iter().max().unwrap();
            let min = *buckets.iter().min().unwrap();
            assert!(max < 160 && min > 40, "seed {seed}: {min}..{max}");
        }
    }
}
