//! The paper's encoder-decoder (Figure 1): shared embeddings with positions, the encoder over the
//! source, the decoder over the shifted target attending to the encoder output, and the
//! pre-softmax projection tied to the embedding matrix (section 3.4).

use super::config::ModelConfig;
use super::decoder::{Decoder, DecoderCache, DecoderMasks, StepAttention};
use super::embedding::{Embedding, EmbeddingCache};
use super::encoder::{Encoder, EncoderCache};
use super::kv_cache::{KvCache, StepKvCache};
use super::param::{Module, Param};
use crate::batch::Batch;
use crate::kernels::matmul::{matmul, transpose_weight, weight_product, MatMut, MatRef};
use crate::model::loss::{label_smoothed_cross_entropy, LossStats};
use crate::rng::Rng;
use crate::Float;
use rayon::prelude::*;

/// The encoder-decoder Transformer.
#[derive(Clone, Debug)]
pub struct Seq2Seq<T> {
    pub config: ModelConfig,
    /// The one embedding matrix of the shared vocabulary, E [vocab, d_model].
    pub embedding: Embedding<T>,
    pub encoder: Encoder<T>,
    pub decoder: Decoder<T>,
    /// The pre-softmax projection [vocab, d_model] when not tied to `embedding`.
    pub output_proj: Option<Param<T>>,
    /// Inference only: the projection transposed, [d_model, vocab] (see
    /// [`Seq2Seq::prepare_inference`]); dropped by any mutable access to the parameters.
    projection_t: Option<Vec<T>>,
}

/// Everything the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct Seq2SeqCache<T> {
    pub src_embedding: EmbeddingCache<T>,
    pub encoder: EncoderCache<T>,
    /// Encoder output [batch*src_len, d_model].
    pub memory: Vec<T>,
    pub tgt_embedding: EmbeddingCache<T>,
    pub decoder: DecoderCache<T>,
    /// Final decoder states, the projection's input [batch*tgt_len, d_model].
    pub hidden: Vec<T>,
}

/// The state of incremental decoding for a batch of sources.
#[derive(Clone, Debug)]
pub struct DecodeState<T> {
    /// Per decoder layer: cached self-attention keys/values of the tokens fed so far.
    pub self_caches: Vec<StepKvCache<T>>,
    /// Per decoder layer: the encoder output's keys/values, computed once. One row per decoder
    /// row, or one per group of `g` consecutive decoder rows that share a source (beam search:
    /// the beams of a sentence), which the cross-attention then reads as `g` queries (its
    /// weights come out as `[sentences, heads, g, src_len]`).
    pub cross_caches: Vec<KvCache<T>>,
    /// Source lengths, one per cross-attention cache row.
    pub src_lens: Vec<usize>,
}

impl<T: Float> Seq2Seq<T> {
    /// A freshly initialised model (Xavier-uniform matrices, unit norms, zero biases).
    pub fn new(config: ModelConfig, rng: &mut Rng) -> Self {
        let c = &config;
        let embedding =
            Embedding::with_positions(c.vocab_size, c.d_model, c.max_len, c.positions, rng);
        let encoder = Encoder::new(c, rng);
        let decoder = Decoder::new(c, rng);
        let output_proj = (!c.tie_embeddings)
            .then(|| Param::xavier(&[c.vocab_size, c.d_model], c.d_model, c.vocab_size, rng));
        Seq2Seq {
            config,
            embedding,
            encoder,
            decoder,
            output_proj,
            projection_t: None,
        }
    }

    /// Readies the model for a run of decoding steps that leave the weights alone: the decoder's
    /// linear layers and the output projection keep transposed copies of their weights, which
    /// gemm multiplies in place instead of repacking them at every step (see
    /// [`Linear::prepare_inference`](super::linear::Linear::prepare_inference)). Results equal
    /// the unprepared model's up to float rounding. Training (`params_mut`) drops the copies.
    pub fn prepare_inference(&mut self) {
        for layer in &mut self.encoder.layers {
            layer.self_attn.prepare_inference();
            layer.ffn.prepare_inference();
        }
        self.decoder.prepare_inference();
        let (d, v) = (self.config.d_model, self.config.vocab_size);
        self.projection_t = Some(transpose_weight(self.projection_weight(), v, d));
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
        let (w, w_t) = (self.projection_weight(), self.projection_t.as_deref());
        weight_product(&mut logits, hidden, w, w_t, rows, d, v);
        logits
    }

