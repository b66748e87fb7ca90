//! BERT's masked-language-model pre-training (Devlin et al., 2019, section 3.1, "Task #1"):
//! the encoder [`Bert`] reads a sequence in which some tokens were replaced (see
//! `train::mlm` for which), and the [`MlmHead`] predicts the original token at each chosen
//! position `i ∈ M`:
//!
//! `x = Dropout(LayerNorm(E_word[t] + E_type[0] + E_pos[i]))`, `h = Encoder(x)` (post-LN blocks,
//! GELU, no mask but padding: every token sees every token), `z_i = MlmHead(h_i)`,
//! `L = Σ_{i ∈ M} −log softmax(z_i)[y_i]`.
//!
//! Only the chosen rows go through the head (the others carry no loss). The model's shape is a
//! [`ModelConfig`] of `n_encoder_layers` blocks and no decoder (see [`check_mlm_config`] for
//! what else it must say); its directory is ours (`config.json` of that config, tensors
//! `bert.word_embeddings.weight`, `bert.layers.0.self_attn.q_proj.weight`, …,
//! `mlm_head.dense.weight`, …) and [`crate::pipeline::embed::SentenceEncoder`] reads its
//! encoder for sentence embeddings. Sentences are one segment: token type 0 throughout.

use super::bert::{Bert, BertConfig};
use super::bert_train::{encoder_backward, encoder_forward, training_bert, EncoderCache};
use super::checkpoint::Model;
use super::config::{Activation, ModelConfig, NormPlacement, Positions};
use super::loss::{cross_entropy_ignoring, LossStats};
use super::mlm_head::{MlmHead, MlmHeadCache};
use super::param::{Init, Module, ParamVisitor};
use crate::rng::Rng;
use crate::Float;

/// Token types of a masked-LM encoder (BERT's two segments; only type 0 is trained here).
pub const TYPE_VOCAB: usize = 2;

/// The encoder and its pre-training head.
#[derive(Clone, Debug)]
pub struct MaskedLm<T> {
    pub config: ModelConfig,
    pub bert: Bert<T>,
    pub head: MlmHead<T>,
}

/// What the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct MaskedLmCache<T> {
    encoder: EncoderCache<T>,
    /// Rows of the hidden states `[batch*seq]`.
    rows: usize,
    /// Row indices (into `[batch*seq]`) of the chosen positions.
    positions: Vec<usize>,
    head: MlmHeadCache<T>,
}

/// The BERT config of a masked-LM model config (`hidden_act` from its activation, one
/// position per token of `max_len`, two token types).
pub fn bert_config_of(c: &ModelConfig) -> BertConfig {
    BertConfig {
        vocab_size: c.vocab_size,
        hidden_size: c.d_model,
        num_hidden_layers: c.n_encoder_layers,
        num_attention_heads: c.n_heads,
        intermediate_size: c.d_ff,
        hidden_act: match c.activation {
            Activation::GeluTanh => "gelu_new",
            Activation::Relu => "relu",
            _ => "gelu",
        }
        .into(),
        max_position_embeddings: c.max_len,
        type_vocab_size: TYPE_VOCAB,
        layer_norm_eps: c.layer_norm_eps,
        position_embedding_type: "absolute".into(),
        is_decoder: false,
        add_cross_attention: false,
        model_type: Some("bert".into()),
    }
}

/// The one config of a masked-LM encoder of these sizes: post-LN blocks with biases, learned
/// positions, GELU (erf), layer norm ε 1e-12 (BERT's), the decoder tied to the word embeddings,
/// dropout `dropout` on the residual branches, embeddings and attention weights (BERT's 0.1).
pub fn mlm_config(
    vocab_size: usize,
    (d_model, n_heads, d_ff, layers): (usize, usize, usize, usize),
    max_len: usize,
    dropout: f64,
) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", vocab_size).expect("the tiny preset exists");
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.d_ff = d_ff;
    c.n_encoder_layers = layers;
    c.n_decoder_layers = 0;
    c.max_len = max_len;
    c.dropout = dropout;
    c.attention_dropout = dropout;
    c.activation_dropout = 0.0;
    c.norm = NormPlacement::PostLn;
    c.layer_norm_eps = 1e-12;
    c.tie_embeddings = true;
    c.activation = Activation::GeluErf;
    c.positions = Positions::Learned;
    c.bias = true;
    c.scale_embeddings = false;
    c
}

/// Refuses a config this model does not compute, naming each field that differs from
/// [`mlm_config`] of its sizes (and dropout rates); also `n_encoder_layers` 0.
pub fn check_mlm_config(c: &ModelConfig) -> Result<(), String> {
    c.validate()?;
    if c.n_encoder_layers == 0 {
        return Err("n_encoder_layers is 0: a masked-LM encoder needs at least one block".into());
    }
    let mut want = mlm_config(
        c.vocab_size,
        (c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers),
        c.max_len,
        c.dropout,
    );
    want.attention_dropout = c.attention_dropout;
    want.activation_dropout = c.activation_dropout;
    if matches!(c.activation, Activation::GeluTanh | Activation::Relu) {
        want.activation = c.activation;
    }
    let (got, want) = (
        serde_json::to_value(c).map_err(|e| e.to_string())?,
        serde_json::to_value(&want).map_err(|e| e.to_string())?,
    );
    let (Some(got), Some(want)) = (got.as_object(), want.as_object()) else {
        return Err("the config is not a JSON object".into());
    };
    let differ: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| {
            let g = got.get(k).map_or("absent".to_string(), |g| g.to_string());
            format!("{k} {g} (a masked-LM encoder has {v})")
        })
        .collect();
    match differ.is_empty() {
        true => Ok(()),
        false => Err(format!("not a masked-LM encoder: {}", differ.join(", "))),
    }
}

