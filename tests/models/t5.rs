//! T5, mT5 / MADLAD-400 and umT5 against transformers: three tiny random models made by
//! `tests/fixtures/t5/make.py` with a unigram SentencePiece model trained on ../shared's German,
//! English and Spanish (T5's ids: `<pad>` 0, `</s>` 1, `<unk>` 2): the original T5
//! (`tests/fixtures/t5`: ReLU, the head tied to the table with the decoder's output scaled by
//! `d_model^-0.5`, 16 buckets up to 24, a table padded past the pieces and sentinels), an mT5
//! (`tests/fixtures/mt5`: gated GELU, its own head, heads of `d_kv` 6 beside `d_model` 32,
//! MADLAD's `<2xx>` language pieces, sources written `<2en> text`) and an umT5
//! (`tests/fixtures/umt5`: a bias table in every layer, tied and scaled; its tokenizer is T5's,
//! whose ids are not checked again).
//!
//! Checked for each: the tokenizer gives transformers' ids (`</s>` last) on every line of both
//! test corpora, and its text back; our buckets are transformers' for every offset up to ±600;
//! encoder states and teacher-forced logits within 1e-4 at every position and token; greedy
//! translations are `generate`'s ids wherever its margin exceeds 1e-2, and its text (also
//! through the translator, MADLAD's target chosen by its code); beam 4 under transformers' rule
//! gives its 4-best lists and scores (within 1e-4). Broken directories are errors naming the
//! file and the field.

use crate::seq2seq_reference::{fnv1a, ours, state_and_logit_errors};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use transformer::decode::beam::{beam_search, BeamOptions, BeamStop};
use transformer::decode::greedy::{greedy_decode, GreedyOptions};
use transformer::model::relative_bias::relative_bucket;
use transformer::pipeline::translate::Translator;
use transformer::text::id_map::IdMap;
use transformer::text::{EOS, PAD};

