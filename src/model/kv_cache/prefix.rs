//! Blocks kept for their prefix (automatic prefix caching, as vLLM's): a full block of a row may
//! be given a **key** naming its tokens and the tokens of every block before it
//! (`key_i = hash(key_{i−1}, tokens of block i)`, computed by the caller). Rows that hold it see
//! nothing different. When its last row leaves, a keyed block is not freed but kept in a
//! least-recently-used list, keys and values intact, so that a later row whose tokens start the
//! same way takes it back ([`KvCache::share_blocks`]) instead of computing those positions again.
//!
//! Kept blocks are evicted, oldest release first, only when the cache needs a new block, the
//! free list is empty and the storage already holds its limit of blocks
//! ([`KvCache::set_block_limit`]); an evicted block loses its key. Without a limit (or with no
//! block ever keyed) the cache allocates exactly as before.
//!
//! A row only ever writes past its own length, and only full blocks carry keys, so a kept or
//! shared block is never written: the keys and values under a key stay those of its tokens.

use super::KvCache;
use crate::Float;
use std::collections::BTreeMap;

/// The keys of a cache's blocks and the blocks kept for them (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct PrefixBlocks {
    /// Per block id, its key if it has one.
    keys: Vec<Option<u64>>,
    /// Kept blocks no row refers to, by the tick of their release (oldest first).
    lru: BTreeMap<u64, u32>,
    /// Per block id, the tick of its release into `lru` (valid while it is there).
    released_at: Vec<u64>,
    tick: u64,
    /// Blocks the storage may hold before kept blocks are evicted; `None`: no limit.
    limit: Option<usize>,
    /// Kept blocks evicted so far.
    evictions: u64,
}

impl PrefixBlocks {
    fn key(&self, id: u32) -> Option<u64> {
        self.keys.get(id as usize).copied().flatten()
    }

    /// Block `id` has no row left: kept (true) when it has a key.
    pub(super) fn keep(&mut self, id: u32) -> bool {
        if self.key(id).is_none() {
            return false;
        }
        let i = id as usize;
        if self.released_at.len() <= i {
            self.released_at.resize(i + 1, 0);
        }
        self.tick += 1;
        self.released_at[i] = self.tick;
        self.lru.insert(self.tick, id);
        true
    }

    /// Block `id` loses its key (a row rolled back into it will write over positions the key
    /// names).
    pub(super) fn forget(&mut self, id: u32) {
        if let Some(key) = self.keys.get_mut(id as usize) {
            *key = None;
        }
    }

    /// The oldest kept block, its key forgotten.
    fn evict_oldest(&mut self) -> Option<u32> {
        let (_, id) = self.lru.pop_first()?;
        self.keys[id as usize] = None;
        self.evictions += 1;
        Some(id)
    }
}

impl<T: Float> KvCache<T> {
    /// Lets the storage hold `blocks` blocks at most before kept blocks are evicted (`None`: no
    /// limit, kept blocks are then never evicted). The limit only chooses between growing and
    /// evicting: with no free or kept block left the storage still grows.
    pub fn set_block_limit(&mut self, blocks: Option<usize>) {
        self.prefix.limit = blocks;
    }

    /// A kept block to reuse, when the storage is at its limit.
    pub(super) fn evict_for_alloc(&mut self) -> Option<u32> {
        let limit = self.prefix.limit?;
        if self.refs.len() < limit {
            return None;
        }
        self.prefix.evict_oldest()
    }

    /// The key of block `id`, if it has one (it may have been evicted and reused since it was
    /// given one: the caller compares).
    pub fn block_key(&self, id: u32) -> Option<u64> {
        self.prefix.key(id)
    }

    /// Gives the `i`-th block of row `b` the key `key`, unless it has one already; the block's
    /// id, or `None` when that block is not full or no longer held (released by a sliding
    /// window).
    pub fn register_block(&mut self, b: usize, i: usize, key: u64) -> Option<u32> {
        let bs = self.block_rows;
        if b >= self.batch || i >= self.lens[b] / bs || i < self.first_live[b] {
            return None;
        }
        let id = self.table[b * self.blocks_per_row() + i];
        if self.refs[id as usize] == 0 {
            return None;
        }
        let keys = &mut self.prefix.keys;
        if keys.len() <= id as usize {
            keys.resize(id as usize + 1, None);
        }
        keys[id as usize].get_or_insert(key);
        Some(id)
    }

    /// Row `b`, empty, takes the keyed blocks `ids` as its first `ids.len()` blocks (shared
    /// with whoever else holds them, taken back from the kept list otherwise): its length
    /// becomes `ids.len() · block_rows`.
    pub fn share_blocks(&mut self, b: usize, ids: &[u32]) {
        assert!(b < self.batch, "row {b} of a batch of {}", self.batch);
        assert_eq!(self.lens[b], 0, "blocks are shared into an empty row");
        let (bs, per_row) = (self.block_rows, self.blocks_per_row());
        assert!(
            ids.len() <= per_row,
            "{} blocks in a row of {per_row}",
            ids.len()
        );
        for (i, &id) in ids.iter().enumerate() {
            assert!(
                self.prefix.key(id).is_some(),
                "block {id} holds no kept prefix"
            );
            if self.refs[id as usize] == 0 {
                let tick = self.prefix.released_at[id as usize];
                self.prefix.lru.remove(&tick);
            }
            self.refs[id as usize] += 1;
            self.table[b * per_row + i] = id;
        }
        self.lens[b] = ids.len() * bs;
        self.first_live[b] = 0;
        self.len = self.len.max(self.lens[b]);
    }

