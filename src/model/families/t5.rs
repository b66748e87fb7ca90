//! T5 (Raffel et al., 2020), mT5, MADLAD-400 and umT5 as Hugging Face stores them
//! (`model_type` `t5`, `mt5` or `umt5`, `T5ForConditionalGeneration` and its kin): the paper's
//! encoder-decoder with the norms
//! before each sublayer (pre-LN, a final norm closing each stack), every norm an RMSNorm
//! without bias (`T5LayerNorm`: `g ⊙ x / √(mean(x²) + ε)`), no biases anywhere, no positions
//! added to the embeddings (which are not scaled) and instead T5's relative position bias in
//! every self-attention (`model::relative_bias`: `relative_attention_bias [buckets, heads]`,
//! stored once per stack in its first layer, which we copy to each layer of the stack; umT5
//! stores one in every layer), scores
//! left unscaled (`q·k`, our `query_pre_attn_scalar` 1), heads of `d_kv` columns whatever
//! `d_model / num_heads` is, and the FFN of `feed_forward_proj`:
//!
//! - `relu` (the original T5): `FFN(x) = relu(x W_iᵀ) W_oᵀ` (`wi`, `wo`);
//! - `gated-gelu` (T5 v1.1, mT5, MADLAD): `(gelu_tanh(x W_i0ᵀ) ⊙ x W_i1ᵀ) W_oᵀ` (`wi_0` our
//!   gate, `wi_1` our up projection), `gated-silu` likewise with SiLU; `gelu` and `silu`
//!   ungated.
//!
//! One token table is shared by both stacks; the head is the table (tied) or `lm_head.weight`
//! where the checkpoint stores one that differs from it (T5 v1.1, mT5). As transformers 5
//! computes it, the original T5 multiplies the decoder's output by `d_model^-0.5` before the
//! head (model_type `t5` whose config says `scale_decoder_outputs`, which transformers 5
//! writes, or else does not set `tie_word_embeddings` false; mT5 never scales): we fold that
//! factor into the decoder's final norm gain at load (the same product, the norm being linear
//! in its gain).
//!
//! The decoder starts from the padding token (`decoder_start_token_id` 0); ids are
//! `spiece.model`'s (`text::t5_tokenizer`), mapped onto our specials by [`IdMap`] with our own
//! padding row (its logit −10⁹) as Marian's are. Refused by name: `feed_forward_proj` values we
//! do not compute, a decoder that does not start from the padding token, a bias table of the
//! wrong shape, missing (umT5) or where T5 has none.

