//! Translation with a model directory written by `train`, `demo --out` or `average`
//! (`config.json`, `model.safetensors`, `vocab.json`), a Hugging Face Marian or M2M100 / NLLB
//! model, a CTranslate2 model directory or an Argos Translate package: greedy and beam
//! translation of lines, n-best lists, and the log-probability of given pairs. Empty lines
//! stay empty, so line counts always match.

use super::{check_model_dir, check_vocab};
use crate::decode::beam::{beam_search, length_penalty, BeamHypothesis, BeamOptions, BeamRules};
use crate::decode::greedy::{greedy_decode, GreedyOptions, Hypothesis};
use crate::decode::score::score_pairs;
use crate::decode::TokenRules;
use crate::error::{Error, Result};
use crate::model::checkpoint::load;
use crate::model::families;
use crate::model::Seq2Seq;
use crate::store::VOCAB_FILE;
use crate::text::corpus::Pair;
use crate::text::languages::LanguagePair;
use crate::text::vocab::Vocab;
#[cfg(feature = "viz")]
use crate::viz::{attention_maps, AttentionMaps};
use std::path::Path;

mod languages;

/// CTranslate2's default `min_decoding_length` (`translate_batch`, `ctranslate2.Translator`):
/// EOS is not its first output.
pub const CT2_MIN_DECODING_LENGTH: usize = 1;

/// A translation model and its vocabulary.
pub struct Translator {
    /// The encoder-decoder model.
    pub model: Seq2Seq<f32>,
    /// The shared source/target vocabulary.
    pub vocab: Vocab,
    /// A multilingual model's languages (its source and target tokens), when chosen.
    pub languages: Languages,
    /// The language pair a package names (an Argos Translate package's `from_code` and
    /// `to_code`), for routing requests by language.
    pub pair: Option<LanguagePair>,
    /// What beam search's step after the forced target-language token lets EOS do: the rule
    /// of the runtime the model came from (CTranslate2's for its model directories).
    pub beam_rules: BeamRules,
    /// EOS is not emitted before this many target tokens are (the forced target-language
    /// token counted): the default of the runtime the model came from (CTranslate2's
    /// `min_decoding_length` 1 for its model directories, which forbids an empty translation
    /// where nothing is forced); searches take the larger of this and their options'.
    pub min_len: usize,
    /// EOS is forced as the last token of every output limit: a Hugging Face model's
    /// `forced_eos_token_id` (see `model::families::generation_config`); searches force it
    /// when this or their options say so.
    pub forced_end: bool,
    /// What the model's generation settings ask that is not read (`num_beams 4`, ...), one line
    /// for a warning (see `model::families::generation_config`).
    pub generation_note: Option<String>,
    /// A CTranslate2 model's int8 weights as stored, multiplied as they are in int8 inference.
    stored_int8: Option<families::ctranslate2_int8::StoredInt8>,
}

/// A multilingual model's source and target languages: our ids of their tokens. The source
/// token starts every source (MADLAD-400: the target language's `<2xx>` piece); the target
/// token is forced as every translation's first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Languages {
    /// The source language's token.
    pub source: Option<u32>,
    /// The target language's token.
    pub target: Option<u32>,
}

