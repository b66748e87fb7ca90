//! The tokenizer stored in a GGUF file's metadata, computed as llama.cpp computes it
//! ([`super::llama_vocab`]). Only the metadata is read: a vocabulary file without weights
//! loads as well as a model.
//!
//! llama.cpp's keys (`llama-vocab.cpp`):
//! - `tokenizer.ggml.model`: the algorithm: `llama` (SentencePiece: scored pieces, byte
//!   fallback `<0xXX>`, spaces as `▁`), `gpt2` (byte-level BPE with merges), `bert`
//!   (WordPiece) or `gemma4` (BPE with merges on the UTF-8 of the text with its spaces as `▁`,
//!   unknown bytes as `<0xXX>`). Any other is refused by name.
//! - `tokenizer.ggml.tokens`: the vocabulary, id = index. A BPE vocabulary is spelt in GPT-2's
//!   byte-level alphabet (each byte one printable character, a space `Ġ`, a newline `Ċ`).
//! - `tokenizer.ggml.scores` (SentencePiece), `tokenizer.ggml.merges` (BPE: the merge rules,
//!   highest priority first, each `"left right"`).
//! - `tokenizer.ggml.token_type`: per token 1 normal, 2 unknown, 3 control, 4 user-defined,
//!   5 unused, 6 byte. Control tokens (`<|im_start|>`, ...) are matched whole in a text when
//!   special tokens are parsed, user-defined ones always, before any splitting; both decode to
//!   their text's UTF-8.
//! - `tokenizer.ggml.pre`: a BPE vocabulary's pre-tokenizer (see
//!   [`super::llama_vocab::pre_tokenizer`]: `gpt-2`, `llama-bpe`, `qwen2`, `smollm`, `falcon`,
//!   `default` and the names llama.cpp gives them, such as `starcoder`, `command-r`, `mpt`,
//!   `dbrx`; any other is refused by name). A file without one is cut with GPT-2's expression (as this
//!   crate always did; llama.cpp would use its `default`).
//! - `tokenizer.ggml.bos_token_id`, `eos_token_id`, `unknown_token_id`, `seperator_token_id`
//!   (sic), `padding_token_id`; `add_bos_token`, `add_eos_token`, `add_space_prefix`;
//!   `normalizer.lowercase`, `normalizer.strip_accents` (WordPiece); `tokenizer.chat_template`.
//!   Absent, they default as in llama.cpp: SentencePiece BOS 1, EOS 2, unknown 0, BOS added, a
//!   space put before the text; WordPiece `[CLS]` 101, `[SEP]` 102, unknown 100, lowercased
//!   and accents stripped; Llama 3's BPE adds BOS.
//!
//! [`GgufTokenizer::encode`] adds nothing to the text (no BOS) and recognises the special
//! tokens written in it: a chat prompt already holds its special tokens, written by the chat
//! template. [`GgufTokenizer::tokenize`] chooses both. [`GgufTokenizer::decode`] renders special
//! tokens as their text.

use super::llama_vocab::pre_tokenizer::{PreTokenizer, PRE_NAMES};
use super::llama_vocab::special::{self, Fragment, SpecialToken};
use super::llama_vocab::token_type::{BYTE, CONTROL, UNKNOWN, UNUSED, USER_DEFINED};
use super::llama_vocab::wpm::Normalizer;
use super::llama_vocab::{bpe, spm, wpm, PieceHasher, Vocab};
use super::TextError;
use crate::error::{Error, Result};
use crate::store::gguf::{GgufFile, Value};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

/// `tokenizer.ggml.token_type` of a control token.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub const TOKEN_TYPE_CONTROL: i64 = CONTROL;
/// `tokenizer.ggml.token_type` of a user-defined token.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub const TOKEN_TYPE_USER_DEFINED: i64 = USER_DEFINED;
/// The `tokenizer.ggml.model` values understood.
pub const SUPPORTED_MODELS: [&str; 4] = ["llama", "gpt2", "bert", "gemma4"];

