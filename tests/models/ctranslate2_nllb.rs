//! NLLB-200 and M2M100 models converted by CTranslate2 4.8.5 against CTranslate2 itself
//! (`tests/fixtures/ct2/{nllb,nllb_int8,m2m100}`, made by `make_fairseq.py` from the Hugging
//! Face fixtures `tests/fixtures/nllb` and `tests/fixtures/m2m100`). For each pair of the
//! reference (NLLB: deu_Latn → eng_Latn on ../shared/data/de-en/ding.test.tsv, eng_Latn →
//! spa_Latn on en-es/bible.test.tsv; M2M100: de → en), on every line whose source fits the
//! model's 64 positions: our source ids are the ones CTranslate2 was given (the Hugging Face
//! tokenizer's: source code, pieces, `</s>`), and our greedy and beam-4 translations with the
//! target code forced (CTranslate2's `target_prefix`, and its rule for the step after it) are
//! CTranslate2's ids with its scores (within 1e-3), the first lines' text its decoded text; the
//! int8 model, run in int8 with its weights as stored, gives CTranslate2 int8's ids on a share
//! of lines we bound below. Mismatched tokenizer files and unknown codes are errors naming the
//! file or the code.

use super::ctranslate2::{check_outputs, edited_copy, fixtures, theirs, translate, Ids};
use crate::seq2seq_reference::fnv1a;
use serde::Deserialize;
use std::path::Path;
use transformer::decode::beam::BeamRules;
use transformer::decode::greedy::GreedyOptions;
use transformer::pipeline::translate::{Languages, Translator};

#[derive(Deserialize)]
struct Pair {
    file: String,
    column: usize,
    source_lang: String,
    target_lang: String,
    /// The 0-based numbers of the lines translated (those whose source fits the model).
    lines: Vec<usize>,
    sources: Ids,
    greedy: Ids,
    beam4: Option<Ids>,
    #[serde(default)]
    greedy_text: Vec<String>,
}

#[derive(Deserialize)]
struct Reference {
    max_decoding_length: usize,
    pairs: Vec<Pair>,
}

fn reference(dir: &Path) -> Reference {
    serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap()
}

/// The pair's lines, or `None` (with the reason printed) where ../shared is absent.
fn lines(pair: &Pair) -> Option<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(&pair.file);
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipped: {} is absent", path.display());
        return None;
    };
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    Some(
        (pair.lines.iter())
            .map(|&i| all[i].split('\t').nth(pair.column).unwrap().to_string())
            .collect(),
    )
}

/// The pair's languages, its lines and our sources, checked against CTranslate2's (with the
/// `</s>` the search appends).
fn sources(t: &Translator, pair: &Pair) -> Option<(Languages, Vec<String>, Vec<Vec<u32>>)> {
    let languages = (t.languages_of(Some(&pair.source_lang), Some(&pair.target_lang))).unwrap();
    let lines = lines(pair)?;
    let eos = theirs(t, &[transformer::text::EOS])[0];
    let sources: Vec<Vec<u32>> = (lines.iter())
        .map(|l| {
            languages
                .source
                .into_iter()
                .chain(t.vocab.encode(l))
                .collect()
        })
        .collect();
    for (i, s) in sources.iter().enumerate() {
        let mut ids = theirs(t, s);
        ids.push(eos);
        if i < pair.sources.ids.len() {
            assert_eq!(ids, pair.sources.ids[i], "line {}", pair.lines[i] + 1);
        }
        let what = format!("{} line {} source ids", pair.file, pair.lines[i] + 1);
        assert_eq!(fnv1a(&ids), pair.sources.hashes[i], "{what}");
    }
    Some((languages, lines, sources))
}

