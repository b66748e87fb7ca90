//! The paper's encoder-decoder (Figure 1): shared embeddings with positions, the encoder over the
//! source, the decoder over the shifted target attending to the encoder output, and the
//! pre-softmax projection tied to the embedding matrix (section 3.4).
//!
//! Relative positions (T5, `super::relative_bias`): every self-attention gets its bias table,
//! `*.self_attn.relative_bias.weight`.
//!
//! Parameters: `embedding.*`, `encoder.layers.{i}.*`, `encoder.final_norm.*` (pre-LN),
//! `decoder.layers.{i}.*`, `decoder.final_norm.*` (pre-LN), `output_proj.weight` (untied).

use super::block::{SelfAttentionBlock, SelfAttentionBlockCache};
use super::cache_stack::CacheStack;
use super::config::{AttentionSite, ModelConfig, Positions};
use super::decoder::{Decoder, DecoderLayer, DecoderLayerCache, DecoderMasks, StepAttention};
use super::embedding::{Embedding, EmbeddingCache, Side};
use super::encoder::{padding_mask, Encoder};
use super::head::OutputHead;
use super::linear::{
    prepare_alone_all, prepare_inference_all, prepare_precision_all, set_bf16_products_all,
};
use super::loss::LossStats;
use super::param::{Init, Module, ParamVisitor};
use super::relative_bias::RelativeBias;
use super::stack::{Stack, StackCache};
use super::step_layout::{embed_ragged, one_per_row, Feed, StepLayout};
use crate::batch::{Batch, PAD};
use crate::backend::{Bf16Kernel, Precision};
use crate::rng::Rng;
use crate::Float;

/// The encoder-decoder Transformer.
#[derive(Clone, Debug)]
pub struct Seq2Seq<T> {
    /// The shapes and options the model was built from.
    pub config: ModelConfig,
    /// The one embedding matrix of the shared vocabulary, E [vocab, d_model].
    pub embedding: Embedding<T>,
    /// The encoder stack: `n_encoder_layers` self-attention blocks.
    pub encoder: Encoder<T>,
    /// The decoder stack: `n_decoder_layers` blocks with self- and cross-attention.
    pub decoder: Decoder<T>,
    /// The pre-softmax projection: the embedding matrix, or its own when untied.
    pub head: OutputHead<T>,
}

/// Everything the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct Seq2SeqCache<T> {
    pub src_embedding: EmbeddingCache<T>,
    pub encoder: StackCache<SelfAttentionBlockCache<T>, T>,
    /// Encoder output [batch*src_len, d_model].
    pub memory: Vec<T>,
    pub tgt_embedding: EmbeddingCache<T>,
    pub decoder: StackCache<DecoderLayerCache<T>, T>,
    /// Final decoder states, the projection's input [batch*tgt_len, d_model].
    pub hidden: Vec<T>,
}

/// The state of incremental decoding for a batch of sources.
#[derive(Clone, Debug)]
pub struct DecodeState<T> {
    /// Per decoder layer: the self-attention keys/values of the tokens fed so far, paged one
    /// position per block (beam search re-gathers rows after every step).
    pub self_caches: CacheStack<T>,
    /// Per decoder layer: the encoder output's keys/values, computed once. One row per decoder
    /// row, or one per group of `g` consecutive decoder rows that share a source (beam search:
    /// the beams of a sentence), which the cross-attention then reads as `g` queries (its
    /// weights come out as `[sentences, heads, g, src_len]`).
    pub cross_caches: CacheStack<T>,
    /// Source lengths, one per cross-attention cache row.
    pub src_lens: Vec<usize>,
}

