//! M2M100 and NLLB-200 (fairseq's multilingual translators) as Hugging Face stores them
//! (`model_type` `m2m_100`, `M2M100ForConditionalGeneration`): the paper's encoder-decoder with
//! the norms before each sublayer (pre-LN, a final LayerNorm closing each stack), token
//! embeddings scaled by √d_model, one table shared by both stacks and (tied) the pre-softmax
//! projection, and fairseq's sinusoids: with `h = d_model / 2` and the padding id `p`, position
//! `t` of a sequence (counted from 0) reads row `t + p + 1` of
//!
//! `PE(r, i) = sin(r · 10000^(−i/(h−1)))`, `PE(r, h + i) = cos(r · 10000^(−i/(h−1)))`
//!
//! (note `h − 1`, where the paper has `h`), computed in float32 as transformers computes it and
//! held as a fixed [`Positions::Learned`] table. Every source starts with its language's token,
//! the decoder starts from `</s>` and its first output is forced to the target language's token
//! (see `text::fairseq`; transformers' `forced_bos_token_id`).
//!
//! fairseq's ids become ours through [`IdMap`]: our BOS is a copy of `</s>` (the decoder's
//! start) and our padding row is added, both with a logit of −10⁹ (never emitted, no
//! probability taken from the others). Refused by name: separate encoder and decoder shapes, a
//! decoder that does not start from `</s>`, activations other than ReLU / GELU / SiLU, and
//! layer-drop or MoE variants (NLLB-MoE is its own `model_type`).

use super::{Family, FamilyKind};
use crate::error::Result;
use crate::model::checkpoint::{build_filled, RenameTable};
use super::hf_seq2seq::{BartDefaults, DecoderStart, HfBartConfig};
use crate::model::config::{NormPlacement, Positions};
use crate::model::{ModelConfig, Seq2Seq};
use crate::store::{ckpt_err, read_file, read_hf_weights, strip_bom, TensorMap};
use crate::text::fairseq::FairseqTokenizer;
use crate::text::fairseq_codes;
use crate::text::id_map::IdMap;
use crate::text::vocab::Vocab;
use std::path::Path;

/// The row of [`super::FAMILIES`]: a translation model, loaded by [`load`].
pub const FAMILY: Family = Family {
    name: "m2m100",
    kind: FamilyKind::Translation,
    model_types: &["m2m_100"],
    hf_names: HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// Hugging Face M2M100 tensor names (after the `model.` prefix is stripped) -> ours: Marian's
/// blocks, the stacks' final norms and the position table we compute.
pub const HF_NAMES: RenameTable = RenameTable(&[&super::hf_seq2seq::with_layer_names!(
    // (Before `shared.`: our name for the table we compute is also its own.)
    ("embedding.positions", "embedding.positions"),
    ("encoder.layer_norm.", "encoder.final_norm."),
    ("decoder.layer_norm.", "decoder.final_norm."),
)]);

/// What M2M100 computes: pre-LN, one computed position table; `M2M100Config`'s defaults.
const M2M100: BartDefaults = BartDefaults {
    start: DecoderStart::Eos,
    positions: Positions::Learned,
    activation: "relu",
    scale_embedding: true,
    norm: NormPlacement::PreLn,
    stack_inputs: false,
};

/// Loads a Hugging Face M2M100 / NLLB directory (`config.json`, `model.safetensors`,
/// `sentencepiece.bpe.model` with `vocab.json` or `tokenizer.json`): the model in our ids and
/// its vocabulary.
pub fn load(dir: &Path) -> Result<(Seq2Seq<f32>, Vocab)> {
    let config_path = dir.join("config.json");
    let bytes = read_file(&config_path)?;
    let hf: HfBartConfig = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&config_path, format!("not an M2M100 config: {e}")))?;
    let config = hf.config(&M2M100).map_err(|e| ckpt_err(&config_path, e))?;
    let eos = hf.eos().map_err(|e| ckpt_err(&config_path, e))?;
    let tokenizer = FairseqTokenizer::load(dir, hf.vocab_size, eos, fairseq_codes::NLLB)?;
    let weights = read_hf_weights(dir, |_| false)?;
    let tensors = our_tensors(dir, weights, &config, tokenizer.ids(), hf.pad_token_id)?;
    let model = build_filled(dir, config, tensors, Some(&HF_NAMES))?;
    Ok((model, Vocab::from_fairseq(tokenizer)))
}

