//! The key/value cache of incremental decoding, one per attention layer: the projected keys and
//! values of every position fed so far, for each row of the batch.
//!
//! Storage is a list of fixed-size **blocks** of `block_rows` positions (`[block_rows, d_model]`
//! keys and values each), and each batch row has a **block table**: position `t` of row `b` lives
//! in block `table[b][t / block_rows]` at offset `t % block_rows`. This is the layout of
//! PagedAttention (Kwon et al., 2023):
//! - rows are re-ordered, dropped or repeated ([`KvCache::gather_rows`]: beam search keeping a
//!   hypothesis' continuation, greedy search dropping finished sentences) by rewriting tables, not
//!   by copying keys and values; a block shared by several rows is copied only when one of them
//!   writes into it (copy on write), and a block no row refers to returns to the free list;
//! - memory follows the positions actually held, one block at a time.
//!
//! The block size is a choice of the layer that owns the cache:
//! - `1` for the decoder's self-attention fed one token per step (beam search re-gathers its
//!   rows after every step: with one position per block nothing is ever copied);
//! - the whole capacity (one block per row) for the cross-attention's projected source and the
//!   language model's self-attention, whose attention runs as matrix products over a dense
//!   `[batch, capacity, d_model]` buffer ([`KvCache::dense`]).
//!
//! **Ragged rows** (continuous batching, `serve`): rows may also be added one at a time
//! ([`KvCache::add_row`]), grow by different numbers of positions ([`KvCache::append_ragged`])
//! and leave ([`KvCache::gather_rows`]); each row then has its own length ([`KvCache::row_len`])
//! and `len` is the longest. One such cache per layer, with small blocks, is the serving pool:
//! every sequence of the running batch is a row, its blocks come from the shared free list and
//! go back to it the moment the row leaves.
//!
//! **Sliding windows** (Mistral): a layer whose queries see only their last `w` keys releases,
//! before each step, the blocks of a row whose positions all lie before the window of the
//! step's first query ([`KvCache::release_before`]); a row then holds at most
//! `⌈w / block_rows⌉ + 1` blocks however long it grows. The released positions keep their
//! table entries but are never attended (the window masks them).
//!
//! **Linear attention** (`kernels::linear_attention`): such a layer stores no keys or values,
//! only its running sums per row ([`KvCache::linear_state`], the same size at every length);
//! its positions are counted ([`KvCache::advance_ragged`]) and its rows gathered, added and
//! copied with the others. A Gated DeltaNet layer (`super::gated_delta`) keeps its
//! convolution window and delta-rule states the same way ([`KvCache::delta_state`]).
//!
//! **Rollback** (speculative decoding, `rollback`): a row may be cut back to fewer positions
//! ([`KvCache::truncate_row`]); the blocks past its new length are released, and a block it
//! will write into again loses its prefix key (or is copied first, if another row shares it).
//!
//! **Prefix caching** (`serve`, [`prefix`]): a full block may carry a key naming the tokens it and
//! every block before it hold; released, it waits in a least-recently-used list instead of the
//! free list, so a later row whose prompt starts with the same tokens can take it back
//! ([`KvCache::share_blocks`]); it is evicted (oldest first) only when a block is needed, no
//! plain free block remains and the storage is at its limit ([`KvCache::set_block_limit`]).

#[cfg(test)]
mod packed_tests;
pub mod prefix;
mod rollback;
pub mod rows;
pub use prefix::PrefixBlocks;
pub use rows::{KvTypes, StoredRows};

use crate::backend::{DeltaState, KvSlice, KvStore, LinearState};
use crate::Float;
use std::borrow::Cow;