use super::hf_seq2seq::one_eos;
use super::{Family, FamilyKind};
use crate::error::Result;
use crate::model::checkpoint::{build_filled, RenameTable};
use crate::model::config::{Activation, NormPlacement, Normalization, Positions};
use crate::model::{ModelConfig, Seq2Seq};
use crate::store::{ckpt_err, read_file, read_hf_weights, strip_bom, TensorMap};
use crate::text::id_map::IdMap;
use crate::text::t5_tokenizer::T5Tokenizer;
use crate::text::vocab::Vocab;
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`]: a translation model, loaded by [`load`].
pub const FAMILY: Family = Family {
    name: "t5",
    kind: FamilyKind::Translation,
    model_types: &["t5", "mt5", "umt5"],
    hf_names: HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// Hugging Face T5 tensor names -> ours. (The ungated FFN's `wi` is read as `wi_1`, which is
/// our `linear1` in both FFNs: see [`our_tensors`].)
pub const HF_NAMES: RenameTable = RenameTable(&[&[
    ("shared.", "embedding."),
    ("final_logits_bias", "output_proj.bias"),
    ("lm_head.", "output_proj."),
    (
        "encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.",
        "encoder.layers.{i}.self_attn.relative_bias.",
    ),
    (
        "encoder.block.{i}.layer.0.SelfAttention.q.",
        "encoder.layers.{i}.self_attn.q_proj.",
    ),
    (
        "encoder.block.{i}.layer.0.SelfAttention.k.",
        "encoder.layers.{i}.self_attn.k_proj.",
    ),
    (
        "encoder.block.{i}.layer.0.SelfAttention.v.",
        "encoder.layers.{i}.self_attn.v_proj.",
    ),
    (
        "encoder.block.{i}.layer.0.SelfAttention.o.",
        "encoder.layers.{i}.self_attn.out_proj.",
    ),
    (
        "encoder.block.{i}.layer.0.layer_norm.",
        "encoder.layers.{i}.self_attn_norm.",
    ),
    (
        "encoder.block.{i}.layer.1.DenseReluDense.wi_0.",
        "encoder.layers.{i}.ffn.gate.",
    ),
    (
        "encoder.block.{i}.layer.1.DenseReluDense.wi_1.",
        "encoder.layers.{i}.ffn.linear1.",
    ),
    (
        "encoder.block.{i}.layer.1.DenseReluDense.wo.",
        "encoder.layers.{i}.ffn.linear2.",
    ),
    (
        "encoder.block.{i}.layer.1.layer_norm.",
        "encoder.layers.{i}.ffn_norm.",
    ),
    ("encoder.final_layer_norm.", "encoder.final_norm."),
    (
        "decoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.",
        "decoder.layers.{i}.self_attn.relative_bias.",
    ),
    (
        "decoder.block.{i}.layer.0.SelfAttention.q.",
        "decoder.layers.{i}.self_attn.q_proj.",
    ),
    (
        "decoder.block.{i}.layer.0.SelfAttention.k.",
        "decoder.layers.{i}.self_attn.k_proj.",
    ),
    (
        "decoder.block.{i}.layer.0.SelfAttention.v.",
        "decoder.layers.{i}.self_attn.v_proj.",
    ),
    (
        "decoder.block.{i}.layer.0.SelfAttention.o.",
        "decoder.layers.{i}.self_attn.out_proj.",
    ),
    (
        "decoder.block.{i}.layer.0.layer_norm.",
        "decoder.layers.{i}.self_attn_norm.",
    ),
    (
        "decoder.block.{i}.layer.1.EncDecAttention.q.",
        "decoder.layers.{i}.cross_attn.q_proj.",
    ),
    (
        "decoder.block.{i}.layer.1.EncDecAttention.k.",
        "decoder.layers.{i}.cross_attn.k_proj.",
    ),
    (
        "decoder.block.{i}.layer.1.EncDecAttention.v.",
        "decoder.layers.{i}.cross_attn.v_proj.",
    ),
    (
        "decoder.block.{i}.layer.1.EncDecAttention.o.",
        "decoder.layers.{i}.cross_attn.out_proj.",
    ),
    (
        "decoder.block.{i}.layer.1.layer_norm.",
        "decoder.layers.{i}.cross_attn_norm.",
    ),
    (
        "decoder.block.{i}.layer.2.DenseReluDense.wi_0.",
        "decoder.layers.{i}.ffn.gate.",
    ),
    (
        "decoder.block.{i}.layer.2.DenseReluDense.wi_1.",
        "decoder.layers.{i}.ffn.linear1.",
    ),
    (
        "decoder.block.{i}.layer.2.DenseReluDense.wo.",
        "decoder.layers.{i}.ffn.linear2.",
    ),
    (
        "decoder.block.{i}.layer.2.layer_norm.",
        "decoder.layers.{i}.ffn_norm.",
    ),
    ("decoder.final_layer_norm.", "decoder.final_norm."),
]]);

/// The fields of `T5Config` / `MT5Config` we read, with the classes' defaults; the rest
/// (`dropout_rate`, `initializer_factor`, `dense_act_fn` and `is_gated_act`, which follow from
/// `feed_forward_proj`, ...) change nothing at inference.
#[derive(Deserialize)]
struct HfT5Config {
    model_type: String,
    vocab_size: usize,
    d_model: usize,
    #[serde(default = "default_d_kv")]
    d_kv: usize,
    d_ff: usize,
    num_layers: usize,
    num_decoder_layers: Option<usize>,
    num_heads: usize,
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "default_max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    feed_forward_proj: Option<String>,
    tie_word_embeddings: Option<bool>,
    /// transformers 5 writes what it computed from `tie_word_embeddings`, and reads it back
    /// over it.
    scale_decoder_outputs: Option<bool>,
    #[serde(default)]
    pad_token_id: u32,
    #[serde(default = "default_eos")]
    eos_token_id: serde_json::Value,
    decoder_start_token_id: Option<u32>,
    /// The sequence length the model was trained on (T5's 512), our `max_len`.
    n_positions: Option<usize>,
}

fn default_d_kv() -> usize {
    64
}
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_eps() -> f64 {
    1e-6
}
fn default_eos() -> serde_json::Value {
    serde_json::json!(1)
}

/// The three models of the family: what differs between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The original T5 and T5 v1.1 (`t5`): ReLU unless said otherwise.
    T5,
    /// mT5 and MADLAD-400 (`mt5`): gated GELU unless said otherwise, never a scaled output.
    Mt5,
    /// umT5 (`umt5`): as mT5, a bias table in every layer, the output scaled as T5's.
    Umt5,
}

impl Kind {
    fn of(model_type: &str) -> std::result::Result<Kind, String> {
        match model_type {
            "t5" => Ok(Kind::T5),
            "mt5" => Ok(Kind::Mt5),
            "umt5" => Ok(Kind::Umt5),
            other => Err(format!("model_type {other:?} is not T5's")),
        }
    }
}

/// Our `max_len` where the config states no `n_positions` (T5's training length).
const DEFAULT_MAX_LEN: usize = 512;

/// The sentinel pieces `<extra_id_N>` after the SentencePiece pieces (`T5Tokenizer`'s
/// `extra_ids`) where `tokenizer_config.json` does not say.
const DEFAULT_EXTRA_IDS: usize = 100;

impl HfT5Config {
    /// Our config (the table gains our padding row; `tied`: whether the head is the table) and
    /// whether the decoder's output is scaled by `d_model^-0.5`, or what is not supported (by
    /// its field's name).
    fn config(&self, tied: bool) -> std::result::Result<(ModelConfig, bool), String> {
        let kind = Kind::of(&self.model_type)?;
        let default_ffn = match kind {
            Kind::T5 => "relu",
            Kind::Mt5 | Kind::Umt5 => "gated-gelu",
        };
        let ffn = self.feed_forward_proj.as_deref().unwrap_or(default_ffn);
        let activation = match ffn {
            "relu" => Activation::Relu,
            "gelu" => Activation::GeluErf,
            "gelu_new" => Activation::GeluTanh,
            "silu" | "swish" => Activation::Silu,
            "gated-gelu" | "gated-gelu_new" => Activation::GeluTanhGated,
            "gated-silu" | "gated-swish" => Activation::SiluGated,
            other => {
                return Err(format!(
                    "feed_forward_proj {other:?} is not supported (relu, gelu, gelu_new, silu, \
                     gated-gelu and gated-silu are)"
                ))
            }
        };
        if let Some(start) = self.decoder_start_token_id.filter(|&s| s != self.pad_token_id) {
            return Err(format!(
                "decoder_start_token_id {start} is not pad_token_id {}: only decoders that \
                 start from the padding token are supported",
                self.pad_token_id
            ));
        }
        one_eos(&self.eos_token_id)?;
        let mut c = ModelConfig::preset("base", self.vocab_size + 1).expect("a preset");
        c.d_model = self.d_model;
        c.n_heads = self.num_heads;
        c.head_dim = Some(self.d_kv);
        c.d_ff = self.d_ff;
        c.n_encoder_layers = self.num_layers;
        c.n_decoder_layers = self.num_decoder_layers.unwrap_or(self.num_layers);
        c.dropout = 0.0;
        c.norm = NormPlacement::PreLn;
        c.normalization = Normalization::RmsNorm;
        c.layer_norm_eps = self.layer_norm_epsilon;
        c.tie_embeddings = tied;
        c.max_len = self.n_positions.unwrap_or(DEFAULT_MAX_LEN);
        c.activation = activation;
        c.positions = Positions::Relative;
        c.relative_buckets = (
            self.relative_attention_num_buckets,
            self.relative_attention_max_distance,
        );
        c.bias = false;
        c.scale_embeddings = false;
        // T5's scores are the dot products themselves: q·k / √1.
        c.query_pre_attn_scalar = Some(1.0);
        // Our padding row's logit (−10⁹), through the logit bias.
        c.output_bias = true;
        c.validate()?;
        // transformers 5: T5 and umT5 scale as `scale_decoder_outputs` says, else unless the
        // config sets tie_word_embeddings false; mT5 never does.
        let tied_config = self.tie_word_embeddings != Some(false);
        let scaled = kind != Kind::Mt5 && self.scale_decoder_outputs.unwrap_or(tied_config);
        Ok((c, scaled))
    }
}

/// Loads a Hugging Face T5 / mT5 / MADLAD-400 directory (`config.json`, `model.safetensors` or
/// `pytorch_model.bin`, `spiece.model`): the model in our ids and its vocabulary.
pub fn load(dir: &Path) -> Result<(Seq2Seq<f32>, Vocab)> {
    let config_path = dir.join("config.json");
    let bytes = read_file(&config_path)?;
    let hf: HfT5Config = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&config_path, format!("not a T5 config: {e}")))?;
    // What the config refuses, before the weights are read.
    hf.config(true).map_err(|e| ckpt_err(&config_path, e))?;
    let eos = one_eos(&hf.eos_token_id).map_err(|e| ckpt_err(&config_path, e))?;
    let tokenizer = T5Tokenizer::load(dir, hf.vocab_size, (hf.pad_token_id, eos), extra_ids(dir)?)?;
    let weights = read_hf_weights(dir, |_| false)?;
    let tied = match (weights.get("lm_head.weight"), weights.get("shared.weight")) {
        (Some(head), Some(table)) => head == table,
        (head, _) => head.is_none(),
    };
    let (config, scaled) = hf.config(tied).map_err(|e| ckpt_err(&config_path, e))?;
    let every_layer = hf.model_type == "umt5";
    let tensors = our_tensors(dir, weights, &config, tokenizer.ids(), (scaled, every_layer))?;
    let model = build_filled(dir, config, tensors, Some(&HF_NAMES))?;
    Ok((model, Vocab::from_t5(tokenizer)))
}

/// `tokenizer_config.json`'s `extra_ids` (the sentinels after the pieces), else 100.
fn extra_ids(dir: &Path) -> Result<usize> {
    let path = dir.join("tokenizer_config.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(DEFAULT_EXTRA_IDS);
    };
    let json: serde_json::Value = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&path, format!("not valid JSON: {e}")))?;
    match &json["extra_ids"] {
        serde_json::Value::Null => Ok(DEFAULT_EXTRA_IDS),
        n => (n.as_u64().map(|n| n as usize)).ok_or_else(|| {
            ckpt_err(&path, format!("extra_ids {n} is not a count"))
        }),
    }
}

/// The checkpoint's tensors named as [`HF_NAMES`] reads them, in our ids: the shared table
/// (and an untied head) as [`super::hf_seq2seq::in_our_ids`] gives it, the ungated FFN's `wi`
/// named `wi_1` (our `linear1`, as the gated FFN's `wi_1`), each stack's bias table
/// copied from its first layer to the others (umT5, `every_layer`: each layer's own, checked),
/// the logit bias of our padding row, the decoder's final norm times `d_model^-0.5` when
/// `scaled` (see the module docs).
fn our_tensors(
    dir: &Path,
    weights: TensorMap,
    config: &ModelConfig,
    ids: &IdMap,
    (scaled, every_layer): (bool, bool),
) -> Result<TensorMap> {
    let bad = |reason: String| ckpt_err(dir, reason);
    // The ungated FFN's W_i is our linear1, as the gated one's W_i1.
    let weights = (weights.into_iter())
        .map(|(name, t)| (name.replace(".DenseReluDense.wi.", ".DenseReluDense.wi_1."), t))
        .collect();
    let mut tensors = super::hf_seq2seq::in_our_ids(dir, weights, config, ids)?;
    let table = [config.relative_buckets.0, config.n_heads];
    for (stack, layers) in [
        ("encoder", config.n_encoder_layers),
        ("decoder", config.n_decoder_layers),
    ] {
        let name = |i: usize| {
            format!("{stack}.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight")
        };
        let (shape, values) = tensors.get(&name(0)).cloned().ok_or_else(|| {
            bad(format!("no {} (the stack's relative position bias)", name(0)))
        })?;
        for i in 0..layers {
            match tensors.get(&name(i)) {
                Some((shape, _)) if *shape != table => {
                    return Err(bad(format!(
                        "{} has shape {shape:?}, the config needs {table:?} \
                         (relative_attention_num_buckets, num_heads)",
                        name(i)
                    )))
                }
                Some(_) if i == 0 || every_layer => {}
                Some(_) => {
                    return Err(bad(format!(
                        "{} is stored: a bias table in every layer is umT5's (model_type \
                         umt5), not T5's or mT5's",
                        name(i)
                    )))
                }
                None if every_layer => {
                    return Err(bad(format!(
                        "no {} (umT5 has a relative position bias in every layer)",
                        name(i)
                    )))
                }
                None => {
                    tensors.insert(name(i), (shape.clone(), values.clone()));
                }
            }
        }
    }
    if scaled {
        let name = "decoder.final_layer_norm.weight";
        let (_, gain) = tensors
            .get_mut(name)
            .ok_or_else(|| bad(format!("no {name} (the decoder's final norm)")))?;
        let factor = (config.d_model as f64).powf(-0.5) as f32;
        gain.iter_mut().for_each(|g| *g *= factor);
    }
    let n = ids.len_theirs();
    tensors.insert(
        "final_logits_bias".into(),
        (vec![ids.len_ours()], ids.logit_bias(&vec![0.0; n])),
    );
    Ok(tensors)
}

/// Whether `dir` holds a Hugging Face T5 model (`model_type` `t5`, `mt5` or `umt5`).
pub fn is_t5_dir(dir: &Path) -> bool {
    super::model_type_of(dir).is_some_and(|t| FAMILY.model_types.contains(&t.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> std::result::Result<ModelConfig, String> {
        let mut json = serde_json::json!({
            "model_type": "t5", "vocab_size": 100, "d_model": 16, "d_kv": 6, "d_ff": 32,
            "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4,
            "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false,
            "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20
        });
        edit(&mut json);
        let hf: HfT5Config = serde_json::from_value(json).map_err(|e| e.to_string())?;
        hf.config(false).map(|(c, _)| c)
    }

    #[test]
    fn t5_configs_become_ours_and_the_rest_is_refused_by_name() {
        let c = config(|_| {}).unwrap();
        assert_eq!(
            (c.vocab_size, c.d_model, c.n_heads, c.d_head(), c.d_ff),
            (101, 16, 4, 6, 32)
        );
        assert_eq!((c.n_encoder_layers, c.n_decoder_layers), (2, 1));
        assert_eq!((c.activation, c.positions), (Activation::GeluTanhGated, Positions::Relative));
        assert_eq!(c.relative_buckets, (8, 20));
        assert_eq!((c.norm, c.normalization), (NormPlacement::PreLn, Normalization::RmsNorm));
        assert!(!c.bias && !c.scale_embeddings && c.output_bias && !c.tie_embeddings);
        assert_eq!(c.query_pre_attn_scalar, Some(1.0));
        assert_eq!(c.max_len, DEFAULT_MAX_LEN);
        // The defaults of each class: T5's ReLU, mT5's gated GELU.
        let relu = config(|j| {
            j.as_object_mut().unwrap().remove("feed_forward_proj");
        });
        assert_eq!(relu.unwrap().activation, Activation::Relu);
        let mt5 = config(|j| {
            j["model_type"] = "mt5".into();
            j.as_object_mut().unwrap().remove("feed_forward_proj");
        });
        assert_eq!(mt5.unwrap().activation, Activation::GeluTanhGated);
        let umt5 = config(|j| {
            j["model_type"] = "umt5".into();
            j.as_object_mut().unwrap().remove("feed_forward_proj");
        });
        assert_eq!(umt5.unwrap().activation, Activation::GeluTanhGated);
        for (edit, wanted) in [
            (("feed_forward_proj", serde_json::json!("gated-relu")), "feed_forward_proj \"gated-relu\""),
            (("model_type", serde_json::json!("bart")), "model_type \"bart\""),
            (("decoder_start_token_id", serde_json::json!(3)), "decoder_start_token_id 3"),
            (("eos_token_id", serde_json::json!([1, 5])), "eos_token_id"),
            (("relative_attention_num_buckets", serde_json::json!(2)), "relative_buckets"),
        ] {
            let e = config(|j| j[edit.0] = edit.1.clone()).unwrap_err();
            assert!(e.contains(wanted), "{}: {e}", edit.0);
        }
    }

    /// transformers 5's rule: T5 and umT5 scale their decoder's output unless
    /// `tie_word_embeddings` is false; mT5 never.
    #[test]
    fn the_output_scale_follows_transformers() {
        let scaled = |model_type: &str, tie: Option<bool>| {
            let mut json = serde_json::json!({
                "model_type": model_type, "vocab_size": 100, "d_model": 16, "d_ff": 32,
                "num_layers": 1, "num_heads": 2
            });
            if let Some(t) = tie {
                json["tie_word_embeddings"] = t.into();
            }
            let hf: HfT5Config = serde_json::from_value(json).unwrap();
            hf.config(true).unwrap().1
        };
        assert!(scaled("t5", None) && scaled("t5", Some(true)));
        assert!(!scaled("t5", Some(false)));
        assert!(!scaled("mt5", None) && !scaled("mt5", Some(true)));
        assert!(scaled("umt5", None) && !scaled("umt5", Some(false)));
        // What transformers 5 wrote wins over tie_word_embeddings.
        let json = serde_json::json!({
            "model_type": "t5", "vocab_size": 100, "d_model": 16, "d_ff": 32, "num_layers": 1,
            "num_heads": 2, "tie_word_embeddings": false, "scale_decoder_outputs": true
        });
        let hf: HfT5Config = serde_json::from_value(json).unwrap();
        assert!(hf.config(true).unwrap().1);
    }
}
