//! The simulated prefix (KV) cache: which whole blocks of which prompts the engine has already
//! computed, per (served name, cache salt). Entries are chain hashes of block prefixes, so a
//! block only matches when everything before it matched too; capacity is counted in blocks and
//! the least recently used block is evicted first.

use std::collections::{BTreeMap, HashMap};

/// A bounded LRU set of block-prefix hashes.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    /// hash -> last-use tick.
    entries: HashMap<u64, u64>,
    /// last-use tick -> hash, oldest first.
    order: BTreeMap<u64, u64>,
    tick: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity` blocks of `block_size` tokens (a block size of 0 counts as 1).
    pub fn new(block_size: u32, capacity: usize) -> Self {
        Self {
            block_size: usize::try_from(block_size.max(1)).unwrap_or(1),
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    /// Looks the prompt up and then records all its full blocks; returns the cached token count:
    /// the longest run of leading blocks seen before under the same (model, salt), capped so at
    /// least one prompt token is always computed.
    pub fn admit(&mut self, model: &str, salt: Option<&str>, tokens: &[u64]) -> u32 {
        let hashes = self.block_hashes(model, salt, tokens);
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut hit_blocks = 0;
        for hash in hashes.iter().take(max_blocks) {
            if !self.entries.contains_key(hash) {
                break;
            }
            hit_blocks += 1;
        }
        for hash in hashes {
            self.touch(hash);
        }
        u32::try_from(hit_blocks * self.block_size).unwrap_or(u32::MAX)
    }

    /// Number of blocks held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Chain hashes of every full block of `tokens`, seeded by the model and salt.
    fn block_hashes(&self, model: &str, salt: Option<&str>, tokens: &[u64]) -> Vec<u64> {
        let mut h = bytes_hash(0x5eed, model.as_bytes());
        h = match salt {
            Some(s) => bytes_hash(mix(h, 1), s.as_bytes()),
            None => mix(h, 0),
        };
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                h = block.iter().fold(mix(h, 0xb10c), |acc, &t| mix(acc, t));
                h
            })
            .collect()
    }

    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(old) = self.entries.insert(hash, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, hash);
        while self.entries.len() > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&victim);
        }
    }
}

/// One step of a 64-bit mixing hash (splitmix64 finaliser over the combined value).
fn mix(h: u64, v: u64) -> u64 {
    let mut z = (h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn bytes_hash(seed: u64, bytes: &[u8]) -> u64 {
    mix(
        bytes.iter().fold(seed, |h, &b| mix(h, u64::from(b))),
        bytes.len() as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(n: u64, offset: u64) -> Vec<u64> {
        (offset..offset + n).collect()
    }

    #[test]
    fn repeat_hits_whole_blocks_but_keeps_one_token() {
        let mut cache = PrefixCache::new(4, 100);
        assert_eq!(cache.admit("m", None, &prompt(10, 0)), 0);
        assert_eq!(cache.admit("m", None, &prompt(10, 0)), 8);
        // Exactly two blocks: the last token must still be computed, so only one block counts.
        let mut c2 = PrefixCache::new(4, 100);
        assert_eq!(c2.admit("m", None, &prompt(8, 0)), 0);
        assert_eq!(c2.admit("m", None, &prompt(8, 0)), 4);
        assert_eq!(c2.admit("m", None, &prompt(3, 0)), 0);
    }

    #[test]
    fn shared_prefix_only_counts_matching_blocks() {
        let mut cache = PrefixCache::new(4, 100);
        cache.admit("m", None, &prompt(12, 0));
        let mut other = prompt(12, 0);
        other[5] = 999;
        assert_eq!(cache.admit("m", None, &other), 4);
    }

    #[test]
    fn model_and_salt_isolate() {
        let mut cache = PrefixCache::new(4, 100);
        cache.admit("m", Some("a"), &prompt(9, 0));
        assert_eq!(cache.admit("m", Some("b"), &prompt(9, 0)), 0);
        assert_eq!(cache.admit("m", None, &prompt(9, 0)), 0);
        assert_eq!(cache.admit("lora", Some("a"), &prompt(9, 0)), 0);
        assert_eq!(cache.admit("m", Some("a"), &prompt(9, 0)), 8);
    }

    #[test]
    fn lru_evicts_oldest_blocks() {
        let mut cache = PrefixCache::new(2, 4);
        cache.admit("m", None, &prompt(5, 0)); // 2 blocks
        cache.admit("m", None, &prompt(5, 100)); // 2 blocks, full
        assert_eq!(cache.len(), 4);
        cache.admit("m", None, &prompt(5, 0)); // refresh the first prompt
        cache.admit("m", None, &prompt(5, 200)); // evicts the 100.. prompt
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.admit("m", None, &prompt(5, 0)), 4);
        assert_eq!(cache.admit("m", None, &prompt(5, 100)), 0);
    }
}
