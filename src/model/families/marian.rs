//! Marian (Junczys-Dowmunt et al., 2018; the OPUS-MT models) as Hugging Face stores it
//! (`model_type` `marian`, `MarianMTModel`): the paper's encoder-decoder itself. Post-LN blocks
//! with biases, sinusoidal positions laid out in halves (sines, then cosines:
//! [`Positions::SinusoidalHalves`]) added to token embeddings scaled by √d_model, one embedding
//! table shared by the encoder, the decoder and (tied) the pre-softmax projection, and a bias on
//! the logits (`final_logits_bias`). The FFN's activation is the config's (OPUS-MT: `swish`).
//!
//! Marian's special ids are not ours: [`IdMap`] reorders the embedding table's rows and the
//! logit bias at load, adding our padding row (zero embedding, logit −10⁹: probability exactly
//! zero, so the softmax is Marian's), and the tokenizer ([`MarianTokenizer`]) speaks our ids.
//! What we do not compute is refused by name: separate encoder and decoder vocabularies,
//! different encoder and decoder shapes, a decoder that does not start from the padding token.

use super::hf_seq2seq::{BartDefaults, DecoderStart, HfBartConfig};
use super::{Family, FamilyKind};
use crate::error::Result;
use crate::model::checkpoint::{build_filled, RenameTable};
use crate::model::config::{NormPlacement, Positions};
use crate::model::embedding::sinusoid_halves;
use crate::model::{ModelConfig, Seq2Seq};
use crate::store::{ckpt_err, read_file, read_hf_weights, strip_bom, TensorMap};
use crate::text::id_map::IdMap;
use crate::text::marian::MarianTokenizer;
use crate::text::vocab::Vocab;
use std::path::Path;

/// The row of [`super::FAMILIES`]: a translation model, loaded by [`load`].
pub const FAMILY: Family = Family {
    name: "marian",
    kind: FamilyKind::Translation,
    model_types: &["marian"],
    hf_names: HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// Hugging Face Marian tensor names (after the `model.` prefix is stripped) -> ours.
pub const HF_NAMES: RenameTable = RenameTable(&[&super::hf_seq2seq::with_layer_names!()]);

/// What Marian computes: post-LN, sinusoids in halves, a decoder starting from the padding
/// token; `MarianConfig`'s defaults (GELU, unscaled embeddings).
const MARIAN: BartDefaults = BartDefaults {
    start: DecoderStart::Pad,
    positions: Positions::SinusoidalHalves,
    activation: "gelu",
    scale_embedding: false,
    norm: NormPlacement::PostLn,
    stack_inputs: false,
};

/// Loads a Hugging Face Marian directory (`config.json`, `model.safetensors`, `source.spm`,
/// `target.spm`, `vocab.json`): the model in our ids and its vocabulary.
pub fn load(dir: &Path) -> Result<(Seq2Seq<f32>, Vocab)> {
    let config_path = dir.join("config.json");
    let bytes = read_file(&config_path)?;
    let hf: HfBartConfig = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&config_path, format!("not a Marian config: {e}")))?;
    let config = hf.config(&MARIAN).map_err(|e| ckpt_err(&config_path, e))?;
    let eos = hf.eos().map_err(|e| ckpt_err(&config_path, e))?;
    let tokenizer = MarianTokenizer::load(dir, hf.vocab_size, hf.pad_token_id, eos)?;
    let weights = read_hf_weights(dir, |_| false)?;
    let tensors = our_tensors(dir, weights, &config, tokenizer.ids())?;
    let model = build_filled(dir, config, tensors, Some(&HF_NAMES))?;
    Ok((model, Vocab::from_marian(tokenizer)))
}

/// The checkpoint's tensors named as [`HF_NAMES`] reads them, in our ids: the shared table as
/// [`super::hf_seq2seq::in_our_ids`] gives it, the stored position tables dropped (checked
/// against the sinusoids we compute), the logit bias reordered by `ids`.
fn our_tensors(
    dir: &Path,
    weights: TensorMap,
    config: &ModelConfig,
    ids: &IdMap,
) -> Result<TensorMap> {
    let bad = |reason: String| ckpt_err(dir, reason);
    let mut tensors = super::hf_seq2seq::in_our_ids(dir, weights, config, ids)?;
    let d = config.d_model;
    for name in ["encoder.embed_positions.weight", "decoder.embed_positions.weight"] {
        if let Some((shape, values)) = tensors.remove(name) {
            check_sinusoids(name, &shape, &values, d).map_err(bad)?;
        }
    }
    let bias = super::hf_seq2seq::stored_logit_bias(&mut tensors, ids).map_err(bad)?;
    tensors.insert("final_logits_bias".into(), (vec![bias.len()], bias));
    Ok(tensors)
}

