//! What each head does, read from its attention weights `α_ij` (query `i`, key `j`) on data:
//! per head, averaged over the queries,
//! - the mean attention distance `Σ_j α_ij |i − j|` (in positions),
//! - the entropy `−Σ_j α_ij ln α_ij` (nats; `ln k` for a uniform look over `k` keys),
//! - the weight on the previous key `α_{i,i−1}` (queries `i ≥ 1` only), on the same position
//!   `α_ii` (queries with a key at `i`) and on the first key `α_{i0}`.
//!
//! For cross-attention, `i` is the target position and `j` the source position: "same" is
//! the diagonal, where a monotone alignment would put its weight.

use super::{per_head, site_of, HeadModel, PerHead};
use crate::batch::Batch;
use crate::kernels::attention::AttnMask;
use crate::model::config::AttentionSite;
use crate::model::{LanguageModel, Seq2Seq};
use crate::Float;
use serde::Serialize;

/// Sums over queries of one head's statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeadSums {
    pub distance: f64,
    pub entropy: f64,
    pub previous: f64,
    pub same: f64,
    pub first: f64,
    /// Queries summed (distance, entropy, first).
    pub queries: f64,
    /// Queries with a previous key (`i ≥ 1`).
    pub with_previous: f64,
    /// Queries with a key at their own position.
    pub with_same: f64,
}

/// One head's averages (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct HeadBehaviour {
    pub distance: f64,
    pub entropy: f64,
    pub previous: f64,
    pub same: f64,
    pub first: f64,
}

impl HeadSums {
    /// The averages (0 where no query counted).
    pub fn mean(&self) -> HeadBehaviour {
        let over = |s: f64, n: f64| if n > 0.0 { s / n } else { 0.0 };
        HeadBehaviour {
            distance: over(self.distance, self.queries),
            entropy: over(self.entropy, self.queries),
            previous: over(self.previous, self.with_previous),
            same: over(self.same, self.with_same),
            first: over(self.first, self.queries),
        }
    }
}

/// The shape of one attention call's weights `[batch, heads, q_len, k_len]` and each row's
/// real query and key counts (the rest is padding).
pub struct WeightsShape<'a> {
    pub heads: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub q_lens: &'a [usize],
    pub k_lens: &'a [usize],
}

/// Adds the statistics of `weights [batch, heads, q_len, k_len]` to `sums [heads]`.
pub fn add_weights<T: Float>(sums: &mut [HeadSums], weights: &[T], shape: &WeightsShape<'_>) {
    let (heads, q_len, k_len) = (shape.heads, shape.q_len, shape.k_len);
    for (b, (&q_n, &k_n)) in shape.q_lens.iter().zip(shape.k_lens).enumerate() {
        for (h, s) in sums.iter_mut().enumerate().take(heads) {
            let head = &weights[(b * heads + h) * q_len * k_len..][..q_len * k_len];
            for i in 0..q_n.min(q_len) {
                let row = &head[i * k_len..][..k_n.min(k_len)];
                for (j, w) in row.iter().enumerate() {
                    let w = w.f64();
                    s.distance += w * i.abs_diff(j) as f64;
                    if w > 0.0 {
                        s.entropy -= w * w.ln();
                    }
                }
                s.first += row.first().map_or(0.0, |w| w.f64());
                s.queries += 1.0;
                if i >= 1 && i - 1 < row.len() {
                    s.previous += row[i - 1].f64();
                    s.with_previous += 1.0;
                }
                if i < row.len() {
                    s.same += row[i].f64();
                    s.with_same += 1.0;
                }
            }
        }
    }
}

/// Statistics summed over batches, `[site][layer][head]`.
pub struct Behaviour {
    pub sums: PerHead<HeadSums>,
}

impl Behaviour {
    /// Empty sums for `model`'s heads.
    pub fn new<T>(model: &impl HeadModel<T>) -> Self {
        Behaviour {
            sums: per_head(model, HeadSums::default()),
        }
    }

    /// The averages per head.
    pub fn means(&self) -> PerHead<HeadBehaviour> {
        super::importance::map(&self.sums, HeadSums::mean)
    }

    /// Adds a language model's weights on `tokens [batch, seq]` (causal, no padding).
    pub fn add_lm<T: Float>(&mut self, model: &LanguageModel<T>, tokens: &[u32], batch: usize) {
        let seq = tokens.len() / batch;
        let (x, _) = model.embedding.forward(tokens, seq, 0, 0.0, None);
        let lens = vec![seq; batch];
        let mask = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let layers = site_of(&mut self.sums, AttentionSite::Decoder);
        model.blocks.apply(x, |i, l, x| {
            let (y, w) = l.forward_weights(x, batch, mask);
            let shape = WeightsShape {
                heads: l.self_attn.n_heads,
                q_len: seq,
                k_len: seq,
                q_lens: &lens,
                k_lens: &lens,
            };
            add_weights(&mut layers[i], &w, &shape);
            y
        });
    }

    /// Adds a translation model's weights on a teacher-forced `batch`.
    pub fn add_seq2seq<T: Float>(&mut self, model: &Seq2Seq<T>, batch: &Batch) {
        let (encoder, decoder) = model.attention_weights(batch);
        let (src, tgt) = (&batch.src_lens[..], &batch.tgt_lens[..]);
        let (s, t) = (batch.src_len, batch.tgt_len);
        for (i, w) in encoder.iter().enumerate() {
            let heads = model.encoder.layers[i].self_attn.n_heads;
            let shape = WeightsShape {
                heads,
                q_len: s,
                k_len: s,
                q_lens: src,
                k_lens: src,
            };
            add_weights(
                &mut site_of(&mut self.sums, AttentionSite::Encoder)[i],
                w,
                &shape,
            );
        }
        for (i, w) in decoder.iter().enumerate() {
            let layer = &model.decoder.layers[i];
            let shape = WeightsShape {
                heads: layer.self_attn.n_heads,
                q_len: t,
                k_len: t,
                q_lens: tgt,
                k_lens: tgt,
            };
            let sums = &mut site_of(&mut self.sums, AttentionSite::Decoder)[i];
            add_weights(sums, &w.self_attn, &shape);
            let shape = WeightsShape {
                heads: layer.cross_attn.n_heads,
                q_len: t,
                k_len: s,
                q_lens: tgt,
                k_lens: src,
            };
            let sums = &mut site_of(&mut self.sums, AttentionSite::Cross)[i];
            add_weights(sums, &w.cross_attn, &shape);
        }
    }
}
