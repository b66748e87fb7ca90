//! Cutting a row back to fewer positions: the verification step of speculative decoding
//! (`crate::decode::speculative`) appends the keys and values of every drafted token, then
//! keeps only those of the accepted ones.
//!
//! For row `b` cut from `n₀` to `n` positions: the blocks `⌈n / block_rows⌉ .. ⌈n₀ /
//! block_rows⌉` are released (back to the free list, or, keyed, to the prefix cache's kept
//! list: their contents are untouched, so their keys stay true); the block holding position
//! `n` when `n` is not a block boundary stays, and the row will write into it again, so:
//! shared with another row, it is copied on that write (as any shared block is); held by this
//! row alone and keyed, it loses its key now, since its positions past `n` will no longer be
//! the tokens the key names. A row's length only shrinks here; a cache whose layer keeps
//! running sums (linear attention) cannot be cut back, nor a row past blocks a sliding window
//! has released.

use super::KvCache;
use crate::Float;

impl<T: Float> KvCache<T> {
    /// Whether [`truncate_row`](Self::truncate_row) can cut row `b` back to `n` positions:
    /// no running sums, and no position before `n` released by a sliding window.
    pub fn can_truncate_row(&self, b: usize, n: usize) -> bool {
        self.running.is_none()
            && b < self.batch
            && n <= self.lens[b]
            && n >= self.first_live[b] * self.block_rows
    }

    /// Cuts row `b` back to its first `n` positions (module docs). Panics when `n` exceeds the
    /// row's length, when the layer keeps running sums (linear attention), or when positions
    /// before `n` were released by a sliding window.
    pub fn truncate_row(&mut self, b: usize, n: usize) {
        assert!(b < self.batch, "row {b} of a batch of {}", self.batch);
        let old = self.lens[b];
        assert!(n <= old, "row {b} holds {old} positions, not {n}");
        if n == old {
            return;
        }
        assert!(
            self.running.is_none(),
            "a linear-attention layer's running sums cannot be rolled back"
        );
        let (bs, per_row) = (self.block_rows, self.blocks_per_row());
        assert!(
            n >= self.first_live[b] * bs,
            "row {b}'s positions before {} were released (sliding window)",
            self.first_live[b] * bs
        );
        for i in n.div_ceil(bs)..old.div_ceil(bs) {
            self.release(self.table[b * per_row + i]);
        }
        if !n.is_multiple_of(bs) {
            let id = self.table[b * per_row + n / bs];
            if self.refs[id as usize] == 1 {
                self.prefix.forget(id);
            }
        }
        self.lens[b] = n;
        self.len = self.lens.iter().copied().max().unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` positions of keys numbered from `from` (values: their negatives), `[n, d]`.
    fn positions(from: usize, n: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
        let k: Vec<f64> = (from * d..(from + n) * d).map(|x| x as f64).collect();
        let v = k.iter().map(|x| -x).collect();
        (k, v)
    }

    /// A row cut back and grown again holds its kept positions and the new ones; the blocks
    /// past its length are free; the other rows are untouched; a dense one-block row too.
    #[test]
    fn a_row_cut_back_grows_again_from_its_new_length() {
        let (d, bs) = (2, 4);
        let mut cache = KvCache::<f64>::new(0, 32, d, bs);
        let (a, b) = (cache.add_row(), cache.add_row());
        let (k, v) = positions(0, 11, d);
        cache.append_ragged(&[a; 11], &k, &v);
        let (kb, vb) = positions(100, 6, d);
        cache.append_ragged(&[b; 6], &kb, &vb);
        assert_eq!(cache.blocks_in_use(), 3 + 2);
        assert!(cache.can_truncate_row(a, 5));
        cache.truncate_row(a, 5);
        assert_eq!((cache.row_len(a), cache.len, cache.blocks_in_use()), (5, 6, 2 + 2));
        let (k2, v2) = positions(50, 4, d);
        cache.append_ragged(&[a; 4], &k2, &v2);
        for t in 0..5 {
            assert_eq!(cache.row(a, t, false), &k[t * d..(t + 1) * d]);
        }
        for t in 0..4 {
            assert_eq!(cache.row(a, 5 + t, true), &v2[t * d..(t + 1) * d]);
        }
        for t in 0..6 {
            assert_eq!(cache.row(b, t, false), &kb[t * d..(t + 1) * d]);
        }
        cache.truncate_row(b, 0);
        assert_eq!((cache.row_len(b), cache.blocks_in_use()), (0, 3));
        // One block per row (the language model's dense cache).
        let mut dense = KvCache::<f64>::new(1, 8, d, 8);
        let (k, v) = positions(0, 7, d);
        dense.append(&k, &v);
        dense.truncate_row(0, 3);
        let (k3, v3) = positions(70, 2, d);
        dense.append(&k3, &v3);
        assert_eq!(dense.len, 5);
        let (dk, dv) = dense.dense();
        assert_eq!(&dk[..3 * d], &k[..3 * d]);
        assert_eq!(&dk[3 * d..5 * d], &k3[..]);
        assert_eq!(&dv[3 * d..5 * d], &v3[..]);
    }

    /// A keyed block shared by two rows: the row cut back into it copies it on its next
    /// write, so the other row and the key keep the original contents; a keyed block held by
    /// one row loses its key when that row is cut back into it; a keyed block released whole
    /// stays kept.
    #[test]
    fn prefix_keys_stay_true_after_a_cut() {
        let (d, bs) = (1, 4);
        let mut cache = KvCache::<f64>::new(0, 32, d, bs);
        let row = cache.add_row();
        let (k, v) = positions(0, 8, d);
        cache.append_ragged(&[row; 8], &k, &v);
        let ids: Vec<u32> = (0..2)
            .map(|i| cache.register_block(row, i, 10 + i as u64).unwrap())
            .collect();
        let other = cache.add_row();
        cache.share_blocks(other, &ids);
        // Shared: cut `row` into block 1, write over position 6.
        cache.truncate_row(row, 6);
        cache.append_ragged(&[row], &[-5.0], &[5.0]);
        assert_eq!(&cache.row(row, 6, false)[..], &[-5.0]);
        assert_eq!(&cache.row(other, 6, false)[..], &[6.0]);
        assert_eq!(cache.block_key(ids[1]), Some(11));
        // Held by `other` alone now: cut into it, its key goes; block 0 stays keyed.
        cache.truncate_row(other, 7);
        assert_eq!(cache.block_key(ids[1]), None);
        assert_eq!(cache.block_key(ids[0]), Some(10));
        // Released whole: block 0 is kept once no row holds it.
        cache.truncate_row(other, 0);
        cache.truncate_row(row, 0);
        assert_eq!(cache.kept_blocks(), 1);
    }
}
