//! mBART-50 (fairseq's multilingual denoising pre-training, fine-tuned to translate between 50
//! languages) as Hugging Face stores it (`model_type` `mbart`, `MBartForConditionalGeneration`):
//! the paper's encoder-decoder with the norms before each sublayer (pre-LN, a final LayerNorm
//! closing each stack), GELU, one token table shared by both stacks and (tied) the pre-softmax
//! projection with a stored logit bias (`final_logits_bias`), and each stack's own input:
//!
//! `x = LayerNorm_emb(E[token] · s + P_stack(t + 2))`
//!
//! with `s = √d_model` where `scale_embedding` (mBART-50's configs say so; the class's default
//! is 1), `P_stack` the encoder's or the decoder's own learned table (fairseq's offset of 2:
//! position `t` reads row `t + 2`; we keep rows `2 ..` as `embedding.positions` and
//! `embedding.target_positions`) and `LayerNorm_emb` the stack's `layernorm_embedding`
//! (`embedding.norm`, `embedding.target_norm`).
//!
//! Tokens as mBART-50's tokenizer (`MBart50Tokenizer`) numbers them: fairseq's dictionary over
//! `sentencepiece.bpe.model` with the 52 language codes (`en_XX`) after it (see `text::fairseq`):
//! a source is `[source code] pieces </s>`, the decoder starts from `</s>` and its first output
//! is forced to the target code. Refused by name: mBART-cc25's own order
//! (`MBartTokenizer`: `pieces </s> [code]`, the decoder starting from the code), a decoder
//! that does not start from `</s>`, unequal encoder and decoder shapes.

use super::hf_seq2seq::{BartDefaults, DecoderStart, HfBartConfig};
use super::{Family, FamilyKind};
use crate::error::Result;
use crate::model::checkpoint::{build_filled, RenameTable};
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
    name: "mbart",
    kind: FamilyKind::Translation,
    model_types: &["mbart"],
    hf_names: HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// Hugging Face mBART tensor names (after the `model.` prefix is stripped) -> ours: the
/// shared blocks, the stacks' final norms, each stack's input norm and position table.
pub const HF_NAMES: RenameTable = RenameTable(&[&super::hf_seq2seq::with_layer_names!(
    // (Before `shared.`: the tables cut to our rows keep our names.)
    ("embedding.positions", "embedding.positions"),
    ("embedding.target_positions", "embedding.target_positions"),
    ("encoder.layernorm_embedding.", "embedding.norm."),
    ("decoder.layernorm_embedding.", "embedding.target_norm."),
    ("encoder.layer_norm.", "encoder.final_norm."),
    ("decoder.layer_norm.", "decoder.final_norm."),
)]);

/// What mBART computes, and `MBartConfig`'s defaults.
const MBART: BartDefaults = BartDefaults {
    start: DecoderStart::Eos,
    positions: Positions::Learned,
    activation: "gelu",
    scale_embedding: false,
    norm: NormPlacement::PreLn,
    stack_inputs: true,
};

/// The rows of a stored position table before position 0 (fairseq's padding offset).
const POSITION_OFFSET: usize = 2;

/// Loads a Hugging Face mBART-50 directory (`config.json`, `model.safetensors` or
/// `pytorch_model.bin`, `sentencepiece.bpe.model` with `tokenizer.json` or alone): the model in
/// our ids and its vocabulary.
pub fn load(dir: &Path) -> Result<(Seq2Seq<f32>, Vocab)> {
    let config_path = dir.join("config.json");
    let bytes = read_file(&config_path)?;
    let hf: HfBartConfig = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&config_path, format!("not an mBART config: {e}")))?;
    let config = hf.config(&MBART).map_err(|e| ckpt_err(&config_path, e))?;
    let eos = hf.eos().map_err(|e| ckpt_err(&config_path, e))?;
    check_tokenizer_class(dir)?;
    let tokenizer = FairseqTokenizer::load(dir, hf.vocab_size, eos, fairseq_codes::MBART50)?;
    let weights = read_hf_weights(dir, |_| false)?;
    let tensors = our_tensors(dir, weights, &config, tokenizer.ids())?;
    let model = build_filled(dir, config, tensors, Some(&HF_NAMES))?;
    Ok((model, Vocab::from_fairseq(tokenizer)))
}

