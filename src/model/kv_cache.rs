//! Key/value caches of incremental decoding.
//!
//! [`KvCache`]: one `[batch, capacity, d_model]` block per layer, rows filled in order: the
//! cross-attention's projected encoder output (computed once per sentence), and the
//! self-attention of the language model. [`StepKvCache`]: the decoder's self-attention keys and
//! values stored step by step behind a table of row indices, so beam search reorders its
//! hypotheses by rewriting indices instead of copying keys.

use crate::Float;

/// Cached keys and values of one attention layer for incremental decoding:
/// `[batch, capacity, d_model]`, the first `len` rows of each batch element filled.
#[derive(Clone, Debug)]
pub struct KvCache<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub batch: usize,
    pub capacity: usize,
    pub len: usize,
}

impl<T: Float> KvCache<T> {
    /// An empty cache with room for `capacity` positions per batch element.
    pub fn new(batch: usize, capacity: usize, d_model: usize) -> Self {
        KvCache {
            k: vec![T::zero(); batch * capacity * d_model],
            v: vec![T::zero(); batch * capacity * d_model],
            batch,
            capacity,
            len: 0,
        }
    }

    /// Rebuilds the batch from the rows `rows` (any order, repeats allowed): row `j` becomes the
    /// old row `rows[j]`. Beam search uses it to make each surviving hypothesis inherit its
    /// parent's keys and values. Only the `len` filled positions of the rows that change
    /// (`rows[j] != j`) are copied; a beam that extends its own row costs nothing.
    pub fn gather_rows(&mut self, rows: &[usize]) {
        let block = self.k.len().checked_div(self.batch).unwrap_or(0);
        let filled = block.checked_div(self.capacity).unwrap_or(0) * self.len;
        if let Some(&r) = rows.iter().find(|&&r| r >= self.batch) {
            panic!("row {r} of a batch of {}", self.batch);
        }
        let moved: Vec<(usize, usize)> = rows
            .iter()
            .enumerate()
            .filter(|&(j, &r)| r != j)
            .map(|(j, &r)| (j, r))
            .collect();
        for buf in [&mut self.k, &mut self.v] {
            // The filled part of every moved row's source, read before anything is written.
            let mut picked = Vec::with_capacity(moved.len() * filled);
            for &(_, r) in &moved {
                picked.extend_from_slice(&buf[r * block..r * block + filled]);
            }
            buf.resize(rows.len() * block, T::zero());
            for (&(j, _), part) in moved.iter().zip(picked.chunks_exact(filled.max(1))) {
                buf[j * block..j * block + filled].copy_from_slice(part);
            }
        }
        self.batch = rows.len();
    }
}

/// Self-attention keys and values of a decoder fed one token per row and step, kept in the
/// order they were computed: every step appends one key row and one value row per batch row
/// to `k` and `v` (`[stored rows, d_model]`), and `rows[b * capacity + t]` names the stored row
/// that holds batch row `b`'s key and value at position `t` (a page table with pages of one
/// row). [`StepKvCache::gather_rows`] (beam search keeping a hypothesis' continuation) copies
/// `len` indices per moved row, not `len` keys and values; stored rows no row refers to any
/// more are simply never read again.
#[derive(Clone, Debug)]
pub struct StepKvCache<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
    /// `[batch, capacity]`; the first `len` of each row are valid.
    pub rows: Vec<u32>,
    pub batch: usize,
    pub capacity: usize,
    pub len: usize,
    pub d_model: usize,
}

impl<T: Float> StepKvCache<T> {
    /// An empty cache for `batch` rows of up to `capacity` positions. Keys and values take
    /// memory only as steps are appended.
    pub fn new(batch: usize, capacity: usize, d_model: usize) -> Self {
        StepKvCache {
            k: Vec::new(),
            v: Vec::new(),
            rows: vec![0; batch * capacity],
            batch,
            capacity,
            len: 0,
            d_model,
        }
    }

    /// Stores the keys and values `[batch, d_model]` of the next position of every row.
    pub fn push(&mut self, k_new: &[T], v_new: &[T]) {
        let d = self.d_model;
        assert!(self.len < self.capacity, "KV cache capacity exceeded");
        assert_eq!(k_new.len(), self.batch * d, "one key row per batch row");
        assert_eq!(v_new.len(), self.batch * d, "one value row per batch row");
        let first = self.k.len().checked_div(d).unwrap_or(0);
        assert!(
            first + self.batch <= u32::MAX as usize,
            "KV cache holds more than 2^32 rows"
        );
        self.k.extend_from_slice(k_new);
        self.v.extend_from_slice(v_new);
        for b in 0..self.batch {
            self.rows[b * self.capacity + self.len] = (first + b) as u32;
        }
        self.len += 1;
    }