/// Cached keys and values of one attention layer: see the module docs.
#[derive(Clone, Debug)]
pub struct KvCache<T> {
    /// Keys `[blocks, block_rows, d_model]`, in the cache's key type (`rows`).
    k: StoredRows<T>,
    /// Values, laid out like `k`, in the value type.
    v: StoredRows<T>,
    /// `[batch, blocks_per_row]` block ids; the first `len.div_ceil(block_rows)` of a row are
    /// valid.
    table: Vec<u32>,
    /// How many table entries refer to each block (0: free).
    refs: Vec<u32>,
    /// Blocks no table refers to, reused before the storage grows.
    free: Vec<u32>,
    pub block_rows: usize,
    pub batch: usize,
    /// Positions each row has room for.
    pub capacity: usize,
    /// Positions filled in every row (ragged rows: in the longest row).
    pub len: usize,
    pub d_model: usize,
    /// Positions filled in each row `[batch]` (all `len` unless rows were appended ragged).
    lens: Vec<usize>,
    /// Per row, its first block still held: those before were released (sliding window).
    first_live: Vec<usize>,
    /// A linear-attention or Gated DeltaNet layer's state, one row per batch row (then no keys
    /// or values are stored).
    running: Option<Running<T>>,
    /// Blocks kept for their prefix key after their last row left (see [`prefix`]).
    prefix: PrefixBlocks,
}

impl<T: Float> KvCache<T> {
    /// An empty cache for `batch` rows of up to `capacity` positions, in blocks of
    /// `block_rows` positions (at least 1, at most `capacity`). Takes memory only as positions
    /// are appended.
    pub fn new(batch: usize, capacity: usize, d_model: usize, block_rows: usize) -> Self {
        Self::with_types(batch, capacity, (d_model, d_model), block_rows, KvTypes::default())
    }

    /// As [`new`](Self::new), keys and values stored as `types` (`rows`; packed types need
    /// `d_model` in whole blocks), in heads of `d_head` values (which choose the block types'
    /// rotations, [`KvTypes::rotations`]).
    pub fn with_types(
        batch: usize,
        capacity: usize,
        (d_model, d_head): (usize, usize),
        block_rows: usize,
        types: KvTypes,
    ) -> Self {
        let block_rows = block_rows.clamp(1, capacity.max(1));
        let (k_rotation, v_rotation) = types.rotations(d_head);
        KvCache {
            k: StoredRows::new(types.k, d_model, k_rotation),
            v: StoredRows::new(types.v, d_model, v_rotation),
            table: vec![0; batch * capacity.div_ceil(block_rows)],
            refs: Vec::new(),
            free: Vec::new(),
            block_rows,
            batch,
            capacity,
            len: 0,
            d_model,
            lens: vec![0; batch],
            first_live: vec![0; batch],
            running: None,
            prefix: PrefixBlocks::default(),
        }
    }

    /// The running sums of a linear-attention layer, made by `make(batch)` on first use.
    pub fn linear_state(
        &mut self,
        make: impl FnOnce(usize) -> LinearState<T>,
    ) -> &mut LinearState<T> {
        let batch = self.batch;
        match self.running.get_or_insert_with(|| Running::Linear(make(batch))) {
            Running::Linear(state) => state,
            Running::Delta(_) => panic!("a Gated DeltaNet layer's cache read as linear attention's"),
        }
    }

    /// The convolution windows and delta-rule states of a Gated DeltaNet layer, made by
    /// `make(batch)` on first use.
    pub fn delta_state(
        &mut self,
        make: impl FnOnce(usize) -> DeltaState<T>,
    ) -> &mut DeltaState<T> {
        let batch = self.batch;
        match self.running.get_or_insert_with(|| Running::Delta(make(batch))) {
            Running::Delta(state) => state,
            Running::Linear(_) => panic!("a linear-attention layer's cache read as Gated DeltaNet's"),
        }
    }

    /// Counts one more position for each entry of `rows` (a linear-attention layer, whose
    /// state took the tokens), storing nothing.
    pub fn advance_ragged(&mut self, rows: &[usize]) {
        for &b in rows {
            assert!(b < self.batch, "row {b} of a batch of {}", self.batch);
            assert!(self.lens[b] < self.capacity, "KV cache capacity exceeded");
            self.lens[b] += 1;
            self.len = self.len.max(self.lens[b]);
        }
    }

    /// A full cache of `batch` rows of `len` positions, one block per row, holding `k` and `v`
    /// (`[batch * len, d_model]` each, row-major): the cross-attention's projected source.
    pub fn from_dense(k: Vec<T>, v: Vec<T>, batch: usize, len: usize, d_model: usize) -> Self {
        assert_eq!(
            k.len(),
            batch * len * d_model,
            "keys are [batch * len, d_model]"
        );
        assert_eq!(v.len(), k.len(), "values are shaped like the keys");
        let mut cache = Self::new(batch, len, d_model, len);
        if len > 0 {
            cache.table = (0..batch as u32).collect();
            cache.refs = vec![1; batch];
        }
        (cache.k, cache.v) = (StoredRows::Float(k), StoredRows::Float(v));
        cache.len = len;
        cache.lens = vec![len; batch];
        cache
    }

