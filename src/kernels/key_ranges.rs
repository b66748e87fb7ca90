//! Which keys each query of an attention call may see: query `i` of batch row `b` sees the keys
//! `start .. end` of its row ([`KeyRanges::range`]); every other key gets exactly zero weight.
//! Every attention kernel (plain, tiled, step) reads visibility through this one question, so a
//! new kind of mask is a new [`KeyRanges`], not an edit of each kernel.
//!
//! - [`AttnMask`]: padding (keys past `key_lens[b]`) and causality (keys after the query's
//!   absolute position `q_offset + i`), the one place these are turned into ranges. `start` is 0.
//! - `[usize]`: row `b`'s queries see keys `0 .. lens[b]` (a padded source, or each row's filled
//!   length of a cache).
//! - [`Windowed`]: any of them restricted to its last `window` keys (sliding-window attention).
//! - [`QueryRanges`]: an explicit `[start, end)` per query.
//! - a fixed sparse pattern (`super::sparse_pattern`; the layers' `LayerRanges`) (Child et al. 2019), whose
//!   ranges have holes: the range is the envelope of what a query sees, and
//!   [`KeyRanges::sees`] says which keys inside it are seen ([`KeyRanges::has_holes`]: whether
//!   to ask). The kernels give the hidden keys a score of −∞ ([`hide_holes`]), so their
//!   weights are exactly 0 as outside the range.
//!
//! A mask is an additive score of −∞; the ranges may also carry a finite one, a bias per head,
//! query and key ([`KeyRanges::bias`], T5's relative position buckets: `model::relative_bias`),
//! added by every kernel at the same place ([`add_bias`]): after the scale and the soft cap,
//! before the holes and the softmax,
//!
//! `s_ij = cap(scale · q_i·k_j) + bias(h, b, i, j)`.
//!
//! A query's position, which a bias of positions needs, is read from its range as causal masks
//! already state it: the last key it sees (see `model::relative_bias`).

use std::ops::Range;

/// The keys each query may see (see the module docs). `Sync`: the kernels ask from their
/// threads.
pub trait KeyRanges: Sync {
    /// The keys `start .. end` query `i` of batch row `b` may see (clipped by the kernels to
    /// the keys they hold; `end <= start` sees nothing).
    fn range(&self, b: usize, i: usize) -> Range<usize>;

    /// Whether query `i` of row `b` sees key `j` of its [`range`](Self::range): `false` is a
    /// hole inside the range (a sparse pattern). Asked only when [`has_holes`](Self::has_holes)
    /// says so; contiguous ranges see every key of the range.
    fn sees(&self, _b: usize, _i: usize, _j: usize) -> bool {
        true
    }

    /// Whether some range has holes ([`sees`](Self::sees) may answer `false`).
    fn has_holes(&self) -> bool {
        false
    }

    /// The bias added to the score of key `j` (inside the range) by query `i` of row `b` in head
    /// `h` (see the module docs). Asked only when [`has_bias`](Self::has_bias) says so.
    fn bias(&self, _h: usize, _b: usize, _i: usize, _j: usize) -> f64 {
        0.0
    }

    /// Whether the scores get a [`bias`](Self::bias).
    fn has_bias(&self) -> bool {
        false
    }

    /// Head `h`'s attention sink: a logit that joins every softmax's denominator of the head
    /// and carries no value (`super::sinks`); `None`: no sink.
    fn sink(&self, _h: usize) -> Option<f64> {
        None
    }

    /// The same ranges restricted to the last `window` keys of each (sliding-window attention).
    fn windowed(self, window: usize) -> Windowed<Self>
    where
        Self: Sized,
    {
        Windowed {
            inner: self,
            window,
        }
    }
}

impl<R: KeyRanges + ?Sized> KeyRanges for &R {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        (**self).range(b, i)
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        (**self).sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        (**self).has_holes()
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        (**self).bias(h, b, i, j)
    }

    fn has_bias(&self) -> bool {
        (**self).has_bias()
    }

    fn sink(&self, h: usize) -> Option<f64> {
        (**self).sink(h)
    }
}

/// Padding and causality: the masks of the paper's encoder (padding), decoder self-attention
/// (causal, with padding) and cross-attention (padding of the source).
#[derive(Clone, Copy, Debug)]
pub struct AttnMask<'a> {
    /// Real (unpadded) keys of each batch element.
    pub key_lens: &'a [usize],
    /// Causal: query `i` sees keys `j <= i + q_offset` (decoder self-attention).
    pub causal: bool,
    /// Absolute position of query row 0 (incremental decoding).
    pub q_offset: usize,
}

impl AttnMask<'_> {
    /// Number of visible keys for query row `i` of batch element `b`: the `end` of its range
    /// (`key_lens[b]`, and at most `i + q_offset + 1` when causal).
    pub fn visible(&self, b: usize, i: usize) -> usize {
        let pad = self.key_lens[b];
        if self.causal {
            pad.min(i + self.q_offset + 1)
        } else {
            pad
        }
    }
}

impl KeyRanges for AttnMask<'_> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        0..self.visible(b, i)
    }
}

