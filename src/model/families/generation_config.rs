//! What a Hugging Face encoder-decoder directory asks of `generate` (`GenerationConfig`), read
//! as transformers 5 reads it: `generation_config.json` when the directory has one, else the
//! generation fields of `config.json` (older checkpoints kept them there). Each field that can
//! change a translation is honoured, refused by name, or noted by name:
//!
//! - honoured: `forced_bos_token_id` (BART's first output; a multilingual model forces its
//!   target language instead), `forced_eos_token_id` (transformers' `ForcedEOSTokenLogitsProcessor`:
//!   at the last step a hypothesis may take, `max_length − 1` there, EOS with log-probability 0;
//!   here at the last of our output limit, see `decode::TokenRules::end_at_limit`), and
//!   `bad_words_ids` that name only the decoder's start token (Marian's padding), which our
//!   searches never emit;
//! - checked against `config.json`: `eos_token_id` and `decoder_start_token_id` (the loaders
//!   read those from `config.json`; a generation config that differs is refused);
//! - refused (they change which tokens are chosen, and no search here computes them):
//!   [`REFUSED`], each when set to anything but its neutral value;
//! - noted (settings of the search that our command line and server choose instead: `--beam`,
//!   `--alpha`, `--beam-stop`, `--max-extra`, greedy without sampling): [`NOTED`], each when set
//!   to anything but transformers' default. `renormalize_logits` is among them: with only the
//!   never-emitted start token banned, it moves beam scores by that token's probability.
//!
//! Bookkeeping fields (`transformers_version`, `_from_model_config`, `use_cache`, the `output_*`
//! flags, `pad_token_id`, `bos_token_id`) change no output.

use crate::error::Result;
use crate::store::{ckpt_err, strip_bom};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The file transformers 5 reads first.
pub const GENERATION_CONFIG: &str = "generation_config.json";

/// Fields that change which tokens are chosen and that no search here computes, each with its
/// neutral value (`Null`: unset); refused by name when set otherwise.
pub const REFUSED: &[(&str, Neutral)] = &[
    ("no_repeat_ngram_size", Neutral::Number(0.0)),
    ("encoder_no_repeat_ngram_size", Neutral::Number(0.0)),
    ("repetition_penalty", Neutral::Number(1.0)),
    ("encoder_repetition_penalty", Neutral::Number(1.0)),
    ("min_length", Neutral::Number(0.0)),
    ("min_new_tokens", Neutral::Number(0.0)),
    ("suppress_tokens", Neutral::Empty),
    ("begin_suppress_tokens", Neutral::Empty),
    ("forced_decoder_ids", Neutral::Empty),
    ("sequence_bias", Neutral::Empty),
    ("exponential_decay_length_penalty", Neutral::Empty),
    ("num_beam_groups", Neutral::Number(1.0)),
    ("diversity_penalty", Neutral::Number(0.0)),
    ("constraints", Neutral::Empty),
    ("force_words_ids", Neutral::Empty),
    ("guidance_scale", Neutral::Number(1.0)),
    ("penalty_alpha", Neutral::Empty),
    ("dola_layers", Neutral::Empty),
    ("stop_strings", Neutral::Empty),
    ("watermarking_config", Neutral::Empty),
    ("token_healing", Neutral::Bool(false)),
];

/// Settings of `generate`'s search that the command line and the server choose instead, each
/// with transformers' default; noted by name when set otherwise.
pub const NOTED: &[(&str, Neutral)] = &[
    ("num_beams", Neutral::Number(1.0)),
    ("length_penalty", Neutral::Number(1.0)),
    ("early_stopping", Neutral::Bool(false)),
    ("max_length", Neutral::Number(20.0)),
    ("max_new_tokens", Neutral::Empty),
    ("num_return_sequences", Neutral::Number(1.0)),
    ("do_sample", Neutral::Bool(false)),
    ("renormalize_logits", Neutral::Bool(false)),
    ("max_time", Neutral::Empty),
];

/// A field's value that changes nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Neutral {
    /// This number (or unset).
    Number(f64),
    /// This flag (or unset).
    Bool(bool),
    /// Unset, `null`, an empty list or an empty object.
    Empty,
}

impl Neutral {
    /// Whether `value` changes nothing.
    fn holds(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (Neutral::Number(n), Value::Number(v)) => v.as_f64() == Some(n),
            (Neutral::Bool(b), Value::Bool(v)) => *v == b,
            (Neutral::Empty, Value::Array(a)) => a.is_empty(),
            (Neutral::Empty, Value::Object(o)) => o.is_empty(),
            _ => false,
        }
    }
}

