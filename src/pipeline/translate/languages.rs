//! The translator's languages (a multilingual model's codes: NLLB / M2M100 / mBART-50's
//! source and forced target tokens, MADLAD-400's `<2xx>` target pieces) and the generation
//! settings of a Hugging Face directory (see `model::families::generation_config`).

use super::{Languages, Translator};
use crate::error::{Error, Result};
use crate::model::families;
use std::path::Path;

impl Translator {
    /// This translator with the generation settings of the Hugging Face directory `dir`
    /// (`generation_config.json`, else `config.json`; see
    /// `model::families::generation_config`): its forced EOS, a note of what is not read, and
    /// a `forced_bos_token_id` refused where nothing reads it (BART's family forces it; a
    /// multilingual model forces its target language instead, noted).
    pub(super) fn with_generation_config(mut self, dir: &Path) -> Result<Translator> {
        let vocab_size = self.vocab.len();
        let generation = families::generation_config::read_dir(dir, vocab_size)?;
        let mut note = generation.note();
        if let Some(bos) = generation.forced_bos {
            let path = generation.path.display();
            if self.vocab.fairseq().is_some() {
                let replaced = format!(
                    "{path}: forced_bos_token_id {bos} not read: the target language's token is \
                     forced instead (--target-lang)"
                );
                note = Some(match note {
                    Some(n) => format!("{n}; {replaced}"),
                    None => replaced,
                });
            } else if self.vocab.bart().is_none() {
                return Err(Error::Input(format!(
                    "{path}: forced_bos_token_id {bos} is not supported for this model (only \
                     BART's and the multilingual models' first token is forced)"
                )));
            }
        }
        self.forced_end = generation.forced_eos;
        self.generation_note = note;
        Ok(self)
    }

    /// A multilingual model's languages that `dir`'s `tokenizer_config.json` names (`src_lang`,
    /// `tgt_lang`) where the model knows them; none for a model of one pair.
    pub(super) fn tokenizer_languages(&self, dir: &Path) -> Languages {
        let Some(tokenizer) = self.vocab.fairseq() else {
            return Languages::default();
        };
        let (source, target) = crate::text::languages::tokenizer_languages(dir);
        Languages {
            source: source.and_then(|c| tokenizer.language(&c)),
            target: target.and_then(|c| tokenizer.language(&c)),
        }
    }

    /// A multilingual model's languages of codes `source` and `target` (`eng_Latn`; M2M100:
    /// `en`), each `None` keeping this translator's; an error names a code the model does not
    /// know, or says that the model has no languages to choose.
    pub fn languages_of(&self, source: Option<&str>, target: Option<&str>) -> Result<Languages> {
        if source.is_none() && target.is_none() {
            return Ok(self.languages);
        }
        if let Some(t5) = self
            .vocab
            .t5()
            .filter(|t| t.language_codes().next().is_some())
        {
            return self.madlad_languages(t5, source, target);
        }
        let Some(tokenizer) = self.vocab.fairseq() else {
            return Err(Error::Input(
                "--source-lang / --target-lang: this model has no language codes (it \
                 translates one pair)"
                    .into(),
            ));
        };
        let pick = |what: &str, code: Option<&str>, kept: Option<u32>| match code {
            Some(code) => (tokenizer.language_or_error(code))
                .map(Some)
                .map_err(|e| Error::Input(format!("--{what}-lang: {e}"))),
            None => Ok(kept),
        };
        Ok(Languages {
            source: pick("source", source, self.languages.source)?,
            target: pick("target", target, self.languages.target)?,
        })
    }

    /// MADLAD-400's languages: the target's piece `<2xx>` starts the source (our
    /// [`Languages::source`] token); nothing is forced first. A source language is not an input
    /// of the model: a code it knows is accepted and changes nothing.
    fn madlad_languages(
        &self,
        t5: &crate::text::t5_tokenizer::T5Tokenizer,
        source: Option<&str>,
        target: Option<&str>,
    ) -> Result<Languages> {
        let known = |what: &str, code: &str| {
            t5.language(code).ok_or_else(|| {
                let few: Vec<&str> = t5.language_codes().take(4).collect();
                Error::Input(format!(
                    "--{what}-lang {code}: not one of this model's {} languages (its <2xx> \
                     pieces: codes such as {}; all of them are its vocabulary's <2xx> tokens, \
                     which `serve` lists at GET /languages)",
                    t5.language_codes().count(),
                    few.join(", ")
                ))
            })
        };
        if let Some(code) = source {
            known("source", code)?;
        }
        let first = match target {
            Some(code) => Some(known("target", code)?),
            None => self.languages.source,
        };
        Ok(Languages {
            source: first,
            target: None,
        })
    }

    /// Chooses a multilingual model's languages (see [`languages_of`](Self::languages_of)).
    pub fn set_languages(&mut self, source: Option<&str>, target: Option<&str>) -> Result<()> {
        self.languages = self.languages_of(source, target)?;
        Ok(())
    }

    /// `languages` when this model needs them and has both (else an error saying how to choose
    /// them); `Languages::default()` for a model of one pair.
    pub fn check_languages(&self, languages: Languages) -> Result<Languages> {
        if let Some(t5) = self
            .vocab
            .t5()
            .filter(|t| t.language_codes().next().is_some())
        {
            let languages = match languages == Languages::default() {
                true => self.languages,
                false => languages,
            };
            if languages.source.is_none() {
                let few: Vec<&str> = t5.language_codes().take(4).collect();
                return Err(Error::Input(format!(
                    "this model translates into {} languages: choose the target with \
                     --target-lang (codes such as {})",
                    t5.language_codes().count(),
                    few.join(", ")
                )));
            }
            return Ok(languages);
        }
        let Some(tokenizer) = self.vocab.fairseq() else {
            // A model of one pair: its own tokens, if any (BART's `<s>` first on both sides).
            return Ok(if languages == Languages::default() {
                self.languages
            } else {
                languages
            });
        };
        if languages.source.is_none() || languages.target.is_none() {
            let few: Vec<&str> = tokenizer.language_codes().take(4).collect();
            return Err(Error::Input(format!(
                "this model translates between {} languages: choose the source and the target \
                 with --source-lang and --target-lang (codes such as {})",
                tokenizer.language_codes().count(),
                few.join(", ")
            )));
        }
        Ok(languages)
    }
}
