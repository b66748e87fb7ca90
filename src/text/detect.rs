//! Which language a text is in, among the languages a server translates from: LibreTranslate's
//! `/detect` and `source: "auto"`. The identification is `whatlang`'s (trigram profiles of 70
//! languages, restricted to the candidates); this module matches its ISO 639-3 answers to the
//! codes the models use, whatever their scheme:
//!
//! - ISO 639-1 (`de`, Marian's and M2M100's, also `__de__`), with a region or script after it
//!   (`pt-BR`, mBART-50's `de_DE`);
//! - ISO 639-3 (`deu`), with a script after it (NLLB-200's `deu_Latn`).
//!
//! Codes of languages `whatlang` does not know are never detected; a text it cannot place
//! (too short, no letters) is not detected either, and the caller falls back to its default.

use whatlang::{Detector, Lang};

/// ISO 639-3 -> ISO 639-1 of every language `whatlang` identifies.
const ISO_639_1: &[(&str, &str)] = &[
    ("afr", "af"), ("aka", "ak"), ("amh", "am"), ("ara", "ar"), ("aze", "az"), ("bel", "be"),
    ("ben", "bn"), ("bul", "bg"), ("cat", "ca"), ("ces", "cs"), ("cmn", "zh"), ("cym", "cy"),
    ("dan", "da"), ("deu", "de"), ("ell", "el"), ("eng", "en"), ("epo", "eo"), ("est", "et"),
    ("fin", "fi"), ("fra", "fr"), ("guj", "gu"), ("heb", "he"), ("hin", "hi"), ("hrv", "hr"),
    ("hun", "hu"), ("hye", "hy"), ("ind", "id"), ("ita", "it"), ("jav", "jv"), ("jpn", "ja"),
    ("kan", "kn"), ("kat", "ka"), ("khm", "km"), ("kor", "ko"), ("lat", "la"), ("lav", "lv"),
    ("lit", "lt"), ("mal", "ml"), ("mar", "mr"), ("mkd", "mk"), ("mya", "my"), ("nep", "ne"),
    ("nld", "nl"), ("nob", "nb"), ("ori", "or"), ("pan", "pa"), ("pes", "fa"), ("pol", "pl"),
    ("por", "pt"), ("ron", "ro"), ("rus", "ru"), ("sin", "si"), ("slk", "sk"), ("slv", "sl"),
    ("sna", "sn"), ("spa", "es"), ("srp", "sr"), ("swe", "sv"), ("tam", "ta"), ("tel", "te"),
    ("tgl", "tl"), ("tha", "th"), ("tuk", "tk"), ("tur", "tr"), ("ukr", "uk"), ("urd", "ur"),
    ("uzb", "uz"), ("vie", "vi"), ("yid", "yi"), ("zul", "zu"),
];

/// The other names a model may give a language: Norwegian Bokmål as `no`, Chinese as `zho`,
/// Persian as `fas` (macro-language codes beside `whatlang`'s).
const ALIASES: &[(&str, &str)] = &[("nob", "no"), ("cmn", "zho"), ("pes", "fas")];

/// Whether the model code `code` names the language `lang`.
fn names(code: &str, lang: Lang) -> bool {
    let iso3 = lang.code();
    let bare = code
        .strip_prefix("__")
        .and_then(|c| c.strip_suffix("__"))
        .unwrap_or(code);
    let base = bare.split(['_', '-']).next().unwrap_or(bare);
    let iso1 = ISO_639_1.iter().find(|(three, _)| *three == iso3).map(|p| p.1);
    base == iso3
        || Some(base) == iso1
        || ALIASES
            .iter()
            .any(|&(three, other)| three == iso3 && base == other)
}

/// A detector over a server's source languages.
#[derive(Debug)]
pub struct LanguageDetector {
    /// Each candidate language `whatlang` knows, with the first model code naming it.
    candidates: Vec<(Lang, String)>,
    /// `whatlang`'s detector restricted to the candidates.
    detector: Detector,
}

impl LanguageDetector {
    /// A detector choosing among `codes` (as the models name them; unknown ones are left out).
    pub fn new<'a>(codes: impl IntoIterator<Item = &'a str>) -> LanguageDetector {
        let mut candidates: Vec<(Lang, String)> = Vec::new();
        for code in codes {
            for &lang in Lang::all() {
                if names(code, lang) && !candidates.iter().any(|(l, _)| *l == lang) {
                    candidates.push((lang, code.to_string()));
                }
            }
        }
        let detector = Detector::with_allowlist(candidates.iter().map(|(l, _)| *l).collect());
        LanguageDetector {
            candidates,
            detector,
        }
    }

    /// The language of `text` among the candidates, or `None` when none fits (no letters, a
    /// script none of them is written in). One candidate is the answer to every text written
    /// in its script.
    pub fn detect(&self, text: &str) -> Option<Detected<'_>> {
        if self.candidates.is_empty() {
            return None;
        }
        let info = self.detector.detect(text)?;
        let code = self
            .candidates
            .iter()
            .find(|(l, _)| *l == info.lang())
            .map(|(_, c)| c.as_str())?;
        Some(Detected {
            code,
            confidence: info.confidence(),
            reliable: info.is_reliable(),
        })
    }
}

/// A detected language.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detected<'a> {
    /// The candidate code.
    pub code: &'a str,
    /// How sure the detector is, 0 to 1.
    pub confidence: f64,
    /// Whether the text was long and clear enough to trust it (short texts rarely are).
    pub reliable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_of_every_scheme_name_their_language() {
        for (code, lang) in [
            ("de", Lang::Deu),
            ("__de__", Lang::Deu),
            ("de_DE", Lang::Deu),
            ("deu_Latn", Lang::Deu),
            ("pt-BR", Lang::Por),
            ("eng_Latn", Lang::Eng),
            ("en_XX", Lang::Eng),
            ("zh_CN", Lang::Cmn),
            ("no", Lang::Nob),
        ] {
            assert!(names(code, lang), "{code}");
        }
        assert!(!names("es", Lang::Eng) && !names("xx", Lang::Deu) && !names("", Lang::Deu));
        // Every language whatlang knows has its two-letter code here.
        for &lang in Lang::all() {
            assert!(ISO_639_1.iter().any(|(three, _)| *three == lang.code()), "{lang:?}");
        }
    }

    #[test]
    fn texts_are_placed_among_the_candidates_only() {
        let d = LanguageDetector::new(["de", "en", "es", "xx"]);
        assert_eq!(d.candidates.len(), 3);
        let cases = [
            ("Das Haus ist sehr alt und steht am Rande der kleinen Stadt.", "de"),
            ("The house is very old and stands at the edge of the small town.", "en"),
            ("La casa es muy vieja y está al borde del pequeño pueblo.", "es"),
        ];
        for (text, want) in cases {
            let got = d.detect(text).unwrap();
            assert_eq!(got.code, want, "{text}");
            assert!(got.reliable && got.confidence > 0.5 && got.confidence <= 1.0, "{got:?}");
        }
        // A word is a guess.
        assert!(!d.detect("Hallo").unwrap().reliable);
        // NLLB's codes: the same answers in its scheme; French is not a candidate here.
        let nllb = LanguageDetector::new(["deu_Latn", "eng_Latn", "spa_Latn"]);
        assert_eq!(nllb.detect(cases[0].0).unwrap().code, "deu_Latn");
        assert!(nllb.detect("1234 !!").is_none(), "no letters");
        assert!(LanguageDetector::new(["xx"]).detect(cases[0].0).is_none());
    }
}
