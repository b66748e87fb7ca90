//! `serve --model A --model B`: several translation models behind one LibreTranslate surface.
//! The Marian fixture (German → English, as its `tokenizer_config.json` says) and a copy of it
//! told by `languages.json` that it translates English → Spanish (its outputs are the same
//! model's; what is checked is the routing): each pair goes to its model, German → Spanish
//! through English (the second model reading the first one's translations), `/languages` lists
//! the pairs of both and the pivot, `/detect` and `source: "auto"` tell German from English,
//! and a pair no route serves is a 400 naming it. Models that cannot be routed are refused at
//! load, by name.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use transformer::decode::greedy::GreedyOptions;
use transformer::pipeline::translate::Translator;
use transformer::serve::client::request;
use transformer::serve::{ServeConfig, Server};

const T: Duration = Duration::from_secs(120);

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = request(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

fn marian() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian")
}

/// A copy of the Marian fixture whose `languages.json` names `source` → `target`.
fn relabelled(source: &str, target: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(marian()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let pair = json!({"source": source, "target": target}).to_string();
    std::fs::write(dir.path().join("languages.json"), pair).unwrap();
    dir
}

fn start(first: &Path, more: &[&Path]) -> Result<Server, String> {
    start_pair(first, ("de", "en"), more)
}

/// [`start`] with the first model's pair `(source, target)`.
fn start_pair(first: &Path, pair: (&str, &str), more: &[&Path]) -> Result<Server, String> {
    let config = ServeConfig {
        source_lang: pair.0.into(),
        target_lang: pair.1.into(),
        more_models: more.iter().map(|p| p.to_path_buf()).collect(),
        ..ServeConfig::new(first.to_path_buf(), "127.0.0.1:0".parse().unwrap())
    };
    let server = Server::start(config).map_err(|e| e.to_string())?;
    match server.wait_ready() {
        Ok(()) => Ok(server),
        Err(e) => {
            let _ = server.shutdown();
            Err(e.to_string())
        }
    }
}

#[test]
fn pairs_go_to_their_model_and_others_through_english() {
    let en_es = relabelled("en", "es");
    let server = start(&marian(), &[en_es.path()]).unwrap();
    let addr = server.addr;
    let mut model = Translator::load(&marian()).unwrap();
    // Prepared as the server prepares its translators (every weight in one form).
    model
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let greedy = GreedyOptions::default();
    // Sentences whose (random) translation is short enough to be translated again.
    let candidates = [
        "Das Haus ist alt.",
        "Er gab uns nur einen Bericht.",
        "Guten Morgen.",
        "Wir gehen nach Hause.",
        "Die Katze schläft.",
        "Ich weiß es nicht.",
        "Ja.",
        "Danke.",
        "Gut.",
        "Hallo Welt.",
    ];
    let limit = model.model.config.max_len - 1;
    let lines: Vec<String> = (candidates.iter().map(|s| s.to_string()))
        .filter(|l| {
            let once = model.translate(std::slice::from_ref(l), &greedy).unwrap();
            !once[0].is_empty() && model.vocab.encode(&once[0]).len() < limit
        })
        .collect();
    assert!(lines.len() >= 2, "{lines:?}");
    let first = model.translate(&lines, &greedy).unwrap();
    let second = model.translate(&first, &greedy).unwrap();
    assert_ne!(first, second, "the pivot must be told apart from one step");

    let (status, _, text) = request(addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let langs: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        langs,
        json!([
            {"code": "de", "name": "German", "targets": ["en", "es"]},
            {"code": "en", "name": "English", "targets": ["es"]},
        ])
    );
    for (source, target, want) in [
        ("de", "en", &first),
        // (The copy has the same weights: the same outputs on the same lines.)
        ("en", "es", &first),
        ("de", "es", &second),
    ] {
        let body = json!({"q": lines, "source": source, "target": target});
        let (status, got) = post(addr, "/translate", &body);
        assert_eq!(status, 200, "{source} -> {target}: {got}");
        assert_eq!(got["translatedText"], json!(want), "{source} -> {target}");
    }
    // `auto`: the language of the text, among the sources (German, English).
    let german = lines.iter().max_by_key(|l| l.len()).unwrap().as_str();
    let body = json!({"q": german, "source": "auto", "target": "es"});
    let (status, got) = post(addr, "/translate", &body);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["detectedLanguage"]["language"], "de");
    let want = model.translate(
        &model.translate(&[german.to_string()], &greedy).unwrap(),
        &greedy,
    );
    assert_eq!(got["translatedText"], json!(want.unwrap()[0]));
    for (text, want) in [
        (
            "Er gab uns nur einen Bericht über das Haus und die Stadt.",
            "de",
        ),
        (
            "The house is very old and stands at the edge of the town.",
            "en",
        ),
    ] {
        let (status, got) = post(addr, "/detect", &json!({"q": text}));
        assert_eq!(status, 200, "{got}");
        assert_eq!(got[0]["language"], want, "{text}");
        let confidence = got[0]["confidence"].as_f64().unwrap();
        assert!(confidence > 50.0 && confidence <= 100.0, "{confidence}");
    }
    // Alternatives come from the last model of the route.
    let body = json!({"q": lines[0], "source": "de", "target": "es", "alternatives": 2});
    let (status, got) = post(addr, "/translate", &body);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["alternatives"].as_array().unwrap().len(), 2);
    for (body, wanted) in [
        (
            json!({"q": "x", "source": "es", "target": "de"}),
            "es to de",
        ),
        (json!({"q": "x", "source": "de", "target": "de"}), "both de"),
        (json!({"q": "x", "source": "de"}), "target"),
    ] {
        let (status, got) = post(addr, "/translate", &body);
        assert_eq!(status, 400, "{got}");
        let error = got["error"].as_str().unwrap();
        assert!(error.contains(wanted), "{error}");
    }
    server.shutdown().unwrap();
}

