//! A pretrained decoder saved in this crate's directory format (`config.json` of
//! [`ModelConfig`](crate::model::ModelConfig), float32 `model.safetensors`), as `transformer
//! prune` writes a pruned Llama/GPT-2 directory or GGUF file: the weights are ours, the
//! tokenizer stays the model's own. Beside the weights:
//!
//! | file | what |
//! |---|---|
//! | `pretrained.json` | `{"tokenizer": "hugging-face", "family": …, "eos_token_id": …}` or `{"tokenizer": "gguf"}` |
//! | `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`) | a Hugging Face model's tokenizer and chat template, copied |
//! | `tokenizer.gguf` | a GGUF model's metadata (tokenizer, chat template), no tensors |
//!
//! Without `pretrained.json` the directory is `train-lm`'s, with this crate's byte-level BPE.

use super::chat::{hf_chat_template, ChatTemplate};
use super::generate::ModelSource;
use crate::error::{Error, Result};
use crate::model::families;
use crate::store::gguf::GgufFile;
use crate::store::{ckpt_err, gguf_write, read_file, CONFIG_FILE, TOKENIZER_FILE, VOCAB_FILE};
use crate::text::decoder_tokenizer::DecoderTokenizer;
use crate::text::gguf_tokenizer::GgufTokenizer;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where the tokenizer of a saved pretrained model came from.
pub const PRETRAINED_FILE: &str = "pretrained.json";
/// A GGUF model's metadata without its tensors.
pub const TOKENIZER_GGUF_FILE: &str = "tokenizer.gguf";
/// A Hugging Face model's tokenizer settings (its chat template among them).
const HF_TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// A Hugging Face model's chat template as a file of its own.
const HF_CHAT_TEMPLATE: &str = "chat_template.jinja";

/// What `pretrained.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tokenizer", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Pretrained {
    /// A Hugging Face `tokenizer.json`, of a model of this family (its default chat template),
    /// with this end-of-sequence id.
    HuggingFace {
        /// The family's name in `crate::model::families`.
        family: String,
        /// The model's end-of-sequence id.
        eos_token_id: Option<u32>,
    },
    /// The tokenizer in `tokenizer.gguf`.
    Gguf,
}

/// The files to save beside a model's weights (name, bytes) so that the directory loads with
/// the tokenizer and chat template of the model of `source` loaded from `path` (a model
/// directory of any kind, or a GGUF file).
pub fn tokenizer_files(path: &Path, source: ModelSource) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let json = |p: &Pretrained| serde_json::to_vec_pretty(p).expect("serialises");
    if path.is_file() {
        let file = GgufFile::open(path)?;
        files.push((
            TOKENIZER_GGUF_FILE.to_string(),
            gguf_write::metadata_only(file.metadata()),
        ));
        files.push((PRETRAINED_FILE.to_string(), json(&Pretrained::Gguf)));
        return Ok(files);
    }
    let copied = [
        VOCAB_FILE,
        TOKENIZER_FILE,
        HF_TOKENIZER_CONFIG,
        HF_CHAT_TEMPLATE,
        PRETRAINED_FILE,
        TOKENIZER_GGUF_FILE,
    ];
    for name in copied {
        let from = path.join(name);
        if from.is_file() {
            files.push((name.to_string(), read_file(&from)?));
        }
    }
    let hf_config = path.join(CONFIG_FILE);
    if let (ModelSource::HuggingFace(family), false) =
        (source, path.join(PRETRAINED_FILE).is_file())
    {
        // A Hugging Face directory: its end-of-sequence id is in its config.json.
        let config: serde_json::Value = serde_json::from_slice(&read_file(&hf_config)?)
            .map_err(|e| ckpt_err(&hf_config, format!("invalid JSON: {e}")))?;
        let p = Pretrained::HuggingFace {
            family: family.to_string(),
            eos_token_id: super::generate::hf_eos(&config),
        };
        files.push((PRETRAINED_FILE.to_string(), json(&p)));
    }
    Ok(files)
}

/// The tokenizer, its source and chat template of a directory in this crate's format holding a
/// pretrained model (`pretrained.json`); `None` for a `train-lm` directory.
pub fn load_pretrained_tokenizer(
    dir: &Path,
) -> Result<Option<(DecoderTokenizer, ModelSource, Option<ChatTemplate>)>> {
    let path = dir.join(PRETRAINED_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let pretrained: Pretrained = serde_json::from_slice(&read_file(&path)?)
        .map_err(|e| ckpt_err(&path, format!("invalid {PRETRAINED_FILE}: {e}")))?;
    match pretrained {
        Pretrained::HuggingFace {
            family,
            eos_token_id,
        } => {
            let fam = families::by_name(&family).ok_or_else(|| {
                ckpt_err(
                    &path,
                    format!("family {family:?} is not one this build knows"),
                )
            })?;
            let tok = DecoderTokenizer::hugging_face(&dir.join(TOKENIZER_FILE), eos_token_id)?;
            let chat = hf_chat_template(dir)?.or_else(|| {
                Some(ChatTemplate {
                    template: fam.chat_template?.to_string(),
                    bos: String::new(),
                    eos: String::new(),
                })
            });
            Ok(Some((tok, ModelSource::HuggingFace(fam.name), chat)))
        }
        Pretrained::Gguf => {
            let gguf_path = dir.join(TOKENIZER_GGUF_FILE);
            if !gguf_path.is_file() {
                return Err(Error::Checkpoint {
                    path: gguf_path,
                    reason: format!("missing: {PRETRAINED_FILE} says the tokenizer is here"),
                });
            }
            let file = GgufFile::open(&gguf_path)?;
            let tokenizer = GgufTokenizer::from_gguf(&file)?;
            let chat = super::generate::gguf_chat(&tokenizer);
            Ok(Some((
                DecoderTokenizer::Gguf(Box::new(tokenizer)),
                ModelSource::Gguf,
                chat,
            )))
        }
    }
}