/// The algorithm of a vocabulary, with its settings.
enum Algorithm {
    /// SentencePiece (`llama`); `add_space_prefix`: a space is put before the text and after
    /// every special token.
    Spm { add_space_prefix: bool },
    /// Byte-level BPE (`gpt2`); `ignore_merges`: a word that is a token is taken whole.
    Bpe {
        pre: PreTokenizer,
        ignore_merges: bool,
    },
    /// WordPiece (`bert`).
    Wpm { normalizer: Normalizer },
}

/// A tokenizer from GGUF metadata.
pub struct GgufTokenizer {
    vocab: Vocab,
    algorithm: Algorithm,
    model: String,
    /// Special tokens in matching order (longest text first).
    matched: Vec<SpecialToken>,
    /// The bytes each token stands for (a control token's: its text).
    token_bytes: Vec<Vec<u8>>,
    special: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    pre: String,
    chat_template: Option<String>,
    path: PathBuf,
}

/// GPT-2's byte-level alphabet, inverted: the byte each of the 256 characters stands for.
/// Bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` are their own character; the other 68, in byte
/// order, are U+0100 onwards (so a space is `Ġ` U+0120 and a newline `Ċ` U+010A).
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let c = c as u32;
    if c < 0x100 {
        return printable(c).then_some(c as u8);
    }
    (0..=255u32)
        .filter(|&b| !printable(b))
        .nth(c.checked_sub(0x100)? as usize)
        .map(|b| b as u8)
}

/// The bytes a BPE vocabulary entry stands for: each character through the byte-level
/// alphabet, or, for a token not spelt in it, its UTF-8 (as the `tokenizers` ByteLevel decoder
/// does).
pub(crate) fn bytes_of_token(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(byte_of_char)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// The ids of merge rule `m` (`"left right"`), or why it cannot be one: `Err(None)` when it
/// is not two pieces separated by one space, `Err(Some(piece))` for a piece (either, or their
/// join, which `joined` is left holding) outside `ids`.
fn merge_pair(
    ids: &HashMap<Vec<u8>, u32, PieceHasher>,
    m: &str,
    joined: &mut String,
) -> std::result::Result<(u32, u32), Option<String>> {
    let (a, b) = match m.split_once(' ') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => (a, b),
        _ => return Err(None),
    };
    let id = |t: &str| ids.get(t.as_bytes()).copied().ok_or_else(|| Some(t.to_string()));
    let pair = (id(a)?, id(b)?);
    joined.clear();
    joined.push_str(a);
    joined.push_str(b);
    id(joined)?;
    Ok(pair)
}

/// The byte of a `<0xXX>` token.
pub(crate) fn byte_of_hex_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