    /// Whether attention reads this cache through its block table (blocks smaller than a row,
    /// or of one position: the translator's self-attention, the serving pool) rather than as
    /// one dense block per row (the language model's self-attention, a projected source); see
    /// `super::step_layout`.
    pub fn is_paged(&self) -> bool {
        self.block_rows < self.capacity || self.block_rows == 1
    }

    /// The storage types of the keys and values.
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.k.ty(),
            v: self.v.ty(),
        }
    }

    /// Bytes the stored keys and values hold (free and kept blocks included).
    pub fn stored_bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }

    /// Blocks some row refers to (the memory the cache holds is `block_rows · d_model` keys
    /// and as many values per block in use, in their types; free blocks are kept for reuse).
    pub fn blocks_in_use(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    fn blocks_per_row(&self) -> usize {
        self.capacity.div_ceil(self.block_rows)
    }

    /// A block for one table entry: a free one, or a new one at the end of the storage, or
    /// (storage at its limit) the least recently used block kept for its prefix key.
    fn alloc(&mut self) -> u32 {
        let id = match self.free.pop().or_else(|| self.evict_for_alloc()) {
            Some(id) => id,
            None => {
                self.k.grow(self.block_rows, self.d_model);
                self.v.grow(self.block_rows, self.d_model);
                self.refs.push(0);
                assert!(
                    self.refs.len() <= u32::MAX as usize,
                    "KV cache holds 2^32 blocks"
                );
                (self.refs.len() - 1) as u32
            }
        };
        self.refs[id as usize] = 1;
        id
    }

    /// Drops one reference to `id`; the block is free when none is left.
    fn release(&mut self, id: u32) {
        let r = &mut self.refs[id as usize];
        *r -= 1;
        if *r == 0 && !self.prefix.keep(id) {
            self.free.push(id);
        }
    }

    /// Appends `q_len` positions to every row: `k_new`, `v_new` are `[batch * q_len, d_model]`
    /// (row `b`'s positions consecutive).
    pub fn append(&mut self, k_new: &[T], v_new: &[T]) {
        let d = self.d_model;
        let q_len = k_new.len().checked_div(self.batch * d).unwrap_or(0);
        assert_eq!(
            k_new.len(),
            self.batch * q_len * d,
            "keys are [batch * q_len, d_model]"
        );
        assert_eq!(v_new.len(), k_new.len(), "values are shaped like the keys");
        assert!(
            self.len + q_len <= self.capacity,
            "KV cache capacity exceeded"
        );
        assert!(
            self.lens.iter().all(|&l| l == self.len),
            "rows of different lengths grow with append_ragged"
        );
        for b in 0..self.batch {
            for i in 0..q_len {
                let src = (b * q_len + i) * d;
                self.write(b, self.len + i, &k_new[src..src + d], &v_new[src..src + d]);
            }
        }
        self.len += q_len;
        self.lens.iter_mut().for_each(|l| *l += q_len);
    }

    /// Stores key `k` and value `v` (`[d_model]` each) at position `t` of row `b`: a new block
    /// when `t` starts one, a private copy of a shared block before writing into it.
    fn write(&mut self, b: usize, t: usize, k: &[T], v: &[T]) {
        let (d, bs) = (self.d_model, self.block_rows);
        let slot = b * self.blocks_per_row() + t / bs;
        if t.is_multiple_of(bs) {
            self.table[slot] = self.alloc();
        } else if self.refs[self.table[slot] as usize] > 1 {
            // Copy on write: this row stops sharing the block with the others.
            let shared = self.table[slot];
            let own = self.alloc();
            let (from, to) = (shared as usize * bs, own as usize * bs);
            self.k.copy_rows(from, to, bs, d);
            self.v.copy_rows(from, to, bs, d);
            self.release(shared);
            self.table[slot] = own;
        }
        let at = self.table[slot] as usize * bs + t % bs;
        self.k.write(at, k, d);
        self.v.write(at, v, d);
    }

    /// A new empty row at the end of the batch (ragged use); returns its index.
    pub fn add_row(&mut self) -> usize {
        let per_row = self.blocks_per_row();
        self.table.resize(self.table.len() + per_row, 0);
        self.lens.push(0);
        self.first_live.push(0);
        self.len = self.lens.iter().copied().max().unwrap_or(0);
        if let Some(state) = &mut self.running {
            state.add_row();
        }
        self.batch += 1;
        self.batch - 1
    }

    /// A new row at the end of the batch holding positions `0 .. n` of row `b` of `other`
    /// (copied; `other` may have another block size and capacity, at most this one's):
    /// decoding states of separate starts joined into one running batch. Returns its index.
    pub fn push_row_from(&mut self, other: &KvCache<T>, b: usize, n: usize) -> usize {
        assert_eq!(other.d_model, self.d_model, "caches of different widths");
        assert!(
            n <= other.row_len(b),
            "row {b} holds {} positions",
            other.row_len(b)
        );
        assert!(n <= self.capacity, "KV cache capacity exceeded");
        let row = self.add_row();
        if let Some(theirs) = &other.running {
            let batch = self.batch;
            let state = self.running.get_or_insert_with(|| theirs.empty_like(batch));
            state.copy_row(row, theirs, b);
            assert_eq!(
                n,
                other.row_len(b),
                "a linear-attention state holds whole rows"
            );
            self.lens[row] = n;
            self.len = self.len.max(n);
            return row;
        }
        // Blocks `other` released (sliding window) are not copied: they are never read.
        let first =
            (other.first_live[b] * other.block_rows / self.block_rows).min(n / self.block_rows);
        self.first_live[row] = first;
        for t in first * self.block_rows..n {
            self.write(row, t, &other.row(b, t, false), &other.row(b, t, true));
        }
        self.lens[row] = n;
        self.len = self.len.max(n);
        row
    }

    /// Positions filled in row `b`.
    pub fn row_len(&self, b: usize) -> usize {
        self.lens[b]
    }

    /// Releases the blocks of row `b` whose positions all lie before `pos` (no later query of a
    /// sliding-window layer sees them). Their table entries stay, never attended.
    pub fn release_before(&mut self, b: usize, pos: usize) {
        let (bs, per_row) = (self.block_rows, self.blocks_per_row());
        let end = (pos / bs).min(self.lens[b].div_ceil(bs));
        for i in self.first_live[b]..end {
            self.release(self.table[b * per_row + i]);
        }
        self.first_live[b] = self.first_live[b].max(end);
    }

    /// Appends position `i` of `k_new`, `v_new` (`[n, d_model]` each) to row `rows[i]` at its
    /// next position, in order (a row may appear several times: a prompt chunk).
    pub fn append_ragged(&mut self, rows: &[usize], k_new: &[T], v_new: &[T]) {
        let d = self.d_model;
        assert_eq!(k_new.len(), rows.len() * d, "keys are [rows, d_model]");
        assert_eq!(v_new.len(), k_new.len(), "values are shaped like the keys");
        for (i, &b) in rows.iter().enumerate() {
            assert!(b < self.batch, "row {b} of a batch of {}", self.batch);
            let t = self.lens[b];
            assert!(t < self.capacity, "KV cache capacity exceeded");
            self.write(b, t, &k_new[i * d..(i + 1) * d], &v_new[i * d..(i + 1) * d]);
            self.lens[b] += 1;
            self.len = self.len.max(t + 1);
        }
    }

    /// The stored rows (indices into `[stored rows, d_model]`, see [`paged`](Self::paged)) of
    /// positions `0 .. n` of row `b`, appended to `out`.
    pub fn stored_rows_of(&self, b: usize, n: usize, out: &mut Vec<u32>) {
        assert!(
            n <= self.lens[b],
            "row {b} holds {} positions",
            self.lens[b]
        );
        let (bs, per_row) = (self.block_rows, self.blocks_per_row());
        let blocks = &self.table[b * per_row..b * per_row + n.div_ceil(bs)];
        for (i, &id) in blocks.iter().enumerate() {
            let start = id as usize * bs;
            let count = bs.min(n - i * bs);
            out.extend((start..start + count).map(|r| r as u32));
        }
    }

    /// Keys and values as stored, `[stored rows, d_model]` each, floats or packed (read
    /// through [`stored_rows_of`](Self::stored_rows_of)).
    pub fn storage(&self) -> (KvSlice<'_, T>, KvSlice<'_, T>) {
        (self.k.view(), self.v.view())
    }

    /// Rows the storage holds (`blocks · block_rows`).
    pub fn stored_rows(&self) -> usize {
        self.refs.len() * self.block_rows
    }

    /// Rebuilds the batch from the rows `rows` (any order, repeats allowed): row `j` becomes the
    /// old row `rows[j]`. Only tables change; repeated rows share blocks until they write.
    pub fn gather_rows(&mut self, rows: &[usize]) {
        if let Some(&r) = rows.iter().find(|&&r| r >= self.batch) {
            panic!("row {r} of a batch of {}", self.batch);
        }
        let per_row = self.blocks_per_row();
        let bs = self.block_rows;
        // A linear-attention layer counts positions but stores no blocks (its state is gathered
        // below): its table holds nothing to share or release.
        let stores_blocks = self.running.is_none();
        let used = |len: usize| if stores_blocks { len.div_ceil(bs) } else { 0 };
        let mut table = vec![0; rows.len() * per_row];
        for (j, &r) in rows.iter().enumerate() {
            let old = &self.table[r * per_row..r * per_row + used(self.lens[r])];
            table[j * per_row..j * per_row + old.len()].copy_from_slice(old);
            for &id in &old[self.first_live[r].min(old.len())..] {
                self.refs[id as usize] += 1;
            }
        }
        for b in 0..self.batch {
            for i in self.first_live[b]..used(self.lens[b]) {
                self.release(self.table[b * per_row + i]);
            }
        }
        self.table = table;
        self.batch = rows.len();
        self.first_live = rows.iter().map(|&r| self.first_live[r]).collect();
        self.lens = rows.iter().map(|&r| self.lens[r]).collect();
        if let Some(state) = &mut self.running {
            state.gather_rows(rows);
        }
        if self.lens.iter().any(|&l| l != self.len) {
            self.len = self.lens.iter().copied().max().unwrap_or(0);
        }
    }

    /// The stored row of position `t` of batch row `b` (an index into `[stored rows, d_model]`).
    fn stored_row(&self, b: usize, t: usize) -> usize {
        let block = self.table[b * self.blocks_per_row() + t / self.block_rows] as usize;
        block * self.block_rows + t % self.block_rows
    }

    /// Key (or, with `values`, value) of batch row `b` at position `t`, `[d_model]` (unpacked
    /// from a packed type).
    pub fn row(&self, b: usize, t: usize, values: bool) -> Cow<'_, [T]> {
        assert!(
            b < self.batch && t < self.lens[b],
            "no position {t} in row {b}"
        );
        let at = self.stored_row(b, t);
        let buf = if values { &self.v } else { &self.k };
        buf.read(at, self.d_model)
    }

    /// Keys and values as stored, `[stored rows, d_model]` (floats or packed), and the table
    /// of stored rows `[batch, capacity]` (the first `len` of each row valid) that the step
    /// kernel reads them through (`kernels::step_attention`).
    pub fn paged(&self) -> (KvSlice<'_, T>, KvSlice<'_, T>, Cow<'_, [u32]>) {
        let rows = if self.block_rows == 1 {
            Cow::Borrowed(&self.table[..])
        } else {
            let mut rows = vec![0u32; self.batch * self.capacity];
            for b in 0..self.batch {
                for t in 0..self.len {
                    rows[b * self.capacity + t] = self.stored_row(b, t) as u32;
                }
            }
            Cow::Owned(rows)
        };
        (self.k.view(), self.v.view(), rows)
    }

    /// Keys and values as dense `[batch, capacity, d_model]` buffers (position `t` of row `b`
    /// at row `b * capacity + t`), for attention as matrix products. Free when every row owns
    /// block `b` whole (one block per row, in order) and the types are floats; otherwise the
    /// blocks are first put in that order, and packed rows are unpacked into a copy (the first
    /// `len` positions of each row; the cache keeps its packed form).
    pub fn dense(&mut self) -> (Cow<'_, [T]>, Cow<'_, [T]>) {
        let in_order = self.block_rows == self.capacity
            && self
                .table
                .iter()
                .enumerate()
                .all(|(b, &id)| id as usize == b)
            && self.refs.iter().all(|&r| r == 1);
        if !in_order && self.len > 0 {
            let (d, cap) = (self.d_model, self.capacity);
            let mut k = self.k.new_like(d);
            let mut v = self.v.new_like(d);
            k.grow(self.batch * cap, d);
            v.grow(self.batch * cap, d);
            for b in 0..self.batch {
                for t in 0..self.len {
                    let (from, to) = (self.stored_row(b, t), b * cap + t);
                    k.copy_row_from(to, &self.k, from, d);
                    v.copy_row_from(to, &self.v, from, d);
                }
            }
            *self = KvCache {
                table: (0..self.batch as u32).collect(),
                refs: vec![1; self.batch],
                free: Vec::new(),
                block_rows: cap,
                lens: std::mem::take(&mut self.lens),
                first_live: vec![0; self.batch],
                running: self.running.take(),
                prefix: PrefixBlocks::default(),
                k,
                v,
                ..*self
            };
        }
        (self.unpacked(&self.k), self.unpacked(&self.v))
    }

    /// `rows` (this cache's keys or values, one block per row) as floats `[batch, capacity,
    /// d_model]`: themselves, or the first `row_len` positions of each row unpacked.
    fn unpacked<'a>(&self, rows: &'a StoredRows<T>) -> Cow<'a, [T]> {
        if let StoredRows::Float(x) = rows {
            return Cow::Borrowed(x);
        }
        let (d, cap) = (self.d_model, self.capacity);
        let mut x = vec![T::zero(); self.batch * cap * d];
        for b in 0..self.batch {
            for t in 0..self.lens[b].min(cap) {
                let r = b * cap + t;
                x[r * d..(r + 1) * d].copy_from_slice(&rows.read(r, d));
            }
        }
        Cow::Owned(x)
    }
}

