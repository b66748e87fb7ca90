//! A BERT-style encoder (Devlin et al., 2019) built from this crate's encoder layers, to run
//! pretrained Hugging Face checkpoints such as sentence-transformers' all-MiniLM-L6-v2.
//!
//! `x = LayerNorm(E_word[t] + E_type[s] + E_pos[i])`, then a [`Stack`] of N post-LN
//! [`SelfAttentionBlock`]s with GELU and a padding mask on the keys. Inference only: no dropout, no backward. A sentence embedding
//! is the mean of the last hidden states over the real (unpadded) tokens, L2-normalised.
//!
//! [`Bert::load`] reads a Hugging Face model directory (`config.json`, `model.safetensors`) and
//! maps its tensor names onto our module paths with the explicit table of its family,
//! [`families::bert::HF_NAMES`](super::families::bert::HF_NAMES) (Hugging
//! Face `encoder.layer.i.attention.self.query.weight` is our `layers.i.self_attn.q_proj.weight`,
//! and so on), then loads through the one loader of `super::checkpoint`.
//!
//! A `bert.` prefix (checkpoints of task models) is stripped; old `gamma`/`beta` layer-norm names
//! are read as `weight`/`bias`. Tensors that are not encoder parameters are skipped by name, never
//! silently: the `position_ids` / `token_type_ids` buffers and the `pooler.` / `cls.` heads.
//! Any other unknown tensor is an error.

use super::block::SelfAttentionBlock;
use super::checkpoint::{build_filled, load_config_of, Model};
use super::config::{Activation, BlockConfig, NormPlacement, MAX_LAYERS};
use super::encoder::padding_mask;
use super::families::bert::{canonical_name, is_ignored, HF_NAMES};
use super::families::{hf_list, FamilyKind};
use super::layer_norm::LayerNorm;
use super::param::{count_params, Init, Module, Param, ParamVisitor, ShapesOnly};
use super::stack::Stack;
use crate::error::{Error, Result};
use crate::store::{ckpt_err, read_tensors_skipping, MODEL_FILE};
use crate::Float;
use serde::Deserialize;
use std::path::Path;

fn default_hidden_act() -> String {
    "gelu".into()
}
fn default_max_positions() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_position_type() -> String {
    "absolute".into()
}

/// The fields of a Hugging Face BERT `config.json` that shape the computation. Other keys
/// (dropout rates, initialiser range, ...) do not change inference and are ignored.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
    #[serde(default)]
    pub is_decoder: bool,
    #[serde(default)]
    pub add_cross_attention: bool,
    #[serde(default)]
    pub model_type: Option<String>,
}

impl BertConfig {
    /// Parses a `config.json`; the error names the file and the unsupported field.
    pub fn from_json(bytes: &[u8], path: &Path) -> Result<BertConfig> {
        let err = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let c: BertConfig =
            serde_json::from_slice(bytes).map_err(|e| err(format!("invalid BERT config: {e}")))?;
        c.validate().map_err(err)?;
        Ok(c)
    }

    /// The blocks' shape: post-LN, no dropout, not rotary (BERT adds its own learned position
    /// table before the first block).
    pub fn block(&self) -> BlockConfig {
        BlockConfig {
            d_model: self.hidden_size,
            n_heads: self.num_attention_heads,
            d_ff: self.intermediate_size,
            activation: self.activation().expect("validated config"),
            norm: NormPlacement::PostLn,
            layer_norm_eps: self.layer_norm_eps,
            dropout: 0.0,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            rotary: false,
            n_kv_heads: self.num_attention_heads,
            d_head: self.hidden_size / self.num_attention_heads.max(1),
            bias: true,
            normalization: super::config::Normalization::LayerNorm,
            rope_base: super::config::ROPE_BASE,
            rope_style: super::config::RopeStyle::Interleaved,
            qkv_bias: false,
            norm_weight_offset: 0.0,
            query_pre_attn_scalar: None,
            attn_logit_softcap: None,
            post_norms: false,
            qk_norm: false,
            qk_norm_whole: false,
            experts: None,
            residual_scale: None,
            input_norms: true,
        }
    }