    /// Blocks kept for their key that no row holds (reusable at once, evicted first when
    /// memory is short).
    pub fn kept_blocks(&self) -> usize {
        self.prefix.lru.len()
    }

    /// Blocks carrying a key, held by rows or kept.
    pub fn keyed_blocks(&self) -> usize {
        self.prefix.keys.iter().filter(|k| k.is_some()).count()
    }

    /// Kept blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.prefix.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` positions of keys `[n, d]` numbered from `from` (values: their negatives).
    fn positions(from: usize, n: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
        let k: Vec<f64> = (from * d..(from + n) * d).map(|x| x as f64).collect();
        let v = k.iter().map(|x| -x).collect();
        (k, v)
    }

    /// A row's full blocks, keyed, kept after it leaves, shared by a new row (which sees the
    /// same keys and values and grows past them into blocks of its own), kept again, evicted
    /// oldest first only once the storage is at its limit and nothing is free.
    #[test]
    fn keyed_blocks_are_kept_shared_and_evicted_oldest_first() {
        let (d, bs) = (2, 4);
        let mut cache = KvCache::<f64>::new(0, 32, d, bs);
        cache.set_block_limit(Some(4));
        let row = cache.add_row();
        let (k, v) = positions(0, 10, d);
        cache.append_ragged(&[row; 10], &k, &v);
        // Two full blocks and a partial one; the partial one cannot be keyed.
        let ids: Vec<u32> = (0..2)
            .map(|i| cache.register_block(row, i, 100 + i as u64).unwrap())
            .collect();
        assert_eq!(cache.register_block(row, 2, 102), None);
        assert_eq!(cache.block_key(ids[1]), Some(101));
        cache.gather_rows(&[]);
        assert_eq!((cache.blocks_in_use(), cache.kept_blocks()), (0, 2));
        // A new row takes the two kept blocks back and appends after them.
        let row = cache.add_row();
        cache.share_blocks(row, &ids);
        assert_eq!((cache.row_len(row), cache.kept_blocks()), (8, 0));
        let (k2, v2) = positions(50, 3, d);
        cache.append_ragged(&[row; 3], &k2, &v2);
        for t in 0..8 {
            assert_eq!(cache.row(row, t, false), &k[t * d..(t + 1) * d]);
            assert_eq!(cache.row(row, t, true), &v[t * d..(t + 1) * d]);
        }
        assert_eq!(cache.row(row, 9, false), &k2[d..2 * d]);
        // A second row shares the first block with it.
        let other = cache.add_row();
        cache.share_blocks(other, &ids[..1]);
        assert_eq!(cache.blocks_in_use(), 3);
        cache.gather_rows(&[other]);
        // Block 1 kept (released first), block 0 still held; the partial blocks freed.
        assert_eq!((cache.blocks_in_use(), cache.kept_blocks()), (1, 1));
        cache.gather_rows(&[]);
        assert_eq!(cache.kept_blocks(), 2);
        // Storage holds 3 blocks (limit 4): a new row takes the free one, grows to the limit,
        // then evicts block 1 (released first) and only then block 0.
        let row = cache.add_row();
        let (k3, v3) = positions(100, 8, d);
        cache.append_ragged(&[row; 8], &k3, &v3);
        assert_eq!((cache.evictions(), cache.kept_blocks()), (0, 2));
        let (k4, v4) = positions(200, 4, d);
        cache.append_ragged(&[row; 4], &k4, &v4);
        assert_eq!((cache.evictions(), cache.kept_blocks()), (1, 1));
        assert_eq!(cache.block_key(ids[1]), None);
        assert_eq!(cache.block_key(ids[0]), Some(100));
        cache.append_ragged(&[row; 1], &k4[..d], &v4[..d]);
        assert_eq!((cache.evictions(), cache.kept_blocks()), (2, 0));
        assert_eq!(cache.keyed_blocks(), 0);
        // The row's contents are its own, whatever blocks it reused.
        for t in 0..8 {
            assert_eq!(cache.row(row, t, false), &k3[t * d..(t + 1) * d]);
        }
        for t in 0..4 {
            assert_eq!(cache.row(row, 8 + t, true), &v4[t * d..(t + 1) * d]);
        }
        assert_eq!(cache.stored_rows(), 4 * bs);
        assert_eq!(cache.storage().0.as_float().unwrap().len(), 4 * bs * d);
    }

    /// Without a limit nothing kept is ever evicted: the storage grows instead.
    #[test]
    fn without_a_limit_kept_blocks_stay() {
        let (d, bs) = (1, 2);
        let mut cache = KvCache::<f64>::new(0, 16, d, bs);
        let row = cache.add_row();
        let (k, v) = positions(0, 4, d);
        cache.append_ragged(&[row; 4], &k, &v);
        cache.register_block(row, 0, 7).unwrap();
        cache.gather_rows(&[]);
        assert_eq!(cache.kept_blocks(), 1);
        let row = cache.add_row();
        let (k, v) = positions(0, 8, d);
        cache.append_ragged(&[row; 8], &k, &v);
        assert_eq!((cache.evictions(), cache.kept_blocks()), (0, 1));
    }
}