/// The attention call reads a cache as the kernel it chooses needs: rows in order
/// ([`KvCache::dense`]) or through the table of stored rows ([`KvCache::paged`]); both with
/// `capacity` positions per row.
impl<T: Float> KvStore<T> for KvCache<T> {
    fn contiguous(&mut self) -> (Cow<'_, [T]>, Cow<'_, [T]>) {
        self.dense()
    }
    fn paged(&self) -> (KvSlice<'_, T>, KvSlice<'_, T>, Cow<'_, [u32]>) {
        KvCache::paged(self)
    }
}

/// The state a layer keeps in place of keys and values: linear attention's running sums or a
/// Gated DeltaNet layer's windows and states; either one row per batch row.
#[derive(Clone, Debug)]
enum Running<T> {
    Linear(LinearState<T>),
    Delta(DeltaState<T>),
}

impl<T: Float> Running<T> {
    fn add_row(&mut self) -> usize {
        match self {
            Running::Linear(s) => s.add_row(),
            Running::Delta(s) => s.add_row(),
        }
    }

    fn gather_rows(&mut self, rows: &[usize]) {
        match self {
            Running::Linear(s) => s.gather_rows(rows),
            Running::Delta(s) => s.gather_rows(rows),
        }
    }

    fn empty_like(&self, rows: usize) -> Self {
        match self {
            Running::Linear(s) => Running::Linear(s.empty_like(rows)),
            Running::Delta(s) => Running::Delta(s.empty_like(rows)),
        }
    }

