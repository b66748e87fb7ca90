//! T5's relative position bias (Raffel et al. 2020, section 2.1): the only way positions enter
//! T5. Every self-attention score gets a learned scalar per head and *bucket* of the key's
//! offset from the query, `j − p`:
//!
//! `s_ij = q_i·k_j + B[bucket(j − p_i), h]`
//!
//! (T5 leaves the dot products unscaled). With `n` buckets and `max_distance` `m` (transformers'
//! `_relative_position_bucket`): an encoder's (bidirectional) buckets give keys after the query
//! their own half (`n ← n/2`, offset `n/2` for `j > p`) and read `r = |j − p|`; a decoder's
//! (causal) read `r = max(p − j, 0)`. Then `r < n/2` is bucket `r`, and farther offsets share
//! logarithmically wider buckets,
//!
//! `bucket = n/2 + ⌊ln(r / (n/2)) / ln(m / (n/2)) · (n − n/2)⌋`, at most `n − 1`,
//!
//! computed in float32 as transformers computes it (so the ties at the bucket edges fall as
//! they do there). The table `B [n, heads]` is each self-attention's own parameter
//! (`self_attn.relative_bias.weight`); T5 and mT5 store one per stack, in its first layer, and
//! their loader gives every layer of the stack a copy (`families::t5`).
//!
//! The bias reaches every attention kernel through the key ranges ([`Biased`], see the
//! backend's `KeyRanges::bias`): training (plain or tiled), attention maps and each decoding
//! layout. The query's position `p_i` is read from its range: a decoder's (causal) ranges end
//! at the query, whatever the call (teacher forcing, a step over the cache, ragged rows of a
//! continuous batch), so `p_i` is the last key it sees; an encoder's queries are its keys,
//! `p_i = i`. The kernels pass no gradient to the table: models with it load for inference only
//! (training is refused by name, see `ModelConfig::check_trainable`).

use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::KeyRanges;
use crate::Float;
use std::ops::Range;

/// One self-attention's relative position bias (see the module docs).
#[derive(Clone, Debug)]
pub struct RelativeBias<T> {
    /// `B [num_buckets, heads]`.
    pub weight: Param<T>,
    pub heads: usize,
    /// An encoder's buckets (keys on both sides of the query); `false`: a decoder's (causal).
    pub bidirectional: bool,
    /// The bucket of each offset `j − p` in `−max_distance ..= max_distance`, at
    /// `max_distance + (j − p)` (farther offsets share the outermost buckets).
    buckets: Vec<u32>,
}

impl<T: Float> RelativeBias<T> {
    /// A table of zeros (from `init`) of `num_buckets` buckets for `heads` heads, offsets up to
    /// `max_distance` told apart.
    pub fn new(
        heads: usize,
        (num_buckets, max_distance): (usize, usize),
        bidirectional: bool,
        init: &mut impl Init,
    ) -> Self {
        let m = max_distance as i64;
        let buckets = (-m..=m)
            .map(|r| relative_bucket(r, bidirectional, num_buckets, max_distance) as u32)
            .collect();
        RelativeBias {
            weight: init.constant(&[num_buckets, heads], 0.0),
            heads,
            bidirectional,
            buckets,
        }
    }

    /// The bias of head `h` for a key at offset `relative = j − p` from its query.
    pub fn value(&self, h: usize, relative: i64) -> f64 {
        let m = (self.buckets.len() / 2) as i64;
        let bucket = self.buckets[(relative.clamp(-m, m) + m) as usize] as usize;
        self.weight.value.data[bucket * self.heads + h].f64()
    }

    /// `ranges` with this bias added to their scores (see [`Biased`]).
    pub fn over<R: KeyRanges>(&self, ranges: R) -> Biased<'_, R, T> {
        Biased {
            inner: ranges,
            bias: self,
        }
    }
}

/// transformers' `_relative_position_bucket` of one offset `relative = j − p` (see the module
/// docs), in `0 .. num_buckets`.
pub fn relative_bucket(
    relative: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let (mut n, mut bucket) = (num_buckets as i64, 0);
    let r = if bidirectional {
        n /= 2;
        if relative > 0 {
            bucket += n;
        }
        relative.abs()
    } else {
        (-relative).max(0)
    };
    let exact = n / 2;
    if r < exact {
        return (bucket + r) as usize;
    }
    // In float32, as torch computes it: ln(r / exact) / ln(m / exact) · (n − exact).
    let log_ratio = (r as f32 / exact as f32).ln() / (max_distance as f64 / exact as f64).ln() as f32;
    let large = exact + (log_ratio * (n - exact) as f32) as i64;
    (bucket + large.min(n - 1)) as usize
}