impl<T: Float> DecodeState<T> {
    /// Positions fed so far (ragged rows: in the longest row).
    pub fn len(&self) -> usize {
        self.self_caches.len()
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decoder row `j` becomes the old row `rows[j]` (the cross-attention rows stay).
    pub fn gather_rows(&mut self, rows: &[usize]) {
        self.self_caches.gather_rows(rows);
    }

    /// Cross-attention row `j` becomes the old cross row `rows[j]`, with its source length.
    pub fn gather_sources(&mut self, rows: &[usize]) {
        self.cross_caches.gather_rows(rows);
        self.src_lens = rows.iter().map(|&r| self.src_lens[r]).collect();
    }
}

impl<T: Float> Seq2Seq<T> {
    /// A freshly initialised model (Xavier-uniform matrices, unit norms, zero biases), drawn
    /// from `init` in the order embedding, encoder, decoder, projection.
    pub fn new(config: ModelConfig, init: &mut impl Init) -> Self {
        let c = &config;
        let block = c.block();
        let mut embedding =
            Embedding::with_positions(c.vocab_size, c.d_model, c.max_len, c.positions, init);
        embedding.scaled = c.scale_embeddings;
        embedding.scale_override = c.embedding_scale;
        // mBART / BART: the decoder's own positions, each side's input norm.
        if c.target_positions {
            embedding.target_positions = Some(init.xavier(&[c.max_len, c.d_model], c.max_len, c.d_model));
        }
        if c.embedding_norm {
            embedding.norm = Some(block.norm(init));
            embedding.target_norm = Some(block.norm(init));
        }
        // Each layer's heads per site: `config.layer_n_heads` (fewer where pruned).
        let heads = |site, i| block.with_heads(c.layer_n_heads(site, i));
        let (mut encoder_layer, mut decoder_layer) = (0, 0);
        let mut encoder = Stack::new(
            c.n_encoder_layers,
            init,
            |init| {
                encoder_layer += 1;
                SelfAttentionBlock::new(&heads(AttentionSite::Encoder, encoder_layer - 1), init)
            },
            |init| block.final_norm(init),
        );
        let mut decoder = Stack::new(
            c.n_decoder_layers,
            init,
            |init| {
                decoder_layer += 1;
                let i = decoder_layer - 1;
                let (self_heads, cross_heads) = (
                    heads(AttentionSite::Decoder, i),
                    heads(AttentionSite::Cross, i),
                );
                DecoderLayer::with_cross(&self_heads, &cross_heads, init)
            },
            |init| block.final_norm(init),
        );
        let rope_freq_factors = c.rope_freq_factors();
        for (i, layer) in decoder.layers.iter_mut().enumerate() {
            layer.self_attn.window = c.layer_window(i);
            layer.self_attn.set_kind(c.layer_attention_kind(i), true);
            layer.self_attn.rope_freq_factors = rope_freq_factors.clone();
            layer.self_attn.rope.attention_factor = c.rope_attention_factor();
        }
        for (i, layer) in encoder.layers.iter_mut().enumerate() {
            layer.self_attn.set_kind(c.encoder_attention_kind(i), false);
            layer.self_attn.rope_freq_factors = rope_freq_factors.clone();
            layer.self_attn.rope.attention_factor = c.rope_attention_factor();
        }
        // T5: each self-attention's relative position bias, the encoder's bidirectional.
        if c.positions == Positions::Relative {
            let encoders = encoder.layers.iter_mut().map(|l| (&mut l.self_attn, true));
            let decoders = decoder.layers.iter_mut().map(|l| (&mut l.self_attn, false));
            for (attention, bidirectional) in encoders.chain(decoders) {
                let heads = attention.n_heads;
                let bias = RelativeBias::new(heads, c.relative_buckets, bidirectional, init);
                attention.relative_bias = Some(bias);
            }
        }
        let head = OutputHead::new(c.vocab_size, c.d_model, c.tie_embeddings, init)
            .with_softcap(c.final_logit_softcap)
            .with_bias(c.output_bias, init);
        Seq2Seq {
            config,
            embedding,
            encoder,
            decoder,
            head,
        }
    }

    /// Readies the model for a run of decoding steps that leave the weights alone: the linear
    /// layers and the output projection keep transposed copies of their weights, which gemm
    /// multiplies in place instead of repacking them at every step (see
    /// `Linear::prepare_inference`). Results equal
    /// the unprepared model's up to float rounding. Training (`params_mut`) drops the copies.
    pub fn prepare_inference(&mut self) {
        prepare_inference_all(&mut self.encoder);
        prepare_inference_all(&mut self.decoder);
        self.head.prepare_inference(&self.embedding);
    }

    /// Training: the linear layers multiply bf16-rounded operands with `kernel`, or float32
    /// ones (`None`; see `train::precision`).
    pub fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        set_bf16_products_all(&mut self.encoder, kernel);
        set_bf16_products_all(&mut self.decoder, kernel);
    }