impl Translator {
    /// Loads a model directory, checking that the vocabulary matches the model: ours, or a
    /// Hugging Face Marian model (OPUS-MT; see `model::families::marian`), or an M2M100 / NLLB
    /// or mBART-50 model (see `model::families::m2m100`, `mbart`; its languages from
    /// `tokenizer_config.json`'s `src_lang` / `tgt_lang` where it names known ones, else
    /// chosen by [`set_languages`](Self::set_languages)), a CTranslate2 model directory (see
    /// `model::families::ctranslate2`; a converted NLLB / M2M100 one takes its languages as
    /// the Hugging Face directory does), or an Argos Translate package, a `.argosmodel` file or
    /// its directory (see [`super::argos`]). CTranslate2's models decode with its defaults and
    /// rules ([`min_len`](Self::min_len), [`beam_rules`](Self::beam_rules)); a Hugging Face
    /// directory's generation settings are honoured, refused or noted by name
    /// ([`forced_end`](Self::forced_end), [`generation_note`](Self::generation_note); see
    /// `model::families::generation_config`).
    pub fn load(dir: &Path) -> Result<Translator> {
        if super::argos::is_package(dir) {
            return super::argos::load(dir);
        }
        check_model_dir(dir)?;
        if families::ctranslate2::is_ctranslate2_dir(dir) {
            let files = crate::store::package::Files::Dir(dir.to_path_buf());
            let (model, vocab, int8) = families::ctranslate2::load_files(&files, None)?;
            let mut translator = Translator::of(model, vocab);
            translator.set_stored_int8(int8);
            translator.beam_rules = BeamRules::CTranslate2;
            translator.min_len = CT2_MIN_DECODING_LENGTH;
            // A converted NLLB / M2M100 model: its languages as for the Hugging Face directory.
            translator.languages = translator.tokenizer_languages(dir);
            return Ok(translator);
        }
        if families::marian::is_marian_dir(dir) {
            let (model, vocab) = families::marian::load(dir)?;
            return Translator::of(model, vocab).with_generation_config(dir);
        }
        if families::t5::is_t5_dir(dir) {
            let (model, vocab) = families::t5::load(dir)?;
            return Translator::of(model, vocab).with_generation_config(dir);
        }
        type Load = fn(&Path) -> Result<(Seq2Seq<f32>, Vocab)>;
        let multilingual: Option<Load> = if families::m2m100::is_m2m100_dir(dir) {
            Some(families::m2m100::load)
        } else if families::mbart::is_mbart_dir(dir) {
            Some(families::mbart::load)
        } else {
            None
        };
        if families::bart::is_bart_dir(dir) {
            let (model, vocab, languages) = families::bart::load(dir)?;
            let mut translator = Translator::of(model, vocab);
            translator.languages = languages;
            return translator.with_generation_config(dir);
        }
        if let Some(load) = multilingual {
            let (model, vocab) = load(dir)?;
            let mut translator = Translator::of(model, vocab);
            translator.languages = translator.tokenizer_languages(dir);
            return translator.with_generation_config(dir);
        }
        let model: Seq2Seq<f32> = load(dir)?;
        let path = dir.join(VOCAB_FILE);
        let vocab = Vocab::load(&path)?;
        check_vocab(&path, vocab.len(), model.config.vocab_size, true)?;
        Ok(Translator::of(model, vocab))
    }

    /// A translator of `model` and `vocab`, no languages chosen.
    pub fn of(model: Seq2Seq<f32>, vocab: Vocab) -> Translator {
        Translator {
            model,
            vocab,
            languages: Languages::default(),
            pair: None,
            beam_rules: BeamRules::Ours,
            min_len: 0,
            forced_end: false,
            generation_note: None,
            stored_int8: None,
        }
    }

    /// Keeps a CTranslate2 model's int8 weights as stored, for int8 inference.
    pub(crate) fn set_stored_int8(&mut self, int8: Option<families::ctranslate2_int8::StoredInt8>) {
        self.stored_int8 = int8;
    }

    /// How many of the model's layers hold int8 weights as stored (a CTranslate2 int8 model's;
    /// 0 for others).
    pub fn stored_int8_layers(&self) -> usize {
        self.stored_int8.as_ref().map_or(0, |w| w.weights())
    }

    /// Readies the model for decoding (see [`Seq2Seq::prepare_inference`]).
    pub fn prepare_inference(&mut self) {
        self.model.prepare_inference();
    }

    /// Readies the model for decoding in `precision` with every weight held in one form, its
    /// float32 values released (see [`Seq2Seq::prepare_alone`]): the model then translates but
    /// no longer trains, saves or goes to a device (for that, [`prepare_inference`](Self::prepare_inference)).
    /// int8 inference of a CTranslate2 int8 model multiplies its weights as stored (moved into
    /// the layers, not copied).
    pub fn prepare_precision(&mut self, precision: crate::kernels::lowp::Precision) -> Result<()> {
        if precision == crate::kernels::lowp::Precision::Int8 {
            if let Some(w) = self.stored_int8.take() {
                w.install(&mut self.model)
                    .map_err(|e| Error::Input(format!("--precision int8: {e}")))?;
            }
        }
        self.model
            .prepare_alone(precision)
            .map_err(|e| Error::Input(format!("--precision: {e}")))?;
        // The released values' pages, which the allocator would keep for reuse.
        crate::alloc::give_back_free_memory();
        Ok(())
    }

