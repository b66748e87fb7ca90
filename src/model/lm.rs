//! A GPT-style decoder-only language model built from the same parts as the encoder-decoder:
//! token embedding (with the config's positions) -> N blocks of causal self-attention and a
//! position-wise FFN, each inside a [`Residual`](super::residual::Residual) (post-LN or pre-LN per `config.norm`) -> a final
//! layer norm (pre-LN only) -> the output projection, tied to the embedding unless
//! `config.tie_embeddings` is false.
//!
//! The shape is a [`ModelConfig`] with `n_encoder_layers == 0`; the depth is
//! `n_decoder_layers`. Parameter names mirror the module tree: `embedding.weight`,
//! `layers.{i}.self_attn.q_proj.weight`, `layers.{i}.self_attn_norm.weight`,
//! `layers.{i}.ffn.linear1.weight`, `layers.{i}.ffn_norm.weight`, `final_norm.weight`,
//! `output_proj.weight` (untied only).

use super::block::{SelfAttentionBlock, SelfAttentionBlockCache};
use super::cache_stack::CacheStack;
use super::config::{AttentionSite, GatedDeltaConfig, ModelConfig};
use super::embedding::{Embedding, EmbeddingCache, Side};
use super::gated_delta::GatedDeltaNet;
use super::head::OutputHead;
use super::kv_cache::KvTypes;
use super::linear::{
    prepare_inference_all, prepare_precision_all, set_bf16_products_all, Linear,
};
use super::loss::LossStats;
use super::param::{count_params, Init, Module, ParamVisitor, ShapesOnly};
use super::stack::{Stack, StackCache};
use super::step_layout::{embed_ragged, one_per_row, Feed, StepLayout};
use crate::backend::{AttnMask, Bf16Kernel, DeltaShape, Precision};
use crate::rng::Rng;
use crate::Float;
use std::borrow::Cow;

/// The decoder-only language model.
#[derive(Clone, Debug)]
pub struct LanguageModel<T> {
    /// The shapes and options the model was built from.
    pub config: ModelConfig,
    /// E [vocab, d_model] (and whatever position parameters the config asks for).
    pub embedding: Embedding<T>,
    /// The blocks (`layers.{i}`) and, pre-LN, the final norm.
    pub blocks: Stack<SelfAttentionBlock<T>, T>,
    /// The output projection: the embedding matrix, or its own when untied.
    pub head: OutputHead<T>,
    /// The positions a sequence may reach in this run: the model's context
    /// `config.max_len` unless [`set_context`](Self::set_context) lowered it (`--ctx-size`).
    pub(super) context: usize,
    /// The storage types of the key/value caches of the states it starts
    /// ([`set_kv_types`](Self::set_kv_types); exact floats by default).
    pub(super) kv_types: KvTypes,
}

/// Everything the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct LmCache<T> {
    pub embedding: EmbeddingCache<T>,
    pub blocks: StackCache<SelfAttentionBlockCache<T>, T>,
    /// The projection's input [batch*seq, d_model].
    pub hidden: Vec<T>,
}

/// Incremental decoding state: one self-attention KV cache per block.
pub type LmState<T> = CacheStack<T>;

/// The number of trainable scalars of a language model of this shape (`None` on overflow),
/// counted from the parameters' shapes. Checked against a weights file before allocating.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn lm_n_params(c: &ModelConfig) -> Option<usize> {
    count_params(&mut LanguageModel::<f32>::new(c.clone(), &mut ShapesOnly))
}