    /// Readies the model for inference in `precision`: f32 as [`prepare_inference`](Self::prepare_inference);
    /// bf16 or int8 packs every linear layer's weight and the output projection once (see
    /// the backend's `pack_weight`); the embeddings, norms and attention stay f32. An error
    /// names a weight that cannot be packed.
    pub fn prepare_precision(&mut self, precision: Precision) -> Result<(), String> {
        prepare_precision_all(&mut self.encoder, precision)?;
        prepare_precision_all(&mut self.decoder, precision)?;
        self.head.prepare_precision(&self.embedding, precision)
    }

    /// Readies the model for inference in `precision` holding every weight in one form only,
    /// its float32 values released (what the translators load for: about half the memory of
    /// [`prepare_precision`](Self::prepare_precision), which keeps `W` beside its prepared
    /// form). f32: each linear layer keeps `Wᵀ`, the (tied) embedding table its panels `Eᵀ`,
    /// which the projection multiplies and the lookups read columns of; bf16 and int8: the
    /// packed rows, the tied table's among them (looked up dequantised, as CTranslate2 does).
    /// Outputs equal the prepared model's up to float rounding (int8: the embedding's own
    /// rounding too). The model can no longer train (the backwards refuse) or be saved
    /// (`checkpoint::write_model` names the first released weight); a device takes the model
    /// before this (`DeviceSeq2Seq::new` reads the float32 values).
    pub fn prepare_alone(&mut self, precision: Precision) -> Result<(), String> {
        prepare_alone_all(&mut self.encoder, precision)?;
        prepare_alone_all(&mut self.decoder, precision)?;
        self.head.prepare_alone(&mut self.embedding, precision)
    }

    /// `hidden [rows, d_model]` -> logits `[rows, vocab]`.
    pub fn project(&self, hidden: &[T]) -> Vec<T> {
        self.head.logits(&self.embedding, hidden)
    }