#[test]
fn models_that_cannot_be_routed_are_refused_by_name() {
    // A second model without a language pair.
    let unnamed = relabelled("en", "es");
    std::fs::remove_file(unnamed.path().join("languages.json")).unwrap();
    let config = unnamed.path().join("tokenizer_config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"source_lang\": \"de\"", "\"source_lang\": null"),
    )
    .unwrap();
    let e = start(&marian(), &[unnamed.path()]).err().unwrap();
    assert!(
        e.contains("names no language pair") && e.contains(&unnamed.path().display().to_string()),
        "{e}"
    );
    // A second model that is not a translation model.
    let encoder = tempfile::tempdir().unwrap();
    std::fs::write(
        encoder.path().join("config.json"),
        r#"{"model_type": "bert", "vocab_size": 10}"#,
    )
    .unwrap();
    let e = start(&marian(), &[encoder.path()]).err().unwrap();
    assert!(e.contains("not a translation model"), "{e}");
    // A second model whose files are broken.
    let broken = relabelled("en", "es");
    std::fs::write(broken.path().join("model.safetensors"), b"not safetensors").unwrap();
    let e = start(&marian(), &[broken.path()]).err().unwrap();
    assert!(e.contains("model.safetensors"), "{e}");
}

/// An Argos Translate package (`.argosmodel`, German -> English by its `metadata.json`) as a
/// further model: its pair routes German to it, and on through English to the first model.
#[test]
fn an_argos_package_is_routed_by_its_metadata() {
    let argos = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ct2/de_en.argosmodel");
    let en_es = relabelled("en", "es");
    let server = start_pair(en_es.path(), ("en", "es"), &[&argos]).unwrap();
    let addr = server.addr;
    let (status, _, text) = request(addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let langs: Value = serde_json::from_str(&text).unwrap();
    let de = langs
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["code"] == "de")
        .unwrap();
    assert_eq!(de["targets"], json!(["en", "es"]));
    let package = Translator::load(&argos).unwrap();
    let line = "Das Haus ist alt.".to_string();
    let want = package
        .translate(std::slice::from_ref(&line), &GreedyOptions::default())
        .unwrap();
    let (status, got) = post(
        addr,
        "/translate",
        &json!({"q": line, "source": "de", "target": "en"}),
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(want[0]));
    // CTranslate2's min_decoding_length 1 in the running batch too: "film film" where EOS
    // first would give the empty translation (CTranslate2 4.8.5's output of both).
    let line = "Er gab uns nur einen Bericht.".to_string();
    let mut no_min = Translator::load(&argos).unwrap();
    no_min.min_len = 0;
    let empty = no_min.translate(std::slice::from_ref(&line), &GreedyOptions::default());
    assert_eq!(empty.unwrap(), [""]);
    let (status, got) = post(
        addr,
        "/translate",
        &json!({"q": line, "source": "de", "target": "en"}),
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!("film film"));
    server.shutdown().unwrap();
}

/// A BART model served alone: its own first tokens (`<s>` before the source, `<s>` forced
/// first) reach the engine, so `/translate` answers what the library computes.
#[test]
fn a_bart_model_serves_what_the_library_computes() {
    serves_what_the_library_computes("bart");
}

/// A T5 model served alone: the continuous-batching engine's ragged steps read the relative
/// position bias at each row's own positions, so `/translate` answers what the library
/// computes (greedy and the beam's alternatives).
#[test]
fn a_t5_model_serves_what_the_library_computes() {
    serves_what_the_library_computes("t5");
}

