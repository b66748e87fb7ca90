//! A CTranslate2 model directory's `config.json` (its tokens and source options) and
//! vocabulary (`shared_vocabulary.json` / `.txt`, or equal `source_vocabulary.*` and
//! `target_vocabulary.*`), and the SentencePiece model its users tokenize with: `source.spm` /
//! `target.spm` (a converted Marian model, whose Transformers tokenizer ends every source with
//! `</s>`), `sentencepiece.model` (an Argos Translate package, which gives CTranslate2 the
//! pieces alone unless `add_source_eos`) or `sentencepiece.bpe.model` (a converted NLLB-200 /
//! M2M100 model: its language tokens and fairseq's tokenizer, see `text::fairseq_ct2`; the
//! source is the language code, the pieces and `</s>`, the decoder starts from `</s>`).

use crate::error::Result;
use crate::store::ckpt_err;
use crate::store::package::Files;
use crate::text::ct2_tokenizer::Ct2Tokenizer;
use crate::text::fairseq_ct2;
use crate::text::id_map::IdMap;
use crate::text::sentencepiece::SentencePiece;
use crate::text::vocab::Vocab;
use serde::Deserialize;
use std::path::Path;

/// The fields of CTranslate2's `config.json` for a `TransformerSpec` (its
/// `TransformerConfig`); any other field is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ct2Config {
    #[serde(default = "unk")]
    pub unk_token: String,
    #[serde(default = "bos")]
    pub bos_token: String,
    #[serde(default = "eos")]
    pub eos_token: String,
    #[serde(default = "bos_some")]
    pub decoder_start_token: Option<String>,
    #[serde(default)]
    pub add_source_bos: bool,
    #[serde(default)]
    pub add_source_eos: bool,
    #[serde(default)]
    pub layer_norm_epsilon: Option<f64>,
    #[serde(default)]
    pub multi_query_attention: bool,
}

fn unk() -> String {
    "<unk>".into()
}
fn bos() -> String {
    "<s>".into()
}
fn eos() -> String {
    "</s>".into()
}
fn bos_some() -> Option<String> {
    Some(bos())
}

impl Ct2Config {
    /// `config.json` of `files` (CTranslate2's defaults when there is none, as in models
    /// converted before it wrote one); an error names the file and the field.
    pub fn read(files: &Files) -> Result<Ct2Config> {
        let path = files.path("config.json");
        if !files.has("config.json") {
            return Ok(serde_json::from_str("{}").expect("defaults"));
        }
        let bytes = files.read("config.json")?;
        let c: Ct2Config = serde_json::from_slice(crate::store::strip_bom(&bytes))
            .map_err(|e| ckpt_err(&path, format!("not a CTranslate2 TransformerSpec config: {e}")))?;
        if c.multi_query_attention {
            return Err(ckpt_err(&path, "multi_query_attention true is not supported"));
        }
        if c.decoder_start_token.is_none() {
            return Err(ckpt_err(
                &path,
                "decoder_start_token null (the start token given with each target prefix) is not supported",
            ));
        }
        Ok(c)
    }
}

/// The vocabulary of a model: our ids and the tokenizer.
pub struct VocabSetup {
    pub ids: IdMap,
    pub vocab: Vocab,
    /// Whether the decoder starts from a zero embedding (our BOS row is zero).
    pub zero_start: bool,
    /// Whether sources end with EOS.
    pub source_eos: bool,
}

impl VocabSetup {
    /// Reads the vocabulary of `files` (`n` tokens, the embedding table's rows) and the
    /// SentencePiece model (`spm`: a package's, beside `model/`), with `config`'s tokens;
    /// `zero_start`: the decoder starts from a zero embedding (Marian).
    pub fn read(
        files: &Files,
        config: &Ct2Config,
        spm: Option<(&[u8], &Path)>,
        n: usize,
        zero_start: bool,
    ) -> Result<VocabSetup> {
        let (vocab_path, pieces) = read_vocabulary(files)?;
        let bad = |reason: String| ckpt_err(&vocab_path, reason);
        if pieces.len() != n {
            return Err(bad(format!(
                "{} tokens, the model's embedding table has {n} rows",
                pieces.len()
            )));
        }
        let index = |what: &str, token: &str| {
            pieces
                .iter()
                .position(|p| p == token)
                .map(|i| i as u32)
                .ok_or_else(|| bad(format!("no {what} {token:?} (config.json)")))
        };
        let eos = index("eos_token", &config.eos_token)?;
        let unk = index("unk_token", &config.unk_token)?;
        let start = match (zero_start, &config.decoder_start_token) {
            (true, _) => eos,
            (false, Some(t)) => index("decoder_start_token", t)?,
            (false, None) => unreachable!("refused by Ct2Config::read"),
        };
        if spm.is_none() && is_multilingual(files) {
            let tokens = Tokens { eos, unk, start };
            return multilingual(files, config, (&vocab_path, &pieces), tokens, zero_start);
        }
        let first = match config.add_source_bos {
            true => Some(index("bos_token", &config.bos_token)?),
            false => None,
        };
        let ids = IdMap::new(n, start, eos, unk).map_err(bad)?;
        let (source, target, source_eos) = sentencepiece(files, config, spm)?;
        check_pieces(&source, &pieces, &vocab_path)?;
        let tokenizer = Ct2Tokenizer::new(source, target, &pieces, ids.clone(), unk, first);
        Ok(VocabSetup {
            ids,
            vocab: Vocab::from_ct2(tokenizer),
            zero_start,
            source_eos,
        })
    }
}

/// The model's ids of its special tokens.
struct Tokens {
    eos: u32,
    unk: u32,
    /// The decoder's start.
    start: u32,
}

