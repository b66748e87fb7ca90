//! BART (Lewis et al., 2019; `model_type` `bart`, `BartForConditionalGeneration`: the
//! summarisers and paraphrasers fine-tuned from it) as Hugging Face stores it: mBART's layout
//! with the paper's post-LN blocks (no final norms), GELU, each stack's own learned positions
//! (fairseq's offset of 2) and `layernorm_embedding`, embeddings unscaled unless
//! `scale_embedding`, a tied head with `final_logits_bias` (see [`super::mbart`]). Tokens are
//! GPT-2's byte-level BPE with fairseq's specials (`text::bart_tokenizer`): a source is
//! `<s> pieces </s>`, the decoder starts from `</s>`, and `forced_bos_token_id`
//! (`generation_config.json`'s, else `config.json`'s, see [`super::generation_config`]; `<s>`
//! in the published models) is forced as the first output.

use super::hf_seq2seq::{BartDefaults, DecoderStart, HfBartConfig};
use super::{Family, FamilyKind};
use crate::error::Result;
use crate::model::checkpoint::build_filled;
use crate::model::config::{NormPlacement, Positions};
use crate::model::Seq2Seq;
use crate::pipeline::translate::Languages;
use crate::store::{ckpt_err, read_file, read_hf_weights, strip_bom};
use crate::text::bart_tokenizer::BartTokenizer;
use crate::text::vocab::Vocab;
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`]: a translation (sequence-to-sequence) model, loaded by
/// [`load`]; its tensors are named as mBART's.
pub const FAMILY: Family = Family {
    name: "bart",
    kind: FamilyKind::Translation,
    model_types: &["bart"],
    hf_names: super::mbart::HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// What BART computes, and `BartConfig`'s defaults.
const BART: BartDefaults = BartDefaults {
    start: DecoderStart::Eos,
    positions: Positions::Learned,
    activation: "gelu",
    scale_embedding: false,
    norm: NormPlacement::PostLn,
    stack_inputs: true,
};

/// Loads a Hugging Face BART directory (`config.json`, `generation_config.json`,
/// `model.safetensors` or `pytorch_model.bin`, `tokenizer.json`): the model in our ids, its vocabulary, and its own
/// tokens (`<s>` before every source; the forced first output).
pub fn load(dir: &Path) -> Result<(Seq2Seq<f32>, Vocab, Languages)> {
    let config_path = dir.join("config.json");
    let bytes = read_file(&config_path)?;
    let json: serde_json::Value = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&config_path, format!("not a BART config: {e}")))?;
    let hf = HfBartConfig::deserialize(&json)
        .map_err(|e| ckpt_err(&config_path, format!("not a BART config: {e}")))?;
    let config = hf.config(&BART).map_err(|e| ckpt_err(&config_path, e))?;
    let eos = hf.eos().map_err(|e| ckpt_err(&config_path, e))?;
    // generation_config.json's, else config.json's (as transformers 5 reads them).
    let forced = super::generation_config::read(dir, &json, hf.vocab_size)?.forced_bos;
    let tokenizer = BartTokenizer::load(dir, hf.vocab_size, eos)?;
    let languages = Languages {
        source: Some(tokenizer.bos()),
        target: forced.map(|t| tokenizer.ids().ours(t)),
    };
    let weights = read_hf_weights(dir, |_| false)?;
    let tensors = super::mbart::our_tensors(dir, weights, &config, tokenizer.ids())?;
    let model = build_filled(dir, config, tensors, Some(&super::mbart::HF_NAMES))?;
    Ok((model, Vocab::from_bart(tokenizer), languages))
}

/// Whether `dir` holds a Hugging Face BART model (`model_type` `bart`).
pub fn is_bart_dir(dir: &Path) -> bool {
    super::model_type_of(dir).as_deref() == Some("bart")
}
