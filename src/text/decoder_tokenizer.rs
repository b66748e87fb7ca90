//! The tokenizer of a decoder-only model, whichever way it was stored: this crate's byte-level
//! BPE (`train-lm`'s `tokenizer.json`), a Hugging Face `tokenizer.json`, or a GGUF file's
//! metadata. One interface for the generation and perplexity pipelines: a document's ids, text
//! back (also streamed, whole characters only), the tokens that end a generation, the chat
//! template.

use super::bpe::Bpe;
use super::gguf_tokenizer::GgufTokenizer;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A decoder's tokenizer (see the module docs).
pub enum DecoderTokenizer {
    /// This crate's byte-level BPE: a document starts with `<|endoftext|>`.
    Ours(Box<Bpe>),
    /// A Hugging Face `tokenizer.json`, applied as transformers applies it (its post-processor
    /// adds whatever special tokens it adds), with the model's end-of-sequence id.
    HuggingFace {
        /// The parsed `tokenizer.json`.
        inner: Box<tokenizers::Tokenizer>,
        /// The model's end-of-sequence id (`eos_token_id` of its `config.json`).
        eos: Option<u32>,
        /// The `tokenizer.json` it was read from, named in errors.
        path: PathBuf,
    },
    /// The byte-level BPE in a GGUF file's metadata.
    Gguf(Box<GgufTokenizer>),
}

impl DecoderTokenizer {
    /// Loads a Hugging Face `tokenizer.json`; `eos` is the model's end-of-sequence id.
    pub fn hugging_face(path: &Path, eos: Option<u32>) -> Result<DecoderTokenizer> {
        // The checked parser: the tokenizers crate panics on some damaged files.
        let inner = super::vocab::parse_tokenizer(&crate::store::read_file(path)?, path)?;
        Ok(DecoderTokenizer::HuggingFace {
            inner: Box::new(inner),
            eos,
            path: path.to_path_buf(),
        })
    }

    /// Tokens of the vocabulary.
    pub fn vocab_size(&self) -> usize {
        match self {
            DecoderTokenizer::Ours(b) => b.vocab_size(),
            DecoderTokenizer::HuggingFace { inner, .. } => inner.get_vocab_size(true),
            DecoderTokenizer::Gguf(t) => t.vocab_size(),
        }
    }