/// What a directory's generation settings ask of our searches (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// `forced_bos_token_id`, in the model's ids.
    pub forced_bos: Option<u32>,
    /// `forced_eos_token_id` is the model's EOS: EOS is forced as a hypothesis' last token.
    pub forced_eos: bool,
    /// The fields of [`NOTED`] set otherwise than transformers' defaults, `name value` each.
    pub not_read: Vec<String>,
    /// The file they were read from.
    pub path: PathBuf,
}

impl Generation {
    /// One line naming what is not read, for a warning; `None` when everything is.
    pub fn note(&self) -> Option<String> {
        (!self.not_read.is_empty()).then(|| {
            format!(
                "{}: {} not read: the search is the command line's (--beam, --alpha, \
                 --beam-stop, --max-extra; greedy without sampling by default)",
                self.path.display(),
                self.not_read.join(", ")
            )
        })
    }
}

/// Reads the generation settings of the Hugging Face directory `dir` for a model of
/// `vocab_size` ids (see the module docs); `config` is its parsed `config.json`. An error
/// names the file and the field it refuses.
pub fn read(dir: &Path, config: &Value, vocab_size: usize) -> Result<Generation> {
    let generation_path = dir.join(GENERATION_CONFIG);
    let (path, fields) = match std::fs::read(&generation_path) {
        Ok(bytes) => {
            let json: Value = serde_json::from_slice(strip_bom(&bytes))
                .map_err(|e| ckpt_err(&generation_path, format!("not valid JSON: {e}")))?;
            (generation_path, json)
        }
        Err(_) => (dir.join("config.json"), config.clone()),
    };
    let bad = |reason: String| ckpt_err(&path, reason);
    if !fields.is_object() {
        return Err(bad("not a JSON object".into()));
    }
    let field = |name: &str| fields.get(name).unwrap_or(&Value::Null);
    for (name, neutral) in REFUSED {
        let value = field(name);
        if !neutral.holds(value) {
            return Err(bad(format!(
                "{name} {value} is not supported: it changes which tokens generate chooses, \
                 and no search here computes it"
            )));
        }
    }
    let not_read = (NOTED.iter())
        .filter(|(name, neutral)| !neutral.holds(field(name)))
        .map(|(name, _)| format!("{name} {}", field(name)))
        .collect();
    // The ids the loaders read from config.json: a generation config may not say otherwise.
    for name in ["eos_token_id", "decoder_start_token_id"] {
        let (here, there) = (field(name), config.get(name).unwrap_or(&Value::Null));
        if !here.is_null() && !there.is_null() && one_id(here) != one_id(there) {
            return Err(bad(format!(
                "{name} {here} differs from config.json's {there}: not supported"
            )));
        }
    }
    let eos = one_id(config.get("eos_token_id").unwrap_or(&Value::Null));
    let start = one_id(config.get("decoder_start_token_id").unwrap_or(&Value::Null));
    let token = |name: &str| -> Result<Option<u32>> {
        match field(name) {
            Value::Null => Ok(None),
            v => (one_id(v).filter(|&id| (id as usize) < vocab_size))
                .map(Some)
                .ok_or_else(|| bad(format!("{name} {v} is not a token id"))),
        }
    };
    let forced_bos = token("forced_bos_token_id")?;
    let forced_eos = match token("forced_eos_token_id")? {
        None => false,
        Some(id) if Some(id) == eos => true,
        Some(id) => {
            return Err(bad(format!(
                "forced_eos_token_id {id} is not eos_token_id {}: only the model's EOS can be \
                 forced at the output limit",
                config.get("eos_token_id").unwrap_or(&Value::Null)
            )))
        }
    };
    check_bad_words(field("bad_words_ids"), start.filter(|&s| Some(s) != eos))
        .map_err(bad)?;
    Ok(Generation {
        forced_bos,
        forced_eos,
        not_read,
        path,
    })
}