/// Token texts after which llama.cpp ends a generation, and which it therefore treats as
/// control tokens whatever their stored type.
const END_OF_GENERATION: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl GgufTokenizer {
    /// Builds the tokenizer described by `file`'s metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufTokenizer> {
        let bad = |reason: String| {
            Error::Text(TextError::BadVocab {
                path: file.path().to_path_buf(),
                reason,
            })
        };
        let model: &str = file.require("tokenizer.ggml.model")?;
        if !SUPPORTED_MODELS.contains(&model) {
            return Err(bad(format!(
                "tokenizer.ggml.model is {model:?}; supported: llama (SentencePiece), gpt2 \
                 (byte-level BPE), bert (WordPiece), gemma4 (BPE on UTF-8)"
            )));
        }
        let pre_name: Option<&str> = file.get("tokenizer.ggml.pre")?;
        // Gemma 4's model implies its pre-tokenizer, as in llama.cpp.
        let pre = match model {
            "gemma4" => "gemma4",
            _ => pre_name.unwrap_or("gpt2"),
        };

        let mut tokens: Vec<String> = file
            .require::<Vec<&str>>("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let mut ids = HashMap::with_capacity_and_hasher(n, PieceHasher::default());
        for (id, t) in tokens.iter().enumerate() {
            if let Some(first) = ids.insert(t.as_bytes().to_vec(), id as u32) {
                return Err(bad(format!(
                    "token {t:?} appears twice (ids {first} and {id})"
                )));
            }
        }
        let mut types: Vec<i64> = match file.get("tokenizer.ggml.token_type")? {
            Some(t) => t,
            None => vec![1; n],
        };
        if types.len() != n {
            return Err(bad(format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            )));
        }
        let scores = match file.value("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(Value::Array(_, items)) if items.len() == n => items
                .iter()
                .map(|v| v.as_float().map(|x| x as f32))
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| bad("tokenizer.ggml.scores holds a non-number".into()))?,
            Some(Value::Array(_, items)) => {
                return Err(bad(format!(
                    "tokenizer.ggml.scores has {} entries for {n} tokens",
                    items.len()
                )))
            }
            Some(_) => return Err(bad("tokenizer.ggml.scores is not an array".into())),
        };
        let mut merge_ranks = HashMap::with_hasher(PieceHasher::default());
        if model == "gpt2" || model == "gemma4" {
            let merges: Vec<&str> = file.require("tokenizer.ggml.merges")?;
            // Each rule's pair of ids, looked up over the thread pool (`None`: a rule that is
            // not two pieces of the vocabulary whose join is one too, named below).
            let pairs: Vec<Option<(u32, u32)>> = merges
                .par_iter()
                .map_init(String::new, |joined, m| merge_pair(&ids, m, joined).ok())
                .collect();
            for (i, (pair, m)) in pairs.into_iter().zip(&merges).enumerate() {
                let pair = match pair {
                    Some(pair) => pair,
                    None => {
                        let reason = match merge_pair(&ids, m, &mut String::new()) {
                            Err(None) | Ok(_) => {
                                format!("merge {i} {m:?} is not two tokens separated by one space")
                            }
                            Err(Some(t)) => format!(
                                "cannot build the BPE model: merge {i} {m:?} needs {t:?}, which is \
                                 not in the vocabulary"
                            ),
                        };
                        return Err(bad(reason));
                    }
                };
                // The first rule for a pair wins, as in llama.cpp's `emplace`.
                merge_ranks.entry(pair).or_insert(i as u32);
            }
        }

        let opt_bool = |key: &str| file.get::<bool>(key);
        // BOS added by default (SentencePiece, WordPiece, and the BPE names llama.cpp says).
        let mut add_bos_default = true;
        let algorithm = match model {
            "llama" => Algorithm::Spm {
                add_space_prefix: opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            },
            "gpt2" | "gemma4" => {
                let settings = PreTokenizer::settings(pre).ok_or_else(|| {
                    let names: Vec<&str> = PRE_NAMES.iter().map(|(n, ..)| *n).collect();
                    bad(format!(
                        "tokenizer.ggml.pre is {pre:?}; supported: {}",
                        names.join(", ")
                    ))
                })?;
                add_bos_default = settings.add_bos;
                Algorithm::Bpe {
                    pre: settings.split,
                    ignore_merges: settings.ignore_merges,
                }
            }
            _ => {
                let lowercase = opt_bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
                Algorithm::Wpm {
                    normalizer: Normalizer {
                        lowercase,
                        strip_accents: opt_bool("tokenizer.ggml.normalizer.strip_accents")?
                            .unwrap_or(lowercase),
                    },
                }
            }
        };
        // llama.cpp's defaults where the file names no id (none for BPE, whose legacy default
        // 11 is Falcon's).
        let (bos0, eos0, unk0, sep0, pad0) = match model {
            "llama" => (Some(1), Some(2), Some(0), None, None),
            "bert" => (Some(101), None, Some(100), Some(102), Some(0)),
            _ => (None, None, None, None, None),
        };
        let id = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            match file.get::<u32>(key)? {
                Some(i) if i as usize >= n => {
                    Err(bad(format!("{key} is {i}, past the {n} tokens")))
                }
                Some(i) => Ok(Some(i)),
                None => Ok(default.filter(|&d| (d as usize) < n)),
            }
        };

        // Control-looking tokens are control tokens (llama.cpp overrides their type).
        for name in END_OF_GENERATION {
            if let Some(&i) = ids.get(name.as_bytes()) {
                if types[i as usize] != CONTROL {
                    types[i as usize] = CONTROL;
                }
            }
        }
        let general_name = file
            .get::<&str>("general.name")?
            .unwrap_or("")
            .to_lowercase();
        let matched = special_tokens(&tokens, &types, &general_name);

        let token_bytes = tokens
            .par_iter()
            .zip(&types)
            .map(|(t, &ty)| match ty {
                CONTROL | USER_DEFINED | UNKNOWN => t.as_bytes().to_vec(),
                BYTE => byte_of_hex_token(t).map_or_else(|| t.as_bytes().to_vec(), |b| vec![b]),
                UNUSED => Vec::new(),
                _ => match algorithm {
                    Algorithm::Bpe { pre, .. } if pre.byte_encoded() => bytes_of_token(t),
                    _ => t.replace('\u{2581}', " ").into_bytes(),
                },
            })
            .collect();
        let special: Vec<u32> = (0..n)
            .filter(|&i| types[i] == CONTROL)
            .map(|i| i as u32)
            .collect();
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        Ok(GgufTokenizer {
            token_bytes,
            special,
            matched,
            bos: id("tokenizer.ggml.bos_token_id", bos0)?,
            eos: id("tokenizer.ggml.eos_token_id", eos0)?,
            unk: id("tokenizer.ggml.unknown_token_id", unk0)?,
            sep: id("tokenizer.ggml.seperator_token_id", sep0)?,
            pad: id("tokenizer.ggml.padding_token_id", pad0)?,
            add_bos: opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default),
            add_eos: opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            algorithm,
            model: model.to_string(),
            pre: pre.to_string(),
            chat_template: file.chat_template()?.map(str::to_string),
            path: file.path().to_path_buf(),
            vocab: Vocab {
                tokens,
                ids,
                scores,
                types,
                merge_ranks,
                max_token_len,
            },
        })
    }

    /// The ids of `text`, special tokens written in it recognised; nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize(text, false, true)
    }

    /// The ids of `text` as llama.cpp's `llama_tokenize` gives them: `add_special` adds what the
    /// vocabulary adds around a text (BOS when `add_bos_token`, EOS when `add_eos_token`;
    /// WordPiece's `[CLS]` and `[SEP]`), `parse_special` recognises control tokens written in
    /// the text (user-defined ones always are).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let missing = |what: &str| {
            Error::Input(format!(
                "{}: the vocabulary adds a {what} token but names none",
                self.path.display()
            ))
        };
        let mut out = Vec::new();
        let fragments = special::partition(text, &self.matched, parse_special);
        let wpm = matches!(self.algorithm, Algorithm::Wpm { .. });
        if add_special && (self.add_bos || wpm) {
            out.push(self.bos.ok_or_else(|| missing("BOS"))?);
        }
        let mut after_special = true;
        for fragment in fragments {
            let text = match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                    continue;
                }
                Fragment::Text(text) => text,
            };
            match &self.algorithm {
                Algorithm::Spm { add_space_prefix } => {
                    let prefix = if *add_space_prefix && after_special {
                        " "
                    } else {
                        ""
                    };
                    let escaped = format!("{prefix}{text}").replace(' ', "\u{2581}");
                    spm::tokenize(&self.vocab, &escaped, &mut out).map_err(|b| {
                        Error::Input(format!(
                            "{}: the byte 0x{b:02X} of {text:?} has no token",
                            self.path.display()
                        ))
                    })?;
                }
                Algorithm::Bpe { pre, ignore_merges } => {
                    let hex_bytes = !pre.byte_encoded();
                    // Gemma 4's: the spaces as `▁`, a run of line breaks that is a token whole.
                    let text = match hex_bytes {
                        true => text.replace(' ', "\u{2581}").into(),
                        false => std::borrow::Cow::Borrowed(text),
                    };
                    for word in pre.words(&text) {
                        let breaks = hex_bytes && word.chars().all(|c| c == '\n');
                        let whole = *ignore_merges || breaks;
                        bpe::tokenize_word(&self.vocab, &word, (whole, hex_bytes), &mut out);
                    }
                }
                Algorithm::Wpm { normalizer } => {
                    wpm::tokenize(&self.vocab, text, *normalizer, self.unk, &mut out)
                }
            }
            after_special = false;
        }
        if add_special && wpm {
            out.push(self.sep.ok_or_else(|| missing("separator"))?);
        } else if add_special && self.add_eos {
            out.push(self.eos.ok_or_else(|| missing("EOS"))?);
        }
        Ok(out)
    }

    /// The bytes `ids` stand for (special tokens as their text). Not necessarily UTF-8: a
    /// character may be split across tokens, so streamed output should be cut here.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id).ok_or_else(|| {
                Error::Input(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.vocab_size()
                ))
            })?);
        }
        Ok(out)
    }

    /// The text of `ids`, special tokens rendered; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// The bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(Vec::as_slice)
    }

    /// A token as stored in the vocabulary (byte-level or `▁` spelling, a special token's text).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary entry (as stored: byte-level or `▁` spelling, or a special
    /// token's text).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.ids.get(token.as_bytes()).copied()
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The control tokens' ids (`tokenizer.ggml.token_type` 3), ascending.
    pub fn special_ids(&self) -> &[u32] {
        &self.special
    }

    /// Whether `id` is a control token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }

    /// `tokenizer.ggml.bos_token_id` (WordPiece: `[CLS]`).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id` (for a chat model, the end of a turn).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.padding_token_id`.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether a plain prompt should start with BOS (`tokenizer.ggml.add_bos_token`, else
    /// llama.cpp's default for the vocabulary). [`GgufTokenizer::encode`] never adds it.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The pre-tokenizer's name (`tokenizer.ggml.pre`).
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre
    }

    /// `tokenizer.chat_template`, the Jinja template that writes a conversation as a prompt.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// The tokens matched in text before tokenizing (control, user-defined and unknown ones), in