/// T5's `</s>`.
const THEIR_EOS: u32 = 1;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[derive(Deserialize)]
struct Reference {
    vocab_size: usize,
    tokenized: HashMap<String, Column>,
    buckets: HashMap<String, Vec<usize>>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Column {
    ids: Vec<Vec<u32>>,
    hashes: Vec<u32>,
    decoded: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Case {
    file: String,
    line: usize,
    source: String,
    target_lang: String,
    source_ids: Vec<u32>,
    target_ids: Vec<u32>,
    encoder: Vec<f64>,
    logits: Vec<f64>,
    greedy_steps: usize,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f64>,
    greedy_text: String,
    beam: Vec<Beam>,
}

#[derive(Deserialize)]
struct Beam {
    ids: Vec<u32>,
    score: f64,
}

fn load(name: &str) -> (Translator, Reference, IdMap) {
    load_from(&fixture(name))
}

/// The translator of the model directory `dir` and the reference beside it.
fn load_from(dir: &Path) -> (Translator, Reference, IdMap) {
    let mut translator = Translator::load(dir).unwrap();
    // As the translators run it: every weight in one form, its float32 values released.
    translator
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let json = std::fs::read(dir.join("reference.json")).unwrap();
    let ids = translator.vocab.t5().unwrap().ids().clone();
    (translator, serde_json::from_slice(&json).unwrap(), ids)
}

fn tokenizer_gives_transformers_ids_and_text(name: &str) {
    tokenizer_of_dir_gives_transformers_ids_and_text(name, &fixture(name));
}

/// [`tokenizer_gives_transformers_ids_and_text`] for the model directory `dir`.
fn tokenizer_of_dir_gives_transformers_ids_and_text(name: &str, dir: &Path) {
    let (t, r, ids) = load_from(dir);
    assert_eq!(ids.len_theirs(), r.vocab_size);
    assert_eq!(t.model.config.vocab_size, r.vocab_size + 1);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    if !data.exists() {
        eprintln!("skipped: ../shared/data is absent");
        return;
    }
    let mut lines_checked = 0;
    for (key, column) in &r.tokenized {
        let (file, col) = key.rsplit_once(':').unwrap();
        let col: usize = col.parse().unwrap();
        let text = std::fs::read_to_string(data.join(file)).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split('\t').nth(col).unwrap())
            .collect();
        assert_eq!(lines.len(), column.hashes.len(), "{key}");
        for (i, line) in lines.iter().enumerate() {
            let mut theirs: Vec<u32> = (t.vocab.encode(line).into_iter())
                .map(|id| ids.theirs(id).unwrap())
                .collect();
            theirs.push(THEIR_EOS);
            if let Some(want) = column.ids.get(i) {
                assert_eq!(&theirs, want, "{key} line {}: {line:?}", i + 1);
            }
            assert_eq!(
                fnv1a(&theirs),
                column.hashes[i],
                "{key} line {}: {line:?} -> {theirs:?}",
                i + 1
            );
            let text = t.vocab.decode(&ours(&ids, &theirs, THEIR_EOS));
            let want = column
                .decoded
                .get(&i.to_string())
                .map_or(*line, String::as_str);
            assert_eq!(text, want, "{key} line {}", i + 1);
            lines_checked += 1;
        }
    }
    eprintln!("{name}: {lines_checked} lines tokenized as transformers does");
    assert_eq!(lines_checked, 4000);
}

fn buckets_are_transformers(name: &str) {
    let (t, r, _) = load(name);
    let (n, m) = t.model.config.relative_buckets;
    for (stack, bidirectional) in [("encoder", true), ("decoder", false)] {
        let want = &r.buckets[stack];
        assert_eq!(want.len(), 1201);
        for (k, &bucket) in want.iter().enumerate() {
            let offset = k as i64 - 600;
            assert_eq!(
                relative_bucket(offset, bidirectional, n, m),
                bucket,
                "{name} {stack}: offset {offset}"
            );
        }
    }
}

fn states_and_logits_match_transformers(name: &str) {
    let (t, r, ids) = load(name);
    let mut checked = 0;
    for case in r.cases.iter().filter(|c| !c.logits.is_empty()) {
        let at = format!("{} line {}", case.file, case.line);
        let (src, tgt) = (
            ours(&ids, &case.source_ids, THEIR_EOS),
            ours(&ids, &case.target_ids, THEIR_EOS),
        );
        // Our padding row never takes probability (T5's own padding is our BOS, a token).
        let (states, worst) = state_and_logit_errors(
            &t.model,
            &ids,
            (&src, &tgt),
            (&case.encoder, &case.logits),
            &[PAD],
        );
        assert!(states < 1e-4, "{at}: encoder states differ by {states:e}");
        eprintln!("{name} {at}: encoder states within {states:.1e}");
        assert!(worst < 1e-4, "{at}: logits differ by {worst:e}");
        eprintln!("{name} {at}: logits within {worst:.1e}");
        checked += 1;
    }
    assert!(checked >= 2, "{checked} cases with logits");
}

fn greedy_matches_transformers_generate(name: &str) {
    let (mut t, r, ids) = load(name);
    let madlad = t.vocab.t5().unwrap().language_codes().next().is_some();
    let mut compared = 0;
    for case in &r.cases {
        let at = format!("{} line {}", case.file, case.line);
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        // At most `greedy_steps` tokens, as max_new_tokens.
        let options = GreedyOptions {
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            forced_first: None,
            min_len: 0,
            forced_end: false,
        };
        let hyp = greedy_decode(&t.model, std::slice::from_ref(&src), &options)
            .pop()
            .unwrap();
        let mut emitted = hyp.tokens.clone();
        if hyp.finished {
            emitted.push(EOS);
        }
        let want: Vec<u32> = case.greedy_ids.iter().map(|&id| ids.ours(id)).collect();
        // Up to the first step whose margin is within rounding.
        let sure = (case.greedy_margins.iter())
            .position(|&m| m <= 1e-2)
            .unwrap_or(case.greedy_margins.len());
        let k = sure.min(want.len());
        assert_eq!(
            emitted[..k.min(emitted.len())],
            want[..k],
            "{at}: greedy ids"
        );
        compared += k;
        if sure == case.greedy_margins.len() {
            assert_eq!(t.vocab.decode(&hyp.tokens), case.greedy_text, "{at}");
            // The same through the translator (MADLAD: its target chosen by its code, written
            // before the source).
            if madlad {
                t.set_languages(None, Some(&case.target_lang)).unwrap();
            }
            let texts = t
                .translate(std::slice::from_ref(&case.source), &options)
                .unwrap();
            assert_eq!(texts[0], case.greedy_text, "{at}: Translator::translate");
        }
    }
    assert!(compared >= 40, "only {compared} greedy tokens compared");
    eprintln!("{name}: {compared} greedy tokens identical to transformers'");
}

fn beam_matches_transformers_generate(name: &str) {
    let (t, r, ids) = load(name);
    let (mut finished, mut identical) = (0, 0);
    for case in &r.cases {
        let at = format!("{} line {}", case.file, case.line);
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        let options = BeamOptions {
            beam_size: 4,
            alpha: 1.0,
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            nbest: 4,
            stop: BeamStop::HuggingFace,
            forced_first: None,
            min_len: 0,
            forced_end: false,
            beam_rules: Default::default(),
        };
        let list = beam_search(&t.model, std::slice::from_ref(&src), &options)
            .pop()
            .unwrap();
        assert_eq!(list.len(), case.beam.len(), "{at}");
        for (j, (got, want)) in list.iter().zip(&case.beam).enumerate() {
            let mut emitted = got.tokens.clone();
            if got.finished {
                emitted.push(EOS);
                finished += 1;
            }
            let want_ids: Vec<u32> = want.ids.iter().map(|&id| ids.ours(id)).collect();
            let tied =
                |i: usize| (case.beam.get(i)).is_some_and(|b| (b.score - want.score).abs() < 1e-4);
            if !(tied(j + 1) || j > 0 && tied(j - 1)) {
                assert_eq!(emitted, want_ids, "{at} hypothesis {j}");
                identical += 1;
            }
            assert!(
                (got.score - want.score).abs() < 1e-4,
                "{at} hypothesis {j}: score {} vs {}",
                got.score,
                want.score
            );
        }
    }
    assert!(finished >= 2, "{finished} finished hypotheses");
    eprintln!(
        "{name}: {} hypotheses' scores compared, {identical} identical token for token, \
         {finished} finished",
        4 * r.cases.len()
    );
}

#[test]
fn t5_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("t5");
}