impl<T: Float> LanguageModel<T> {
    /// A freshly initialised model, drawn from `init` in the order embedding, blocks,
    /// projection. `config.n_encoder_layers` is ignored (an LM has no encoder). Layer `i`'s
    /// self-attention has the sliding window `config.layer_window(i)`, rotates or not as
    /// `config.layer_rotary(i)` says (a NoPE layer), the rotary base
    /// `config.layer_rope_base(i)` and, unless it rotates with the sliding base, the rotary
    /// scaling `config.rope_freq_factors()`.
    pub fn new(config: ModelConfig, init: &mut impl Init) -> Self {
        let c = &config;
        let block = c.block();
        let mut embedding =
            Embedding::with_positions(c.vocab_size, c.d_model, c.max_len, c.positions, init);
        embedding.scaled = c.scale_embeddings;
        embedding.scale_override = c.embedding_scale;
        // Layer `i` has `config.layer_n_heads(Decoder, i)` heads (fewer where pruned), or is a
        // hybrid stack's Gated DeltaNet layer (its attention without heads).
        let mut layer = 0;
        let mut blocks = Stack::new(
            c.n_decoder_layers,
            init,
            |init| {
                let i = layer;
                layer += 1;
                match c.gated_delta.as_ref().filter(|g| g.is_delta(i)) {
                    Some(g) => delta_block(c, g, init),
                    None => {
                        let heads = c.layer_n_heads(AttentionSite::Decoder, i);
                        let mut b = SelfAttentionBlock::new(&block.with_heads(heads), init);
                        let a = &mut b.self_attn;
                        a.rotary_dim = c.rotary_dim;
                        if c.attn_output_gate {
                            a.output_gate = Some(Linear::with_bias(c.d_model, a.d_q(), false, init));
                        }
                        if c.attention_sinks {
                            a.sinks = Some(init.constant(&[heads], 0.0));
                        }
                        b
                    }
                }
            },
            |init| block.final_norm(init),
        );
        let rope_freq_factors = c.rope_freq_factors();
        for (i, layer) in blocks.layers.iter_mut().enumerate() {
            layer.self_attn.window = c.layer_window(i);
            layer.self_attn.set_kind(c.layer_attention_kind(i), true);
            layer.self_attn.rotary = c.layer_rotary(i);
            layer.self_attn.rope.base = c.layer_rope_base(i);
            // Scaling belongs to `rope_base`: a layer of its own sliding base is unscaled.
            (layer.self_attn.rope_freq_factors, layer.self_attn.rope.attention_factor) =
                match c.has_sliding_rope(i) {
                    true => (Vec::new(), 1.0),
                    false => (rope_freq_factors.clone(), c.rope_attention_factor()),
                };
        }
        let head = OutputHead::new(c.vocab_size, c.d_model, c.tie_embeddings, init)
            .with_softcap(c.final_logit_softcap)
            .with_divisor(c.logit_divisor)
            .with_bias(c.output_bias, init);
        LanguageModel {
            context: config.max_len,
            kv_types: KvTypes::default(),
            config,
            embedding,
            blocks,
            head,
        }
    }

    /// Transposed weight copies for a run of decoding steps (see
    /// [`Seq2Seq::prepare_inference`](super::Seq2Seq::prepare_inference)).
    pub fn prepare_inference(&mut self) {
        prepare_inference_all(&mut self.blocks);
        self.head.prepare_inference(&self.embedding);
    }

