//! NLLB-200, M2M100 and mBART-50 (fairseq's multilingual translators) against transformers: one tiny
//! random `M2M100ForConditionalGeneration` layout (2 + 2 pre-LN layers of width 32, ReLU,
//! fairseq's sinusoids, tied table) with a SentencePiece BPE model trained on ../shared's
//! German, English and Spanish, saved with NLLB's tokenizer (`tests/fixtures/nllb`:
//! `tokenizer.json`, codes such as `deu_Latn`) and with M2M100's (`tests/fixtures/m2m100`:
//! `vocab.json`, codes such as `__de__`), both made by `tests/fixtures/nllb/make.py`; and one
//! tiny random `MBartForConditionalGeneration` (GELU, each stack's own learned positions and
//! embedding norm, a random logit bias) with a unigram SentencePiece model and mBART-50's
//! tokenizer (`tests/fixtures/mbart`, codes such as `de_DE`, by its `make.py`); and one tiny
//! random `BartForConditionalGeneration` (post-LN, no final norms) with a byte-level BPE
//! tokenizer (`tests/fixtures/bart`: `<s>` before every source and forced first).
//!
//! Checked for each: the tokenizer gives transformers' ids (source language code first, `</s>`
//! last) on every line of both test corpora in its language, and its text back; encoder states
//! and teacher-forced logits within 1e-4 at every position and token; greedy translations with
//! the target language forced are `generate`'s ids (with `forced_bos_token_id`) wherever its
//! margin exceeds 1e-2, and its text; beam 4 under transformers' rule gives its 4-best lists
//! and scores (within 1e-4).

use crate::seq2seq_reference::{fnv1a, ours, state_and_logit_errors};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use transformer::decode::beam::{beam_search, BeamOptions, BeamStop};
use transformer::decode::greedy::{greedy_decode, GreedyOptions};
use transformer::pipeline::translate::Translator;
use transformer::text::id_map::IdMap;
use transformer::text::EOS;

/// fairseq's `</s>`.
const THEIR_EOS: u32 = 2;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[derive(Deserialize)]
struct Reference {
    vocab_size: usize,
    tokenized: HashMap<String, Column>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Column {
    lang: String,
    ids: Vec<Vec<u32>>,
    hashes: Vec<u32>,
    decoded: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Case {
    file: String,
    line: usize,
    source: String,
    source_lang: String,
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
    let dir = fixture(name);
    let mut translator = Translator::load(&dir).unwrap();
    // As the translators run it: every weight in one form, its float32 values released.
    translator
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let json = std::fs::read(dir.join("reference.json")).unwrap();
    let ids = match (translator.vocab.fairseq(), translator.vocab.bart()) {
        (Some(fairseq), _) => fairseq.ids().clone(),
        (None, bart) => bart.unwrap().ids().clone(),
    };
    (translator, serde_json::from_slice(&json).unwrap(), ids)
}

fn tokenizer_gives_transformers_ids_and_text(name: &str) {
    let (t, r, ids) = load(name);
    assert_eq!(ids.len_theirs(), r.vocab_size);
    assert_eq!(t.model.config.vocab_size, r.vocab_size + 2);
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
            .map(|l| l.split('\t').nth(col).unwrap())
            .collect();
        assert_eq!(lines.len(), column.hashes.len(), "{key}");
        // A language's token; BART's `<s>`.
        let code = match t.vocab.fairseq() {
            Some(fairseq) => fairseq.language(&column.lang).unwrap(),
            None => t.languages.source.unwrap(),
        };
        let vocab = &t.vocab;
        for (i, line) in lines.iter().enumerate() {
            let mut theirs: Vec<u32> = (std::iter::once(code).chain(vocab.encode(line)))
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
            let text = vocab.decode(&ours(&ids, &theirs, THEIR_EOS));
            let want = column
                .decoded
                .get(&i.to_string())
                .map_or(*line, String::as_str);
            assert_eq!(text, want, "{key} line {}", i + 1);
            lines_checked += 1;
        }
    }
    assert_eq!(lines_checked, 4000);
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
        // Our padding and start rows never take probability.
        let (states, worst) = state_and_logit_errors(
            &t.model,
            &ids,
            (&src, &tgt),
            (&case.encoder, &case.logits),
            &[transformer::text::PAD, transformer::text::BOS],
        );
        assert!(states < 1e-4, "{at}: encoder states differ by {states:e}");
        eprintln!("{name} {at}: encoder states within {states:.1e}");
        assert!(worst < 1e-4, "{at}: logits differ by {worst:e}");
        eprintln!("{name} {at}: logits within {worst:.1e}");
        checked += 1;
    }
    assert!(checked >= 3, "{checked} cases with logits");
}

