//! The tokenizers of fairseq's multilingual translation models, NLLB-200 and M2M100
//! (transformers' `NllbTokenizer`, `M2M100Tokenizer`): a SentencePiece model
//! (`sentencepiece.bpe.model`) cuts the text into pieces, a fairseq dictionary numbers them, and
//! one token per language names the source (before the text) and the target (forced as the
//! decoder's first output).
//!
//! The dictionary, by what the directory holds:
//! - `vocab.json` (M2M100): piece -> id, then the language tokens `__xx__` numbered after it
//!   (`language_codes` `m2m100` or `wmt21` in `tokenizer_config.json`);
//! - `tokenizer.json` (NLLB as published): its model's `vocab` (piece -> id), and its added
//!   special tokens besides `<s>`, `<pad>`, `</s>`, `<unk>` and `<mask>` are the language codes;
//! - neither (NLLB from its SentencePiece file alone): fairseq's offset, `<s>` 0, `<pad>` 1,
//!   `</s>` 2, `<unk>` 3 and the model's piece `k` at `k + 1`, then NLLB's 202 codes.
//!
//! A source is `[source code] pieces </s>` (the searches append `</s>`); the decoder starts
//! from `</s>` and its first output is the target code. Ids are mapped onto ours by
//! [`IdMap`] (the decoder's start `</s>` is our BOS, a copy of our EOS). Decoding skips the
//! special tokens and the language codes. Text never injects a special or language token:
//! a code written in the text is cut into pieces like any word.

use super::fairseq_codes;
use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::{BOS, EOS, PAD, UNK};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// The SentencePiece model of a fairseq directory.
pub const SPM_FILE: &str = "sentencepiece.bpe.model";

/// How the directory numbers its tokens (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dictionary {
    /// `vocab.json` and `__xx__` codes after it.
    M2m100,
    /// `tokenizer.json`, or fairseq's offset over the SentencePiece ids and NLLB's codes.
    Nllb,
}

/// A fairseq model's tokenizer in our ids.
pub struct FairseqTokenizer {
    spm: SentencePiece,
    dictionary: Dictionary,
    /// Piece -> their id.
    ids_by_piece: HashMap<String, u32>,
    /// Their id of `<unk>`.
    unk: u32,
    /// Language code (as users write it: `eng_Latn`, `en`) -> our id of its token.
    languages: Vec<(String, u32)>,
    /// Our id -> piece text (empty for ids nothing names).
    pieces: Vec<String>,
    /// Our id -> whether decoding skips it (specials, language codes, unnamed ids).
    skipped: Vec<bool>,
    ids: IdMap,
}

impl std::fmt::Debug for FairseqTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairseqTokenizer")
            .field("dictionary", &self.dictionary)
            .field("pieces", &self.pieces.len())
            .field("languages", &self.languages.len())
            .finish_non_exhaustive()
    }
}

/// The specials of fairseq's dictionary, which decoding skips.
pub(crate) const SPECIALS: [&str; 5] = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"];

