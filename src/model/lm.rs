//! A GPT-style decoder-only language model built from the same parts as the encoder-decoder:
//! token embedding (with the config's positions) -> N blocks of causal self-attention and a
//! position-wise FFN, each inside a [`Residual`] (post-LN or pre-LN per `config.norm`) -> a final
//! layer norm (pre-LN only) -> the output projection, tied to the embedding unless
//! `config.tie_embeddings` is false.
//!
//! The shape is a [`ModelConfig`] with `n_encoder_layers == 0`; the depth is
//! `n_decoder_layers`. Parameter names mirror the module tree: `embedding.weight`,
//! `layers.{i}.self_attn.q_proj.weight`, `layers.{i}.self_attn_norm.weight`,
//! `layers.{i}.ffn.linear1.weight`, `layers.{i}.ffn_norm.weight`, `final_norm.weight`,
//! `output_proj.weight` (untied only).

use super::attention::{AttentionCache, MultiHeadAttention};
use super::block::{Residual, ResidualCache};
use super::config::{ModelConfig, NormPlacement, Positions};
use super::embedding::{Embedding, EmbeddingCache};
use super::feed_forward::{FeedForward, FeedForwardCache};
use super::kv_cache::KvCache;
use super::layer_norm::LayerNorm;
use super::param::{Module, Param};
use crate::kernels::attention::AttnMask;
use crate::kernels::layer_norm::LayerNormStats;
use crate::kernels::matmul::{linear_forward, matmul, MatMut, MatRef};
use crate::model::loss::{cross_entropy_ignoring, LossStats};
use crate::rng::Rng;
use crate::Float;

/// One block: causal self-attention, then the FFN, each in a residual connection.
#[derive(Clone, Debug)]
pub struct LmBlock<T> {
    pub self_attn: MultiHeadAttention<T>,
    pub self_attn_res: Residual<T>,
    pub ffn: FeedForward<T>,
    pub ffn_res: Residual<T>,
}

/// What a block's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct LmBlockCache<T> {
    pub self_attn: ResidualCache<T, AttentionCache<T>>,
    pub ffn: ResidualCache<T, FeedForwardCache<T>>,
}

impl<T: Float> LmBlock<T> {
    pub fn new(c: &ModelConfig, rng: &mut Rng) -> Self {
        let res = || Residual::new(c.d_model, c.layer_norm_eps, c.norm, c.dropout);
        LmBlock {
            self_attn: MultiHeadAttention::new(c.d_model, c.n_heads, rng)
                .with_dropout(c.attention_dropout)
                .with_rotary(c.positions == Positions::Rotary),
            self_attn_res: res(),
            ffn: FeedForward::new(c.d_model, c.d_ff, c.activation, rng)
                .with_dropout(c.activation_dropout),
            ffn_res: res(),
        }
    }

    /// `x [batch*seq, d_model]` -> same shape, causal self-attention within each row.
    pub fn forward(
        &self,
        x: Vec<T>,
        batch: usize,
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, LmBlockCache<T>) {
        let seq = x.len() / (batch * self.self_attn.d_model);
        let lens = vec![seq; batch];
        let causal = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let (x, self_attn) = self.self_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.self_attn.dropout,
            |u, r| self.self_attn.forward_train(u, u, batch, causal, r),
        );
        let (x, ffn) = self
            .ffn_res
            .forward_inner(x, rng, self.ffn.dropout, |u, r| {
                self.ffn.forward_train(u, r)
            });
        (x, LmBlockCache { self_attn, ffn })
    }

    /// Accumulates gradients and returns dx.
    pub fn backward(&mut self, cache: LmBlockCache<T>, dy: &[T]) -> Vec<T> {
        let dx = self
            .ffn_res
            .backward(cache.ffn, dy, |u, c, d| self.ffn.backward(u, c, d));
        self.self_attn_res
            .backward(cache.self_attn, &dx, |u, c, d| {
                let (dq, mut dkv) = self.self_attn.backward(u, u, c, d);
                crate::kernels::activations::add_inplace(&mut dkv, &dq);
                dkv
            })
    }

    /// Incremental: `x [batch*q_len, d_model]` are the next positions; their keys and values are
    /// appended to `cache`.
    pub fn forward_step(&self, x: Vec<T>, cache: &mut KvCache<T>) -> Vec<T> {
        let x = self
            .self_attn_res
            .apply(x, |u| self.self_attn.forward_cached(u, cache, true, None).0);
        self.ffn_res.apply(x, |u| self.ffn.forward(u).0)
    }
}