/// Refuses a stored position table that is not the sinusoids transformers computes for it.
fn check_sinusoids(
    name: &str,
    shape: &[usize],
    values: &[f32],
    d: usize,
) -> std::result::Result<(), String> {
    let [rows, cols] = shape[..] else {
        return Err(format!("{name} has shape {shape:?}, not a matrix"));
    };
    if cols != d {
        return Err(format!("{name} has {cols} columns, not d_model {d}"));
    }
    for pos in 0..rows {
        for dim in 0..d {
            let want = sinusoid_halves(pos, dim, d);
            let got = values[pos * d + dim] as f64;
            if (got - want).abs() > 1e-5 {
                return Err(format!(
                    "{name} row {pos} column {dim} is {got}, not the sinusoid {want} (trained \
                     positions are not supported)"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `dir` holds a Hugging Face Marian model (its `config.json` says `model_type`
/// `marian`).
pub fn is_marian_dir(dir: &Path) -> bool {
    super::model_type_of(dir).as_deref() == Some("marian")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Activation;

    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> std::result::Result<ModelConfig, String> {
        let marian = serde_json::json!({
            "activation_function": "swish", "scale_embedding": true, "pad_token_id": 99,
            "eos_token_id": 0, "decoder_start_token_id": 99, "normalize_before": false
        });
        super::super::hf_seq2seq::test_config("marian", marian, &MARIAN, edit)
    }

    #[test]
    fn marian_configs_become_ours_and_the_rest_is_refused_by_name() {
        let c = config(|_| {}).unwrap();
        assert_eq!(
            (c.vocab_size, c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers),
            (101, 16, 4, 32, 2, 1)
        );
        assert_eq!((c.activation, c.positions), (Activation::Silu, Positions::SinusoidalHalves));
        assert!(c.output_bias && c.tie_embeddings && c.scale_embeddings && c.bias);
        assert_eq!(c.norm, NormPlacement::PostLn);
        assert_eq!(c.max_len, 64);
        for (edit, wanted) in [
            (("decoder_vocab_size", serde_json::json!(50)), "decoder_vocab_size 50"),
            (("share_encoder_decoder_embeddings", serde_json::json!(false)), "share_encoder"),
            (("decoder_attention_heads", serde_json::json!(2)), "encoder_attention_heads 4"),
            (("decoder_ffn_dim", serde_json::json!(64)), "decoder_ffn_dim 64"),
            (("decoder_start_token_id", serde_json::json!(3)), "decoder_start_token_id 3"),
            (("activation_function", serde_json::json!("mish")), "\"mish\""),
            (("eos_token_id", serde_json::json!([0, 5])), "eos_token_id [0,5]"),
            (("d_model", serde_json::json!(18)), "d_model"),
        ] {
            let e = config(|j| j[edit.0] = edit.1.clone()).unwrap_err();
            assert!(e.contains(wanted), "{}: {e}", edit.0);
        }
        // A list of one EOS is one EOS; the config class's defaults fill what is absent.
        assert!(config(|j| j["eos_token_id"] = serde_json::json!([0])).is_ok());
        let c = config(|j| {
            j.as_object_mut().unwrap().remove("activation_function");
            j.as_object_mut().unwrap().remove("scale_embedding");
        })
        .unwrap();
        assert_eq!(c.activation, Activation::GeluErf);
        assert!(!c.scale_embeddings);
    }

    #[test]
    fn stored_positions_must_be_the_sinusoids() {
        let d = 6;
        let mut table: Vec<f32> = (0..4 * d)
            .map(|i| sinusoid_halves(i / d, i % d, d) as f32)
            .collect();
        assert!(check_sinusoids("p", &[4, d], &table, d).is_ok());
        table[2 * d + 1] += 0.01;
        let e = check_sinusoids("p", &[4, d], &table, d).unwrap_err();
        assert!(e.contains("p row 2 column 1"), "{e}");
        assert!(check_sinusoids("p", &[4, d], &table, 8).is_err());
    }
}