    /// The FFN activation named by `hidden_act`.
    pub fn activation(&self) -> std::result::Result<Activation, String> {
        match self.hidden_act.as_str() {
            "gelu" => Ok(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            other => Err(format!(
                "hidden_act {other:?} is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)"
            )),
        }
    }

    /// Rejects what this implementation does not compute; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(t) = &self.model_type {
            if !super::families::bert::FAMILY
                .model_types
                .contains(&t.as_str())
            {
                return Err(format!(
                    "model_type {t:?} is not supported (only \"bert\"; e.g. RoBERTa offsets its positions)"
                ));
            }
        }
        self.activation()?;
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        if self.is_decoder {
            return Err("is_decoder true is not supported (encoder only)".into());
        }
        if self.add_cross_attention {
            return Err("add_cross_attention true is not supported (encoder only)".into());
        }
        if self.num_hidden_layers > MAX_LAYERS {
            return Err(format!(
                "num_hidden_layers {} is above the supported {MAX_LAYERS}",
                self.num_hidden_layers
            ));
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps <= 0.0 {
            return Err("layer_norm_eps must be positive".into());
        }
        Ok(())
    }

    /// The number of parameters these sizes imply (`None` on overflow), counted from the
    /// parameters' shapes; checked against the weights file before anything is allocated.
    pub fn n_params(&self) -> Option<usize> {
        count_params(&mut Bert::<f32>::new(self.clone(), &mut ShapesOnly))
    }
}

/// The BERT encoder: embeddings, their layer norm and the stack of post-LN encoder layers.
#[derive(Clone, Debug)]
pub struct Bert<T> {
    pub config: BertConfig,
    /// [vocab_size, d]
    pub word_embeddings: Param<T>,
    /// [max_position_embeddings, d]
    pub position_embeddings: Param<T>,
    /// [type_vocab_size, d]
    pub token_type_embeddings: Param<T>,
    pub embeddings_norm: LayerNorm<T>,
    /// The post-LN self-attention blocks (no final norm).
    pub encoder: Stack<SelfAttentionBlock<T>, T>,
}

impl<T: Float> Bert<T> {
    /// A model of the given (validated) shape, parameters drawn from `init` in the order
    /// word, position and token-type tables, blocks.
    pub fn new(config: BertConfig, init: &mut impl Init) -> Self {
        let block = config.block();
        Self::with_block(config, &block, init)
    }

    /// [`Bert::new`] with the blocks of `block` (the same shape as `config.block()`, with
    /// the dropout rates of a training run: see [`super::masked_lm`]).
    pub fn with_block(config: BertConfig, block: &BlockConfig, init: &mut impl Init) -> Self {
        let d = config.hidden_size;
        let mut table = |n: usize| init.xavier(&[n, d], n, d);
        let (word_embeddings, position_embeddings, token_type_embeddings) = (
            table(config.vocab_size),
            table(config.max_position_embeddings),
            table(config.type_vocab_size),
        );
        let embeddings_norm = LayerNorm::with_init(d, config.layer_norm_eps, init);
        let encoder = Stack::new(
            config.num_hidden_layers,
            init,
            |init| SelfAttentionBlock::new(block, init),
            |_| None,
        );
        Bert {
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            encoder,
            config,
        }
    }

    /// Every parameter under its Hugging Face name (see [`HF_NAMES`]), in a fixed order.
    pub fn hf_params(&mut self) -> Vec<(String, &mut Param<T>)> {
        self.named_params("")
            .into_iter()
            .map(|(name, p)| {
                (
                    HF_NAMES.export(&name).expect("every parameter has a name"),
                    p,
                )
            })
            .collect()
    }