fn greedy_matches_transformers_generate(name: &str) {
    let (mut t, r, ids) = load(name);
    let mut compared = 0;
    for case in &r.cases {
        let at = format!("{} line {}", case.file, case.line);
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        let forced = ids.ours(case.greedy_ids[0]);
        // At most `greedy_steps` tokens, the forced one included, as max_new_tokens.
        let options = GreedyOptions {
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            forced_first: Some(forced),
            min_len: 0,
            forced_end: false,
        };
        let hyp = greedy_decode(&t.model, std::slice::from_ref(&src), &options)
            .pop()
            .unwrap();
        assert_eq!(
            hyp.token_logprobs[0], 0.0,
            "{at}: the forced token's log-probability"
        );
        let mut emitted = hyp.tokens.clone();
        if hyp.finished {
            emitted.push(EOS);
        }
        let want: Vec<u32> = case.greedy_ids.iter().map(|&id| ids.ours(id)).collect();
        // The forced token, then up to the first step whose margin is within rounding.
        let sure = 1
            + (case.greedy_margins.iter())
                .position(|&m| m <= 1e-2)
                .unwrap_or(case.greedy_margins.len());
        let k = sure.min(want.len());
        assert_eq!(
            emitted[..k.min(emitted.len())],
            want[..k],
            "{at}: greedy ids"
        );
        compared += k;
        if sure > case.greedy_margins.len() {
            assert_eq!(t.vocab.decode(&hyp.tokens), case.greedy_text, "{at}");
            // The same through the translator, its languages chosen by their codes (BART's
            // are its own).
            if t.vocab.fairseq().is_some() {
                t.set_languages(Some(&case.source_lang), Some(&case.target_lang))
                    .unwrap();
            }
            let options = GreedyOptions {
                max_len_extra: case.greedy_steps - src.len(),
                batch_size: 1,
                forced_first: None,
                min_len: 0,
                forced_end: false,
            };
            let texts = t
                .translate(std::slice::from_ref(&case.source), &options)
                .unwrap();
            assert_eq!(texts[0], case.greedy_text, "{at}: Translator::translate");
        }
    }
    assert!(compared >= 40, "only {compared} greedy tokens compared");
    eprintln!("{name}: {compared} greedy tokens compared");
}

fn beam_matches_transformers_generate(name: &str) {
    let (t, r, ids) = load(name);
    let mut finished = 0;
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
            forced_first: Some(ids.ours(case.greedy_ids[0])),
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
        "{name}: {} hypotheses compared, {finished} finished",
        4 * r.cases.len()
    );
}

#[test]
fn nllb_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("nllb");
}

#[test]
fn m2m100_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("m2m100");
}

#[test]
fn nllb_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("nllb");
}

#[test]
fn m2m100_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("m2m100");
}

#[test]
fn nllb_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("nllb");
}

#[test]
fn m2m100_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("m2m100");
}

#[test]
fn nllb_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("nllb");
}

#[test]
fn m2m100_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("m2m100");
}

#[test]
fn mbart_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("mbart");
}

#[test]
fn mbart_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("mbart");
}

#[test]
fn mbart_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("mbart");
}

#[test]
fn mbart_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("mbart");
}

#[test]
fn bart_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    tokenizer_gives_transformers_ids_and_text("bart");
}

#[test]
fn bart_states_and_logits_match_transformers() {
    states_and_logits_match_transformers("bart");
}

#[test]
fn bart_greedy_translations_match_transformers_generate() {
    greedy_matches_transformers_generate("bart");
}

#[test]
fn bart_beam_search_matches_transformers_generate() {
    beam_matches_transformers_generate("bart");
}