/// Every pair of the reference: sources, greedy and beam-4 outputs, the greedy text.
fn same_as_ctranslate2(dir: &Path) {
    let mut t = Translator::load(dir).unwrap();
    // As the translators run it: every weight in one form, its float32 values released.
    t.prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    assert!(t.model.config.source_eos);
    assert_eq!(t.beam_rules, BeamRules::CTranslate2);
    let r = reference(dir);
    // Every source fits: the limit is the model's (its 64 positions), as CTranslate2's.
    let max = r.max_decoding_length;
    assert_eq!(t.model.config.max_len, max);
    for pair in &r.pairs {
        let Some((languages, lines, sources)) = sources(&t, pair) else {
            return;
        };
        let what = |search: &str| format!("{} → {} {search}", pair.source_lang, pair.target_lang);
        let greedy = translate(&t, &sources, max, 1, languages.target);
        check_outputs(&what("greedy"), &greedy, &pair.greedy);
        let beam = translate(&t, &sources, max, 4, languages.target);
        check_outputs(&what("beam 4"), &beam, pair.beam4.as_ref().unwrap());
        // The text, through the translator's own forcing, as the tokenizer decodes CTranslate2's
        // tokens without the code.
        let n = pair.greedy_text.len();
        let options = GreedyOptions {
            max_len_extra: max,
            ..GreedyOptions::default()
        };
        let texts = t.translate_in(languages, &lines[..n], &options).unwrap();
        assert_eq!(texts, pair.greedy_text, "{}", what("text"));
    }
}

#[test]
fn converted_nllb_translates_as_ctranslate2_does() {
    let dir = fixtures().join("nllb");
    same_as_ctranslate2(&dir);
    let t = Translator::load(&dir).unwrap();
    // The copied tokenizer_config.json's languages; the vocabulary's 202 codes.
    let tokenizer = t.vocab.fairseq().expect("NLLB's tokenizer");
    assert_eq!(tokenizer.language_codes().count(), 202);
    assert_eq!(
        t.languages,
        t.languages_of(Some("deu_Latn"), Some("eng_Latn")).unwrap()
    );
    let e = t
        .languages_of(Some("deu_Latn"), Some("xyz_Latn"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--target-lang") && e.contains("\"xyz_Latn\""),
        "{e}"
    );
}

#[test]
fn converted_m2m100_translates_as_ctranslate2_does() {
    let dir = fixtures().join("m2m100");
    same_as_ctranslate2(&dir);
    let t = Translator::load(&dir).unwrap();
    let tokenizer = t.vocab.fairseq().expect("M2M100's tokenizer");
    assert_eq!(tokenizer.language_codes().count(), 100);
    // No tokenizer_config.json: no languages until chosen; `__de__` is `de`.
    assert_eq!(t.languages, Languages::default());
    assert_eq!(tokenizer.language("__de__"), tokenizer.language("de"));
    let e = t.check_languages(t.languages).unwrap_err().to_string();
    assert!(e.contains("--source-lang"), "{e}");
}

/// The share of lines of the int8 model, run in int8 with its weights as stored, identical to
/// CTranslate2 int8's greedy output.
#[test]
fn int8_nllb_runs_its_stored_rows_close_to_ctranslate2_int8() {
    let dir = fixtures().join("nllb_int8");
    let mut t = Translator::load(&dir).unwrap();
    assert!(t.stored_int8_layers() > 0);
    t.prepare_precision(transformer::kernels::lowp::Precision::Int8)
        .unwrap();
    let r = reference(&dir);
    for pair in &r.pairs {
        let Some((languages, _, sources)) = sources(&t, pair) else {
            return;
        };
        let ours = translate(&t, &sources, r.max_decoding_length, 1, languages.target);
        let same = (ours.iter().enumerate())
            .filter(|(i, o)| {
                (o.as_ref()).is_some_and(|(ids, _)| fnv1a(ids) == pair.greedy.hashes[*i])
            })
            .count();
        let share = same as f64 / ours.len() as f64;
        eprintln!(
            "int8 {} → {}: {same} of {} lines identical to CTranslate2 int8 ({:.1}%)",
            pair.source_lang,
            pair.target_lang,
            ours.len(),
            100.0 * share
        );
        assert!(
            share >= INT8_SHARE,
            "int8: only {same} of {} lines",
            ours.len()
        );
    }
}

/// The bound of the int8 test. Measured: 994 of 1000 lines (99.4%; 995 before the
/// translators held each weight in one form) deu_Latn → eng_Latn and
/// 840 of 841 (99.9%) eng_Latn → spa_Latn identical to CTranslate2 int8's.
const INT8_SHARE: f64 = 0.95;