    /// Training: the linear layers multiply bf16-rounded operands with `kernel`, or float32
    /// ones (`None`; see `train::precision`).
    pub fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        set_bf16_products_all(&mut self.blocks, kernel);
    }

    /// Readies the model for inference in `precision` (see
    /// [`Seq2Seq::prepare_precision`](super::Seq2Seq::prepare_precision)).
    pub fn prepare_precision(&mut self, precision: Precision) -> Result<(), String> {
        prepare_precision_all(&mut self.blocks, precision)?;
        self.head.prepare_precision(&self.embedding, precision)
    }

    /// The longest sequence this run accepts: the context set by
    /// [`set_context`](Self::set_context), by default the model's (`config.max_len`).
    pub fn max_len(&self) -> usize {
        self.context
    }

    /// `hidden [rows, d_model]` -> logits `[rows, vocab]`.
    pub fn project(&self, hidden: &[T]) -> Vec<T> {
        self.head.logits(&self.embedding, hidden)
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
        let (x, embedding) =
            self.embedding
                .forward(tokens, seq, 0, self.config.dropout, rng.as_deref_mut());
        let lens = vec![seq; batch];
        let causal = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let (hidden, blocks) = self
            .blocks
            .forward(x, rng, |l, x, r| l.forward(x, batch, causal, r));
        let logits = self.project(&hidden);
        let cache = LmCache {
            embedding,
            blocks,
            hidden,
        };
        (logits, cache)
    }

    /// Backward from `dlogits [batch*seq, vocab]`; accumulates every parameter gradient.
    pub fn backward(&mut self, cache: LmCache<T>, dlogits: &[T]) {
        let dhidden = self
            .head
            .backward(&mut self.embedding, &cache.hidden, dlogits);
        let dx = self
            .blocks
            .backward(cache.blocks, dhidden, |l, c, d| l.backward(c, d));
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
        let stats = self.head.loss(
            &mut logits,
            targets,
            None,
            label_smoothing,
            Some(grad_scale),
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
        let stats = self.head.loss(&mut logits, targets, None, 0.0, None);
        (stats, logits)
    }

    /// Whether a decoding state can be cut back to fewer positions (speculative decoding):
    /// not when a layer keeps running sums (linear attention, Gated DeltaNet) instead of keys
    /// and values.
    pub fn can_roll_back(&self) -> bool {
        !self
            .blocks
            .layers
            .iter()
            .any(|l| l.self_attn.linear || l.linear_attn.is_some())
    }

    /// An empty incremental-decoding state for `batch` sequences of up to `capacity` positions
    /// (at most [`max_len`](Self::max_len)): one block per row, attended as matrix products
    /// (its memory is taken at the first feed: ask for the positions the run needs).
    ///
    /// With sliding windows, blocks of the smallest window (at most 64 positions), released as
    /// the window moves on: a windowed layer then holds about its window's positions, not
    /// `capacity` (attention then reads through the block tables).
    pub fn start(&self, batch: usize, capacity: usize) -> LmState<T> {
        let capacity = capacity.min(self.context);
        let windows = self.blocks.layers.iter().filter_map(|l| l.self_attn.window);
        let block_rows = windows.min().map_or(capacity, |w| w.clamp(1, 64));
        CacheStack::with_types(self.kv_widths(), batch, capacity, block_rows, self.kv_types)
    }

    /// An empty state for continuous batching: no rows yet, each row may hold up to
    /// [`max_len`](Self::max_len) positions (at least one block), stored in blocks of
    /// `block_rows` from one free list per layer (the serving pool; rows join with
    /// `CacheStack::add_row`, grow through [`step`](Self::step) with a ragged layout and leave
    /// with `CacheStack::gather_rows`).
    pub fn start_paged(&self, block_rows: usize) -> LmState<T> {
        let capacity = self.context.max(block_rows);
        CacheStack::with_types(self.kv_widths(), 0, capacity, block_rows, self.kv_types)
    }

    /// The key/value width and the head width of each block's self-attention.
    fn kv_widths(&self) -> Vec<(usize, usize)> {
        self.blocks
            .layers
            .iter()
            .map(|l| (l.self_attn.d_kv(), l.self_attn.d_head))
            .collect()
    }

    /// Feeds `tokens` laid out as `layout` says (see `super::step_layout`): a uniform feed
    /// `[rows, q_len]` at the state's next positions (a prompt at once, or one token a row), or
    /// tokens of any rows at their own positions (continuous batching). Returns the
    /// log-probabilities of the token after each output the layout selects,
    /// `[outputs, vocab]`: the output projection (the widest product of a step) runs on those
    /// rows only, and with `Outputs::Last` on a uniform
    /// feed the last block too.
    pub fn step(&self, state: &mut LmState<T>, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<T> {
        let mut logits = self.step_logits(state, tokens, layout);
        self.head.log_softmax_rows(&mut logits);
        logits
    }

    /// [`Self::step`] before the last log-softmax: the logits `[outputs, vocab]` (soft-capped
    /// where the model caps them). `step` is this followed by
    /// `OutputHead::log_softmax_rows`, bit for bit.
    pub fn step_logits(
        &self,
        state: &mut LmState<T>,
        tokens: &[u32],
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        // A one-per-row feed is the ragged feed of every row at its own length.
        let (rows, positions): (Cow<'_, [usize]>, Cow<'_, [usize]>) = match layout.feed {
            Feed::Uniform => {
                let (x, q_len) = self.embed_uniform(state, tokens);
                return self.step_blocks(state, x, q_len, layout);
            }
            Feed::Ragged { rows, positions } => (rows.into(), positions.into()),
            Feed::OnePerRow => {
                let (rows, positions) = one_per_row(state.row_lens());
                (rows.into(), positions.into())
            }
        };
        let x = embed_ragged(&self.embedding, Side::Source, tokens, &rows, &positions, self.max_len());
        let ragged = StepLayout {
            feed: Feed::Ragged {
                rows: &rows,
                positions: &positions,
            },
            outputs: layout.outputs,
        };
        self.step_blocks(state, x, 1, &ragged)
    }

    /// The blocks over the embedded step `x`, then the selected outputs' logits.
    fn step_blocks(
        &self,
        state: &mut LmState<T>,
        x: Vec<T>,
        q_len: usize,
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        let caches = &mut state.caches;
        let last = self.blocks.layers.len().saturating_sub(1);
        let inner = layout.all_outputs();
        let h = self.blocks.apply(x, |i, l, x| {
            l.step(x, &mut caches[i], if i == last { layout } else { &inner })
        });
        // The last block already kept only the last positions when it could.
        let reduced = layout.last_of_several(q_len) && !self.blocks.layers.is_empty();
        let h = if reduced {
            h
        } else {
            layout.select(h, q_len, self.config.d_model)
        };
        self.head.logits(&self.embedding, &h)
    }

    /// The embeddings `[batch*q_len, d_model]` of `tokens [batch, q_len]` at the state's next
    /// positions, and `q_len`.
    fn embed_uniform(&self, state: &LmState<T>, tokens: &[u32]) -> (Vec<T>, usize) {
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
        let (x, _) = self.embedding.forward(tokens, q_len, pos, 0.0, None);
        (x, q_len)
    }
}

/// A hybrid stack's Gated DeltaNet block (`g`'s shape): the layer, then the FFN, each in its
/// residual connection; its self-attention has no heads (it is never called).
fn delta_block<T: Float>(c: &ModelConfig, g: &GatedDeltaConfig, init: &mut impl Init) -> SelfAttentionBlock<T> {
    let block = c.block();
    let shape = DeltaShape {
        key_heads: g.key_heads,
        value_heads: g.value_heads,
        d_key: g.d_key,
        d_value: g.d_value,
        conv_kernel: g.conv_kernel,
    };
    SelfAttentionBlock {
        self_attn: block.with_heads(0).attention(true, init),
        linear_attn: Some(GatedDeltaNet::new(c.d_model, shape, c.layer_norm_eps, init)),
        self_attn_res: block.residual(init),
        ffn: block.ffn(init),
        ffn_res: block.residual(init),
    }
}

impl<T> Module<T> for LanguageModel<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("embedding", &mut self.embedding);
        self.blocks.visit(v);
        self.head.visit(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NormPlacement, Positions};

    /// A prompt through `step` with the last outputs only (the last block on the last positions
    /// only) against the last rows of a dense `step` (every position everywhere), in f64, post-LN sinusoidal and pre-LN
    /// rotary grouped-query models, after a cached prefix; then one more token through both
    /// states, which checks that the last block cached every position's keys and values.
    #[test]
    fn last_outputs_equal_the_last_rows_of_a_dense_step() {
        for (norm, positions) in [
            (NormPlacement::PostLn, Positions::Sinusoidal),
            (NormPlacement::PreLn, Positions::Rotary),
        ] {
            let mut c = ModelConfig::preset("tiny", 29).unwrap();
            c.n_encoder_layers = 0;
            c.n_decoder_layers = 2;
            c.norm = norm;
            c.positions = positions;
            if positions == Positions::Rotary {
                c.n_kv_heads = Some(c.n_heads / 2);
            }
            let m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(3));
            let (batch, q_len, vocab) = (2, 5, c.vocab_size);
            let (mut a, mut b) = (m.start(batch, 16), m.start(batch, 16));
            let prefix = [4, 9, 1, 7, 7, 2];
            let (dense, last) = (StepLayout::dense(), StepLayout::last());
            m.step(&mut a, &prefix, &dense);
            m.step(&mut b, &prefix, &dense);
            let prompt: Vec<u32> = (0..batch * q_len).map(|i| (i * 7 % vocab) as u32).collect();
            let last_rows = m.step(&mut a, &prompt, &last);
            let all = m.step(&mut b, &prompt, &dense);
            let want = super::super::residual::last_rows(&all, q_len, vocab);
            assert_eq!(last_rows.len(), want.len());
            for (x, y) in last_rows.iter().zip(&want) {
                assert!((x - y).abs() < 1e-10, "{norm:?} {positions:?}: {x} vs {y}");
            }
            let (next_a, next_b) = (
                m.step(&mut a, &[3, 5], &last),
                m.step(&mut b, &[3, 5], &last),
            );
            for (x, y) in next_a.iter().zip(&next_b) {
                assert!(
                    (x - y).abs() < 1e-10,
                    "{norm:?} {positions:?} next: {x} vs {y}"
                );
            }
        }
    }

    /// The count from shapes against the arithmetic of the encoder-decoder's count: the same
    /// model without the encoder, the decoder's cross-attention sublayers and the encoder's
    /// final norm.
    #[test]
    fn param_count_from_shapes_matches_the_formula_and_the_model() {
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
                let d = c.d_model;
                let cross = 3 * (4 * (d * d + d) + 2 * d);
                let final_norm = if norm == NormPlacement::PreLn {
                    2 * d
                } else {
                    0
                };
                let formula = c.n_params().unwrap() - cross - final_norm;
                assert_eq!(lm_n_params(&c), Some(m.n_params()), "{norm:?} tie={tie}");
                assert_eq!(lm_n_params(&c), Some(formula), "{norm:?} tie={tie}");
            }
        }
    }
}