/// Key ranges whose scores get a [`RelativeBias`]: `inner`'s keys, and the bias of each key's
/// offset from its query (a causal bias reads the query's position from the end of its range,
/// a bidirectional one from its index; see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Biased<'a, R, T> {
    pub inner: R,
    pub bias: &'a RelativeBias<T>,
}

impl<R: KeyRanges, T: Float> KeyRanges for Biased<'_, R, T> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        self.inner.range(b, i)
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        self.inner.sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        self.inner.has_holes()
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        let p = match self.bias.bidirectional {
            true => i,
            false => self.inner.range(b, i).end.saturating_sub(1),
        };
        self.bias.value(h, j as i64 - p as i64)
    }

    fn has_bias(&self) -> bool {
        true
    }

    fn sink(&self, h: usize) -> Option<f64> {
        self.inner.sink(h)
    }
}

impl<T> Module<T> for RelativeBias<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.param("weight", &mut self.weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::AttnMask;
    use crate::rng::Rng;

    /// Buckets as transformers gives them for T5's 32 buckets and distance 128 (values printed
    /// by `T5Attention._relative_position_bucket`); the fixtures check every offset up to ±600
    /// of their own tables against transformers' (`tests/models/t5.rs`).
    #[test]
    fn buckets_are_transformers() {
        let enc = |r| relative_bucket(r, true, 32, 128);
        let dec = |r| relative_bucket(r, false, 32, 128);
        let got: Vec<usize> = [-200, -128, -64, -16, -9, -8, -7, -1, 0, 1, 7, 8, 16, 64, 127, 500]
            .into_iter()
            .map(enc)
            .collect();
        assert_eq!(got, [15, 15, 14, 10, 8, 8, 7, 1, 0, 17, 23, 24, 26, 30, 31, 31]);
        let got: Vec<usize> = [-500, -128, -64, -32, -17, -16, -15, -1, 0, 1, 9]
            .into_iter()
            .map(dec)
            .collect();
        assert_eq!(got, [31, 31, 26, 21, 16, 16, 15, 1, 0, 0, 0]);
    }

    /// A decoder's bias reads the query's position from the end of its range whatever the
    /// layout (a step at position 6, a teacher-forced row); an encoder's from the query index.
    #[test]
    fn query_positions_follow_the_ranges() {
        let mut rng = Rng::new(1);
        let mut bias = RelativeBias::<f64>::new(2, (8, 16), false, &mut rng);
        for (i, w) in bias.weight.value.data.iter_mut().enumerate() {
            *w = i as f64;
        }
        let step = [7usize];
        let biased = bias.over(&step[..]);
        // Key 2 seen from position 6: offset −4, bucket 4 (8 buckets: 0 ..= 3 exact).
        assert_eq!(biased.bias(1, 0, 0, 2), (4 * 2 + 1) as f64);
        let lens = [10];
        let causal = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        assert_eq!(bias.over(causal).bias(0, 0, 6, 2), biased.bias(0, 0, 0, 2));
        let mut both = RelativeBias::<f64>::new(2, (8, 16), true, &mut rng);
        both.weight.value.data = bias.weight.value.data.clone();
        let encoder = AttnMask {
            causal: false,
            ..causal
        };
        // Query 6 of 10 keys: offset −4 (bucket 2), not −7 from the last key (bucket 3).
        assert_eq!(both.over(encoder).bias(0, 0, 6, 2), (2 * 2) as f64);
        assert_eq!(both.value(0, -7), (3 * 2) as f64);
        assert_eq!(both.value(0, 3), (6 * 2) as f64);
    }

    /// Relative positions are an encoder-decoder's only and are not trained (refused by
    /// name); the model gets one table per self-attention, none in the cross-attentions, as
    /// the config counts them.
    #[test]
    fn configs_with_relative_positions() {
        use crate::model::config::{ModelConfig, Positions};
        let mut c = ModelConfig::preset("tiny", 20).unwrap();
        c.positions = Positions::Relative;
        c.validate().unwrap();
        assert!(c.check_trainable().unwrap_err().contains("relative"));
        let lm = ModelConfig {
            n_encoder_layers: 0,
            ..c.clone()
        };
        assert!(lm.validate().unwrap_err().contains("encoder-decoders only"));
        let linear = ModelConfig {
            layer_attention: vec![crate::model::attention_kind::AttentionKind::Linear; 2],
            ..c.clone()
        };
        assert!(linear.validate().unwrap_err().contains("linear attention"));
        let mut plain = ModelConfig::preset("tiny", 20).unwrap();
        plain.check_trainable().unwrap();
        plain.relative_buckets = (16, 24);
        assert!(plain.validate().unwrap_err().contains("relative_buckets"));
        let mut m = crate::model::Seq2Seq::<f32>::new(c.clone(), &mut Rng::new(0));
        let tables: Vec<String> = (m.params_mut().into_iter())
            .map(|(n, _)| n)
            .filter(|n| n.contains("relative_bias"))
            .collect();
        assert_eq!(tables.len(), c.n_encoder_layers + c.n_decoder_layers, "{tables:?}");
        assert!(tables.iter().all(|n| n.ends_with("self_attn.relative_bias.weight")));
        assert_eq!(c.n_params(), Some(m.n_params()));
        assert_eq!(c.n_params_formula(), Some(m.n_params()));
    }

    /// A T5-shaped model in float64 with sources and targets past 128 positions (the tiled
    /// kernel in the teacher-forced forward) and offsets past `max_distance`: its
    /// log-probabilities are incremental decoding's, one position of every row at a time and
    /// one token per row (the ragged step), rows of different lengths.
    #[test]
    fn teacher_forcing_equals_incremental_decoding() {
        use crate::batch::Batch;
        use crate::model::config::{ModelConfig, NormPlacement, Normalization, Positions};
        use crate::model::{Module, StepLayout};
        let mut c = ModelConfig::preset("tiny", 30).unwrap();
        (c.d_model, c.n_heads, c.d_ff, c.max_len, c.dropout) = (16, 2, 24, 200, 0.0);
        (c.n_encoder_layers, c.n_decoder_layers, c.relative_buckets) = (1, 2, (8, 20));
        (c.norm, c.normalization) = (NormPlacement::PreLn, Normalization::RmsNorm);
        (c.positions, c.bias, c.scale_embeddings) = (Positions::Relative, false, false);
        c.query_pre_attn_scalar = Some(1.0);
        let mut m = crate::model::Seq2Seq::<f64>::new(c, &mut Rng::new(3));
        let mut rng = Rng::new(4);
        for (name, p) in m.params_mut() {
            if name.ends_with("relative_bias.weight") {
                let values = p.value.data.iter_mut();
                values.for_each(|w| *w = 2.0 * rng.uniform_range(-1.0, 1.0));
            }
        }
        let seq = |n: usize, k: u32| -> Vec<u32> { (0..n as u32).map(|i| 4 + (i * k) % 26).collect() };
        let (s0, s1, t0, t1) = (seq(140, 7), seq(131, 5), seq(135, 3), seq(129, 11));
        let batch = Batch::from_pairs(&[(&s0, &t0), (&s1, &t1)]);
        let (logits, _) = m.forward(&batch, None);
        let (v, len) = (30, batch.tgt_len);
        for layout in [StepLayout::dense(), StepLayout::one_per_row()] {
            let mut state = m.start_decoding(&batch.src, batch.src_len, &batch.src_lens, len);
            for t in 0..len {
                let tokens = [batch.tgt_in[t], batch.tgt_in[len + t]];
                let lp = m.step(&mut state, &tokens, &layout);
                for b in 0..2 {
                    if t >= batch.tgt_lens[b] {
                        continue;
                    }
                    let row = &logits[(b * len + t) * v..(b * len + t + 1) * v];
                    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                    for (k, &x) in row.iter().enumerate() {
                        let got = lp[b * v + k];
                        assert!((got - (x - z)).abs() < 1e-9, "row {b} position {t}: {got} vs {}", x - z);
                    }
                }
            }
        }
    }
}