    /// Greedy translations of `lines` (empty lines stay empty).
    pub fn translate(&self, lines: &[String], options: &GreedyOptions) -> Result<Vec<String>> {
        self.translate_in(self.languages, lines, options)
    }

    /// Greedy translations of `lines` between `languages` (a multilingual model's; ignored by a
    /// model of one pair).
    pub fn translate_in(
        &self,
        languages: Languages,
        lines: &[String],
        options: &GreedyOptions,
    ) -> Result<Vec<String>> {
        let languages = self.check_languages(languages)?;
        let options = GreedyOptions {
            forced_first: languages.target,
            min_len: options.min_len.max(self.min_len),
            forced_end: options.forced_end || self.forced_end,
            ..*options
        };
        translate_lines(&self.model, &self.vocab, languages.source, lines, &options)
    }

    /// The n-best translations `(score, text)` of `lines`; see [`translate_nbest`].
    pub fn translate_nbest(
        &self,
        lines: &[String],
        options: &BeamOptions,
    ) -> Result<Vec<Vec<(f64, String)>>> {
        self.translate_nbest_in(self.languages, lines, options)
    }

    /// The n-best translations of `lines` between `languages` (see
    /// [`translate_in`](Self::translate_in)).
    pub fn translate_nbest_in(
        &self,
        languages: Languages,
        lines: &[String],
        options: &BeamOptions,
    ) -> Result<Vec<Vec<(f64, String)>>> {
        let languages = self.check_languages(languages)?;
        let options = BeamOptions {
            forced_first: languages.target,
            min_len: options.min_len.max(self.min_len),
            forced_end: options.forced_end || self.forced_end,
            beam_rules: self.beam_rules,
            ..*options
        };
        translate_nbest(&self.model, &self.vocab, languages.source, lines, &options)
    }

    /// `log p(target | source)` of each pair, summed over the target tokens and the closing EOS;
    /// a pair that does not fit the model is refused with `input` (the file's name) and its
    /// line number.
    pub fn score(&self, pairs: &[Pair], batch_size: usize, input: &str) -> Result<Vec<f64>> {
        let limit = self.model.config.max_len - 1;
        let mut encoded = Vec::with_capacity(pairs.len());
        let languages = self.check_languages(self.languages)?;
        for p in pairs {
            // A multilingual model's source starts with its language's token, its target with
            // the target's (scored, not forced).
            let s = encode_after(&self.vocab, languages.source, &p.source);
            let t = encode_after(&self.vocab, languages.target, &p.target);
            if s.len() > limit || t.len() > limit {
                return Err(Error::Input(format!(
                    "{input} line {}: {} source / {} target tokens, the model accepts at most {limit}",
                    p.line,
                    s.len(),
                    t.len()
                )));
            }
            self.model.embedding.check_ids(&s)?;
            self.model.embedding.check_ids(&t)?;
            encoded.push((s, t));
        }
        Ok(score_pairs(&self.model, &encoded, batch_size.max(1)))
    }
}

