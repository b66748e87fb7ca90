//! Incremental decoding of [`MultiHeadAttention`] over a [`KvCache`]: one
//! [`step`](MultiHeadAttention::step) for self-attention, whose [`StepLayout`] says which new
//! positions come and which need outputs (and so how the cache is read, see
//! `super::step_layout`), and [`cross_cached`](MultiHeadAttention::cross_cached) for
//! cross-attention over a cache computed once.
//!
//! Rotary (self-attention only): the new keys are stored rotated at their positions, and the
//! queries rotated at the same positions.
//!
//! A layer with a sliding [`window`](MultiHeadAttention::window) cuts every step's key ranges
//! to their last `w` keys (the query at position `p` sees `max(0, p + 1 − w) ..= p`), and
//! before appending releases the blocks of each row that its first new query no longer sees
//! ([`KvCache::release_before`]: a paged cache holds about `w` positions a row).
//!
//! A linear-attention layer (`super::attention_approx`) keeps running sums instead of keys and
//! values: every layout goes through them, one token at a time.

use super::attention::{probs, MultiHeadAttention};
use super::kv_cache::KvCache;
use super::step_layout::{runs, Feed, StepLayout};
use crate::backend::{AttnMask, Backend, KvView, Purpose, CPU};
use crate::Float;

impl<T: Float> MultiHeadAttention<T> {
    /// Self-attention of the new positions `x [tokens, d_model]` laid out as `layout` says: their
    /// keys and values are appended to `cache`, then they attend causally to their rows. Returns
    /// the output rows the layout asks for (a uniform feed with [`Outputs::Last`] and several
    /// tokens a row: `[rows, d_model]`, only each row's last position projected and attending;
    /// otherwise `[tokens, d_model]`) and the attention weights
    /// `[rows, heads, queries per row, k_len]`.
    ///
    /// [`Outputs::Last`]: super::step_layout::Outputs::Last
    pub fn step(
        &self,
        x: &[T],
        cache: &mut KvCache<T>,
        layout: &StepLayout<'_>,
    ) -> (Vec<T>, Vec<T>) {
        if self.linear {
            return (self.linear_step_layout(x, cache, layout), Vec::new());
        }
        match layout.feed {
            Feed::Ragged { rows, positions } => self.step_ragged(x, cache, rows, positions),
            Feed::OnePerRow => {
                let rows: Vec<usize> = (0..cache.batch).collect();
                let positions: Vec<usize> = rows.iter().map(|&r| cache.row_len(r)).collect();
                self.step_ragged(x, cache, &rows, &positions)
            }
            Feed::Uniform => {
                let d = self.d_model;
                let q_len = x.len().checked_div(cache.batch * d).unwrap_or(0);
                assert_eq!(
                    x.len(),
                    cache.batch * q_len * d,
                    "query rows are not a whole number per cached batch element"
                );
                if layout.last_of_several(q_len) {
                    self.step_last(x, cache, q_len)
                } else {
                    self.step_uniform(x, cache, q_len)
                }
            }
        }
    }

    /// A linear-attention layer's step (`super::attention_approx`): the tokens of `layout`
    /// through the rows' running sums; the same outputs as the other layers' steps (no
    /// weights: there are none to show).
    fn linear_step_layout(
        &self,
        x: &[T],
        cache: &mut KvCache<T>,
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        match layout.feed {
            Feed::Ragged { rows, positions } => {
                for (s, _) in runs(rows, positions) {
                    assert_eq!(
                        positions[s],
                        cache.row_len(rows[s]),
                        "tokens continue their row"
                    );
                }
                self.linear_step(x, cache, rows)
            }
            Feed::OnePerRow => {
                let rows: Vec<usize> = (0..cache.batch).collect();
                self.linear_step(x, cache, &rows)
            }
            Feed::Uniform => {
                let (d, batch) = (self.d_model, cache.batch);
                let q_len = x.len().checked_div(batch * d).unwrap_or(0);
                assert_eq!(
                    x.len(),
                    batch * q_len * d,
                    "query rows are not a whole number per cached batch element"
                );
                let rows: Vec<usize> = (0..batch)
                    .flat_map(|b| std::iter::repeat_n(b, q_len))
                    .collect();
                let y = self.linear_step(x, cache, &rows);
                match layout.last_of_several(q_len) {
                    true => super::residual::last_rows(&y, q_len, d),
                    false => y,
                }
            }
        }
    }

    /// `q_len` new positions of every row, appended, then attended causally ([`Purpose::Decode`]:
    /// the step kernel through the cache's table for a few positions a row or a paged cache,
    /// matrix products over the dense cache for a prompt).
    fn step_uniform(&self, x: &[T], cache: &mut KvCache<T>, q_len: usize) -> (Vec<T>, Vec<T>) {
        let batch = cache.batch;
        let q_offset = cache.len;
        (0..batch).for_each(|b| self.release_outside_window(cache, b, q_offset));
        let mut k_new = self.keys(x);
        self.rotate(&mut k_new, q_len, self.n_kv_heads, q_offset);
        cache.append(&k_new, &self.v_proj.forward(x));
        let k_len = cache.len;
        let mut q = self.queries(x);
        self.rotate(&mut q, q_len, self.n_heads, q_offset);
        let dims = self.dims(batch, q_len, k_len, cache.capacity);
        let full = vec![k_len; batch];
        let causal = AttnMask {
            key_lens: &full,
            causal: true,
            q_offset,
        };
        let attended = self.attend(&q, KvView::Store(cache), causal, dims, Purpose::Decode);
        (self.output(x, &attended.ctx), probs(attended.weights))
    }

