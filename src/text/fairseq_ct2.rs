//! The tokenizer of an NLLB-200 or M2M100 model converted by CTranslate2
//! (`ct2-transformers-converter`): fairseq's tokenizer ([`FairseqTokenizer`]) whose dictionary
//! is the converted vocabulary. CTranslate2 itself takes tokens; its users tokenize with the
//! Hugging Face tokenizer (`src_lang` code, the pieces of `sentencepiece.bpe.model`, `</s>`),
//! force the target code with `target_prefix` and drop it from the output. The converter
//! writes the tokenizer's tokens in id order (`shared_vocabulary.json`), its language tokens
//! among them, then `madeupword` rows up to the model's size; the SentencePiece model is the
//! one `--copy_files sentencepiece.bpe.model` copies beside it.
//!
//! The language tokens are read from the vocabulary: NLLB's codes as written (`eng_Latn`,
//! [`fairseq_codes::NLLB`]) or M2M100's `__en__` ([`fairseq_codes::M2M100`]). Where the
//! Hugging Face tokenizer was copied too, `tokenizer.json`'s added special tokens must sit at
//! the same ids in the vocabulary (they name any code the lists do not know, as a fine-tuned
//! model's added language), and `tokenizer_config.json`'s `legacy_behaviour: true` is refused
//! as for the Hugging Face directory.

use super::fairseq::{self, Codes, Dictionary, FairseqDictionary, FairseqTokenizer, SPECIALS};
use super::fairseq_codes;
use super::sentencepiece::SentencePiece;
use crate::error::{Error, Result};
use crate::store::package::Files;
use std::collections::HashMap;
use std::path::Path;

/// The SentencePiece model of a converted NLLB / M2M100 directory.
pub const SPM_FILE: &str = fairseq::SPM_FILE;

/// The tokenizer of the converted model in `files` with its SentencePiece model `spm` (read
/// from [`SPM_FILE`]) and vocabulary `pieces` (read from `vocab_path`), whose `eos` is also the
/// decoder's start and whose unknown token is `unk`; errors name the file and the token.
pub fn load(
    files: &Files,
    spm: SentencePiece,
    vocab_path: &Path,
    pieces: &[String],
    eos: u32,
    unk: u32,
) -> Result<FairseqTokenizer> {
    let json = |name: &str| -> Result<Option<serde_json::Value>> {
        if !files.has(name) {
            return Ok(None);
        }
        let path = files.path(name);
        serde_json::from_slice(crate::store::strip_bom(&files.read(name)?))
            .map(Some)
            .map_err(|e| Error::Input(format!("{}: not valid JSON: {e}", path.display())))
    };
    let config = json("tokenizer_config.json")?;
    fairseq::refuse_legacy(config.as_ref(), &files.path("tokenizer_config.json"))?;
    let (kind, mut codes) = vocabulary_codes(pieces);
    if let Some(tokenizer) = json("tokenizer.json")? {
        let path = files.path("tokenizer.json");
        let (_, _, copied) = fairseq::tokenizer_json_dictionary(&tokenizer, &path)?;
        for (code, token, id) in copied {
            match pieces.get(id as usize) {
                Some(p) if *p == token => {}
                held => {
                    return Err(Error::Input(format!(
                        "{}: language token {token:?} has id {id}, {} holds {} there: they do \
                         not belong together",
                        path.display(),
                        vocab_path.display(),
                        held.map_or_else(|| "nothing".to_string(), |p| format!("{p:?}")),
                    )))
                }
            }
            if !codes.iter().any(|&(_, _, known)| known == id) {
                codes.push((code, token, id));
            }
        }
        codes.sort_by_key(|&(_, _, id)| id);
    }
    if codes.is_empty() {
        return Err(Error::Input(format!(
            "{}: no language tokens (NLLB's such as eng_Latn, M2M100's such as __en__): not the \
             vocabulary of a multilingual model for {SPM_FILE}",
            vocab_path.display()
        )));
    }
    let mut ids_by_piece = HashMap::with_capacity(pieces.len());
    for (id, piece) in pieces.iter().enumerate() {
        if !codes.iter().any(|&(_, _, code)| code as usize == id) {
            // The first of repeated pieces, as CTranslate2's vocabulary map keeps it.
            ids_by_piece.entry(piece.clone()).or_insert(id as u32);
        }
    }
    let dictionary = FairseqDictionary {
        kind,
        ids_by_piece,
        codes,
    };
    FairseqTokenizer::of(spm, dictionary, pieces.len(), eos, unk, vocab_path)
}

/// The language tokens of a vocabulary (see the module docs), and which codes users write:
/// M2M100's (`en` for `__en__`) when it holds any, else NLLB's.
fn vocabulary_codes(pieces: &[String]) -> (Dictionary, Codes) {
    let m2m100: Codes = (pieces.iter().zip(0..))
        .filter_map(|(p, id)| {
            let code = p.strip_prefix("__")?.strip_suffix("__")?;
            fairseq_codes::M2M100
                .contains(&code)
                .then(|| (code.to_string(), p.clone(), id))
        })
        .collect();
    if !m2m100.is_empty() {
        return (Dictionary::M2m100, m2m100);
    }
    let nllb = (pieces.iter().zip(0..))
        .filter(|(p, _)| fairseq_codes::NLLB.contains(&p.as_str()) && !SPECIALS.contains(&p.as_str()))
        .map(|(p, id)| (p.clone(), p.clone(), id))
        .collect();
    (Dictionary::Nllb, nllb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn codes_are_read_from_the_vocabulary() {
        let nllb = pieces(&["<s>", "<pad>", "</s>", "<unk>", "▁a", "eng_Latn", "fra_Latn", "<mask>"]);
        let (kind, codes) = vocabulary_codes(&nllb);
        assert_eq!(kind, Dictionary::Nllb);
        assert_eq!(
            codes,
            vec![
                ("eng_Latn".to_string(), "eng_Latn".to_string(), 5),
                ("fra_Latn".to_string(), "fra_Latn".to_string(), 6)
            ]
        );
        let m2m = pieces(&["<s>", "<pad>", "</s>", "<unk>", "▁a", "__de__", "__xx__", "__en__", "madeupword0"]);
        let (kind, codes) = vocabulary_codes(&m2m);
        assert_eq!(kind, Dictionary::M2m100);
        let found: Vec<(&str, u32)> = codes.iter().map(|(c, _, id)| (c.as_str(), *id)).collect();
        assert_eq!(found, [("de", 5), ("en", 7)]);
        assert!(vocabulary_codes(&pieces(&["<s>", "▁a"])).1.is_empty());
    }
}