#[cfg(feature = "viz")]
impl Translator {
    /// Every attention map of one sentence pair (see [`attention_maps`]); without `target`,
    /// the target is the greedy translation of `source`, returned with the maps.
    pub fn attention_maps(
        &self,
        source: &str,
        target: Option<&str>,
    ) -> Result<(AttentionMaps, Option<String>)> {
        let limit = self.model.config.max_len - 1;
        // A multilingual model's source and target start with their languages' tokens.
        let languages = self.check_languages(self.languages)?;
        let encode = |what: &str, text: &str| -> Result<Vec<u32>> {
            let first = match what {
                "src" => languages.source,
                _ => languages.target,
            };
            let ids = encode_after(&self.vocab, first, text);
            self.model.embedding.check_ids(&ids)?;
            if ids.len() > limit {
                return Err(Error::Input(format!(
                    "--{what} has {} tokens; the model takes at most {limit}",
                    ids.len()
                )));
            }
            Ok(ids)
        };
        let src = encode("src", source)?;
        if src.len() == usize::from(languages.source.is_some()) {
            return Err(Error::Input("--src is empty".into()));
        }
        let (tgt, greedy) = match target {
            Some(t) => (encode("tgt", t)?, None),
            None => {
                let options = GreedyOptions {
                    forced_first: languages.target,
                    min_len: self.min_len,
                    forced_end: self.forced_end,
                    ..GreedyOptions::default()
                };
                let hyp = greedy_decode(&self.model, std::slice::from_ref(&src), &options)
                    .pop()
                    .expect("one hypothesis per source");
                let mut tokens = hyp.tokens;
                tokens.truncate(limit);
                let text = self.vocab.decode(&tokens);
                (tokens, Some(text))
            }
        };
        let maps = attention_maps(&self.model, &src, &tgt, &self.vocab);
        Ok((maps, greedy))
    }
}

/// The token ids of `text` after `first` when given (a multilingual model's language token).
fn encode_after(vocab: &Vocab, first: Option<u32>, text: &str) -> Vec<u32> {
    // MADLAD-400's language piece is written before the text, `<2de> text`, and the whole
    // encoded, as its inputs are (SentencePiece gives the piece a `▁` of its own before it).
    if let (Some(t5), Some(first)) = (vocab.t5(), first) {
        if let Some(piece) = t5.token(first) {
            return vocab.encode(&format!("{piece} {text}"));
        }
    }
    first.into_iter().chain(vocab.encode(text)).collect()
}