/// `bad_words_ids` may name the decoder's start token alone (when it is not EOS: our searches
/// never emit it), as Marian's configs do; anything else is refused.
fn check_bad_words(value: &Value, never_emitted: Option<u32>) -> std::result::Result<(), String> {
    let words = match value {
        Value::Null => return Ok(()),
        Value::Array(words) => words,
        v => return Err(format!("bad_words_ids {v} is not a list of token id lists")),
    };
    for word in words {
        let ids: Option<Vec<u32>> =
            (word.as_array()).and_then(|ids| ids.iter().map(one_id).collect());
        match ids {
            Some(ids) if ids.len() == 1 && Some(ids[0]) == never_emitted => {}
            _ => {
                return Err(format!(
                    "bad_words_ids {value} is not supported: only the decoder's start token \
                     ({}), which is never emitted, may be banned",
                    never_emitted.map_or("none here".to_string(), |s| s.to_string())
                ))
            }
        }
    }
    Ok(())
}

/// One token id: a number, or a list of one.
fn one_id(value: &Value) -> Option<u32> {
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match value {
        Value::Array(ids) if ids.len() == 1 => one(&ids[0]),
        v => one(v),
    }
}

/// [`read`] for a directory whose `config.json` has not been parsed yet.
pub fn read_dir(dir: &Path, vocab_size: usize) -> Result<Generation> {
    let path = dir.join("config.json");
    let bytes = crate::store::read_file(&path)?;
    let config: Value = serde_json::from_slice(strip_bom(&bytes))
        .map_err(|e| ckpt_err(&path, format!("not valid JSON: {e}")))?;
    read(dir, &config, vocab_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use serde_json::json;

    fn with(generation: Option<Value>, config: Value) -> std::result::Result<Generation, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        if let Some(g) = generation {
            std::fs::write(dir.path().join(GENERATION_CONFIG), g.to_string()).unwrap();
        }
        read_dir(dir.path(), 100).map_err(|e: Error| e.to_string())
    }

    #[test]
    fn fields_are_honoured_refused_or_noted_by_name() {
        let marian = json!({"eos_token_id": 0, "decoder_start_token_id": 9, "pad_token_id": 9,
            "forced_eos_token_id": 0, "bad_words_ids": [[9]], "num_beams": 4, "max_length": 512,
            "renormalize_logits": true, "transformers_version": "4.32.0"});
        // config.json's fields where there is no generation_config.json.
        let g = with(None, marian.clone()).unwrap();
        assert!(g.forced_eos && g.forced_bos.is_none());
        assert_eq!(g.not_read, ["num_beams 4", "max_length 512", "renormalize_logits true"]);
        assert!(g.note().unwrap().contains("num_beams 4, max_length 512"));
        // generation_config.json wins whole, as in transformers 5: config.json's forced EOS
        // is not read when it leaves it out.
        let g = with(Some(json!({"eos_token_id": 0})), marian.clone()).unwrap();
        assert!(!g.forced_eos && g.not_read.is_empty() && g.note().is_none());
        let bart = json!({"eos_token_id": 2, "decoder_start_token_id": 2, "forced_bos_token_id": 0});
        let g = with(None, bart.clone()).unwrap();
        assert_eq!((g.forced_bos, g.forced_eos), (Some(0), false));
        for (generation, named) in [
            (json!({"no_repeat_ngram_size": 3}), "no_repeat_ngram_size 3"),
            (json!({"repetition_penalty": 1.2}), "repetition_penalty 1.2"),
            (json!({"min_length": 56}), "min_length 56"),
            (json!({"suppress_tokens": [5]}), "suppress_tokens [5]"),
            (json!({"forced_eos_token_id": 5}), "forced_eos_token_id 5 is not eos_token_id 2"),
            (json!({"forced_bos_token_id": 100}), "forced_bos_token_id 100 is not a token id"),
            (json!({"eos_token_id": 3}), "eos_token_id 3 differs"),
            // BART's start is its EOS: banning it would ban EOS.
            (json!({"bad_words_ids": [[2]]}), "bad_words_ids [[2]]"),
            (json!({"bad_words_ids": [[5, 6]]}), "bad_words_ids [[5,6]]"),
            (json!([1]), "not a JSON object"),
        ] {
            let e = with(Some(generation.clone()), bart.clone()).unwrap_err();
            assert!(e.contains(named) && e.contains(GENERATION_CONFIG), "{generation}: {e}");
        }
        // Neutral values are no change.
        let neutral = json!({"no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
            "suppress_tokens": [], "num_beams": 1, "do_sample": false, "early_stopping": false});
        assert_eq!(with(Some(neutral), bart).unwrap().not_read, Vec::<String>::new());
    }
}