    /// Last hidden states `[batch*seq_len, d]` of `ids [batch, seq_len]` (row-major, padded
    /// after `lens[b]` real tokens; padding keys are masked, padding rows are computed but carry
    /// no meaning). `type_ids` default to 0 (single sentences).
    pub fn forward(
        &self,
        ids: &[u32],
        type_ids: Option<&[u32]>,
        batch: usize,
        seq_len: usize,
        lens: &[usize],
    ) -> Result<Vec<T>> {
        let c = &self.config;
        let bad = |m: String| Err(Error::Input(m));
        if ids.len() != batch * seq_len || lens.len() != batch {
            return bad(format!(
                "{} ids and {} lengths for a batch of {batch} x {seq_len}",
                ids.len(),
                lens.len()
            ));
        }
        if type_ids.is_some_and(|t| t.len() != ids.len()) {
            return bad("type_ids and ids differ in length".into());
        }
        if seq_len > c.max_position_embeddings {
            return bad(format!(
                "sequence of {seq_len} tokens, the model has {} positions",
                c.max_position_embeddings
            ));
        }
        if let Some(&l) = lens.iter().find(|&&l| l == 0 || l > seq_len) {
            return bad(format!("length {l} outside 1..={seq_len}"));
        }
        if let Some(&t) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
            return bad(format!("token id {t} >= vocab_size {}", c.vocab_size));
        }
        if let Some(&t) =
            type_ids.and_then(|t| t.iter().find(|&&t| t as usize >= c.type_vocab_size))
        {
            return bad(format!(
                "token type {t} >= type_vocab_size {}",
                c.type_vocab_size
            ));
        }
        let x = self.embedding_sum(ids, type_ids, seq_len);
        let (x, _) = self.embeddings_norm.forward(&x);
        let mask = padding_mask(lens);
        Ok(self
            .encoder
            .apply(x, |_, l, x| l.forward(x, batch, mask, None).0))
    }

    /// `E_word[t] + E_type[s] + E_pos[i]` `[batch*seq_len, d]` of checked `ids [batch, seq_len]`
    /// (`type_ids` default to 0), before the embeddings' layer norm.
    pub fn embedding_sum(&self, ids: &[u32], type_ids: Option<&[u32]>, seq_len: usize) -> Vec<T> {
        let d = self.config.hidden_size;
        // x: [batch*seq_len, d] = (word + type) + position, in the reference's order.
        let mut x = vec![T::zero(); ids.len() * d];
        let (word, pos, typ) = (
            &self.word_embeddings.value.data,
            &self.position_embeddings.value.data,
            &self.token_type_embeddings.value.data,
        );
        for (r, row) in x.chunks_exact_mut(d).enumerate() {
            let w = ids[r] as usize * d;
            let t = type_ids.map_or(0, |t| t[r] as usize) * d;
            let p = (r % seq_len) * d;
            for j in 0..d {
                row[j] = word[w + j] + typ[t + j] + pos[p + j];
            }
        }
        x
    }

    /// Sentence embeddings of already tokenized sequences (specials included, token type 0),
    /// computed together in one padded batch: the mean of the last hidden states over each
    /// sequence's tokens, L2-normalised.
    pub fn embed(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<T>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let d = self.config.hidden_size;
        let batch = seqs.len();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let seq_len = lens.iter().copied().max().unwrap_or(0);
        // ids: [batch, seq_len], padded with 0 (masked, so the value does not matter)
        let mut ids = vec![0u32; batch * seq_len];
        for (b, s) in seqs.iter().enumerate() {
            ids[b * seq_len..b * seq_len + s.len()].copy_from_slice(s);
        }
        let hidden = self.forward(&ids, None, batch, seq_len, &lens)?;
        Ok((0..batch)
            .map(|b| mean_pool_l2(&hidden[b * seq_len * d..(b * seq_len + lens[b]) * d], d))
            .collect())
    }
}

/// The mean of the rows of `rows [n, d]`, divided by its L2 norm (kept as is when the norm is
/// below 1e-12, as `torch.nn.functional.normalize` does). Sums in f64.
pub fn mean_pool_l2<T: Float>(rows: &[T], d: usize) -> Vec<T> {
    let n = rows.len() / d;
    let mut mean = vec![0f64; d];
    for row in rows.chunks_exact(d) {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += v.f64();
        }
    }
    mean.iter_mut().for_each(|m| *m /= n.max(1) as f64);
    let norm = mean.iter().map(|m| m * m).sum::<f64>().sqrt().max(1e-12);
    mean.iter().map(|m| T::of(m / norm)).collect()
}

