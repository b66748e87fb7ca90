//! Several translation models behind one LibreTranslate surface (`serve --model A --model B`):
//! each model translates one pair (its `languages.json`, Marian's `tokenizer_config.json`) or
//! many (a multilingual model's codes), and every model runs its own engine on its own compute
//! thread. A request's `(source, target)` goes to the first model that translates it directly,
//! else through English with two models, as LibreTranslate pivots: `source → en` by one, then
//! `en → target` by another (English as each model names it: `en`, `en_XX`, `eng_Latn`).
//! `/languages` lists every pair some route serves, and `/detect` (and `source: "auto"`)
//! chooses among every source language (see `text::detect`).
//!
//! Codes are matched as the models name them: a pair that would need `de` from one model and
//! `deu_Latn` from another is not joined, except through the English pivot.

use super::api_error::ApiError;
use super::jobs::Job;
use super::translate_api::LanguageTable;
use crate::pipeline::translate::Languages;
use crate::text::detect::LanguageDetector;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// What one model translates.
#[derive(Debug)]
pub enum ModelLanguages {
    /// One pair, by its codes.
    Pair { source: String, target: String },
    /// Any two of a multilingual model's codes.
    Many(Arc<LanguageTable>),
}

/// One served translation model.
#[derive(Debug)]
pub struct RoutedModel {
    /// Its file name (for messages).
    pub name: String,
    /// Its engine's job queue.
    pub jobs: Sender<Job>,
    pub languages: ModelLanguages,
}

impl RoutedModel {
    /// The languages to ask this model for, to translate `source` into `target`, when it
    /// does.
    fn translates(&self, source: &str, target: &str) -> Option<Languages> {
        match &self.languages {
            ModelLanguages::Pair { source: s, target: t } => {
                (s == source && t == target).then(Languages::default)
            }
            ModelLanguages::Many(table) if source != target => {
                Some(table.languages(table.token(source)?, table.token(target)?))
            }
            ModelLanguages::Many(_) => None,
        }
    }

    /// Its code of English as a target (`as_target`) or as a source, if it has one.
    fn english(&self, as_target: bool) -> Option<&str> {
        match &self.languages {
            ModelLanguages::Pair { source, target } => {
                Some(if as_target { target } else { source }.as_str()).filter(|c| is_english(c))
            }
            ModelLanguages::Many(table) => table.codes().find(|c| is_english(c)),
        }
    }

    /// The languages it translates from.
    fn sources(&self) -> Vec<&str> {
        match &self.languages {
            ModelLanguages::Pair { source, .. } => vec![source.as_str()],
            ModelLanguages::Many(table) => table.codes().collect(),
        }
    }

    /// Every (source, target) pair it translates directly.
    fn pairs(&self) -> Vec<(&str, &str)> {
        match &self.languages {
            ModelLanguages::Pair { source, target } => vec![(source, target)],
            ModelLanguages::Many(table) => {
                let codes: Vec<&str> = table.codes().collect();
                let mut pairs = Vec::with_capacity(codes.len() * codes.len());
                for &s in &codes {
                    pairs.extend(codes.iter().filter(|&&t| t != s).map(|&t| (s, t)));
                }
                pairs
            }
        }
    }
}

/// Whether a model's code names English (the pivot).
pub fn is_english(code: &str) -> bool {
    let base = code.trim_matches('_').split(['_', '-']).next().unwrap_or(code);
    base == "en" || base == "eng"
}

/// One model's part of a route.
#[derive(Debug)]
pub struct Step<'a> {
    pub model: &'a RoutedModel,
    pub languages: Languages,
}

/// The served models and the language detector over their sources.
#[derive(Debug)]
pub struct Routes {
    pub models: Vec<RoutedModel>,
    detector: LanguageDetector,
}

impl Routes {
    /// The routes of `models` (the first answers a pair several models translate).
    pub fn new(models: Vec<RoutedModel>) -> Routes {
        let sources: BTreeSet<&str> = models.iter().flat_map(RoutedModel::sources).collect();
        let detector = LanguageDetector::new(sources);
        Routes { models, detector }
    }