/// Whether `files` hold a converted NLLB / M2M100 model's tokenizer: `sentencepiece.bpe.model`,
/// and neither Marian's nor Argos Translate's SentencePiece files.
fn is_multilingual(files: &Files) -> bool {
    files.has(fairseq_ct2::SPM_FILE) && !files.has("source.spm") && !files.has("sentencepiece.model")
}

/// The vocabulary setup of a converted NLLB / M2M100 model (see the module docs), its
/// vocabulary `pieces` read from `vocab_path`; the config's source options that would change
/// what its Hugging Face tokenizer gives are refused by name.
fn multilingual(
    files: &Files,
    config: &Ct2Config,
    (vocab_path, pieces): (&Path, &[String]),
    tokens: Tokens,
    zero_start: bool,
) -> Result<VocabSetup> {
    let config_path = files.path("config.json");
    let refuse = |what: &str| {
        Err(ckpt_err(
            &config_path,
            format!("{what} with {} (NLLB / M2M100) is not supported", fairseq_ct2::SPM_FILE),
        ))
    };
    if config.add_source_bos {
        return refuse("add_source_bos true (sources start with their language code)");
    }
    if config.add_source_eos {
        return refuse("add_source_eos true (the tokenizer already ends sources with </s>)");
    }
    if tokens.start != tokens.eos || zero_start {
        return refuse("a decoder that does not start from eos_token (decoder_start_token)");
    }
    let spm_path = files.path(fairseq_ct2::SPM_FILE);
    let spm = SentencePiece::from_bytes(&files.read(fairseq_ct2::SPM_FILE)?, &spm_path)?;
    check_pieces(&spm, pieces, vocab_path)?;
    let tokenizer = fairseq_ct2::load(files, spm, vocab_path, pieces, tokens.eos, tokens.unk)?;
    Ok(VocabSetup {
        ids: tokenizer.ids().clone(),
        vocab: Vocab::from_fairseq(tokenizer),
        zero_start: false,
        source_eos: true,
    })
}

/// The pieces of the vocabulary file (shared, or the source's when equal to the target's).
fn read_vocabulary(files: &Files) -> Result<(std::path::PathBuf, Vec<String>)> {
    let read = |stem: &str| -> Result<Option<(std::path::PathBuf, Vec<String>)>> {
        for (ext, json) in [("json", true), ("txt", false)] {
            let name = format!("{stem}.{ext}");
            if !files.has(&name) {
                continue;
            }
            let path = files.path(&name);
            let bytes = files.read(&name)?;
            let pieces = if json {
                serde_json::from_slice::<Vec<String>>(crate::store::strip_bom(&bytes))
                    .map_err(|e| ckpt_err(&path, format!("not a JSON list of tokens: {e}")))?
            } else {
                let text = std::str::from_utf8(&bytes).map_err(|_| ckpt_err(&path, "not UTF-8"))?;
                text.lines().map(str::to_string).collect()
            };
            return Ok(Some((path, pieces)));
        }
        Ok(None)
    };
    if let Some(v) = read("shared_vocabulary")? {
        return Ok(v);
    }
    match (read("source_vocabulary")?, read("target_vocabulary")?) {
        (Some(s), Some(t)) if s.1 == t.1 => Ok(s),
        (Some(s), Some(t)) => Err(ckpt_err(
            &t.0,
            format!("differs from {}: separate source and target vocabularies are not supported", s.0.display()),
        )),
        _ => Err(ckpt_err(
            &files.path("shared_vocabulary.json"),
            "no vocabulary (shared_vocabulary.json / .txt, or source_vocabulary and target_vocabulary)",
        )),
    }
}

/// The source and target SentencePiece models, and whether sources end with EOS.
fn sentencepiece(
    files: &Files,
    config: &Ct2Config,
    spm: Option<(&[u8], &Path)>,
) -> Result<(SentencePiece, SentencePiece, bool)> {
    let load = |name: &str| SentencePiece::from_bytes(&files.read(name)?, &files.path(name));
    if let Some((bytes, path)) = spm {
        let sp = || SentencePiece::from_bytes(bytes, path);
        return Ok((sp()?, sp()?, config.add_source_eos));
    }
    if files.has("source.spm") && files.has("target.spm") {
        if config.add_source_eos {
            return Err(ckpt_err(
                &files.path("config.json"),
                "add_source_eos true with source.spm (whose Marian tokenizer already ends sources with </s>) is not supported",
            ));
        }
        return Ok((load("source.spm")?, load("target.spm")?, true));
    }
    if files.has("sentencepiece.model") {
        let sp = || load("sentencepiece.model");
        return Ok((sp()?, sp()?, config.add_source_eos));
    }
    Err(ckpt_err(
        &files.root(),
        "no SentencePiece model (source.spm and target.spm, sentencepiece.model, or an NLLB / \
         M2M100 model's sentencepiece.bpe.model; converters copy them with --copy_files)",
    ))
}

/// Refuses a SentencePiece model most of whose pieces the vocabulary does not hold (a model
/// of another vocabulary).
fn check_pieces(sp: &SentencePiece, pieces: &[String], vocab_path: &Path) -> Result<()> {
    let known: std::collections::HashSet<&str> = pieces.iter().map(String::as_str).collect();
    let n = sp.len();
    let found = (0..n as u32)
        .filter_map(|i| sp.id_to_piece(i))
        .filter(|p| known.contains(p))
        .count();
    if found * 2 < n {
        return Err(ckpt_err(
            vocab_path,
            format!("holds only {found} of the {n} pieces of the SentencePiece model: they do not belong together"),
        ));
    }
    Ok(())
}