/// A MADLAD-style mT5 served with `--target-lang en`: every source gets the `<2xx>` piece of
/// its request's `target` before it (`en` when the request names none), as the library writes
/// it once the target is chosen by its code; `/languages` lists every pair of its three codes,
/// and a target it does not know is a 400 naming the field.
#[test]
fn a_madlad_model_serves_each_request_its_target() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mt5");
    let server = start_pair(&dir, ("de", "en"), &[]).unwrap();
    let mut model = Translator::load(&dir).unwrap();
    let lines = vec![
        "Das Haus ist alt.".to_string(),
        "Er gab uns nur einen Bericht.".to_string(),
    ];
    let mut answers = Vec::new();
    for (target, body) in [
        ("en", json!({"q": lines, "source": "de", "target": "en"})),
        ("es", json!({"q": lines, "source": "de", "target": "es"})),
        ("en", json!({"q": lines, "source": "de"})),
        (
            "de",
            json!({"q": lines, "source": "en", "target": "de", "alternatives": 1}),
        ),
    ] {
        model.set_languages(None, Some(target)).unwrap();
        let (status, got) = post(server.addr, "/translate", &body);
        assert_eq!(status, 200, "{body}: {got}");
        let want = match body.get("alternatives") {
            None => json!(model.translate(&lines, &GreedyOptions::default()).unwrap()),
            Some(_) => {
                let beam = transformer::decode::beam::BeamOptions {
                    beam_size: 4,
                    nbest: 2,
                    ..Default::default()
                };
                let nbest = model.translate_nbest(&lines, &beam).unwrap();
                json!(nbest.iter().map(|l| l[0].1.clone()).collect::<Vec<_>>())
            }
        };
        assert_eq!(got["translatedText"], want, "{body}");
        answers.push(want);
    }
    assert_ne!(
        answers[0], answers[1],
        "the target's piece changes the translation"
    );
    assert_eq!(answers[0], answers[2], "the configured target by default");
    // Every pair of its codes.
    let (status, _, text) = request(server.addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let languages: Value = serde_json::from_str(&text).unwrap();
    let codes: Vec<&str> = (languages.as_array().unwrap().iter())
        .map(|l| l["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["de", "en", "es"]);
    assert_eq!(languages[0]["targets"], json!(["en", "es"]));
    let (status, got) = post(
        server.addr,
        "/translate",
        &json!({"q": lines[0], "source": "de", "target": "fr"}),
    );
    assert_eq!(status, 400, "{got}");
    assert!(
        got["error"].as_str().unwrap().contains("target \"fr\""),
        "{got}"
    );
    server.shutdown().unwrap();
}

/// BART with `forced_eos_token_id` 2 in its `config.json`: the running batch (greedy) and the
/// beam's alternatives end each output at its limit with EOS, as the library does, where the
/// fixture's own config lets them run to the limit unfinished.
#[test]
fn a_forced_eos_reaches_the_running_batch() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bart");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "\"forced_eos_token_id\": null",
        "\"forced_eos_token_id\": 2",
    );
    std::fs::write(&config, text).unwrap();
    let forced = Translator::load(dir.path()).unwrap();
    let plain = Translator::load(&fixture).unwrap();
    assert!(forced.forced_end && !plain.forced_end);
    let lines: Vec<String> = [
        "Das Haus ist alt.",
        "Er gab uns nur einen Bericht.",
        "Ja",
        "gut",
    ]
    .map(String::from)
    .to_vec();
    let options = GreedyOptions::default();
    let want = forced.translate(&lines, &options).unwrap();
    assert_ne!(
        want,
        plain.translate(&lines, &options).unwrap(),
        "the forced EOS matters here"
    );
    serves_what_the_library_computes_from(dir.path(), "bart with forced EOS", &lines);
}

/// The fixture `name` served alone answers `/translate` (two lines greedy, one with an
/// alternative from beam 4) as the library translates.
fn serves_what_the_library_computes(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let lines = vec![
        "Das Haus ist alt.".to_string(),
        "Er gab uns nur einen Bericht.".to_string(),
    ];
    serves_what_the_library_computes_from(&dir, name, &lines);
}

/// [`serves_what_the_library_computes`] of the model directory `dir` on `lines`.
fn serves_what_the_library_computes_from(dir: &Path, name: &str, lines: &[String]) {
    let server = start_pair(dir, ("src", "tgt"), &[]).unwrap();
    let model = Translator::load(dir).unwrap();
    let want = model.translate(lines, &GreedyOptions::default()).unwrap();
    let (status, got) = post(
        server.addr,
        "/translate",
        &json!({"q": lines, "source": "src", "target": "tgt"}),
    );
    assert_eq!(status, 200, "{name}: {got}");
    assert_eq!(got["translatedText"], json!(want), "{name}");
    // The beam's alternatives too.
    let body = json!({"q": lines[0], "source": "src", "target": "tgt", "alternatives": 1});
    let (status, got) = post(server.addr, "/translate", &body);
    assert_eq!(status, 200, "{name}: {got}");
    let beam = transformer::decode::beam::BeamOptions {
        beam_size: 4,
        nbest: 2,
        ..Default::default()
    };
    let nbest = model.translate_nbest(&lines[..1], &beam).unwrap();
    assert_eq!(got["translatedText"], json!(nbest[0][0].1), "{name}");
    server.shutdown().unwrap();
}