    /// The steps that translate `source` into `target`: one model, or two through English;
    /// a 400 naming the pair when no route exists.
    pub fn route(&self, source: &str, target: &str) -> Result<Vec<Step<'_>>, ApiError> {
        if source == target {
            return Err(ApiError::invalid(
                Some("target"),
                format!("source and target are both {source}"),
            ));
        }
        let direct = |s: &str, t: &str| {
            (self.models.iter()).find_map(|m| Some(Step { languages: m.translates(s, t)?, model: m }))
        };
        if let Some(step) = direct(source, target) {
            return Ok(vec![step]);
        }
        if !is_english(source) && !is_english(target) {
            for first in &self.models {
                let Some(into) = (first.english(true)).and_then(|e| first.translates(source, e))
                else {
                    continue;
                };
                let onward = (self.models.iter()).find_map(|m| {
                    let languages = m.translates(m.english(false)?, target)?;
                    Some(Step { model: m, languages })
                });
                if let Some(second) = onward {
                    return Ok(vec![Step { model: first, languages: into }, second]);
                }
            }
        }
        Err(ApiError::invalid(
            Some("target"),
            format!(
                "no served model translates {source} to {target}, directly or through English \
                 (GET /languages)"
            ),
        ))
    }

    /// Every source code with the targets some route reaches from it, sorted.
    pub fn pairs(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut direct: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for m in &self.models {
            for (s, t) in m.pairs() {
                direct.entry(s.to_string()).or_default().insert(t.to_string());
            }
        }
        // Through English: what any English code reaches.
        let from_english: BTreeSet<String> = (direct.iter())
            .filter(|(s, _)| is_english(s))
            .flat_map(|(_, ts)| ts.iter().cloned())
            .collect();
        let mut all = direct.clone();
        for (s, targets) in &direct {
            if targets.iter().any(|t| is_english(t)) {
                let reach = all.get_mut(s).expect("a listed source");
                reach.extend(from_english.iter().filter(|&t| t != s && !is_english(t)).cloned());
            }
        }
        all
    }

    /// The source code of `text`'s language and the confidence (0 to 1): the detector's
    /// guess, reliable or not, if it has one.
    pub fn detect(&self, text: &str) -> Option<(&str, f64)> {
        self.detector.detect(text).map(|d| (d.code, d.confidence))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str, source: &str, target: &str) -> RoutedModel {
        RoutedModel {
            name: name.into(),
            jobs: std::sync::mpsc::channel().0,
            languages: ModelLanguages::Pair { source: source.into(), target: target.into() },
        }
    }

    fn names<'a>(steps: &[Step<'a>]) -> Vec<&'a str> {
        steps.iter().map(|s| s.model.name.as_str()).collect()
    }

    #[test]
    fn pairs_route_directly_else_through_english() {
        let routes = Routes::new(vec![
            pair("de-en", "de", "en"),
            pair("en-es", "en", "es"),
            pair("en-de", "en", "de"),
            pair("fr-en", "fr", "en"),
        ]);
        assert_eq!(names(&routes.route("de", "en").unwrap()), ["de-en"]);
        assert_eq!(names(&routes.route("de", "es").unwrap()), ["de-en", "en-es"]);
        assert_eq!(names(&routes.route("fr", "de").unwrap()), ["fr-en", "en-de"]);
        let e = routes.route("es", "de").unwrap_err();
        assert!(e.message.contains("es to de"), "{}", e.message);
        assert!(routes.route("de", "de").is_err());
        let pairs = routes.pairs();
        let of = |s: &str| pairs[s].iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(of("de"), ["en", "es"]);
        assert_eq!(of("fr"), ["de", "en", "es"]);
        assert_eq!(of("en"), ["de", "es"]);
        assert!(!pairs.contains_key("es"));
        // Only the sources are detected.
        assert_eq!(routes.detect("Das ist ein ziemlich langer deutscher Satz.").unwrap().0, "de");
        let french = "C'est une phrase assez longue, écrite en français.";
        assert_eq!(routes.detect(french).unwrap().0, "fr");
    }

    #[test]
    fn english_is_recognised_in_every_scheme() {
        for code in ["en", "eng", "en_XX", "eng_Latn", "__en__", "en-GB"] {
            assert!(is_english(code), "{code}");
        }
        for code in ["es", "ene", "deu_Latn", ""] {
            assert!(!is_english(code), "{code}");
        }
    }
}