    /// Teacher-forced forward: logits `[batch*tgt_len, vocab]` and the cache. Dropout when
    /// `rng` is given.
    pub fn forward(&self, batch: &Batch, mut rng: Option<&mut Rng>) -> (Vec<T>, Seq2SeqCache<T>) {
        let p = self.config.dropout;
        let b = batch.batch_size;
        let (src, src_embedding) =
            self.embedding
                .forward(&batch.src, batch.src_len, 0, p, rng.as_deref_mut());
        let (memory, encoder) = self
            .encoder
            .forward(src, b, &batch.src_lens, rng.as_deref_mut());
        let (tgt, tgt_embedding) =
            self.embedding
                .forward(&batch.tgt_in, batch.tgt_len, 0, p, rng.as_deref_mut());
        let masks = DecoderMasks {
            tgt_lens: &batch.tgt_lens,
            src_lens: &batch.src_lens,
        };
        let (hidden, decoder) = self.decoder.forward(tgt, &memory, b, masks, rng);
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
        let (d, v) = (self.config.d_model, self.config.vocab_size);
        let rows = cache.hidden.len() / d;
        // dW [vocab, d_model] += dlogitsᵀ hidden ; dhidden [rows, d_model] = dlogits W
        let mut dhidden = vec![T::zero(); rows * d];
        matmul(
            MatMut::new(&mut dhidden, rows, d),
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
        let (dtgt, dmemory) = self.decoder.backward(&cache.memory, cache.decoder, dhidden);
        self.embedding.backward(&cache.tgt_embedding, &dtgt);
        let dsrc = self.encoder.backward(cache.encoder, dmemory);
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
        let stats = label_smoothed_cross_entropy(
            &mut logits,
            &batch.tgt_out,
            self.config.vocab_size,
            label_smoothing,
            Some(grad_scale),
        );
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
        let stats = label_smoothed_cross_entropy(
            &mut logits,
            &batch.tgt_out,
            self.config.vocab_size,
            label_smoothing,
            None,
        );
        (stats, logits)
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
        let (x, _) = self.embedding.forward(src, src_len, 0, 0.0, None);
        let (memory, _) = self.encoder.forward(x, batch, src_lens, None);
        let d = self.config.d_model;
        let cross_caches = self
            .decoder
            .layers
            .iter()
            .map(|l| l.cross_attn.project_kv(&memory, batch))
            .collect();
        let self_caches = (0..self.decoder.layers.len())
            .map(|_| StepKvCache::new(batch, max_tgt_len, d))
            .collect();
        DecodeState {
            self_caches,
            cross_caches,
            src_lens: src_lens.to_vec(),
        }
    }

    /// Feeds one token per batch element (`tokens [batch]`) at the next position; returns the
    /// log-probabilities of the following token `[batch, vocab]` and the attention weights.
    pub fn decode_step(
        &self,
        state: &mut DecodeState<T>,
        tokens: &[u32],
    ) -> (Vec<T>, Vec<StepAttention<T>>) {
        let pos = state.self_caches.first().map_or(0, |c| c.len);
        let (x, _) = self.embedding.forward(tokens, 1, pos, 0.0, None);
        let (h, attn) = self.decoder.forward_step(
            x,
            &mut state.self_caches,
            &mut state.cross_caches,
            &state.src_lens,
        );
        let mut logits = self.project(&h);
        logits
            .par_chunks_mut(self.config.vocab_size)
            .with_min_len(8)
            .for_each(|row| {
                crate::kernels::softmax::log_softmax_inplace(row);
            });
        (logits, attn)
    }
}

impl<T> Module<T> for Seq2Seq<T> {
    fn collect_params<'a>(&'a mut self, _prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.projection_t = None; // the caller may change the weights
        self.embedding.collect_params("embedding", out);
        self.encoder.collect_params("encoder", out);
        self.decoder.collect_params("decoder", out);
        if let Some(p) = &mut self.output_proj {
            out.push(("output_proj.weight".into(), p));
        }
    }
}