/// Whether `dir/config.json` is ours (it has `d_model`) and describes an encoder without a
/// decoder: a `train-mlm` directory. Any read or parse failure says no (the caller's loader
/// reports it).
pub fn is_masked_lm_dir(dir: &std::path::Path) -> bool {
    let Ok(bytes) = crate::store::read_file(&dir.join(crate::store::CONFIG_FILE)) else {
        return false;
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(crate::store::strip_bom(&bytes))
    else {
        return false;
    };
    let count = |k: &str| json.get(k).and_then(|v| v.as_u64());
    json.get("d_model").is_some()
        && count("n_decoder_layers") == Some(0)
        && count("n_encoder_layers").is_some_and(|n| n > 0)
}

impl<T: Float> MaskedLm<T> {
    /// A fresh model of `config` (checked with [`check_mlm_config`] by the callers that read
    /// it): encoder tables and blocks, then the head, drawn from `init` in that order.
    pub fn new(config: ModelConfig, init: &mut impl Init) -> Self {
        let bert = training_bert(&config, init);
        let head = MlmHead::new(
            config.d_model,
            config.vocab_size,
            config.layer_norm_eps,
            init,
        );
        MaskedLm { config, bert, head }
    }

    /// `ids [batch, seq]` (whole sequences, no padding) -> the logits `[positions, vocab]` of
    /// the rows `positions` (indices into `[batch*seq]`), and the cache. Dropout when `rng` is
    /// given.
    pub fn forward(
        &self,
        ids: &[u32],
        batch: usize,
        positions: &[usize],
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, MaskedLmCache<T>) {
        assert!(
            batch > 0 && ids.len().is_multiple_of(batch),
            "ids must be [batch, seq]"
        );
        let (seq, d) = (ids.len() / batch, self.config.d_model);
        let lens = vec![seq; batch];
        let (hidden, encoder) = encoder_forward(&self.bert, self.config.dropout, ids, &lens, rng);
        // chosen [positions, d]: the hidden rows of the chosen positions
        let mut chosen = Vec::with_capacity(positions.len() * d);
        for &p in positions {
            chosen.extend_from_slice(&hidden[p * d..(p + 1) * d]);
        }
        let (logits, head) = self
            .head
            .forward(&self.bert.word_embeddings.value.data, chosen);
        let cache = MaskedLmCache {
            encoder,
            rows: ids.len(),
            positions: positions.to_vec(),
            head,
        };
        (logits, cache)
    }

    /// Backward from `dlogits [positions, vocab]`; accumulates every parameter gradient.
    pub fn backward(&mut self, cache: MaskedLmCache<T>, dlogits: &[T]) {
        let d = self.config.d_model;
        let bert = &mut self.bert;
        let dchosen = self.head.backward(
            &bert.word_embeddings.value.data,
            &mut bert.word_embeddings.grad.data,
            cache.head,
            dlogits,
        );
        let mut dhidden = vec![T::zero(); cache.rows * d];
        for (k, &p) in cache.positions.iter().enumerate() {
            let (dst, src) = (
                &mut dhidden[p * d..(p + 1) * d],
                &dchosen[k * d..(k + 1) * d],
            );
            dst.iter_mut().zip(src).for_each(|(a, &b)| *a += b);
        }
        encoder_backward(bert, cache.encoder, dhidden);
    }

    /// One forward and backward: the loss of predicting `labels` at `positions` of
    /// `ids [batch, seq]`; accumulates `grad_scale · ∂(Σ loss)/∂θ` and returns the loss sums.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &mut self,
        ids: &[u32],
        batch: usize,
        positions: &[usize],
        labels: &[u32],
        label_smoothing: f64,
        grad_scale: f64,
        rng: Option<&mut Rng>,
    ) -> LossStats {
        assert_eq!(positions.len(), labels.len(), "one label per position");
        let (mut logits, cache) = self.forward(ids, batch, positions, rng);
        let vocab = self.config.vocab_size;
        let stats = cross_entropy_ignoring(
            &mut logits,
            labels,
            vocab,
            label_smoothing,
            Some(grad_scale),
            None,
        );
        self.backward(cache, &logits);
        stats
    }

    /// Without dropout or gradients: the loss sums (plain cross-entropy) and how many labels
    /// are the most probable token at their position.
    pub fn evaluate(
        &self,
        ids: &[u32],
        batch: usize,
        positions: &[usize],
        labels: &[u32],
    ) -> (LossStats, usize) {
        let (mut logits, _) = self.forward(ids, batch, positions, None);
        let vocab = self.config.vocab_size;
        let correct = logits
            .chunks_exact(vocab)
            .zip(labels)
            .filter(|(row, &y)| argmax(row) == y as usize)
            .count();
        let stats = cross_entropy_ignoring(&mut logits, labels, vocab, 0.0, None, None);
        (stats, correct)
    }
}

/// The index of the largest value (the first of equals).
pub fn argmax<T: Float>(row: &[T]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if v.f64() > row[best].f64() {
            best = i;
        }
    }
    best
}

impl<T> Module<T> for MaskedLm<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("bert", &mut self.bert);
        v.module("mlm_head", &mut self.head);
    }
}

impl Model for MaskedLm<f32> {
    type Config = ModelConfig;
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn check_config(config: &ModelConfig) -> std::result::Result<(), String> {
        check_mlm_config(config)
    }
    fn build(config: ModelConfig, init: &mut impl Init) -> Self {
        MaskedLm::new(config, init)
    }
}