#[test]
fn mt5_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("mt5");
}

#[test]
fn t5_mt5_and_umt5_buckets_are_transformers() {
    buckets_are_transformers("t5");
    buckets_are_transformers("mt5");
    buckets_are_transformers("umt5");
}

#[test]
fn umt5_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("umt5");
}

#[test]
fn umt5_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("umt5");
}

#[test]
fn umt5_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("umt5");
}

#[test]
fn t5_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("t5");
}

#[test]
fn mt5_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("mt5");
}

#[test]
fn t5_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("t5");
}

#[test]
fn mt5_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("mt5");
}

#[test]
fn t5_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("t5");
}

#[test]
fn mt5_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("mt5");
}

/// A copy of fixture `name` edited by `edit`, and the error loading it gives.
fn load_error(name: &str, edit: impl FnOnce(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    match Translator::load(dir.path()) {
        Ok(_) => panic!("the edited fixture loaded"),
        Err(e) => e.to_string(),
    }
}

/// `config.json` of `dir` with `from` replaced by `to` (which must be there).
fn edit_config(dir: &Path, from: &str, to: &str) {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from} not in {text}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

#[test]
fn broken_t5_directories_are_clear_errors() {
    // Neither tokenizer file: both named.
    let e = load_error("t5", |d| {
        std::fs::remove_file(d.join("spiece.model")).unwrap()
    });
    assert!(e.contains("neither spiece.model nor tokenizer.json"), "{e}");
    let e = load_error("t5", |d| {
        std::fs::write(d.join("spiece.model"), b"\x0a\x05ab").unwrap()
    });
    assert!(e.contains("spiece.model"), "{e}");
    // A model of fewer ids than the tokenizer names.
    let e = load_error("t5", |d| {
        edit_config(d, "\"vocab_size\": 1152", "\"vocab_size\": 1050")
    });
    assert!(
        e.contains("spiece.model") && e.contains("vocab_size 1050"),
        "{e}"
    );
    // More ids than the weights hold.
    let e = load_error("t5", |d| {
        edit_config(d, "\"vocab_size\": 1152", "\"vocab_size\": 1200")
    });
    assert!(e.contains("shared.weight has shape [1152, 32]"), "{e}");
    let e = load_error("t5", |d| {
        edit_config(
            d,
            "\"feed_forward_proj\": \"relu\"",
            "\"feed_forward_proj\": \"gated-relu\"",
        )
    });
    assert!(
        e.contains("config.json") && e.contains("feed_forward_proj \"gated-relu\""),
        "{e}"
    );
    // umT5 has a bias table in every layer, T5 and mT5 in the first.
    let e = load_error("t5", |d| {
        edit_config(d, "\"model_type\": \"t5\"", "\"model_type\": \"umt5\"")
    });
    assert!(
        e.contains("no encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
        "{e}"
    );
    let e = load_error("umt5", |d| {
        edit_config(d, "\"model_type\": \"umt5\"", "\"model_type\": \"mt5\"")
    });
    assert!(e.contains("a bias table in every layer is umT5's"), "{e}");
    let e = load_error("t5", |d| {
        edit_config(
            d,
            "\"relative_attention_num_buckets\": 16",
            "\"relative_attention_num_buckets\": 8",
        )
    });
    assert!(
        e.contains("relative_attention_bias.weight has shape [16, 4]"),
        "{e}"
    );
    // The mT5 fixture's head is its own: a config without it asks for a relu FFN and fails on
    // the gated weights, naming them.
    let e = load_error("mt5", |d| {
        edit_config(
            d,
            "\"feed_forward_proj\": \"gated-gelu\"",
            "\"feed_forward_proj\": \"relu\"",
        )
    });
    assert!(e.contains("wi_0"), "{e}");
}

/// MADLAD's target language: chosen by its code, written before the source; an unknown code
/// is an error listing the model's, and a model without language pieces refuses the options.
#[test]
fn madlad_languages_are_chosen_by_code() {
    let (mut t, _, _) = load("mt5");
    let e = t.translate(&["Hallo".to_string()], &GreedyOptions::default());
    let e = e.expect_err("no target chosen").to_string();
    assert!(
        e.contains("--target-lang") && e.contains("3 languages"),
        "{e}"
    );
    let e = t.set_languages(None, Some("fr")).unwrap_err().to_string();
    assert!(
        e.contains("--target-lang fr") && e.contains("de, en, es") && e.contains("/languages"),
        "{e}"
    );
    t.set_languages(Some("de"), Some("en")).unwrap();
    let tokenizer = t.vocab.t5().unwrap();
    assert_eq!(t.languages.source, tokenizer.language("en"));
    assert_eq!(t.languages.target, None);
    let (mut plain, _, _) = load("t5");
    let e = plain
        .set_languages(None, Some("en"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no language codes"), "{e}");
}

/// The cases' sources translated together (padded sources, rows of different lengths in one
/// batch, greedy and beam 4) are each one's translation alone.
#[test]
fn batched_translations_equal_one_at_a_time() {
    for name in ["t5", "mt5", "umt5"] {
        let (t, r, ids) = load(name);
        let sources: Vec<Vec<u32>> = r
            .cases
            .iter()
            .map(|c| ours(&ids, &c.source_ids, THEIR_EOS))
            .collect();
        let greedy = |batch_size| GreedyOptions {
            max_len_extra: 10,
            batch_size,
            forced_first: None,
            min_len: 0,
            forced_end: false,
        };
        let together = greedy_decode(&t.model, &sources, &greedy(8));
        let beam = |batch_size| BeamOptions {
            beam_size: 4,
            max_len_extra: 10,
            batch_size,
            nbest: 2,
            ..BeamOptions::default()
        };
        let beams = beam_search(&t.model, &sources, &beam(8));
        for (i, src) in sources.iter().enumerate() {
            let alone = greedy_decode(&t.model, std::slice::from_ref(src), &greedy(1));
            assert_eq!(
                together[i].tokens, alone[0].tokens,
                "{name} case {i}: greedy"
            );
            let alone = beam_search(&t.model, std::slice::from_ref(src), &beam(1));
            let tokens = |l: &[transformer::decode::beam::BeamHypothesis]| -> Vec<Vec<u32>> {
                l.iter().map(|h| h.tokens.clone()).collect()
            };
            assert_eq!(
                tokens(&beams[i]),
                tokens(&alone[0]),
                "{name} case {i}: beam"
            );
        }
    }
}

/// The mT5 / MADLAD fixture as many Hub repositories ship it: `tokenizer.json` and no
/// `spiece.model`. The tokenizer read from it gives transformers' ids and text on every test
/// line of both corpora, knows MADLAD's `<2xx>` targets, and the model translates as
/// transformers' `generate` does (its target chosen by code); a `tokenizer.json` that is not a
/// unigram model is refused by name.
#[test]
fn mt5_from_tokenizer_json_alone_tokenizes_and_translates_as_transformers() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("mt5")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "spiece.model" {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    assert!(dir.path().join("tokenizer.json").exists());
    tokenizer_of_dir_gives_transformers_ids_and_text("mt5 (tokenizer.json)", dir.path());
    let (mut t, r, ids) = load_from(dir.path());
    let codes: Vec<&str> = t.vocab.t5().unwrap().language_codes().collect();
    assert_eq!(codes, ["de", "en", "es"]);
    let (spm, _, _) = load("mt5");
    assert_eq!(t.vocab.len(), spm.vocab.len());
    for id in 0..t.vocab.len() as u32 {
        assert_eq!(t.vocab.token(id), spm.vocab.token(id), "our id {id}");
    }
    let mut translated = 0;
    for case in &r.cases {
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        let sure = case.greedy_margins.iter().all(|&m| m > 1e-2);
        if !sure {
            continue;
        }
        t.set_languages(None, Some(&case.target_lang)).unwrap();
        let options = GreedyOptions {
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            ..GreedyOptions::default()
        };
        let text = t
            .translate(std::slice::from_ref(&case.source), &options)
            .unwrap();
        assert_eq!(
            text[0], case.greedy_text,
            "{} line {}",
            case.file, case.line
        );
        translated += 1;
    }
    assert!(translated >= 3, "{translated} translations compared");
    // A BPE tokenizer.json is not T5's.
    let bart = fixture("bart").join("tokenizer.json");
    std::fs::copy(bart, dir.path().join("tokenizer.json")).unwrap();
    match Translator::load(dir.path()) {
        Ok(_) => panic!("a BPE tokenizer.json loaded as T5's"),
        Err(e) => assert!(e.to_string().contains("not a unigram model"), "{e}"),
    }
}