/// llama.cpp's order, longest text first, with its strip rules: Phi-3 (`general.name`) strips
/// the white space after its special tokens except `<unk>`, `<s>`, `<|endoftext|>`.
fn special_tokens(tokens: &[String], types: &[i64], general_name: &str) -> Vec<SpecialToken> {
    let phi3 = general_name.contains("phi-3") || general_name.contains("phi3");
    let mut matched: Vec<SpecialToken> = (0..tokens.len())
        .filter(|&i| matches!(types[i], CONTROL | USER_DEFINED | UNKNOWN))
        .map(|i| {
            let text = tokens[i].clone();
            SpecialToken {
                id: i as u32,
                always: types[i] == USER_DEFINED,
                lstrip: false,
                rstrip: phi3 && !matches!(text.as_str(), "<unk>" | "<s>" | "<|endoftext|>"),
                text,
            }
        })
        .collect();
    matched.sort_by_key(|s| std::cmp::Reverse(s.text.len()));
    matched
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('ĉ'), Some(b'\t'));
        assert_eq!(byte_of_char('Ā'), Some(0));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('ÿ'), Some(0xff));
        assert_eq!(byte_of_char('ł'), Some(0xa0));
        assert_eq!(byte_of_char('Ń'), Some(0xad));
        assert_eq!(byte_of_char(' '), None);
        assert_eq!(byte_of_char('ń'), None);
        // A bijection between 256 characters and the 256 bytes, the inverse of the spelling
        // the pre-tokenizer writes.
        let mut seen = [false; 256];
        for c in (0u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_of_char(c) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
                assert_eq!(super::super::llama_vocab::pre_tokenizer::byte_char(b), c);
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(bytes_of_token("ĠHello"), b" Hello");
        assert_eq!(bytes_of_token("<|im_start|>"), b"<|im_start|>");
        assert_eq!(bytes_of_token("Ã©"), "é".as_bytes());
        assert_eq!(byte_of_hex_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_of_hex_token("<0xzz>"), None);
    }
}