/// Encodes source lines, each after `first` when given (a multilingual model's source
/// language), refusing any that do not fit the model (1-based line numbers).
pub fn encode_sources(
    lines: &[String],
    vocab: &Vocab,
    first: Option<u32>,
    model: &Seq2Seq<f32>,
) -> Result<Vec<Vec<u32>>> {
    let limit = model.config.max_len - 1;
    let mut too_long = Vec::new();
    let sources: Vec<Vec<u32>> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ids = encode_after(vocab, first, l);
            if ids.len() > limit {
                too_long.push(format!("line {} ({} tokens)", i + 1, ids.len()));
            }
            ids
        })
        .collect();
    for ids in &sources {
        model.embedding.check_ids(ids)?;
    }
    if !too_long.is_empty() {
        return Err(Error::Input(format!(
            "{} input {} longer than the model's limit of {limit} tokens: {}",
            too_long.len(),
            if too_long.len() == 1 {
                "line is"
            } else {
                "lines are"
            },
            too_long
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(sources)
}

/// Greedy translations of `lines` (empty lines stay empty), each source after `first` when
/// given (see [`encode_sources`]).
pub fn translate_lines(
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    first: Option<u32>,
    lines: &[String],
    options: &GreedyOptions,
) -> Result<Vec<String>> {
    let sources = encode_sources(lines, vocab, first, model)?;
    let non_empty: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let to_decode: Vec<Vec<u32>> = non_empty.iter().map(|&i| sources[i].clone()).collect();
    let hyps = greedy_decode(model, &to_decode, options);
    let mut out = vec![String::new(); lines.len()];
    for (&i, h) in non_empty.iter().zip(hyps) {
        out[i] = vocab.decode(&h.tokens);
    }
    Ok(out)
}

/// The n-best translations `(score, text)` of `lines`, best first: beam search when
/// `options.beam_size > 1`, else greedy search (its one hypothesis scored the same way,
/// `log p / lp`), on a device: the CPU's searches over the device's decoder rows. Empty lines
/// get no hypotheses.
pub fn translate_nbest_on_device<D: crate::backend::Device>(
    device_model: &crate::model::device_seq2seq::DeviceSeq2Seq<D>,
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    lines: &[String],
    options: &BeamOptions,
) -> Result<Vec<Vec<(f64, String)>>>
where
    crate::model::device_seq2seq::DeviceSeq2Seq<D>: Sync,
{
    let (k, search) = (
        options.beam_size,
        (options.alpha, Some(options.stop), options.beam_rules),
    );
    let rules =
        (TokenRules::TRANSLATION.ending_from(options.min_len)).ending_at_limit(options.forced_end);
    let config = &model.config;
    if !config.source_eos {
        return Err(Error::Input(
            "--device gpu: models without a source EOS (OpenNMT-py / Argos Translate) are not \
             on a device yet"
                .into(),
        ));
    }
    if vocab.fairseq().is_some() {
        return Err(Error::Input(
            "--device gpu: multilingual models (forced target-language tokens, a logit bias) \
             are not on a device yet"
                .into(),
        ));
    }
    nbest_lists(
        model,
        vocab,
        None,
        lines,
        options,
        |to_decode, greedy| match greedy {
            None => {
                crate::decode::beam::beam_search_with(config, to_decode, options, |srcs, limits| {
                    device_model.translate_beam(srcs, limits, k, search, rules)
                })
                .map(beam_lists)
            }
            Some(greedy) => crate::decode::greedy::greedy_decode_with(
                config,
                to_decode,
                &greedy,
                |srcs, limits| device_model.translate_greedy(srcs, limits, rules),
            )
            .map(|hyps| greedy_lists(hyps, options.alpha)),
        },
    )
}

/// The n-best translations of `lines` on the CPU, each source after `first` when given (see
/// [`translate_nbest_on_device`] for a device's).
pub fn translate_nbest(
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    first: Option<u32>,
    lines: &[String],
    options: &BeamOptions,
) -> Result<Vec<Vec<(f64, String)>>> {
    nbest_lists(model, vocab, first, lines, options, |to_decode, greedy| {
        Ok::<_, Error>(match greedy {
            None => beam_lists(beam_search(model, to_decode, options)),
            Some(greedy) => greedy_lists(greedy_decode(model, to_decode, &greedy), options.alpha),
        })
    })
}

/// The lists `(score, tokens)` of a search.
type Lists = Vec<Vec<(f64, Vec<u32>)>>;

/// The n-best lists of `lines`: their non-empty lines' sources searched by `search` (with the
/// greedy options when `options.beam_size` is 1, else `None`: beam search), decoded to text.
fn nbest_lists<E>(
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    first: Option<u32>,
    lines: &[String],
    options: &BeamOptions,
    search: impl FnOnce(&[Vec<u32>], Option<GreedyOptions>) -> std::result::Result<Lists, E>,
) -> Result<Vec<Vec<(f64, String)>>>
where
    Error: From<E>,
{
    let sources = encode_sources(lines, vocab, first, model)?;
    let non_empty: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let to_decode: Vec<Vec<u32>> = non_empty.iter().map(|&i| sources[i].clone()).collect();
    let greedy = (options.beam_size <= 1).then_some(GreedyOptions {
        max_len_extra: options.max_len_extra,
        batch_size: options.batch_size,
        forced_first: options.forced_first,
        min_len: options.min_len,
        forced_end: options.forced_end,
    });
    let lists = search(&to_decode, greedy)?;
    let mut out = vec![Vec::new(); lines.len()];
    for (&i, list) in non_empty.iter().zip(lists) {
        out[i] = list
            .into_iter()
            .map(|(score, tokens)| (score, vocab.decode(&tokens)))
            .collect();
    }
    Ok(out)
}

/// Beam search's lists as `(score, tokens)`.
fn beam_lists(lists: Vec<Vec<BeamHypothesis>>) -> Lists {
    lists
        .into_iter()
        .map(|l| l.into_iter().map(|h| (h.score, h.tokens)).collect())
        .collect()
}

/// Greedy search's hypotheses as one-entry lists, scored `log p / lp` as beam search scores.
fn greedy_lists(hyps: Vec<Hypothesis>, alpha: f64) -> Lists {
    hyps.into_iter()
        .map(|h| {
            let score = h.score / length_penalty(h.n_emitted(), alpha);
            vec![(score, h.tokens)]
        })
        .collect()
}