/// Rewrites the JSON file `name` of `dir` with `edit`.
fn edit_json(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(name);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
}

/// The Hugging Face fixture's tokenizer.json, copied as `--copy_files` does.
fn copy_tokenizer_json(dir: &Path) {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nllb/tokenizer.json");
    std::fs::copy(hf, dir.join("tokenizer.json")).unwrap();
}

/// Swaps two language codes of the vocabulary.
fn swap_codes(dir: &Path) {
    edit_json(dir, "shared_vocabulary.json", |v| {
        let tokens = v.as_array_mut().unwrap();
        let at = |c: &str| tokens.iter().position(|t| t == c).unwrap();
        let (a, b) = (at("deu_Latn"), at("eng_Latn"));
        tokens.swap(a, b);
    });
}

#[test]
fn a_copied_tokenizer_json_that_matches_loads() {
    let dir = edited_copy("nllb", "tokenizer", copy_tokenizer_json);
    let with = Translator::load(&dir).unwrap();
    let without = Translator::load(&fixtures().join("nllb")).unwrap();
    let line = "Die Ausdehnung des Weltalls übersteigt jedes Vorstellungsvermögen.";
    assert_eq!(with.vocab.encode(line), without.vocab.encode(line));
    assert_eq!(with.languages, without.languages);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A damaged copy: its name, the edit, the file the error names and what it says.
type BadCase = (
    &'static str,
    Box<dyn FnOnce(&Path)>,
    &'static str,
    &'static str,
);

#[test]
fn mismatched_tokenizer_files_are_errors_naming_the_file() {
    let cases: Vec<BadCase> = vec![
        (
            "no-spm",
            Box::new(|d: &Path| std::fs::remove_file(d.join("sentencepiece.bpe.model")).unwrap()),
            "ct2-nllb-no-spm",
            "sentencepiece.bpe.model",
        ),
        (
            "other-spm",
            Box::new(|d: &Path| {
                let other = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/sentencepiece/bible-es.model");
                std::fs::copy(other, d.join("sentencepiece.bpe.model")).unwrap();
            }),
            "shared_vocabulary.json",
            "do not belong together",
        ),
        (
            "codes",
            Box::new(|d: &Path| {
                copy_tokenizer_json(d);
                swap_codes(d);
            }),
            "tokenizer.json",
            "language token \"deu_Latn\" has id",
        ),
        (
            "no-codes",
            Box::new(|d: &Path| {
                edit_json(d, "shared_vocabulary.json", |v| {
                    // Every code (`eng_Latn`) renamed.
                    for t in v.as_array_mut().unwrap() {
                        let s = t.as_str().unwrap().to_string();
                        if s.len() == 8 && s.as_bytes()[3] == b'_' {
                            *t = serde_json::json!(format!("{s}x"));
                        }
                    }
                })
            }),
            "shared_vocabulary.json",
            "no language tokens",
        ),
        (
            "legacy",
            Box::new(|d: &Path| {
                edit_json(d, "tokenizer_config.json", |c| {
                    c["legacy_behaviour"] = serde_json::json!(true)
                })
            }),
            "tokenizer_config.json",
            "legacy_behaviour true",
        ),
        (
            "eos",
            Box::new(|d: &Path| {
                edit_json(d, "config.json", |c| {
                    c["add_source_eos"] = serde_json::json!(true)
                })
            }),
            "config.json",
            "add_source_eos true",
        ),
        (
            "start",
            Box::new(|d: &Path| {
                edit_json(d, "config.json", |c| {
                    c["decoder_start_token"] = serde_json::json!("<s>")
                })
            }),
            "config.json",
            "does not start from eos_token",
        ),
    ];
    for (name, edit, file, wanted) in cases {
        let dir = edited_copy("nllb", name, edit);
        let e = Translator::load(&dir).err().expect("an error").to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.contains(file) && e.contains(wanted), "{name}: {e}");
        eprintln!("{name}: {e}");
    }
}