impl<T> Module<T> for LmBlock<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.self_attn
            .collect_params(&format!("{prefix}.self_attn"), out);
        self.self_attn_res
            .collect_params(&format!("{prefix}.self_attn_norm"), out);
        self.ffn.collect_params(&format!("{prefix}.ffn"), out);
        self.ffn_res
            .collect_params(&format!("{prefix}.ffn_norm"), out);
    }
}

/// The decoder-only language model.
#[derive(Clone, Debug)]
pub struct LanguageModel<T> {
    pub config: ModelConfig,
    /// E [vocab, d_model] (and whatever position parameters the config asks for).
    pub embedding: Embedding<T>,
    pub layers: Vec<LmBlock<T>>,
    /// Pre-LN only: the norm after the last block.
    pub final_norm: Option<LayerNorm<T>>,
    /// The output projection [vocab, d_model] when not tied to the embedding.
    pub output_proj: Option<Param<T>>,
}

/// Everything the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct LmCache<T> {
    pub embedding: EmbeddingCache<T>,
    pub layers: Vec<LmBlockCache<T>>,
    /// Pre-LN: the final norm's input and statistics.
    pub final_norm: Option<(Vec<T>, LayerNormStats<T>)>,
    /// The projection's input [batch*seq, d_model].
    pub hidden: Vec<T>,
}

/// Incremental decoding state: one self-attention KV cache per block.
#[derive(Clone, Debug)]
pub struct LmState<T> {
    pub caches: Vec<KvCache<T>>,
}

impl<T> LmState<T> {
    /// Positions fed so far.
    pub fn len(&self) -> usize {
        self.caches.first().map_or(0, |c| c.len)
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the caches have room for.
    pub fn capacity(&self) -> usize {
        self.caches.first().map_or(0, |c| c.capacity)
    }
}

/// The number of trainable scalars of a language model of this shape (`None` on overflow):
/// the encoder-decoder count without the encoder, the decoder's cross-attention sublayers and
/// the encoder's final norm. Checked against a weights file before allocating.
pub fn lm_n_params(c: &ModelConfig) -> Option<usize> {
    let mut lm = c.clone();
    lm.n_encoder_layers = 0;
    let d = c.d_model;
    let cross = d
        .checked_mul(d)?
        .checked_add(d)?
        .checked_mul(4)?
        .checked_add(2 * d)?;
    let mut n = lm
        .n_params()?
        .checked_sub(cross.checked_mul(c.n_decoder_layers)?)?;
    if c.norm == NormPlacement::PreLn {
        n = n.checked_sub(2 * d)?;
    }
    Some(n)
}

impl<T: Float> LanguageModel<T> {
    /// A freshly initialised model. `config.n_encoder_layers` is ignored (an LM has no encoder).
    pub fn new(config: ModelConfig, rng: &mut Rng) -> Self {
        let c = &config;
        let embedding =
            Embedding::with_positions(c.vocab_size, c.d_model, c.max_len, c.positions, rng);
        let layers = (0..c.n_decoder_layers)
            .map(|_| LmBlock::new(c, rng))
            .collect();
        let final_norm =
            (c.norm == NormPlacement::PreLn).then(|| LayerNorm::new(c.d_model, c.layer_norm_eps));
        let output_proj = (!c.tie_embeddings)
            .then(|| Param::xavier(&[c.vocab_size, c.d_model], c.d_model, c.vocab_size, rng));
        LanguageModel {
            config,
            embedding,
            layers,
            final_norm,
            output_proj,
        }
    }