impl FairseqTokenizer {
    /// Reads the tokenizer of `dir` for a model of `vocab_size` ids whose EOS (also the
    /// decoder's start) is `eos`; `codes` are the family's language codes, numbered after the
    /// pieces where the directory has only its SentencePiece model ([`fairseq_codes::NLLB`],
    /// [`fairseq_codes::MBART50`]). Errors name the file and the problem.
    pub fn load(
        dir: &Path,
        vocab_size: usize,
        eos: u32,
        codes: &'static [&'static str],
    ) -> Result<FairseqTokenizer> {
        let spm = SentencePiece::load(&dir.join(SPM_FILE))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path, true)?;
        refuse_legacy(config.as_ref(), &config_path)?;
        let (kind, ids_by_piece, codes) = if dir.join("vocab.json").exists() {
            m2m100_dictionary(dir, config.as_ref())?
        } else if dir.join("tokenizer.json").exists() {
            let path = dir.join("tokenizer.json");
            tokenizer_json_dictionary(&read_json(&path, false)?.unwrap_or_default(), &path)?
        } else {
            offset_dictionary(&spm, codes)
        };
        let unk = *ids_by_piece.get("<unk>").ok_or_else(|| {
            Error::Input(format!("{}: the dictionary has no <unk>", dir.display()))
        })?;
        let dictionary = FairseqDictionary {
            kind,
            ids_by_piece,
            codes,
        };
        FairseqTokenizer::of(spm, dictionary, vocab_size, eos, unk, dir)
    }

    /// The tokenizer of `spm` and `dictionary` for a model of `vocab_size` ids whose EOS (also
    /// the decoder's start) is `eos` and unknown token `unk`; errors name `origin` (where the
    /// dictionary came from) and the token.
    pub(crate) fn of(
        spm: SentencePiece,
        dictionary: FairseqDictionary,
        vocab_size: usize,
        eos: u32,
        unk: u32,
        origin: &Path,
    ) -> Result<FairseqTokenizer> {
        let FairseqDictionary {
            kind,
            ids_by_piece,
            codes,
        } = dictionary;
        let bad = |reason: String| Error::Input(format!("{}: {reason}", origin.display()));
        let mut by_id: Vec<Option<&str>> = vec![None; vocab_size];
        for (piece, &id) in ids_by_piece.iter().chain(codes.iter().map(|(_, t, id)| (t, id))) {
            let slot = by_id.get_mut(id as usize).ok_or_else(|| {
                bad(format!(
                    "token {piece:?} has id {id}, past the model's vocab_size {vocab_size}"
                ))
            })?;
            if let Some(first) = slot.replace(piece) {
                if first != piece {
                    return Err(bad(format!("tokens {first:?} and {piece:?} share id {id}")));
                }
            }
        }
        let ids = IdMap::new(vocab_size, eos, eos, unk).map_err(bad)?;
        let code_ids: Vec<u32> = codes.iter().map(|&(_, _, id)| ids.ours(id)).collect();
        let mut pieces = Vec::with_capacity(ids.len_ours());
        let mut skipped = Vec::with_capacity(ids.len_ours());
        for ours in 0..ids.len_ours() as u32 {
            let text = ids.theirs(ours).and_then(|t| by_id[t as usize]);
            let special =
                [PAD, BOS, EOS, UNK].contains(&ours) || text.is_none_or(|t| SPECIALS.contains(&t));
            pieces.push(text.unwrap_or_default().to_string());
            skipped.push(special);
        }
        for &code in &code_ids {
            skipped[code as usize] = true;
        }
        let languages = codes
            .iter()
            .zip(&code_ids)
            .map(|((code, _, _), &ours)| (code.clone(), ours))
            .collect();
        Ok(FairseqTokenizer {
            spm,
            dictionary: kind,
            ids_by_piece,
            unk,
            languages,
            pieces,
            skipped,
            ids,
        })
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        &self.ids
    }

    /// How the directory numbers its tokens.
    pub fn dictionary(&self) -> Dictionary {
        self.dictionary
    }

    /// Our ids of the pieces of `text`: no language code, no EOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.spm
            .encode(text)
            .iter()
            .map(|(piece, _)| self.ids.ours(*self.ids_by_piece.get(piece).unwrap_or(&self.unk)))
            .collect()
    }

    /// Our id of the token of language `code` (`eng_Latn`; for M2M100 `en` or `__en__`).
    pub fn language(&self, code: &str) -> Option<u32> {
        let bare = code
            .strip_prefix("__")
            .and_then(|c| c.strip_suffix("__"))
            .filter(|_| self.dictionary == Dictionary::M2m100)
            .unwrap_or(code);
        self.languages
            .iter()
            .find(|(c, _)| c == bare)
            .map(|&(_, id)| id)
    }

    /// [`language`](Self::language), or an error naming `code` and a few codes the model knows.
    pub fn language_or_error(&self, code: &str) -> std::result::Result<u32, String> {
        self.language(code).ok_or_else(|| {
            let shown: Vec<&str> = self.language_codes().take(8).collect();
            format!(
                "language {code:?} is not one of the model's {} language codes ({}{})",
                self.languages.len(),
                shown.join(", "),
                if self.languages.len() > 8 { ", ..." } else { "" }
            )
        })
    }

    /// The language codes, as [`language`](Self::language) takes them, in token order.
    pub fn language_codes(&self) -> impl Iterator<Item = &str> {
        self.languages.iter().map(|(c, _)| c.as_str())
    }

    /// The text of our ids, special and language tokens skipped (transformers'
    /// `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        let pieces: Vec<&str> = ids
            .iter()
            .filter(|&&id| !self.skipped.get(id as usize).copied().unwrap_or(true))
            .map(|&id| self.pieces[id as usize].as_str())
            .collect();
        self.spm.decode_pieces(&pieces)
    }

    /// Our vocabulary size.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Never true: the vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The token text of our id `id` (empty for ids nothing names).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }
}

/// (code as users write it, its token's text, their id) of each language.
pub(crate) type Codes = Vec<(String, String, u32)>;

/// How a directory numbers its tokens: the pieces and specials, and the language tokens.
pub(crate) struct FairseqDictionary {
    /// Which codes users write (`eng_Latn`, or M2M100's `en` for `__en__`).
    pub kind: Dictionary,
    /// Piece (and special token) -> their id.
    pub ids_by_piece: HashMap<String, u32>,
    /// The language tokens.
    pub codes: Codes,
}