/// mBART-50 from its SentencePiece model alone (no `tokenizer.json`): fairseq's offset and
/// the 52 codes after the pieces give the same ids as the published tokenizer, on every test
/// line; mBART-cc25's tokenizer and a position table of the wrong length are refused by name.
#[test]
fn mbart_directories_without_tokenizer_json_and_broken_ones() {
    let (with_json, _, _) = load("mbart");
    let dir = edited("mbart", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap()
    });
    let offset = Translator::load(dir.path()).unwrap();
    let (a, b) = (
        with_json.vocab.fairseq().unwrap(),
        offset.vocab.fairseq().unwrap(),
    );
    assert_eq!(a.language_codes().count(), 52);
    assert!(a.language_codes().eq(b.language_codes()));
    assert_eq!(a.language("en_XX"), b.language("en_XX"));
    assert_eq!(with_json.languages, offset.languages);
    assert!(with_json.languages.source.is_some() && with_json.languages.target.is_some());
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/de-en/ding.test.tsv");
    if let Ok(text) = std::fs::read_to_string(&data) {
        for line in text.lines().flat_map(|l| l.split('\t')) {
            let ids = with_json.vocab.encode(line);
            assert_eq!(ids, offset.vocab.encode(line), "{line}");
            assert_eq!(
                with_json.vocab.decode(&ids),
                offset.vocab.decode(&ids),
                "{line}"
            );
        }
    }
    let e = load_error("mbart", |d| {
        let path = d.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("MBart50Tokenizer", "MBartTokenizer")).unwrap();
    });
    assert!(e.contains("tokenizer_class MBartTokenizer"), "{e}");
    let e = load_error("mbart", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace(
            "\"max_position_embeddings\": 64",
            "\"max_position_embeddings\": 80",
        );
        std::fs::write(&path, text).unwrap();
    });
    assert!(
        e.contains("encoder.embed_positions.weight has shape [66, 32]"),
        "{e}"
    );
    let e = load_error("mbart", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("\"is_decoder\": false", "\"normalize_before\": false");
        std::fs::write(&path, text).unwrap();
    });
    assert!(e.contains("normalize_before false"), "{e}");
}