impl<T> Module<T> for Bert<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.param("word_embeddings.weight", &mut self.word_embeddings);
        v.param("position_embeddings.weight", &mut self.position_embeddings);
        v.param(
            "token_type_embeddings.weight",
            &mut self.token_type_embeddings,
        );
        v.module("embeddings_norm", &mut self.embeddings_norm);
        self.encoder.visit(v);
    }
}

impl Model for Bert<f32> {
    type Config = BertConfig;
    fn config(&self) -> &BertConfig {
        &self.config
    }
    fn check_config(config: &BertConfig) -> std::result::Result<(), String> {
        config.validate()
    }
    fn foreign_config(json: &serde_json::Value) -> Option<String> {
        if json.get("d_model").is_some() && json.get("n_heads").is_some() {
            return Some(
                "a model of this project (train or train-lm), not a BERT encoder; use \
                 translate, generate or perplexity with it"
                    .into(),
            );
        }
        let kind = json.get("model_type")?.as_str()?;
        (!super::families::is_encoder(kind)).then(|| {
            format!(
                "a Hugging Face model of type {kind:?}, not a BERT encoder; generate, chat \
                 and perplexity load {} decoders",
                hf_list(FamilyKind::Decoder)
            )
        })
    }
    fn build(config: BertConfig, init: &mut impl Init) -> Self {
        Bert::new(config, init)
    }
}

impl Bert<f32> {
    /// Packs every linear layer's weight for inference in `precision` (see
    /// [`Backend::pack_weight`](crate::backend::Backend::pack_weight)); f32 leaves the model as
    /// it is.
    pub fn prepare_precision(
        &mut self,
        precision: crate::backend::Precision,
    ) -> std::result::Result<(), String> {
        if precision == crate::backend::Precision::F32 {
            return Ok(());
        }
        super::linear::prepare_precision_all(&mut self.encoder, precision)
    }

    /// Loads a Hugging Face BERT directory (`config.json`, `model.safetensors`), checking every
    /// tensor's name and shape; errors name the file and the tensor.
    ///
    /// A directory of `train-mlm` (our config of an encoder without decoder, see
    /// [`super::masked_lm`]) loads as well: its encoder, without the pre-training head.
    pub fn load(dir: &Path) -> Result<Bert<f32>> {
        if super::masked_lm::is_masked_lm_dir(dir) {
            let model = super::checkpoint::load::<super::masked_lm::MaskedLm<f32>>(dir)?;
            return Ok(model.bert);
        }
        let config = load_config_of::<Bert<f32>>(dir)?;
        let path = dir.join(MODEL_FILE);
        let raw = read_tensors_skipping(&path, |n| is_ignored(&canonical_name(n)))?;
        let mut map = std::collections::HashMap::new();
        for (name, t) in raw {
            let canon = canonical_name(&name);
            if map.insert(canon.clone(), t).is_some() {
                return Err(ckpt_err(&path, format!("tensor {canon} appears twice")));
            }
        }
        build_filled(&path, config, map, Some(&HF_NAMES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_model_has_the_implied_parameter_count() {
        let json = br#"{"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 12, "max_position_embeddings": 16}"#;
        let c = BertConfig::from_json(json, Path::new("config.json")).unwrap();
        let mut m = Bert::<f64>::new(c.clone(), &mut crate::rng::Rng::new(1));
        let n: usize = m.hf_params().iter().map(|(_, p)| p.value.len()).sum();
        assert_eq!(c.n_params(), Some(n));
        let x = m.forward(&[1, 2, 3, 4, 5, 0], None, 2, 3, &[3, 2]).unwrap();
        assert_eq!(x.len(), 6 * 8);
        assert!(m.forward(&[50, 2, 3], None, 1, 3, &[3]).is_err());
    }
}
