//! Fixed attention patterns beyond one contiguous range per query, as [`KeyRanges`]: the query at
//! position `p` sees the key at position `j` when, with `d = |p − j|` (causal ranges already
//! keep `j ≤ p`),
//!
//! - [`Pattern::Band`] (local attention, Longformer / Mistral): `d < w`. Causal: the last `w`
//!   keys (as [`super::key_ranges::Windowed`]); not causal: `p − w < j < p + w`. No holes.
//! - [`Pattern::Strided`] (the Sparse Transformer's strided pattern, Child et al. 2019, both
//!   of its heads' sets in one): `d < local`, or `d` a multiple of `stride`. With
//!   `local = stride = √N` each query sees about `2√N` keys.
//! - [`Pattern::Global`] (local + global tokens, Longformer / BigBird): `d < local`, or the key is
//!   one of the first `global` positions, or the query is (a global query sees every key its
//!   range holds).
//!
//! The query's position `p` is read from the inner ranges: causal, `p = end − 1` of its range
//! (which holds for every causal call: training, prompts and each decoding step); not causal
//! (an encoder), `p = i`, the query's row. The range is the envelope of what the query sees and
//! [`KeyRanges::sees`] answers the holes, so every kernel (plain, tiled, step) honours the
//! pattern through [`super::key_ranges::hide_holes`].

#[cfg(test)]
use super::key_ranges::KeyRanges;
use std::ops::Range;

/// Which keys a query sees, by distance (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `|p − j| < window`.
    Band { window: usize },
    /// `|p − j| < local` or `|p − j| mod stride == 0`.
    Strided { local: usize, stride: usize },
    /// `|p − j| < local`, or `j < global`, or `p < global`.
    Global { local: usize, global: usize },
}

impl Pattern {
    /// Whether a query at `p` sees the key at `j` (before the inner ranges' own limits).
    pub fn sees(&self, p: usize, j: usize) -> bool {
        let d = p.abs_diff(j);
        match *self {
            Pattern::Band { window } => d < window,
            Pattern::Strided { local, stride } => d < local || d.is_multiple_of(stride),
            Pattern::Global { local, global } => d < local || j < global || p < global,
        }
    }

    /// The position of query `i` whose range (before the pattern) is `r`: causal, `r.end − 1`;
    /// not causal, `i`.
    pub fn query_position(r: &Range<usize>, i: usize, causal: bool) -> usize {
        match causal {
            true => r.end.saturating_sub(1),
            false => i,
        }
    }

    /// The range `r` of a query at `p` cut to the envelope of what the pattern lets it see
    /// (a band is cut to the band; the other patterns keep `r`, and their holes).
    pub fn envelope(&self, r: Range<usize>, p: usize) -> Range<usize> {
        match *self {
            Pattern::Band { window } => {
                let end = r.end.min(p.saturating_add(window));
                r.start.max((p + 1).saturating_sub(window)).min(end)..end
            }
            Pattern::Strided { .. } | Pattern::Global { .. } => r,
        }
    }

    /// Whether the pattern punches holes into its ranges (all but the band).
    pub fn has_holes(&self) -> bool {
        !matches!(self, Pattern::Band { .. })
    }
}

/// `inner`'s ranges restricted to `pattern`; `causal` says how the query's position is read (see
/// the module docs). The kernel tests' ranges: the layers compose theirs in
/// `model::attention_approx::LayerRanges` (mask, window, then pattern).
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub struct Patterned<R> {
    pub inner: R,
    pub pattern: Pattern,
    pub causal: bool,
}

#[cfg(test)]
impl<R: KeyRanges> Patterned<R> {
    /// The query's position and its inner range.
    fn position(&self, b: usize, i: usize) -> (usize, Range<usize>) {
        let r = self.inner.range(b, i);
        (Pattern::query_position(&r, i, self.causal), r)
    }
}

#[cfg(test)]
impl<R: KeyRanges> KeyRanges for Patterned<R> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        let (p, r) = self.position(b, i);
        self.pattern.envelope(r, p)
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        let (p, _) = self.position(b, i);
        self.pattern.sees(p, j) && self.inner.sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        self.pattern.has_holes() || self.inner.has_holes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::key_ranges::{AttnMask, KeyRanges};

    /// The seen keys of query `i`, as a string of `x` and `.` over `0 .. len`.
    fn row(r: &impl KeyRanges, i: usize, len: usize) -> String {
        let range = r.range(0, i);
        (0..len)
            .map(
                |j| match range.contains(&j) && (!r.has_holes() || r.sees(0, i, j)) {
                    true => 'x',
                    false => '.',
                },
            )
            .collect()
    }

    /// The patterns written out by hand, causal and not.
    #[test]
    fn patterns_as_drawn() {
        let lens = [8];
        let causal = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let full = AttnMask {
            causal: false,
            ..causal
        };
        let strided = Patterned {
            inner: causal,
            pattern: Pattern::Strided {
                local: 2,
                stride: 3,
            },
            causal: true,
        };
        assert_eq!(row(&strided, 7, 8), ".x..x.xx");
        assert_eq!(row(&strided, 3, 8), "x.xx....");
        let global = Patterned {
            inner: causal,
            pattern: Pattern::Global {
                local: 2,
                global: 2,
            },
            causal: true,
        };
        assert_eq!(row(&global, 6, 8), "xx...xx.");
        let band = Patterned {
            inner: full,
            pattern: Pattern::Band { window: 2 },
            causal: false,
        };
        assert_eq!(row(&band, 0, 8), "xx......");
        assert_eq!(row(&band, 4, 8), "...xxx..");
        assert!(!band.has_holes());
        let open_global = Patterned {
            inner: full,
            pattern: Pattern::Global {
                local: 2,
                global: 1,
            },
            causal: false,
        };
        assert_eq!(row(&open_global, 0, 8), "xxxxxxxx");
        assert_eq!(row(&open_global, 4, 8), "x..xxx..");
        // causal band = the sliding window of `Windowed`, query by query
        let band_causal = Patterned {
            inner: causal,
            pattern: Pattern::Band { window: 3 },
            causal: true,
        };
        let windowed = causal.windowed(3);
        for i in 0..8 {
            assert_eq!(band_causal.range(0, i), windowed.range(0, i));
        }
        // decoding: a query at position 5 of a cache (q_offset) reads its position from the range
        let step = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 5,
        };
        let strided_step = Patterned {
            inner: step,
            pattern: Pattern::Strided {
                local: 2,
                stride: 3,
            },
            causal: true,
        };
        assert_eq!(row(&strided_step, 0, 8), "..x.xx..");
    }
}

#[cfg(test)]
#[path = "sparse_pattern_tests.rs"]
mod kernel_tests;