    /// Rebuilds the batch from the rows `rows` (any order, repeats allowed): row `j` becomes the
    /// old row `rows[j]`. Only the index table changes.
    pub fn gather_rows(&mut self, rows: &[usize]) {
        if let Some(&r) = rows.iter().find(|&&r| r >= self.batch) {
            panic!("row {r} of a batch of {}", self.batch);
        }
        let (cap, len) = (self.capacity, self.len);
        let mut table = vec![0; rows.len() * cap];
        for (j, &r) in rows.iter().enumerate() {
            table[j * cap..j * cap + len].copy_from_slice(&self.rows[r * cap..r * cap + len]);
        }
        self.rows = table;
        self.batch = rows.len();
    }

    /// Key (or, with `values`, value) of batch row `b` at position `t`, `[d_model]`.
    pub fn row(&self, b: usize, t: usize, values: bool) -> &[T] {
        assert!(b < self.batch && t < self.len, "no position {t} in row {b}");
        let at = self.rows[b * self.capacity + t] as usize * self.d_model;
        let buf = if values { &self.v } else { &self.k };
        &buf[at..at + self.d_model]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gather_rows` against copying every filled row: fixed points, repeats, shrinking and
    /// growing batches, and a cache with spare capacity.
    #[test]
    fn gather_rows_matches_copying_every_row() {
        let (capacity, len, d) = (5, 3, 2);
        let block = capacity * d;
        for rows in [
            vec![0, 1, 2, 3],
            vec![0, 0, 2, 2],
            vec![3, 1, 1, 0],
            vec![1, 2],
            vec![0, 0, 0, 1, 1, 1, 3],
            vec![],
        ] {
            let mut cache = KvCache::<f64>::new(4, capacity, d);
            cache.len = len;
            for (i, x) in cache.k.iter_mut().enumerate() {
                *x = i as f64;
            }
            for (i, x) in cache.v.iter_mut().enumerate() {
                *x = -(i as f64);
            }
            let old = cache.clone();
            cache.gather_rows(&rows);
            assert_eq!(
                (cache.batch, cache.k.len()),
                (rows.len(), rows.len() * block)
            );
            for (j, &r) in rows.iter().enumerate() {
                let filled =
                    |buf: &[f64], row: usize| buf[row * block..row * block + len * d].to_vec();
                assert_eq!(filled(&cache.k, j), filled(&old.k, r), "{rows:?}");
                assert_eq!(filled(&cache.v, j), filled(&old.v, r), "{rows:?}");
            }
        }
    }

    /// The step cache against rows kept whole: appends, reorders with repeats, a shrinking and a
    /// growing batch, and more appends after each.
    #[test]
    fn step_cache_follows_its_rows() {
        let d = 3;
        let mut cache = StepKvCache::<f64>::new(2, 6, d);
        // Reference: each row's keys as a list of `[d]` vectors.
        let mut want: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 2];
        let mut next = 0.0;
        let mut step = |cache: &mut StepKvCache<f64>, want: &mut Vec<Vec<Vec<f64>>>| {
            let k: Vec<f64> = (0..cache.batch * d).map(|i| next + i as f64).collect();
            next += 100.0;
            let v: Vec<f64> = k.iter().map(|x| -x).collect();
            cache.push(&k, &v);
            for (b, row) in want.iter_mut().enumerate() {
                row.push(k[b * d..(b + 1) * d].to_vec());
            }
        };
        step(&mut cache, &mut want);
        step(&mut cache, &mut want);
        for rows in [vec![1, 0, 1], vec![2, 2, 0, 1], vec![3], vec![0, 0]] {
            cache.gather_rows(&rows);
            want = rows.iter().map(|&r| want[r].clone()).collect();
            step(&mut cache, &mut want);
            assert_eq!((cache.batch, cache.len), (want.len(), want[0].len()));
            for (b, row) in want.iter().enumerate() {
                for (t, key) in row.iter().enumerate() {
                    assert_eq!(cache.row(b, t, false), &key[..], "{rows:?} b {b} t {t}");
                    let value: Vec<f64> = key.iter().map(|x| -x).collect();
                    assert_eq!(cache.row(b, t, true), &value[..]);
                }
            }
        }
        cache.gather_rows(&[]);
        assert_eq!((cache.batch, cache.rows.len()), (0, 0));
    }
}
