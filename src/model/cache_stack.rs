//! One [`KvCache`] per attention layer of a stack, with the row bookkeeping written once: the
//! language model's decoding state is one stack (`LmState`), the translator's two (its
//! self-attention and its cross-attention caches, `DecodeState`). Every layer's cache holds the
//! same rows at the same lengths, so the first one answers for all.

use super::kv_cache::{KvCache, KvTypes};
use crate::Float;

/// The caches of a stack of attention layers, one per layer.
#[derive(Clone, Debug, Default)]
pub struct CacheStack<T> {
    pub caches: Vec<KvCache<T>>,
}

impl<T: Float> CacheStack<T> {
    /// Empty caches of `batch` rows of `capacity` positions in blocks of `block_rows`, one per
    /// key/value width in `d_kv` (one per layer).
    pub fn new(
        d_kv: impl IntoIterator<Item = usize>,
        batch: usize,
        capacity: usize,
        block_rows: usize,
    ) -> Self {
        let widths = d_kv.into_iter().map(|d| (d, d));
        Self::with_types(widths, batch, capacity, block_rows, KvTypes::default())
    }

    /// As [`new`](Self::new), keys and values stored as `types`, one cache per `(d_kv,
    /// d_head)` of `widths` (a layer's key/value width and its heads').
    pub fn with_types(
        widths: impl IntoIterator<Item = (usize, usize)>,
        batch: usize,
        capacity: usize,
        block_rows: usize,
        types: KvTypes,
    ) -> Self {
        let caches = widths
            .into_iter()
            .map(|w| KvCache::with_types(batch, capacity, w, block_rows, types))
            .collect();
        CacheStack { caches }
    }

    /// Bytes the stored keys and values of every layer hold.
    pub fn stored_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::stored_bytes).sum()
    }

    /// Positions fed so far (ragged rows: in the longest row).
    pub fn len(&self) -> usize {
        self.caches.first().map_or(0, |c| c.len)
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions each row has room for.
    pub fn capacity(&self) -> usize {
        self.caches.first().map_or(0, |c| c.capacity)
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.caches.first().map_or(0, |c| c.batch)
    }

    /// Positions row `b` holds.
    pub fn row_len(&self, b: usize) -> usize {
        self.caches.first().map_or(0, |c| c.row_len(b))
    }

    /// The positions each row holds, `[rows]`.
    pub fn row_lens(&self) -> Vec<usize> {
        (0..self.rows()).map(|b| self.row_len(b)).collect()
    }

    /// Row `j` becomes the old row `rows[j]` (any order, repeats allowed) in every layer.
    pub fn gather_rows(&mut self, rows: &[usize]) {
        for cache in &mut self.caches {
            cache.gather_rows(rows);
        }
    }

    /// Cuts row `b` back to its first `n` positions in every layer
    /// ([`KvCache::truncate_row`]: speculative decoding dropping rejected drafts).
    pub fn truncate_row(&mut self, b: usize, n: usize) {
        for cache in &mut self.caches {
            cache.truncate_row(b, n);
        }
    }

    /// Whether every layer can cut row `b` back to `n` positions
    /// ([`KvCache::can_truncate_row`]).
    pub fn can_truncate_row(&self, b: usize, n: usize) -> bool {
        self.caches.iter().all(|c| c.can_truncate_row(b, n))
    }

    /// A new empty row at the end of every layer's cache (continuous batching); its index.
    pub fn add_row(&mut self) -> usize {
        self.caches
            .iter_mut()
            .map(KvCache::add_row)
            .last()
            .unwrap_or(0)
    }

    /// Appends the first `lens[b]` positions of each row `b` of `other` (a stack of the same
    /// depth) as new rows.
    pub fn push_rows_from(&mut self, other: &CacheStack<T>, lens: &[usize]) {
        assert_eq!(
            self.caches.len(),
            other.caches.len(),
            "states of models with different numbers of layers"
        );
        for (mine, theirs) in self.caches.iter_mut().zip(&other.caches) {
            for (b, &n) in lens.iter().enumerate() {
                mine.push_row_from(theirs, b, n);
            }
        }
    }

    /// Blocks in use, summed over the layers.
    pub fn blocks_in_use(&self) -> usize {
        self.caches.iter().map(KvCache::blocks_in_use).sum()
    }

    /// Blocks in use by the first layer (every layer holds as many).
    pub fn blocks_per_layer(&self) -> usize {
        self.caches.first().map_or(0, KvCache::blocks_in_use)
    }

    /// [`KvCache::set_block_limit`] in every layer.
    pub fn set_block_limit(&mut self, blocks: Option<usize>) {
        for cache in &mut self.caches {
            cache.set_block_limit(blocks);
        }
    }

    /// [`KvCache::register_block`] in every layer. Every layer's cache makes the same moves, so
    /// the block has the same id in every layer; `None` if it is not held (full) in them all.
    pub fn register_block(&mut self, b: usize, i: usize, key: u64) -> Option<u32> {
        let ids: Vec<Option<u32>> = self
            .caches
            .iter_mut()
            .map(|c| c.register_block(b, i, key))
            .collect();
        let first = *ids.first()?;
        assert!(
            ids.iter().all(|&id| id == first),
            "layers hold row {b}'s block {i} under different ids: {ids:?}"
        );
        first
    }

    /// The key of block `id` (the same in every layer), if it has one.
    pub fn block_key(&self, id: u32) -> Option<u64> {
        self.caches.first().and_then(|c| c.block_key(id))
    }

    /// [`KvCache::share_blocks`] in every layer.
    pub fn share_blocks(&mut self, b: usize, ids: &[u32]) {
        for cache in &mut self.caches {
            cache.share_blocks(b, ids);
        }
    }

    /// Blocks kept for their key that no row holds (first layer; every layer holds as many).
    pub fn kept_blocks(&self) -> usize {
        self.caches.first().map_or(0, KvCache::kept_blocks)
    }

    /// Blocks carrying a prefix key, held or kept (first layer).
    pub fn keyed_blocks(&self) -> usize {
        self.caches.first().map_or(0, KvCache::keyed_blocks)
    }
}

impl<T> CacheStack<T> {
    /// The layers' caches in order.
    pub fn iter(&self) -> std::slice::Iter<'_, KvCache<T>> {
        self.caches.iter()
    }
}

impl<T> std::ops::Index<usize> for CacheStack<T> {
    type Output = KvCache<T>;
    fn index(&self, layer: usize) -> &KvCache<T> {
        &self.caches[layer]
    }
}

impl<T> std::ops::IndexMut<usize> for CacheStack<T> {
    fn index_mut(&mut self, layer: usize) -> &mut KvCache<T> {
        &mut self.caches[layer]
    }
}

impl<'a, T> IntoIterator for &'a CacheStack<T> {
    type Item = &'a KvCache<T>;
    type IntoIter = std::slice::Iter<'a, KvCache<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.caches.iter()
    }
}