    /// Row `to` becomes a copy of row `from` of `other` (of the same kind and shape).
    fn copy_row(&mut self, to: usize, other: &Self, from: usize) {
        match (self, other) {
            (Running::Linear(s), Running::Linear(o)) => s.copy_row(to, o, from),
            (Running::Delta(s), Running::Delta(o)) => s.copy_row(to, o, from),
            _ => panic!("a linear-attention row copied into a Gated DeltaNet cache, or back"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends and re-gathers against rows kept whole, for several block sizes: reorders with
    /// repeats, shrinking and growing batches, prompts of several positions, copy on write.
    #[test]
    fn cache_follows_its_rows_for_every_block_size() {
        let d = 3;
        for block_rows in [1, 2, 3, 8] {
            let mut cache = KvCache::<f64>::new(2, 8, d, block_rows);
            // Reference: each row's keys as a list of `[d]` vectors.
            let mut want: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 2];
            let mut next = 0.0;
            let mut feed = |cache: &mut KvCache<f64>, want: &mut Vec<Vec<Vec<f64>>>, n: usize| {
                let k: Vec<f64> = (0..cache.batch * n * d).map(|i| next + i as f64).collect();
                next += 1000.0;
                let v: Vec<f64> = k.iter().map(|x| -x).collect();
                cache.append(&k, &v);
                for (b, row) in want.iter_mut().enumerate() {
                    for i in 0..n {
                        row.push(k[(b * n + i) * d..(b * n + i + 1) * d].to_vec());
                    }
                }
            };
            feed(&mut cache, &mut want, 3);
            for rows in [vec![1, 0, 1], vec![2, 2, 0, 1], vec![3], vec![0, 0]] {
                cache.gather_rows(&rows);
                want = rows.iter().map(|&r| want[r].clone()).collect();
                feed(&mut cache, &mut want, 1);
                assert_eq!((cache.batch, cache.len), (want.len(), want[0].len()));
                let check = |cache: &KvCache<f64>| {
                    for (b, row) in want.iter().enumerate() {
                        for (t, key) in row.iter().enumerate() {
                            assert_eq!(cache.row(b, t, false), &key[..], "{block_rows} {rows:?}");
                            let value: Vec<f64> = key.iter().map(|x| -x).collect();
                            assert_eq!(cache.row(b, t, true), &value[..]);
                        }
                    }
                };
                check(&cache);
                // The paged view names the same rows; the dense view lays them out in order.
                let (k, _, table) = cache.paged();
                let k = k.as_float().unwrap();
                for (b, row) in want.iter().enumerate() {
                    for (t, key) in row.iter().enumerate() {
                        let at = table[b * cache.capacity + t] as usize * d;
                        assert_eq!(&k[at..at + d], &key[..]);
                    }
                }
                let mut dense = cache.clone();
                let capacity = dense.capacity;
                let (k, _) = dense.dense();
                for (b, row) in want.iter().enumerate() {
                    for (t, key) in row.iter().enumerate() {
                        let at = (b * capacity + t) * d;
                        assert_eq!(&k[at..at + d], &key[..]);
                    }
                }
                check(&dense);
            }
            // Blocks no row refers to are reused, so the storage stays bounded.
            let blocks = cache.refs.len();
            let live: usize = cache.refs.iter().filter(|&&r| r > 0).count();
            assert!(live <= 2 * 8usize.div_ceil(block_rows), "{live}");
            assert!(blocks <= 4 * 8 + 2, "{blocks}");
            cache.gather_rows(&[]);
            assert!(cache.refs.iter().all(|&r| r == 0));
            assert_eq!(cache.free.len(), cache.refs.len());
        }
    }

    /// Rows added one at a time and grown by different amounts (continuous batching) against
    /// rows kept whole: contents, stored-row lists, blocks returned when rows leave.
    #[test]
    fn ragged_rows_join_grow_and_leave() {
        let (d, bs) = (2, 4);
        let mut cache = KvCache::<f64>::new(0, 32, d, bs);
        let mut want: Vec<Vec<f64>> = Vec::new();
        let mut next = 0.0;
        let mut grow = |cache: &mut KvCache<f64>, want: &mut Vec<Vec<f64>>, rows: &[usize]| {
            let k: Vec<f64> = (0..rows.len() * d).map(|i| next + i as f64).collect();
            next += 100.0;
            let v: Vec<f64> = k.iter().map(|x| x * 2.0).collect();
            cache.append_ragged(rows, &k, &v);
            for (i, &r) in rows.iter().enumerate() {
                want[r].extend_from_slice(&k[i * d..(i + 1) * d]);
            }
        };
        cache.add_row();
        want.push(Vec::new());
        grow(&mut cache, &mut want, &[0, 0, 0, 0, 0]);
        assert_eq!(cache.add_row(), 1);
        want.push(Vec::new());
        grow(&mut cache, &mut want, &[0, 1, 1, 1]);
        cache.add_row();
        want.push(Vec::new());
        grow(&mut cache, &mut want, &[2, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2]);
        let check = |cache: &KvCache<f64>, want: &[Vec<f64>]| {
            assert_eq!(cache.batch, want.len());
            for (b, row) in want.iter().enumerate() {
                let n = row.len() / d;
                assert_eq!(cache.row_len(b), n);
                let mut stored = Vec::new();
                cache.stored_rows_of(b, n, &mut stored);
                let (k, v) = cache.storage();
                let (k, v) = (k.as_float().unwrap(), v.as_float().unwrap());
                for t in 0..n {
                    assert_eq!(cache.row(b, t, false), &row[t * d..(t + 1) * d]);
                    let at = stored[t] as usize * d;
                    assert_eq!(&k[at..at + d], &row[t * d..(t + 1) * d]);
                    assert_eq!(v[at], 2.0 * row[t * d]);
                }
            }
            let held: usize = want.iter().map(|r| (r.len() / d).div_ceil(bs)).sum();
            assert_eq!(cache.blocks_in_use(), held);
        };
        check(&cache, &want);
        // The middle row leaves; the others keep their contents, its blocks are free again.
        cache.gather_rows(&[0, 2]);
        want.remove(1);
        check(&cache, &want);
        cache.add_row();
        want.push(Vec::new());
        grow(&mut cache, &mut want, &[2, 2, 0]);
        check(&cache, &want);
        cache.gather_rows(&[]);
        assert_eq!(cache.blocks_in_use(), 0);
    }

    /// Rows copied from caches of other block sizes and capacities (a dense cross-attention
    /// cache, a paged one) hold the same keys and values; leaving returns their blocks.
    #[test]
    fn rows_pushed_from_other_caches_keep_their_contents() {
        let d = 2;
        let k: Vec<f64> = (0..2 * 5 * d).map(|i| i as f64).collect();
        let v: Vec<f64> = k.iter().map(|x| x + 0.5).collect();
        let dense = KvCache::from_dense(k.clone(), v.clone(), 2, 5, d);
        let mut paged = KvCache::<f64>::new(1, 6, d, 1);
        paged.append(&[9.0, 8.0, 7.0, 6.0], &[1.0, 2.0, 3.0, 4.0]);
        let mut running = KvCache::<f64>::new(0, 16, d, 3);
        // Row 1 of the dense cache, its first 4 positions (the fifth is padding).
        assert_eq!(running.push_row_from(&dense, 1, 4), 0);
        assert_eq!(running.push_row_from(&paged, 0, 2), 1);
        assert_eq!(running.push_row_from(&dense, 0, 0), 2);
        assert_eq!((running.batch, running.len), (3, 4));
        assert_eq!(
            (running.row_len(0), running.row_len(1), running.row_len(2)),
            (4, 2, 0)
        );
        for t in 0..4 {
            assert_eq!(running.row(0, t, false), &k[(5 + t) * d..(6 + t) * d]);
            assert_eq!(running.row(0, t, true), &v[(5 + t) * d..(6 + t) * d]);
        }
        assert_eq!(&running.row(1, 1, false)[..], &[7.0, 6.0]);
        assert_eq!(&running.row(1, 0, true)[..], &[1.0, 2.0]);
        // ⌈4/3⌉ + ⌈2/3⌉ blocks; the new empty row grows like any other.
        assert_eq!(running.blocks_in_use(), 3);
        running.append_ragged(&[2], &[5.0, 5.0], &[6.0, 6.0]);
        assert_eq!(&running.row(2, 0, false)[..], &[5.0, 5.0]);
        running.gather_rows(&[1]);
        assert_eq!(running.blocks_in_use(), 1);
        assert_eq!(&running.row(0, 1, false)[..], &[7.0, 6.0]);
    }

    #[test]
    fn dense_cache_is_used_in_place() {
        let k: Vec<f32> = (0..2 * 3 * 2).map(|i| i as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| x + 0.5).collect();
        let mut cache = KvCache::from_dense(k.clone(), v.clone(), 2, 3, 2);
        let (k1, v1) = cache.dense();
        assert!(matches!(k1, Cow::Borrowed(_)) && matches!(v1, Cow::Borrowed(_)));
        assert_eq!((&k1[..], &v1[..]), (&k[..], &v[..]));
        assert_eq!(cache.row(1, 2, true), &v[10..12]);
        cache.gather_rows(&[1, 1, 0]);
        let (k2, _) = cache.dense();
        assert_eq!(&k2[..6], &k[6..12]);
        assert_eq!(&k2[6..12], &k[6..12]);
        assert_eq!(&k2[12..18], &k[..6]);
    }
}
