//! Argos Translate packages (LibreTranslate's models): a `.argosmodel` file (a zip of one
//! directory) or that directory extracted, holding `metadata.json` (`from_code`, `to_code`,
//! ...), `model/` (a CTranslate2 model directory, see `model::families::ctranslate2`) and
//! `sentencepiece.model` (the tokenizer of both sides); `stanza/` (sentence splitting) is not
//! read. A package is read in memory: nothing is extracted.

use super::translate::Translator;
use crate::error::Result;
use crate::model::families::ctranslate2;
use crate::store::ckpt_err;
use crate::store::package::Files;
use crate::text::languages::LanguagePair;
use serde::Deserialize;
use std::path::Path;

/// The metadata file of a package.
pub const METADATA: &str = "metadata.json";
/// The tokenizer of a package.
pub const SENTENCEPIECE: &str = "sentencepiece.model";

/// The fields of `metadata.json` we keep (the rest describe the package to its index).
#[derive(Deserialize)]
struct Metadata {
    from_code: String,
    to_code: String,
}

/// Whether `path` is an Argos Translate package: a `.argosmodel` file (or any zip file), or a
/// directory with `metadata.json` and `model/model.bin`.
pub fn is_package(path: &Path) -> bool {
    if path.is_dir() {
        return path.join(METADATA).is_file()
            && path.join("model").join(ctranslate2::MODEL_BIN).is_file();
    }
    path.extension().is_some_and(|e| e == "argosmodel") || is_zip(path)
}

fn is_zip(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"PK\x03\x04"
}

/// The package's files and its language pair (`metadata.json`'s `from_code` / `to_code`,
/// checked as language codes); an error names the file.
fn open(path: &Path) -> Result<(Files, LanguagePair)> {
    let files = if path.is_dir() {
        Files::Dir(path.to_path_buf())
    } else {
        Files::zip(path)?
    };
    let meta_path = files.path(METADATA);
    let meta: Metadata = serde_json::from_slice(crate::store::strip_bom(&files.read(METADATA)?))
        .map_err(|e| {
            ckpt_err(
                &meta_path,
                format!("not an Argos Translate package's metadata: {e}"),
            )
        })?;
    let pair = LanguagePair::new(&meta.from_code, &meta.to_code)
        .map_err(|e| ckpt_err(&meta_path, e.to_string()))?;
    Ok((files, pair))
}

/// The language pair of the package at `path` (`None` when it is not one).
pub fn package_pair(path: &Path) -> Result<Option<LanguagePair>> {
    if !is_package(path) {
        return Ok(None);
    }
    open(path).map(|(_, pair)| Some(pair))
}

/// Loads the package at `path` (see the module docs): its translator, the package's language
/// pair kept on it.
pub fn load(path: &Path) -> Result<Translator> {
    let (files, pair) = open(path)?;
    let spm_path = files.path(SENTENCEPIECE);
    let spm = files.read(SENTENCEPIECE)?;
    let model = files.sub("model");
    let (model, vocab, int8) = ctranslate2::load_files(&model, Some((&spm, &spm_path)))?;
    let mut translator = Translator::of(model, vocab);
    translator.set_stored_int8(int8);
    translator.beam_rules = crate::decode::beam::BeamRules::CTranslate2;
    translator.min_len = super::translate::CT2_MIN_DECODING_LENGTH;
    translator.pair = Some(pair);
    Ok(translator)
}
