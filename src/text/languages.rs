//! The language pair a translation model was trained on, kept beside its vocabulary in
//! `languages.json` (`{"source": "de", "target": "en"}`): written by `train --source-lang
//! --target-lang`, carried by `--resume` and `average`, read by `serve` (LibreTranslate's
//! `/languages`, `/translate`, `/detect`). A model without the file has an unnamed pair.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::CheckpointWriter;

/// The file in a model directory that names its language pair.
pub const LANGUAGES_FILE: &str = "languages.json";

/// Longest language code accepted (BCP 47 tags such as `zh-Hant-TW` fit).
pub const MAX_CODE_LEN: usize = 35;

/// A translation model's source and target language codes (e.g. `de`, `en`, `pt-BR`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguagePair {
    /// The language the model reads.
    pub source: String,
    /// The language the model writes.
    pub target: String,
}

/// Checks one code: 1 ..= [`MAX_CODE_LEN`] ASCII letters, digits, `-` or `_`, starting with a
/// letter. `what` names it in the error (e.g. `--source-lang`).
pub fn check_code(what: &str, code: &str) -> std::result::Result<(), String> {
    let ok = !code.is_empty()
        && code.len() <= MAX_CODE_LEN
        && code.starts_with(|c: char| c.is_ascii_alphabetic())
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{what} {code:?} is not a language code (1 to {MAX_CODE_LEN} ASCII letters, digits, \
             '-' or '_', starting with a letter, e.g. \"de\" or \"pt-BR\")"
        )),
    }
}

impl LanguagePair {
    /// A checked pair; the two codes must differ.
    pub fn new(source: &str, target: &str) -> Result<LanguagePair> {
        check_code("source language", source).map_err(Error::Input)?;
        check_code("target language", target).map_err(Error::Input)?;
        if source == target {
            return Err(Error::Input(format!(
                "the source and target languages are both {source:?}"
            )));
        }
        Ok(LanguagePair {
            source: source.to_string(),
            target: target.to_string(),
        })
    }

    /// Stages [`LANGUAGES_FILE`] in a checkpoint save.
    pub fn write(&self, writer: &mut CheckpointWriter) -> Result<()> {
        let json = serde_json::to_string_pretty(self).expect("two strings serialise");
        writer.add(LANGUAGES_FILE, json.as_bytes())
    }

    /// The pair recorded in the model directory `dir`; `None` when it has no
    /// [`LANGUAGES_FILE`] (or `dir` is a file, such as a GGUF). A file that is there but
    /// unreadable, not this JSON, or holds bad codes is an error naming it.
    ///
    /// Without one, a Hugging Face tokenizer's `tokenizer_config.json` that names both
    /// (`source_lang` and `target_lang`, as Marian's OPUS-MT models do) gives the pair; codes
    /// there that are not valid codes are left out (the model still loads, unnamed).
    pub fn read(dir: &Path) -> Result<Option<LanguagePair>> {
        let path = dir.join(LANGUAGES_FILE);
        if !dir.is_dir() {
            return Ok(None);
        }
        if !path.exists() {
            return Ok(Self::from_tokenizer_config(dir));
        }
        let bytes = crate::store::read_file(&path)?;
        let bad = |why: String| Error::Input(format!("{}: {why}", path.display()));
        let pair: LanguagePair = serde_json::from_slice(&bytes).map_err(|e| {
            bad(format!(
                "not a language pair ({{\"source\": \"de\", \"target\": \"en\"}}): {e}"
            ))
        })?;
        LanguagePair::new(&pair.source, &pair.target)
            .map(Some)
            .map_err(|e| bad(e.to_string()))
    }

    /// `source_lang` / `target_lang` of `dir`'s `tokenizer_config.json`, when both are there
    /// and valid codes.
    fn from_tokenizer_config(dir: &Path) -> Option<LanguagePair> {
        let bytes = std::fs::read(dir.join("tokenizer_config.json")).ok()?;
        let json: serde_json::Value =
            serde_json::from_slice(crate::store::strip_bom(&bytes)).ok()?;
        let code = |key: &str| json.get(key)?.as_str().map(str::to_string);
        LanguagePair::new(&code("source_lang")?, &code("target_lang")?).ok()
    }
}

