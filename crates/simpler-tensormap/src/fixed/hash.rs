//! Bucket selection: a small multiplicative hasher over [`core::hash::Hash`].
//!
//! Written here rather than taken from a hashing crate so that the device build of the map
//! depends on nothing. Keys come from the process itself (buffer addresses), so a fast
//! non-cryptographic mix is enough; the final multiply-and-take-the-top-bits step spreads the
//! aligned addresses buffers usually have (low bits all zero) over every bucket.

use core::hash::{Hash, Hasher};

/// Odd constant close to 2⁶⁴/φ (Fibonacci hashing).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A word-at-a-time multiply-rotate hasher (the shape of the Fx hash).
#[derive(Default)]
struct WordHasher {
    state: u64,
}

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(GOLDEN);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

/// The bucket of `key` in a table of `2^(64 − shift)` buckets (`shift == 64`: one bucket).
pub(crate) fn bucket_of<K: Hash>(key: &K, shift: u32) -> usize {
    let mut hasher = WordHasher::default();
    key.hash(&mut hasher);
    // The top bits of the product depend on every bit of the hash.
    hasher.finish().wrapping_mul(GOLDEN).checked_shr(shift).unwrap_or(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_all_buckets() {
        let shift = 64 - 4; // 16 buckets
        let mut used = [0u32; 16];
        for i in 0..256u64 {
            used[bucket_of(&(0x1000_0000 + i * 1024), shift)] += 1;
        }
        assert!(used.iter().all(|&n| n > 4), "{used:?}");
    }

    #[test]
    fn one_bucket_takes_every_key() {
        assert_eq!(bucket_of(&12345u64, 64), 0);
    }
}