/// Row `b`'s queries see keys `0 .. self[b]`.
impl KeyRanges for [usize] {
    fn range(&self, b: usize, _i: usize) -> Range<usize> {
        0..self[b]
    }
}

/// As the slice: row `b`'s queries see keys `0 .. self[b]`.
impl KeyRanges for Vec<usize> {
    fn range(&self, b: usize, _i: usize) -> Range<usize> {
        0..self[b]
    }
}

/// `inner`'s ranges cut to their last `window` keys: `max(start, end − window) .. end`. With a
/// causal `inner`, query position `p` sees keys `p + 1 − window ..= p`.
#[derive(Clone, Copy, Debug)]
pub struct Windowed<R> {
    pub inner: R,
    pub window: usize,
}

impl<R: KeyRanges> KeyRanges for Windowed<R> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        let r = self.inner.range(b, i);
        r.start.max(r.end.saturating_sub(self.window))..r.end
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        self.inner.sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        self.inner.has_holes()
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        self.inner.bias(h, b, i, j)
    }

    fn has_bias(&self) -> bool {
        self.inner.has_bias()
    }

    fn sink(&self, h: usize) -> Option<f64> {
        self.inner.sink(h)
    }
}

/// An explicit range per query, `[batch * q_len]` in query order.
#[derive(Clone, Debug)]
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub struct QueryRanges {
    pub q_len: usize,
    pub ranges: Vec<Range<usize>>,
}

impl KeyRanges for QueryRanges {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        self.ranges[b * self.q_len + i].clone()
    }
}

/// Gives the keys `j0 ..` of `scores` (one query's scores, key `j0 + c` at `c`) that query `i`
/// of row `b` does not see a score of −∞, so that the softmax gives them weight exactly 0
/// (nothing to do unless `ranges` has holes). `scores` must lie inside the query's range.
pub fn hide_holes<T: crate::Float>(
    ranges: &impl KeyRanges,
    b: usize,
    i: usize,
    j0: usize,
    scores: &mut [T],
) {
    if ranges.has_holes() {
        for (c, s) in scores.iter_mut().enumerate() {
            if !ranges.sees(b, i, j0 + c) {
                *s = T::neg_infinity();
            }
        }
    }
}

/// Adds head `h`'s bias of query `i` of row `b` to its scores of the keys `j0 ..` (`scores`:
/// key `j0 + c` at `c`, inside the query's range); nothing unless `ranges` has a bias.
pub fn add_bias<T: crate::Float>(
    ranges: &impl KeyRanges,
    (h, b, i): (usize, usize, usize),
    j0: usize,
    scores: &mut [T],
) {
    if ranges.has_bias() {
        for (c, s) in scores.iter_mut().enumerate() {
            *s += T::of(ranges.bias(h, b, i, j0 + c));
        }
    }
}

/// The range `r` clipped to `0 .. len`, never reversed (`start <= end`).
pub fn clip(r: Range<usize>, len: usize) -> Range<usize> {
    let end = r.end.min(len);
    r.start.min(end)..end
}

/// The keys any of the queries `i0 .. i0 + rows` of row `b` sees, clipped to `0 .. len`: from
/// the smallest start to the largest end (a tile's span in the tiled kernel). Empty ranges
/// count for nothing; all empty gives `0 .. 0`.
pub fn span(ranges: &impl KeyRanges, b: usize, i0: usize, rows: usize, len: usize) -> Range<usize> {
    let (mut lo, mut hi) = (usize::MAX, 0);
    for i in i0..i0 + rows {
        let r = clip(ranges.range(b, i), len);
        if r.start < r.end {
            lo = lo.min(r.start);
            hi = hi.max(r.end);
        }
    }
    if hi == 0 {
        0..0
    } else {
        lo..hi
    }
}

/// The columns `lo .. hi` of a key tile starting at key `j0`, `cols` wide, that the range `r`
/// covers (`lo == hi` when none).
pub fn tile_cols(r: Range<usize>, j0: usize, cols: usize) -> Range<usize> {
    let hi = r.end.saturating_sub(j0).min(cols);
    let lo = r.start.saturating_sub(j0).min(hi);
    lo..hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_windows_and_tiles() {
        let lens = [5, 3];
        let causal = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 1,
        };
        assert_eq!(causal.range(0, 0), 0..2);
        assert_eq!(causal.range(1, 4), 0..3);
        let w = causal.windowed(2);
        assert_eq!(w.range(0, 2), 2..4);
        assert_eq!(w.range(0, 0), 0..2);
        assert_eq!(lens[..].range(1, 7), 0..3);
        assert_eq!(span(&w, 0, 0, 3, 5), 0..4);
        assert_eq!(span(&w, 0, 2, 1, 3), 2..3);
        assert_eq!(tile_cols(2..70, 64, 64), 0..6);
        assert_eq!(tile_cols(66..70, 64, 64), 2..6);
        assert_eq!(tile_cols(66..70, 0, 64), 64..64);
        assert_eq!(clip(5..9, 3), 3..3);
    }
}