/// The checkpoint's tensors named as [`HF_NAMES`] reads them, in our ids: the shared table as
/// [`super::hf_seq2seq::in_our_ids`] gives it, stored position tables dropped, the position
/// table and the logit bias (zero but for our own rows) added.
fn our_tensors(
    dir: &Path,
    weights: TensorMap,
    config: &ModelConfig,
    ids: &IdMap,
    pad: u32,
) -> Result<TensorMap> {
    let mut tensors = super::hf_seq2seq::in_our_ids(dir, weights, config, ids)?;
    let (d, n, n_ours) = (config.d_model, ids.len_theirs(), ids.len_ours());
    // transformers does not save the (computed) tables; a converter may have.
    for name in [
        "encoder.embed_positions.weights",
        "decoder.embed_positions.weights",
    ] {
        tensors.remove(name);
    }
    tensors.insert(
        "final_logits_bias".into(),
        (vec![n_ours], ids.logit_bias(&vec![0.0; n])),
    );
    tensors.insert(
        "embedding.positions".into(),
        (
            vec![config.max_len, d],
            fairseq_positions(config.max_len, d, pad as usize + 1),
        ),
    );
    Ok(tensors)
}

/// Rows `offset .. offset + n` of fairseq's sinusoid table `[n, d]` (see the module docs), in
/// float32 as transformers' `M2M100SinusoidalPositionalEmbedding.get_embedding` computes them;
/// an odd `d` ends with a zero column.
pub fn fairseq_positions(n: usize, d: usize, offset: usize) -> Vec<f32> {
    let half = d / 2;
    let step = (10000f64.ln() / (half as f64 - 1.0)) as f32;
    let freqs: Vec<f32> = (0..half).map(|i| (i as f32 * -step).exp()).collect();
    let mut table = vec![0.0f32; n * d];
    for (t, row) in table.chunks_exact_mut(d).enumerate() {
        let r = (t + offset) as f32;
        for (i, &f) in freqs.iter().enumerate() {
            let angle = r * f;
            row[i] = angle.sin();
            row[half + i] = angle.cos();
        }
    }
    table
}

/// Whether `dir` holds a Hugging Face M2M100 / NLLB model (`model_type` `m2m_100`).
pub fn is_m2m100_dir(dir: &Path) -> bool {
    super::model_type_of(dir).as_deref() == Some("m2m_100")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Activation;

    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> std::result::Result<ModelConfig, String> {
        super::super::hf_seq2seq::test_config("m2m_100", serde_json::json!({}), &M2M100, edit)
    }

    #[test]
    fn m2m100_configs_become_ours_and_the_rest_is_refused_by_name() {
        let c = config(|_| {}).unwrap();
        assert_eq!(
            (c.vocab_size, c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers),
            (102, 16, 4, 32, 2, 1)
        );
        assert_eq!((c.activation, c.positions), (Activation::Relu, Positions::Learned));
        assert!(c.output_bias && c.tie_embeddings && c.scale_embeddings && c.bias);
        assert_eq!((c.norm, c.max_len), (NormPlacement::PreLn, 64));
        for (edit, wanted) in [
            (("decoder_attention_heads", serde_json::json!(2)), "encoder_attention_heads 4"),
            (("decoder_ffn_dim", serde_json::json!(64)), "decoder_ffn_dim 64"),
            (("decoder_start_token_id", serde_json::json!(0)), "decoder_start_token_id 0"),
            (("activation_function", serde_json::json!("mish")), "\"mish\""),
            (("eos_token_id", serde_json::json!([2, 5])), "eos_token_id [2,5]"),
            (("d_model", serde_json::json!(18)), "d_model"),
        ] {
            let e = config(|j| j[edit.0] = edit.1.clone()).unwrap_err();
            assert!(e.contains(wanted), "{}: {e}", edit.0);
        }
    }

    #[test]
    fn fairseq_positions_are_the_sinusoids_from_the_padding_offset() {
        let (d, half) = (8, 4);
        let table = fairseq_positions(5, d, 2);
        for t in 0..5 {
            let r = (t + 2) as f64;
            for i in 0..half {
                let angle = r * (-(10000f64.ln()) * i as f64 / (half as f64 - 1.0)).exp();
                assert!((table[t * d + i] as f64 - angle.sin()).abs() < 1e-6);
                assert!((table[t * d + half + i] as f64 - angle.cos()).abs() < 1e-6);
            }
        }
        // An odd width ends with zeros.
        let odd = fairseq_positions(3, 9, 2);
        assert!((0..3).all(|t| odd[t * 9 + 8] == 0.0));
    }
}
