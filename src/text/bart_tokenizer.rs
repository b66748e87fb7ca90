//! BART's tokenizer (transformers' `BartTokenizer`: GPT-2's byte-level BPE with fairseq's
//! specials, `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, `<mask>` last), read from the directory's
//! `tokenizer.json` by the `tokenizers` crate. A source is `<s> pieces </s>` (the translator
//! puts `<s>` first, the searches append `</s>`); the decoder starts from `</s>` and the config's
//! `forced_bos_token_id` (`<s>`) is forced as the first output. Decoding skips the special
//! tokens, as `decode(ids, skip_special_tokens=True)`.

use super::id_map::IdMap;
use crate::error::{Error, Result};
use std::path::Path;

/// The file the tokenizer is read from.
pub const TOKENIZER_JSON: &str = "tokenizer.json";

/// A BART model's tokenizer in our ids.
pub struct BartTokenizer {
    tokenizer: tokenizers::Tokenizer,
    ids: IdMap,
    /// Their id of `<s>`.
    bos: u32,
    /// Our id -> token text (empty for ids nothing names).
    pieces: Vec<String>,
    /// Their id -> whether decoding skips it (the tokenizer's special tokens).
    special: Vec<bool>,
}

impl std::fmt::Debug for BartTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BartTokenizer")
            .field("pieces", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

impl BartTokenizer {
    /// Reads `tokenizer.json` of `dir` for a model of `vocab_size` ids whose EOS (also the
    /// decoder's start) is `eos`. Errors name the file and the problem.
    pub fn load(dir: &Path, vocab_size: usize, eos: u32) -> Result<BartTokenizer> {
        let path = dir.join(TOKENIZER_JSON);
        let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let tokenizer = super::vocab::parse_tokenizer(&bytes, &path)?;
        let id_of = |token: &str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| bad(format!("no {token} token")))
        };
        let (bos, unk) = (id_of("<s>")?, id_of("<unk>")?);
        let size = tokenizer.get_vocab_size(true);
        if size > vocab_size {
            return Err(bad(format!(
                "{size} tokens, more than the model's vocab_size {vocab_size}"
            )));
        }
        let ids = IdMap::new(vocab_size, eos, eos, unk).map_err(bad)?;
        let mut special = vec![false; vocab_size];
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            if token.special {
                if let Some(s) = special.get_mut(id as usize) {
                    *s = true;
                }
            }
        }
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| {
                (ids.theirs(ours))
                    .and_then(|t| tokenizer.id_to_token(t))
                    .unwrap_or_default()
            })
            .collect();
        Ok(BartTokenizer {
            tokenizer,
            ids,
            bos,
            pieces,
            special,
        })
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        &self.ids
    }

    /// Our id of `<s>` (every source's first token, and the forced first output).
    pub fn bos(&self) -> u32 {
        self.ids.ours(self.bos)
    }

    /// Our ids of the pieces of `text`: no `<s>`, no `</s>`. A text the tokenizer cannot
    /// encode (it never fails on UTF-8 text) gives no pieces.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.tokenizer.encode(text, false) {
            Ok(encoding) => (encoding.get_ids().iter()).map(|&t| self.ids.ours(t)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The text of our ids, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let theirs: Vec<u32> = (ids.iter())
            .filter_map(|&id| self.ids.theirs(id))
            .filter(|&t| !self.special.get(t as usize).copied().unwrap_or(true))
            .collect();
        self.tokenizer.decode(&theirs, true).unwrap_or_default()
    }

    /// Our vocabulary size.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Never true: the vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The token text of our id `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }
}