/// Refuses mBART-cc25's tokenizer (`MBartTokenizer`, `MBartTokenizerFast`), whose sources put
/// the language code last and whose decoder starts from the target code.
fn check_tokenizer_class(dir: &Path) -> Result<()> {
    let path = dir.join("tokenizer_config.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let json: serde_json::Value = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&path, format!("not valid JSON: {e}")))?;
    match json["tokenizer_class"].as_str() {
        Some(class @ ("MBartTokenizer" | "MBartTokenizerFast")) => Err(ckpt_err(
            &path,
            format!(
                "tokenizer_class {class} (mBART-cc25's order: the language code after the \
                 source's </s>, the decoder starting from the target code) is not supported; \
                 mBART-50's MBart50Tokenizer is"
            ),
        )),
        _ => Ok(()),
    }
}

/// The checkpoint's tensors named as [`HF_NAMES`] reads them, in our ids: the shared table as
/// [`super::hf_seq2seq::in_our_ids`] gives it, each position table without its first two
/// rows, the logit bias reordered (BART's too).
pub(super) fn our_tensors(
    dir: &Path,
    weights: TensorMap,
    config: &ModelConfig,
    ids: &IdMap,
) -> Result<TensorMap> {
    let bad = |reason: String| ckpt_err(dir, reason);
    let mut tensors = super::hf_seq2seq::in_our_ids(dir, weights, config, ids)?;
    let (d, rows) = (config.d_model, config.max_len);
    for (theirs, ours) in [
        ("encoder.embed_positions.weight", "embedding.positions"),
        ("decoder.embed_positions.weight", "embedding.target_positions"),
    ] {
        let (shape, values) = tensors
            .remove(theirs)
            .ok_or_else(|| bad(format!("no {theirs} (the stack's learned positions)")))?;
        if shape != [rows + POSITION_OFFSET, d] {
            return Err(bad(format!(
                "{theirs} has shape {shape:?}, the config needs [{}, {d}] \
                 (max_position_embeddings + 2)",
                rows + POSITION_OFFSET
            )));
        }
        tensors.insert(
            ours.into(),
            (vec![rows, d], values[POSITION_OFFSET * d..].to_vec()),
        );
    }
    let bias = super::hf_seq2seq::stored_logit_bias(&mut tensors, ids).map_err(bad)?;
    tensors.insert("final_logits_bias".into(), (vec![bias.len()], bias));
    Ok(tensors)
}

/// Whether `dir` holds a Hugging Face mBART model (`model_type` `mbart`).
pub fn is_mbart_dir(dir: &Path) -> bool {
    super::model_type_of(dir).as_deref() == Some("mbart")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Activation;

    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> std::result::Result<ModelConfig, String> {
        let flags = serde_json::json!({
            "normalize_before": true, "add_final_layer_norm": true, "normalize_embedding": true
        });
        super::super::hf_seq2seq::test_config("mbart", flags, &MBART, edit)
    }

    #[test]
    fn mbart_configs_become_ours_and_the_rest_is_refused_by_name() {
        let c = config(|_| {}).unwrap();
        assert_eq!(
            (c.vocab_size, c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers),
            (102, 16, 4, 32, 2, 1)
        );
        assert_eq!((c.activation, c.positions), (Activation::GeluErf, Positions::Learned));
        assert!(c.embedding_norm && c.target_positions && c.output_bias && c.tie_embeddings);
        assert!(!c.scale_embeddings, "MBartConfig's default");
        assert_eq!((c.norm, c.max_len), (NormPlacement::PreLn, 64));
        assert!(config(|j| j["scale_embedding"] = true.into()).unwrap().scale_embeddings);
        for (edit, wanted) in [
            (("decoder_attention_heads", serde_json::json!(2)), "encoder_attention_heads 4"),
            (("decoder_start_token_id", serde_json::json!(250004)), "decoder_start_token_id"),
            (("activation_function", serde_json::json!("mish")), "\"mish\""),
            (("normalize_before", serde_json::json!(false)), "normalize_before false"),
            (("add_final_layer_norm", serde_json::json!(false)), "add_final_layer_norm"),
            (("static_position_embeddings", serde_json::json!(true)), "static_position"),
            (("add_bias_logits", serde_json::json!(true)), "add_bias_logits true"),
        ] {
            let e = config(|j| j[edit.0] = edit.1.clone()).unwrap_err();
            assert!(e.contains(wanted), "{}: {e}", edit.0);
        }
    }
}