/// A multilingual tokenizer's configured languages: `src_lang` and `tgt_lang` of `dir`'s
/// `tokenizer_config.json` (NLLB, M2M100), each `None` when absent, null or unreadable.
pub fn tokenizer_languages(dir: &Path) -> (Option<String>, Option<String>) {
    let json: Option<serde_json::Value> = std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(crate::store::strip_bom(&bytes)).ok());
    let code = |key: &str| Some(json.as_ref()?.get(key)?.as_str()?.to_string());
    (code("src_lang"), code("tgt_lang"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marian_tokenizer_config_names_the_pair() {
        let dir = tempfile_dir("marian-langs");
        assert!(LanguagePair::read(&dir).unwrap().is_none());
        let config = dir.join("tokenizer_config.json");
        std::fs::write(&config, r#"{"source_lang": "de", "target_lang": null}"#).unwrap();
        assert!(LanguagePair::read(&dir).unwrap().is_none());
        std::fs::write(&config, r#"{"source_lang": "d e", "target_lang": "en"}"#).unwrap();
        assert!(LanguagePair::read(&dir).unwrap().is_none());
        std::fs::write(&config, r#"{"source_lang": "de", "target_lang": "en"}"#).unwrap();
        let pair = LanguagePair::read(&dir).unwrap().unwrap();
        assert_eq!((pair.source.as_str(), pair.target.as_str()), ("de", "en"));
        // Our own file wins.
        std::fs::write(dir.join(LANGUAGES_FILE), r#"{"source": "fr", "target": "en"}"#).unwrap();
        assert_eq!(LanguagePair::read(&dir).unwrap().unwrap().source, "fr");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn codes_are_checked() {
        for good in ["de", "en", "pt-BR", "zh-Hant-TW", "x_y1"] {
            assert!(check_code("c", good).is_ok(), "{good}");
        }
        for bad in ["", "1de", "d e", "de\n", "ü", &"a".repeat(MAX_CODE_LEN + 1)] {
            let e = check_code("--source-lang", bad).unwrap_err();
            assert!(e.contains("--source-lang"), "{e}");
        }
        assert!(LanguagePair::new("de", "de")
            .unwrap_err()
            .to_string()
            .contains("both"));
    }

    #[test]
    fn a_saved_pair_reads_back_and_bad_files_are_named() {
        let root = std::env::temp_dir().join(format!("langs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("model");
        assert_eq!(LanguagePair::read(&dir).unwrap(), None, "no directory");
        let pair = LanguagePair::new("de", "en").unwrap();
        let mut w = CheckpointWriter::begin(&dir).unwrap();
        pair.write(&mut w).unwrap();
        w.commit().unwrap();
        assert_eq!(LanguagePair::read(&dir).unwrap(), Some(pair));
        // A changed file in a saved checkpoint is caught by its manifest...
        std::fs::write(dir.join(LANGUAGES_FILE), "{}").unwrap();
        let e = LanguagePair::read(&dir).unwrap_err().to_string();
        assert!(e.contains("manifest"), "{e}");
        // ...and a bad one in a plain directory by the reader.
        let dir = root.join("plain");
        std::fs::create_dir_all(&dir).unwrap();
        for (text, expect) in [
            ("{\"source\": \"de\"}", "missing field"),
            (
                "{\"source\": \"de\", \"target\": \"en\", \"x\": 1}",
                "unknown field",
            ),
            (
                "{\"source\": \"de\", \"target\": \"\"}",
                "not a language code",
            ),
            ("[1,", "not a language pair"),
        ] {
            std::fs::write(dir.join(LANGUAGES_FILE), text).unwrap();
            let e = LanguagePair::read(&dir).unwrap_err().to_string();
            assert!(
                e.contains(LANGUAGES_FILE) && e.contains(expect),
                "{text}: {e}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