    /// The source positions the encoder and the cross-attention read: `src_lens`, less the
    /// closing EOS (the last position of each source) for a model that reads none
    /// ([`ModelConfig::source_eos`]; at least one position stays).
    pub fn source_keys<'a>(&self, src_lens: &'a [usize]) -> std::borrow::Cow<'a, [usize]> {
        if self.config.source_eos {
            return std::borrow::Cow::Borrowed(src_lens);
        }
        std::borrow::Cow::Owned(src_lens.iter().map(|&n| n.saturating_sub(1).max(1)).collect())
    }

    /// Embeds and encodes `src [batch, src_len]`: the memory `[batch*src_len, d_model]`.
    fn encode(
        &self,
        src: &[u32],
        src_len: usize,
        src_lens: &[usize],
        mut rng: Option<&mut Rng>,
    ) -> (
        Vec<T>,
        EmbeddingCache<T>,
        StackCache<SelfAttentionBlockCache<T>, T>,
    ) {
        let p = self.config.dropout;
        let (x, embedding) = self
            .embedding
            .forward(src, src_len, 0, p, rng.as_deref_mut());
        let keys = self.source_keys(src_lens);
        let (b, mask) = (src_lens.len(), padding_mask(&keys));
        let (memory, encoder) = self
            .encoder
            .forward(x, rng, |l, x, r| l.forward(x, b, mask, r));
        (memory, embedding, encoder)
    }

    /// Teacher-forced forward: logits `[batch*tgt_len, vocab]` and the cache. Dropout when
    /// `rng` is given.
    pub fn forward(&self, batch: &Batch, mut rng: Option<&mut Rng>) -> (Vec<T>, Seq2SeqCache<T>) {
        let b = batch.batch_size;
        let (memory, src_embedding, encoder) = self.encode(
            &batch.src,
            batch.src_len,
            &batch.src_lens,
            rng.as_deref_mut(),
        );
        let (tgt, tgt_embedding) = self.embedding.forward_on(
            Side::Target,
            &batch.tgt_in,
            batch.tgt_len,
            0,
            self.config.dropout,
            rng.as_deref_mut(),
        );
        let keys = self.source_keys(&batch.src_lens);
        let masks = DecoderMasks {
            tgt_lens: &batch.tgt_lens,
            src_lens: &keys,
        };
        let (hidden, decoder) = self
            .decoder
            .forward(tgt, rng, |l, x, r| l.forward(x, &memory, b, masks, r));
        let logits = self.project(&hidden);
        let cache = Seq2SeqCache {
            src_embedding,
            encoder,
            memory,
            tgt_embedding,
            decoder,
            hidden,
        };
        (logits, cache)
    }

    /// Backward from `dlogits [batch*tgt_len, vocab]`; accumulates every parameter gradient.
    pub fn backward(&mut self, cache: Seq2SeqCache<T>, dlogits: &[T]) {
        let dhidden = self
            .head
            .backward(&mut self.embedding, &cache.hidden, dlogits);
        let memory = &cache.memory;
        let mut dmemory = vec![T::zero(); memory.len()];
        let dtgt = self.decoder.backward(cache.decoder, dhidden, |l, c, d| {
            l.backward(memory, c, d, &mut dmemory)
        });
        self.embedding.backward(&cache.tgt_embedding, &dtgt);
        let dsrc = self
            .encoder
            .backward(cache.encoder, dmemory, |l, c, d| l.backward(c, d));
        self.embedding.backward(&cache.src_embedding, &dsrc);
    }

    /// One forward and backward on `batch`: accumulates `grad_scale · ∂(Σ loss)/∂θ` into the
    /// gradients and returns the loss sums. Dropout when `rng` is given.
    pub fn forward_backward(
        &mut self,
        batch: &Batch,
        label_smoothing: f64,
        grad_scale: f64,
        rng: Option<&mut Rng>,
    ) -> LossStats {
        let (mut logits, cache) = self.forward(batch, rng);
        let targets = &batch.tgt_out;
        let scale = Some(grad_scale);
        let stats = self
            .head
            .loss(&mut logits, targets, Some(PAD), label_smoothing, scale);
        self.backward(cache, &logits);
        stats
    }

    /// Loss sums without dropout and without gradients (validation, scoring).
    pub fn evaluate(&self, batch: &Batch, label_smoothing: f64) -> LossStats {
        self.evaluate_with_logprobs(batch, label_smoothing).0
    }

    /// Loss sums and the teacher-forced `[batch*tgt_len, vocab]` rows: log-probabilities where
    /// the target is not padding; padding rows are left as raw logits.
    pub fn evaluate_with_logprobs(
        &self,
        batch: &Batch,
        label_smoothing: f64,
    ) -> (LossStats, Vec<T>) {
        let (mut logits, _) = self.forward(batch, None);
        let targets = &batch.tgt_out;
        let stats = self
            .head
            .loss(&mut logits, targets, Some(PAD), label_smoothing, None);
        (stats, logits)
    }

    /// Every attention weight of a teacher-forced forward without dropout, with the plain kernel
    /// at any length: per encoder layer `[batch, heads, src_len, src_len]`, per decoder layer
    /// the self-attention `[batch, heads, tgt_len, tgt_len]` and cross-attention
    /// `[batch, heads, tgt_len, src_len]` weights.
    pub fn attention_weights(&self, batch: &Batch) -> (Vec<Vec<T>>, Vec<StepAttention<T>>) {
        let b = batch.batch_size;
        let (x, _) = self
            .embedding
            .forward(&batch.src, batch.src_len, 0, 0.0, None);
        let keys = self.source_keys(&batch.src_lens);
        let mask = padding_mask(&keys);
        let mut encoder = Vec::new();
        let memory = self.encoder.apply(x, |_, l, x| {
            let (y, w) = l.forward_weights(x, b, mask);
            encoder.push(w);
            y
        });
        let (y, _) =
            (self.embedding).forward_on(Side::Target, &batch.tgt_in, batch.tgt_len, 0, 0.0, None);
        let masks = DecoderMasks {
            tgt_lens: &batch.tgt_lens,
            src_lens: &keys,
        };
        let mut decoder = Vec::new();
        self.decoder.apply(y, |_, l, y| {
            let (y, w) = l.forward_weights(y, &memory, b, masks);
            decoder.push(w);
            y
        });
        (encoder, decoder)
    }

    /// Encodes `src [batch, src_len]` and prepares incremental decoding with room for
    /// `max_tgt_len` target positions.
    pub fn start_decoding(
        &self,
        src: &[u32],
        src_len: usize,
        src_lens: &[usize],
        max_tgt_len: usize,
    ) -> DecodeState<T> {
        let batch = src_lens.len();
        let (memory, _, _) = self.encode(src, src_len, src_lens, None);
        let cross_caches = CacheStack {
            caches: self
                .decoder
                .layers
                .iter()
                .map(|l| l.cross_attn.project_kv(&memory, batch))
                .collect(),
        };
        let widths = self.decoder.layers.iter().map(|l| l.self_attn.d_kv());
        let self_caches = CacheStack::new(widths, batch, max_tgt_len, 1);
        DecodeState {
            self_caches,
            cross_caches,
            src_lens: self.source_keys(src_lens).into_owned(),
        }
    }

    /// Feeds target tokens laid out as `layout` says (see `super::step_layout`) and returns
    /// the log-probabilities of the token after each output the layout selects,
    /// `[outputs, vocab]`. A uniform feed `[rows, q_len]` runs one position at a time (the
    /// cross-attention reads one query per row and step); a ragged feed brings one token per
    /// row, each row at its own position (rows started at different steps, see
    /// `super::seq2seq_ragged`).
    pub fn step(
        &self,
        state: &mut DecodeState<T>,
        tokens: &[u32],
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        let (rows, positions) = match layout.feed {
            Feed::Uniform => return self.step_uniform(state, tokens, layout),
            Feed::OnePerRow => one_per_row(state.self_caches.row_lens()),
            Feed::Ragged { rows, positions } => (rows.to_vec(), positions.to_vec()),
        };
        assert!(
            rows.iter().copied().eq(0..state.rows()),
            "the translator's step feeds one token per row, in row order"
        );
        if rows.is_empty() {
            return Vec::new();
        }
        // x: [rows, d_model], each token embedded at its own position.
        let x = embed_ragged(
            &self.embedding,
            Side::Target,
            tokens,
            &rows,
            &positions,
            self.config.max_len,
        );
        let ragged = StepLayout {
            feed: Feed::Ragged {
                rows: &rows,
                positions: &positions,
            },
            outputs: layout.outputs,
        };
        let h = self.decoder_step(state, x, &ragged);
        self.head
            .log_probs(&self.embedding, &ragged.select(h, 1, self.config.d_model))
    }

    /// A uniform feed `[rows, q_len]`: one position of every row at a time, the results in
    /// `[rows, q_len]` order, then the layout's outputs.
    fn step_uniform(
        &self,
        state: &mut DecodeState<T>,
        tokens: &[u32],
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        let rows = state
            .self_caches
            .caches
            .first()
            .map_or(tokens.len(), |c| c.batch);
        let q_len = tokens.len() / rows.max(1);
        let v = self.config.vocab_size;
        let one = |state: &mut DecodeState<T>, column: &[u32]| {
            let pos = state.len();
            let (x, _) = (self.embedding).forward_on(Side::Target, column, 1, pos, 0.0, None);
            let h = self.decoder_step(state, x, &StepLayout::dense());
            self.head.log_probs(&self.embedding, &h)
        };
        if q_len == 1 {
            return layout.select(one(state, tokens), 1, v);
        }
        let mut out = vec![T::zero(); tokens.len() * v];
        for i in 0..q_len {
            let column: Vec<u32> = (0..rows).map(|r| tokens[r * q_len + i]).collect();
            let lp = one(state, &column);
            for r in 0..rows {
                let at = (r * q_len + i) * v;
                out[at..at + v].copy_from_slice(&lp[r * v..(r + 1) * v]);
            }
        }
        layout.select(out, q_len, v)
    }

    /// The decoder layers over the embedded step `x`, one token per row.
    fn decoder_step(
        &self,
        state: &mut DecodeState<T>,
        x: Vec<T>,
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        let DecodeState {
            self_caches,
            cross_caches,
            src_lens,
        } = state;
        self.decoder.apply(x, |i, l, x| {
            l.step(
                x,
                &mut self_caches[i],
                &mut cross_caches[i],
                src_lens,
                layout,
            )
        })
    }
}

impl<T> Module<T> for Seq2Seq<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("embedding", &mut self.embedding);
        v.module("encoder", &mut self.encoder);
        v.module("decoder", &mut self.decoder);
        self.head.visit(v);
    }
}