    /// All parameters with their checkpoint names, in a fixed order.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Param<T>)> {
        let mut out = Vec::new();
        self.collect_params("", &mut out);
        out
    }

    /// Total number of trainable scalars.
    pub fn n_params(&mut self) -> usize {
        self.params_mut().iter().map(|(_, p)| p.value.len()).sum()
    }

    /// Sets every gradient to zero.
    pub fn zero_grads(&mut self) {
        for (_, p) in self.params_mut() {
            p.grad.fill_zero();
        }
    }

    /// The longest sequence the model accepts.
    pub fn max_len(&self) -> usize {
        self.config.max_len
    }

    fn projection_weight(&self) -> &[T] {
        match &self.output_proj {
            Some(p) => &p.value.data,
            None => &self.embedding.weight.value.data,
        }
    }

    /// `hidden [rows, d_model]` -> logits `[rows, vocab]`.
    pub fn project(&self, hidden: &[T]) -> Vec<T> {
        let (d, v) = (self.config.d_model, self.config.vocab_size);
        let rows = hidden.len() / d;
        let mut logits = vec![T::zero(); rows * v];
        linear_forward(
            &mut logits,
            hidden,
            self.projection_weight(),
            None,
            rows,
            d,
            v,
        );
        logits
    }

    /// `tokens [batch, seq]` (row-major, positions from 0) -> logits `[batch*seq, vocab]` and
    /// the cache. Dropout when `rng` is given.
    pub fn forward(
        &self,
        tokens: &[u32],
        batch: usize,
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, LmCache<T>) {
        assert!(
            batch > 0 && tokens.len().is_multiple_of(batch),
            "tokens must be [batch, seq]"
        );
        let seq = tokens.len() / batch;
        let (mut x, embedding) =
            self.embedding
                .forward(tokens, seq, 0, self.config.dropout, rng.as_deref_mut());
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (y, c) = layer.forward(x, batch, rng.as_deref_mut());
            x = y;
            layers.push(c);
        }
        let mut final_norm = None;
        if let Some(norm) = &self.final_norm {
            let (y, stats) = norm.forward(&x);
            final_norm = Some((x, stats));
            x = y;
        }
        let logits = self.project(&x);
        let cache = LmCache {
            embedding,
            layers,
            final_norm,
            hidden: x,
        };
        (logits, cache)
    }

    /// Backward from `dlogits [batch*seq, vocab]`; accumulates every parameter gradient.
    pub fn backward(&mut self, cache: LmCache<T>, dlogits: &[T]) {
        let (d, v) = (self.config.d_model, self.config.vocab_size);
        let rows = cache.hidden.len() / d;
        // dhidden [rows, d] = dlogits W ; dW [vocab, d] += dlogitsᵀ hidden
        let mut dx = vec![T::zero(); rows * d];
        matmul(
            MatMut::new(&mut dx, rows, d),
            MatRef::new(dlogits, rows, v),
            MatRef::new(self.projection_weight(), v, d),
            T::one(),
            false,
        );
        let w_grad = match &mut self.output_proj {
            Some(p) => &mut p.grad.data,
            None => &mut self.embedding.weight.grad.data,
        };
        matmul(
            MatMut::new(w_grad, v, d),
            MatRef::new(dlogits, rows, v).t(),
            MatRef::new(&cache.hidden, rows, d),
            T::one(),
            true,
        );
        if let (Some(norm), Some((x, stats))) = (&mut self.final_norm, &cache.final_norm) {
            dx = norm.backward(x, stats, &dx);
        }
        for (layer, c) in self.layers.iter_mut().zip(cache.layers).rev() {
            dx = layer.backward(c, &dx);
        }
        self.embedding.backward(&cache.embedding, &dx);
    }

    /// One forward and backward on `tokens [batch, seq]` predicting `targets [batch, seq]`
    /// (the tokens shifted by one): accumulates `grad_scale · ∂(Σ loss)/∂θ` and returns the
    /// loss sums. Every target counts (no padding). Dropout when `rng` is given.
    pub fn forward_backward(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        batch: usize,
        label_smoothing: f64,
        grad_scale: f64,
        rng: Option<&mut Rng>,
    ) -> LossStats {
        assert_eq!(tokens.len(), targets.len(), "one target per token");
        let (mut logits, cache) = self.forward(tokens, batch, rng);
        let stats = cross_entropy_ignoring(
            &mut logits,
            targets,
            self.config.vocab_size,
            label_smoothing,
            Some(grad_scale),
            None,
        );
        self.backward(cache, &logits);
        stats
    }

    /// Loss sums without dropout and without gradients.
    pub fn evaluate(&self, tokens: &[u32], targets: &[u32], batch: usize) -> LossStats {
        self.evaluate_with_logprobs(tokens, targets, batch).0
    }

    /// Loss sums (plain cross-entropy) and the log-probabilities `[batch*seq, vocab]`.
    pub fn evaluate_with_logprobs(
        &self,
        tokens: &[u32],
        targets: &[u32],
        batch: usize,
    ) -> (LossStats, Vec<T>) {
        assert_eq!(tokens.len(), targets.len(), "one target per token");
        let (mut logits, _) = self.forward(tokens, batch, None);
        let stats = cross_entropy_ignoring(
            &mut logits,
            targets,
            self.config.vocab_size,
            0.0,
            None,
            None,
        );
        (stats, logits)
    }

    /// An empty incremental-decoding state for `batch` sequences of up to `capacity` positions
    /// (at most `max_len`).
    pub fn start(&self, batch: usize, capacity: usize) -> LmState<T> {
        let capacity = capacity.min(self.config.max_len);
        LmState {
            caches: self
                .layers
                .iter()
                .map(|_| KvCache::new(batch, capacity, self.config.d_model))
                .collect(),
        }
    }

    /// Feeds `tokens [batch, q_len]` at the next positions (a prompt at once, or one token per
    /// step) and returns the log-probabilities of each following token, `[batch*q_len, vocab]`.
    pub fn step(&self, state: &mut LmState<T>, tokens: &[u32]) -> Vec<T> {
        let batch = state.caches.first().map_or(1, |c| c.batch);
        assert!(
            tokens.len().is_multiple_of(batch),
            "tokens must be [batch, q_len]"
        );
        let q_len = tokens.len() / batch;
        let pos = state.len();
        assert!(
            pos + q_len <= state.capacity(),
            "decoding state full ({} positions)",
            state.capacity()
        );
        let (mut x, _) = self.embedding.forward(tokens, q_len, pos, 0.0, None);
        for (layer, cache) in self.layers.iter().zip(&mut state.caches) {
            x = layer.forward_step(x, cache);
        }
        if let Some(norm) = &self.final_norm {
            x = norm.forward(&x).0;
        }
        let mut logits = self.project(&x);
        for row in logits.chunks_exact_mut(self.config.vocab_size) {
            crate::kernels::softmax::log_softmax_inplace(row);
        }
        logits
    }
}

impl<T> Module<T> for LanguageModel<T> {
    fn collect_params<'a>(&'a mut self, _prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.embedding.collect_params("embedding", out);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.collect_params(&format!("layers.{i}"), out);
        }
        if let Some(norm) = &mut self.final_norm {
            norm.collect_params("final_norm", out);
        }
        if let Some(p) = &mut self.output_proj {
            out.push(("output_proj.weight".into(), p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_count_formula_matches_the_model() {
        for (norm, positions) in [
            (NormPlacement::PostLn, Positions::Sinusoidal),
            (NormPlacement::PreLn, Positions::Learned),
            (NormPlacement::PostLn, Positions::Rotary),
        ] {
            for tie in [true, false] {
                let mut c = ModelConfig::preset("tiny", 37).unwrap();
                c.n_encoder_layers = 0;
                c.n_decoder_layers = 3;
                c.norm = norm;
                c.tie_embeddings = tie;
                c.positions = positions;
                let mut m = LanguageModel::<f32>::new(c.clone(), &mut Rng::new(0));
                assert_eq!(lm_n_params(&c), Some(m.n_params()), "{norm:?} tie={tie}");
            }
        }
    }
}