/// A copy of fixture `name` with `edit` applied.
fn edited(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

fn load_error(name: &str, edit: impl FnOnce(&Path)) -> String {
    match Translator::load(edited(name, edit).path()) {
        Ok(_) => panic!("the edited fixture loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn languages_are_chosen_by_code_and_unknown_ones_refused() {
    let (mut t, _, _) = load("nllb");
    let e = t
        .set_languages(Some("xxx_Latn"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--source-lang") && e.contains("\"xxx_Latn\"") && e.contains("202"),
        "{e}"
    );
    let e = t.set_languages(None, Some("en")).unwrap_err().to_string();
    assert!(e.contains("--target-lang") && e.contains("\"en\""), "{e}");
    // M2M100's codes with or without their underscores.
    let (mut m, _, _) = load("m2m100");
    m.set_languages(Some("__es__"), Some("de")).unwrap();
    assert!(m.set_languages(Some("eng_Latn"), None).is_err());
    // Without languages in tokenizer_config.json, translating asks for them.
    let dir = edited("nllb", |d| {
        let path = d.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("\"src_lang\": \"deu_Latn\"", "\"src_lang\": null");
        std::fs::write(&path, text).unwrap();
    });
    let t = Translator::load(dir.path()).unwrap();
    let e = t
        .translate(&["Hallo".into()], &GreedyOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--source-lang and --target-lang"), "{e}");
    // The attention maps of a sentence: its source after the language code, the greedy
    // translation the translator gives.
    let (t, _, _) = load("nllb");
    let line = "Das Haus ist alt.".to_string();
    let (maps, greedy) = t.attention_maps(&line, None).unwrap();
    let want = t.translate(&[line], &GreedyOptions::default()).unwrap();
    assert_eq!(greedy.as_deref(), Some(want[0].as_str()));
    assert_eq!(maps.src_tokens[0], "deu_Latn");
    // A model of one pair has no languages to choose.
    let mut marian = Translator::load(&fixture("marian")).unwrap();
    let e = marian
        .set_languages(Some("de"), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no language codes"), "{e}");
}

#[test]
fn broken_nllb_and_m2m100_directories_are_clear_errors() {
    let e = load_error("nllb", |d| {
        std::fs::remove_file(d.join("sentencepiece.bpe.model")).unwrap()
    });
    assert!(e.contains("sentencepiece.bpe.model"), "{e}");
    let e = load_error("nllb", |d| {
        std::fs::write(d.join("tokenizer.json"), b"{").unwrap()
    });
    assert!(e.contains("tokenizer.json") && e.contains("JSON"), "{e}");
    let e = load_error("m2m100", |d| {
        std::fs::write(d.join("vocab.json"), r#"{"<unk>": 3, "x": 99999}"#).unwrap()
    });
    assert!(e.contains("99999") && e.contains("vocab_size"), "{e}");
    let e = load_error("m2m100", |d| {
        std::fs::write(d.join("vocab.json"), r#"{"a": 500}"#).unwrap()
    });
    assert!(e.contains("no <unk>"), "{e}");
    let e = load_error("nllb", |d| {
        let path = d.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("\"legacy_behaviour\": false", "\"legacy_behaviour\": true");
        std::fs::write(&path, text).unwrap();
    });
    assert!(e.contains("legacy_behaviour"), "{e}");
    let e = load_error("nllb", |d| {
        let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
        std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(e.contains("model.safetensors"), "{e}");
    let e = load_error("nllb", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace(
            "\"decoder_start_token_id\": 2",
            "\"decoder_start_token_id\": 0",
        );
        std::fs::write(&path, text).unwrap();
    });
    assert!(e.contains("decoder_start_token_id 0"), "{e}");
}

/// The command line: `translate` and `score` with `--source-lang` / `--target-lang` give the
/// library's translations and scores; an unknown code is an error naming the flag.
#[test]
fn the_command_line_takes_the_languages_by_code() {
    let bin = env!("CARGO_BIN_EXE_transformer");
    let dir = fixture("nllb");
    let run = |args: &[&str], input: &str| {
        let mut child = std::process::Command::new(bin)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let model = dir.to_str().unwrap();
    let lines = [
        "The house is old.",
        "In the beginning God created the heaven.",
    ];
    let mut t = Translator::load(&dir).unwrap();
    t.set_languages(Some("eng_Latn"), Some("spa_Latn")).unwrap();
    let lines_owned: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    let want = t
        .translate(&lines_owned, &GreedyOptions::default())
        .unwrap();
    let langs = ["--source-lang", "eng_Latn", "--target-lang", "spa_Latn"];
    let (ok, out, err) = run(
        &[&["translate", "--model", model][..], &langs].concat(),
        &lines.join("\n"),
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), want);
    let pairs = [transformer::text::corpus::Pair {
        source: lines[0].into(),
        target: "La casa es vieja.".into(),
        line: 1,
    }];
    let want = t.score(&pairs, 1, "test").unwrap();
    let (ok, out, err) = run(
        &[&["score", "--model", model][..], &langs].concat(),
        "The house is old.\tLa casa es vieja.\n",
    );
    assert!(ok, "{err}");
    let got: f64 = out.trim().parse().unwrap();
    assert!((got - want[0]).abs() < 1e-5, "{got} vs {}", want[0]);
    let (ok, _, err) = run(
        &["translate", "--model", model, "--target-lang", "klingon"],
        "x\n",
    );
    assert!(
        !ok && err.contains("--target-lang") && err.contains("klingon"),
        "{err}"
    );
}

/// BART's own files: a missing `tokenizer.json` or a `forced_bos_token_id` that is no token
/// are errors naming the file.
#[test]
fn broken_bart_directories_are_clear_errors() {
    let e = load_error("bart", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap()
    });
    assert!(e.contains("tokenizer.json"), "{e}");
    let e = load_error("bart", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace(
            "\"forced_bos_token_id\": 0",
            "\"forced_bos_token_id\": 99999",
        );
        std::fs::write(&path, text).unwrap();
    });
    assert!(
        e.contains("config.json") && e.contains("forced_bos_token_id 99999"),
        "{e}"
    );
}