/// Refuses `tokenizer_config.json`'s `legacy_behaviour: true` (at `path`).
pub(crate) fn refuse_legacy(config: Option<&serde_json::Value>, path: &Path) -> Result<()> {
    if config.and_then(|c| c["legacy_behaviour"].as_bool()) == Some(true) {
        return Err(Error::Input(format!(
            "{}: legacy_behaviour true (the language code after the source's </s>) is not \
             supported",
            path.display()
        )));
    }
    Ok(())
}

/// A JSON file, `None` when it is absent and `optional`.
pub(crate) fn read_json(path: &Path, optional: bool) -> Result<Option<serde_json::Value>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Input(format!("{}: cannot read: {e}", path.display()))),
    };
    serde_json::from_slice(crate::store::strip_bom(&bytes))
        .map(Some)
        .map_err(|e| Error::Input(format!("{}: not valid JSON: {e}", path.display())))
}

/// M2M100's `vocab.json` and its `__xx__` codes after it.
fn m2m100_dictionary(
    dir: &Path,
    config: Option<&serde_json::Value>,
) -> Result<(Dictionary, HashMap<String, u32>, Codes)> {
    let ids_by_piece = super::pretrained::read_piece_ids(&dir.join("vocab.json"))?;
    let set = config
        .and_then(|c| c.get("language_codes"))
        .and_then(|v| v.as_str())
        .unwrap_or("m2m100");
    let list = match set {
        "m2m100" => fairseq_codes::M2M100,
        "wmt21" => fairseq_codes::WMT21,
        other => {
            return Err(Error::Input(format!(
                "{}: language_codes {other:?} is not supported (m2m100 or wmt21)",
                dir.join("tokenizer_config.json").display()
            )))
        }
    };
    let first = ids_by_piece.len() as u32;
    let codes = (list.iter().zip(first..))
        .map(|(code, id)| (code.to_string(), format!("__{code}__"), id))
        .collect();
    Ok((Dictionary::M2m100, ids_by_piece, codes))
}

/// NLLB's `tokenizer.json` (`json`, read from `path`): the model's vocabulary and the added
/// language tokens.
pub(crate) fn tokenizer_json_dictionary(
    json: &serde_json::Value,
    path: &Path,
) -> Result<(Dictionary, HashMap<String, u32>, Codes)> {
    let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
    let model = &json["model"];
    let as_id = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let mut ids_by_piece = HashMap::new();
    match model["type"].as_str() {
        Some("BPE") | Some("WordPiece") | Some("WordLevel") => {
            let vocab = model["vocab"]
                .as_object()
                .ok_or_else(|| bad("model.vocab is not a piece -> id object".into()))?;
            for (piece, id) in vocab {
                let id = as_id(id).ok_or_else(|| bad(format!("piece {piece:?}: bad id {id}")))?;
                ids_by_piece.insert(piece.clone(), id);
            }
        }
        Some("Unigram") => {
            let vocab = model["vocab"]
                .as_array()
                .ok_or_else(|| bad("model.vocab is not a list of [piece, score]".into()))?;
            for (id, entry) in vocab.iter().enumerate() {
                let piece = entry[0]
                    .as_str()
                    .ok_or_else(|| bad(format!("model.vocab entry {id} has no piece")))?;
                ids_by_piece.insert(piece.to_string(), id as u32);
            }
        }
        other => return Err(bad(format!("model type {other:?} is not supported"))),
    }
    let mut codes = Vec::new();
    for token in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(content), Some(id)) = (token["content"].as_str(), as_id(&token["id"])) else {
            return Err(bad(format!("an added token without content or id: {token}")));
        };
        if SPECIALS.contains(&content) {
            ids_by_piece.insert(content.to_string(), id);
        } else if token["special"].as_bool() == Some(true) {
            codes.push((content.to_string(), content.to_string(), id));
        }
    }
    Ok((Dictionary::Nllb, ids_by_piece, codes))
}

/// fairseq's dictionary over a SentencePiece model (`<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3,
/// piece `k` at `k + 1` past the model's three specials), the family's `list` of codes after it
/// (then `<mask>`, which decoding skips unnamed).
fn offset_dictionary(
    spm: &SentencePiece,
    list: &[&str],
) -> (Dictionary, HashMap<String, u32>, Codes) {
    let mut ids_by_piece: HashMap<String, u32> = SPECIALS[..4]
        .iter()
        .zip(0..)
        .map(|(p, id)| (p.to_string(), id))
        .collect();
    for k in 3..spm.len() as u32 {
        if let Some(piece) = spm.id_to_piece(k) {
            ids_by_piece.entry(piece.to_string()).or_insert(k + 1);
        }
    }
    let first = spm.len() as u32 + 1;
    let codes: Codes = (list.iter().zip(first..))
        .map(|(code, id)| (code.to_string(), code.to_string(), id))
        .collect();
    (Dictionary::Nllb, ids_by_piece, codes)
}