    /// The ids a document (a prompt, a text to score) is fed as: ours `<|endoftext|>` then the
    /// text; Hugging Face's as its post-processor has it; GGUF's with BOS first when the file
    /// says to add one. Special tokens written in the text are recognised (Hugging Face, GGUF).
    pub fn document(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            DecoderTokenizer::Ours(b) => {
                let mut ids = vec![b.eot()];
                ids.extend(b.encode(text)?);
                Ok(ids)
            }
            DecoderTokenizer::HuggingFace { inner, path, .. } => {
                let enc = inner.encode(text, true).map_err(|e| {
                    Error::Input(format!("{}: cannot tokenize: {e}", path.display()))
                })?;
                Ok(enc.get_ids().to_vec())
            }
            DecoderTokenizer::Gguf(t) => {
                let mut ids: Vec<u32> = t.bos_id().filter(|_| t.add_bos()).into_iter().collect();
                ids.extend(t.encode(text)?);
                Ok(ids)
            }
        }
    }

    /// The ids of `text` with nothing added (special tokens written in it recognised): a
    /// rendered chat prompt, which carries its own special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            DecoderTokenizer::Ours(b) => b.encode(text),
            DecoderTokenizer::HuggingFace { inner, path, .. } => {
                let enc = inner.encode(text, false).map_err(|e| {
                    Error::Input(format!("{}: cannot tokenize: {e}", path.display()))
                })?;
                Ok(enc.get_ids().to_vec())
            }
            DecoderTokenizer::Gguf(t) => t.encode(text),
        }
    }

    /// The text of a token id (special tokens as written), if it is in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            DecoderTokenizer::Ours(b) => b.tokenizer().id_to_token(id),
            DecoderTokenizer::HuggingFace { inner, .. } => inner.id_to_token(id),
            DecoderTokenizer::Gguf(t) => t
                .token_bytes(id)
                .map(|b| String::from_utf8_lossy(b).into_owned()),
        }
    }

    /// The text of `ids`, special tokens rendered as their text; an incomplete UTF-8 character
    /// becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            DecoderTokenizer::Ours(b) => b.decode(ids),
            DecoderTokenizer::HuggingFace { inner, path, .. } => inner
                .decode(ids, false)
                .map_err(|e| Error::Input(format!("{}: cannot decode: {e}", path.display()))),
            DecoderTokenizer::Gguf(t) => t.decode(ids),
        }
    }

    /// The tokens after which a generation stops: none for our models (a sample runs its
    /// length); the end-of-sequence token of the others, and a chat model's end of turn
    /// (`<|im_end|>` of Qwen, `<|eot_id|>` of Llama 3, `<end_of_turn>` of Gemma, `<|end|>` of
    /// Phi-3) when its vocabulary has one.
    pub fn end_tokens(&self) -> Vec<u32> {
        let eos = match self {
            DecoderTokenizer::Ours(_) => return Vec::new(),
            DecoderTokenizer::HuggingFace { eos, .. } => *eos,
            DecoderTokenizer::Gguf(t) => t.eos_id(),
        };
        let mut ends: Vec<u32> = eos.into_iter().collect();
        for turn in ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"] {
            if let Some(id) = self.token_id(turn).filter(|id| !ends.contains(id)) {
                ends.push(id);
            }
        }
        ends
    }

    /// The chat template the model was trained with, when its files carry one.
    pub fn chat_template(&self) -> Option<&str> {
        match self {
            DecoderTokenizer::Gguf(t) => t.chat_template(),
            _ => None,
        }
    }

    /// The id of a token written out, e.g. `<|im_end|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match self {
            DecoderTokenizer::Ours(b) => b.tokenizer().token_to_id(token),
            DecoderTokenizer::HuggingFace { inner, .. } => inner.token_to_id(token),
            DecoderTokenizer::Gguf(t) => t.token_to_id(token),
        }
    }
}

/// Prints decoded text as ids arrive, holding back ids that end inside a UTF-8 character until
/// it is complete (at most 3 ids are held for an invalid sequence, which then prints as U+FFFD).
pub struct StreamDecoder<'a> {
    tokenizer: &'a DecoderTokenizer,
    pending: Vec<u32>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder of `tokenizer`'s ids, holding none yet.
    pub fn new(tokenizer: &'a DecoderTokenizer) -> Self {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending.push(id);
        let text = self.tokenizer.decode(&self.pending)?;
        if text.ends_with('\u{FFFD}') && self.pending.len() < 4 {
            return Ok(String::new());
        }
        self.pending.clear();
        Ok(text)
    }

    /// Whatever is still held back.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.pending)?;
        self.pending.clear();
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tokenizer.json` whose decoder section holds a raw NUL in a key (found by the
    /// `hf_decoder` fuzz target: the tokenizers crate panicked with "Helper") is refused with
    /// an error naming the file.
    #[test]
    fn a_damaged_decoder_section_is_an_error_not_a_panic() {
        let bpe = Bpe::train(["red apples and green apples"; 8].into_iter(), 270).unwrap();
        let json = String::from_utf8(bpe.to_bytes().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(&good, &json).unwrap();
        assert!(DecoderTokenizer::hugging_face(&good, None).is_ok());
        let key = json
            .rfind("\"add_prefix_space\"")
            .expect("a ByteLevel section");
        let damaged = format!("{}add_pref\0ix{}", &json[..key + 1], &json[key + 9..]);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, damaged).unwrap();
        let err = DecoderTokenizer::hugging_face(&bad, None)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("bad.json"), "{err}");
    }
}