    /// A prompt's self-attention when only each row's last position is read further: the keys
    /// and values of every position of `x [batch*q_len, d_model]` are appended to `cache`, but
    /// only the last position's query is projected and attends, to every key of its row.
    /// Returns `[batch, d_model]`.
    fn step_last(&self, x: &[T], cache: &mut KvCache<T>, q_len: usize) -> (Vec<T>, Vec<T>) {
        let (d, batch) = (self.d_model, cache.batch);
        let first = cache.len;
        (0..batch).for_each(|b| self.release_outside_window(cache, b, first));
        let mut k_new = self.keys(x);
        self.rotate(&mut k_new, q_len, self.n_kv_heads, cache.len);
        cache.append(&k_new, &self.v_proj.forward(x));
        let k_len = cache.len;
        // q: [batch, d_model], the last position of each row, at position k_len - 1
        let last = super::residual::last_rows(x, q_len, d);
        let mut q = self.queries(&last);
        self.rotate(&mut q, 1, self.n_heads, k_len - 1);
        let dims = self.dims(batch, 1, k_len, cache.capacity);
        let seen = vec![k_len; batch];
        let attended = self.attend(&q, KvView::Store(cache), &seen, dims, Purpose::Decode);
        (self.output(&last, &attended.ctx), probs(attended.weights))
    }

    /// A continuous-batching step: `x [n, d_model]` are `n` tokens of any rows of `cache`, token
    /// `i` of row `rows[i]` at position `positions[i]` (a prompt chunk of one sequence, the next
    /// token of others). Their keys and values are appended to their rows (rotary: rotated at
    /// their own positions, like the queries); token `i` then attends to positions
    /// `0 ..= positions[i]` of its row (within the layer's window) through the block table, one query per token
    /// ([`Purpose::Decode`]). Returns `[n, d_model]` and the weights `[n, heads, 1, k_len]`.
    fn step_ragged(
        &self,
        x: &[T],
        cache: &mut KvCache<T>,
        rows: &[usize],
        positions: &[usize],
    ) -> (Vec<T>, Vec<T>) {
        let n = rows.len();
        assert_eq!(x.len(), n * self.d_model, "x is [tokens, d_model]");
        assert_eq!(positions.len(), n, "one position per token");
        let mut k_new = self.keys(x);
        let mut q = self.queries(x);
        let (d_kv, d) = (self.d_kv(), self.d_q());
        for (s, len) in runs(rows, positions) {
            let pos = positions[s];
            assert_eq!(pos, cache.row_len(rows[s]), "tokens continue their row");
            self.release_outside_window(cache, rows[s], pos);
            self.rotate(
                &mut k_new[s * d_kv..(s + len) * d_kv],
                len,
                self.n_kv_heads,
                pos,
            );
            self.rotate(&mut q[s * d..(s + len) * d], len, self.n_heads, pos);
        }
        cache.append_ragged(rows, &k_new, &self.v_proj.forward(x));
        // key_rows: [n, k_len], the stored rows of each token's visible keys.
        let k_len = positions.iter().max().map_or(0, |&p| p + 1);
        let mut key_rows = Vec::with_capacity(n * k_len);
        let mut visible = Vec::with_capacity(n);
        for i in 0..n {
            let seen = positions[i] + 1;
            cache.stored_rows_of(rows[i], seen, &mut key_rows);
            key_rows.resize((i + 1) * k_len, 0);
            visible.push(seen);
        }
        let dims = self.dims(n, 1, k_len, k_len);
        let (k, v) = cache.storage();
        let kv = KvView::Paged {
            k,
            v,
            rows: &key_rows,
        };
        // (k and v are floats or packed, as the cache stores them)
        let attended = self.attend(&q, kv, &visible, dims, Purpose::Decode);
        (self.output(x, &attended.ctx), probs(attended.weights))
    }

    /// With a sliding window `w`, releases the blocks of row `b` of `cache` that a query at
    /// `pos` (and every later one) does not see: those wholly before `pos + 1 − w`.
    fn release_outside_window(&self, cache: &mut KvCache<T>, b: usize, pos: usize) {
        if let Some(w) = self.window {
            cache.release_before(b, (pos + 1).saturating_sub(w));
        }
    }

    /// Cross-attention of `x_q [batch*q_len, d_model]` over `cache` (the encoder output's keys
    /// and values, read as is), keys past `key_lens[b]` of row `b` masked; `batch` is the
    /// cache's (beam search reads one cross-attention row per sentence with its beams as `q_len`
    /// queries). [`Purpose::Decode`]: the step kernel up to a few queries per row, matrix
    /// products for more. Returns the output and the weights `[batch, heads, q_len, k_len]`.
    pub fn cross_cached(
        &self,
        x_q: &[T],
        cache: &mut KvCache<T>,
        key_lens: &[usize],
    ) -> (Vec<T>, Vec<T>) {
        assert!(
            !self.rotary,
            "rotary attention reads a KV cache only when appending"
        );
        let (d, batch) = (self.d_model, cache.batch);
        let q_len = x_q.len() / (batch * d);
        assert_eq!(
            x_q.len(),
            batch * q_len * d,
            "query rows are not a whole number per cached batch element"
        );
        let q = self.queries(x_q);
        let dims = self.dims(batch, q_len, cache.len, cache.capacity);
        let attended = CPU.attention(&q, KvView::Store(cache), key_lens, dims, Purpose::Decode);
        (self.output(x_q, &attended.ctx), probs(attended.weights))
    }
}
