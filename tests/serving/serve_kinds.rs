//! `transformer serve` with a translation model (a small random one saved here) and an encoder
//! (all-MiniLM-L6-v2 from ../shared): LibreTranslate's `/translate` (greedy, or the beam's
//! n-best with `alternatives`) and `/languages`, the attention maps of `/attention`, OpenAI's
//! `/v1/embeddings`, each answer equal to what the library computes directly; endpoints of
//! another kind answer 404.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use transformer::decode::beam::BeamOptions;
use transformer::decode::greedy::GreedyOptions;
use transformer::model::{ModelConfig, Seq2Seq};
use transformer::pipeline::embed::SentenceEncoder;
use transformer::pipeline::translate::Translator;
use transformer::rng::Rng;
use transformer::serve::client::request;
use transformer::serve::{ServeConfig, Server};
use transformer::text::vocab::{Vocab, VocabLevel};

const T: Duration = Duration::from_secs(120);

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = request(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

fn serve(dir: &Path) -> Server {
    serve_pair(dir, "en", "de")
}

/// [`serve`] with the pair `source` → `target`.
fn serve_pair(dir: &Path, source: &str, target: &str) -> Server {
    let config = ServeConfig {
        source_lang: source.into(),
        target_lang: target.into(),
        ..ServeConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().unwrap())
    };
    let server = Server::start(config).unwrap();
    server.wait_ready().unwrap();
    server
}

#[test]
fn translation_endpoints_answer_what_the_library_computes() {
    let tmp = tempfile::tempdir().unwrap();
    let vocab = Vocab::build(
        ["the cat sat on the mat", "die katze sass auf der matte"],
        VocabLevel::Char,
        1,
    );
    let mut config = ModelConfig::preset("tiny", vocab.len()).unwrap();
    config.max_len = 40;
    let mut model = Seq2Seq::<f32>::new(config, &mut Rng::new(11));
    let mut writer = transformer::store::CheckpointWriter::begin(tmp.path()).unwrap();
    transformer::model::checkpoint::write_model(&mut writer, &mut model).unwrap();
    vocab.write(&mut writer).unwrap();
    writer.commit().unwrap();
    let mut direct = Translator::load(tmp.path()).unwrap();
    // Prepared as the server prepares its translators (every weight in one form).
    direct
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let server = serve(tmp.path());
    let addr = server.addr;

    let (status, _, text) = request(addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let langs: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        langs[0],
        json!({"code": "en", "name": "English", "targets": ["de"]})
    );

    let lines: Vec<String> = ["the cat", "sat on the mat", "a"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let beam = |nbest| BeamOptions {
        beam_size: 4usize.max(nbest),
        nbest,
        ..BeamOptions::default()
    };
    // Without alternatives: greedy (continuous batching); with: the beam's n-best.
    let want1 = direct.translate(&lines, &GreedyOptions::default()).unwrap();
    let want3 = direct.translate_nbest(&lines, &beam(3)).unwrap();
    // One string.
    let (status, body) = post(
        addr,
        "/translate",
        &json!({"q": lines[0], "source": "en", "target": "de"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translatedText": want1[0]}));
    let (status, body) = post(
        addr,
        "/translate",
        &json!({"q": lines, "source": "en", "target": "de", "alternatives": 0}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"translatedText": want1}));
    // A list with alternatives, source auto: concurrent requests share the searches.
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let lines = lines.clone();
            std::thread::spawn(move || {
                post(
                    addr,
                    "/translate",
                    &json!({"q": lines, "source": "auto", "target": "de", "alternatives": 2}),
                )
            })
        })
        .collect();
    for t in threads {
        let (status, body) = t.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let best: Vec<&str> = want3.iter().map(|l| l[0].1.as_str()).collect();
        assert_eq!(body["translatedText"], json!(best));
        for (i, list) in want3.iter().enumerate() {
            let alts: Vec<&str> = list[1..].iter().map(|h| h.1.as_str()).collect();
            assert_eq!(body["alternatives"][i], json!(alts));
        }
        assert_eq!(body["detectedLanguage"][0]["language"], "en");
    }
    // Errors: LibreTranslate's {"error": ...}.
    let (status, body) = post(
        addr,
        "/translate",
        &json!({"q": "x", "source": "fr", "target": "de"}),
    );
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("translates en to de"),
        "{body}"
    );
    let (status, body) = post(addr, "/translate", &json!({"q": "x", "alternatives": 100}));
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("alternatives"));
    let (status, body) = post(addr, "/translate", &json!({"q": "the cat ".repeat(20)}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("limit of 39"),
        "{body}"
    );

    // Attention maps: the greedy translation and every panel, rows summing to one.
    let (status, body) = post(addr, "/attention", &json!({"q": "the cat"}));
    assert_eq!(status, 200, "{body}");
    let (maps, greedy) = direct.attention_maps("the cat", None).unwrap();
    assert_eq!(body["translatedText"], greedy.unwrap());
    assert_eq!(body["heads"], maps.heads);
    assert_eq!(body["source_tokens"], json!(maps.src_tokens));
    let cross = body["cross"].as_array().unwrap();
    assert_eq!(cross.len(), maps.cross.len());
    for (got, want) in cross.iter().zip(&maps.cross) {
        assert_eq!(got["label"], want.label);
        let rows: Vec<Vec<f32>> = serde_json::from_value(got["weights"].clone()).unwrap();
        assert_eq!(rows, want.weights);
    }

    // Language-model endpoints are not this server's.
    let (status, body) = post(addr, "/v1/completions", &json!({"prompt": "x"}));
    assert_eq!(status, 404);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("translation"));
    let (_, _, info) = request(addr, "GET", "/info", None, T).unwrap();
    assert!(info.contains("\"kind\":\"translation\""), "{info}");
    server.shutdown().unwrap();
}

#[test]
fn embeddings_equal_the_encoder_s() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models/all-MiniLM-L6-v2");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    }
    let server = serve(&dir);
    let inputs = ["A man is eating food.", "The weather is lovely today."];
    let (status, body) = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": inputs, "model": "all-MiniLM-L6-v2"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    let encoder = SentenceEncoder::load(&dir, None).unwrap();
    let owned: Vec<String> = inputs.iter().map(|s| s.to_string()).collect();
    let want = encoder.embed(&owned, 8).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(body["data"][i]["object"], "embedding");
        assert_eq!(body["data"][i]["index"], i);
        let got: Vec<f32> = serde_json::from_value(body["data"][i]["embedding"].clone()).unwrap();
        assert_eq!(&got, w);
    }
    let tokens: usize = owned
        .iter()
        .map(|s| encoder.tokenizer.encode(s).unwrap().len())
        .sum();
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    let (status, body) = post(server.addr, "/v1/embeddings", &json!({"input": 5}));
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "input");
    // llama.cpp's text objects are the same texts; any model name is answered (one model
    // served); ids mixed with texts, or a part that is not text, are refused.
    let objects = json!([{"prompt_string": inputs[0]},
                         {"content": [{"type": "text", "text": "The weather is "},
                                      {"type": "text", "text": "lovely today."}]}]);
    let req = json!({"input": objects, "model": "text-embedding-3-small"});
    let (status, body) = post(server.addr, "/v1/embeddings", &req);
    assert_eq!(status, 200, "{body}");
    for (i, w) in want.iter().enumerate() {
        let got: Vec<f32> = serde_json::from_value(body["data"][i]["embedding"].clone()).unwrap();
        assert_eq!(&got, w);
    }
    for bad in [
        json!([12, "text"]),
        json!({"content": "string"}),
        json!({"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}),
    ] {
        let (status, body) = post(server.addr, "/v1/embeddings", &json!({"input": bad}));
        assert_eq!(status, 400, "{bad}: {body}");
    }
    server.shutdown().unwrap();
}

/// A Hugging Face Marian directory (tests/fixtures/marian) behind `/translate`: each answer is
/// the library's greedy translation, SentencePiece in and out.
#[test]
fn a_marian_model_serves_what_the_library_translates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian");
    let mut direct = Translator::load(&dir).unwrap();
    // Prepared as the server prepares its translators (every weight in one form).
    direct
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let server = serve_pair(&dir, "de", "en");
    let lines: Vec<String> = [
        "Er gab uns nur einen groben Bericht über seinen Besuch.",
        "Das Haus ist alt.",
        "",
        "Ärger über Öl und Straßen",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let want = direct.translate(&lines, &GreedyOptions::default()).unwrap();
    let (status, got) = post(
        server.addr,
        "/translate",
        &json!({"q": lines, "source": "de", "target": "en"}),
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(want));
    // Something was translated: not every answer is empty.
    assert!(want.iter().any(|t| !t.is_empty()), "{want:?}");
}

/// A multilingual model (NLLB's layout, tests/fixtures/nllb) behind LibreTranslate's API: every
/// language of the model in `/languages`, each request translated between the languages it
/// names (several pairs side by side in the running batch), `auto` as the model's configured
/// source, unknown codes a 400 naming the field; each answer is what the library translates.
#[test]
fn a_multilingual_model_serves_every_pair_it_knows() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nllb");
    let mut direct = Translator::load(&dir).unwrap();
    // Prepared as the server prepares its translators (every weight in one form).
    direct
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let server = serve_pair(&dir, "src", "tgt");
    let addr = server.addr;
    let (status, _, text) = request(addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let langs: Value = serde_json::from_str(&text).unwrap();
    let langs = langs.as_array().unwrap();
    assert_eq!(langs.len(), 202);
    let deu = langs.iter().find(|l| l["code"] == "deu_Latn").unwrap();
    assert_eq!(deu["targets"].as_array().unwrap().len(), 201);

    let lines: Vec<String> = ["Das Haus ist alt.", "", "Er gab uns nur einen Bericht."]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let pairs = [
        ("deu_Latn", "eng_Latn"),
        ("eng_Latn", "spa_Latn"),
        ("spa_Latn", "deu_Latn"),
    ];
    let wants: Vec<Vec<String>> = (pairs.iter())
        .map(|&(s, t)| {
            let languages = direct.languages_of(Some(s), Some(t)).unwrap();
            (direct.translate_in(languages, &lines, &GreedyOptions::default())).unwrap()
        })
        .collect();
    // Different targets give different translations (the forced token differs).
    assert_ne!(wants[0], wants[1]);
    std::thread::scope(|scope| {
        let answers: Vec<_> = (pairs.iter())
            .map(|&(s, t)| {
                let body = json!({"q": lines, "source": s, "target": t});
                scope.spawn(move || post(addr, "/translate", &body))
            })
            .collect();
        for (answer, want) in answers.into_iter().zip(&wants) {
            let (status, got) = answer.join().unwrap();
            assert_eq!(status, 200, "{got}");
            assert_eq!(got["translatedText"], json!(want));
        }
    });
    // The beam's alternatives, between the languages asked.
    let languages = direct
        .languages_of(Some("eng_Latn"), Some("deu_Latn"))
        .unwrap();
    let beam = BeamOptions {
        beam_size: 4,
        nbest: 2,
        ..BeamOptions::default()
    };
    let want = direct
        .translate_nbest_in(languages, &lines[..1], &beam)
        .unwrap();
    let body =
        json!({"q": lines[0], "source": "eng_Latn", "target": "deu_Latn", "alternatives": 1});
    let (status, got) = post(addr, "/translate", &body);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(want[0][0].1));
    assert_eq!(got["alternatives"], json!([want[0][1].1]));
    // `auto`: the configured source (tokenizer_config.json's src_lang).
    let (status, got) = post(
        addr,
        "/translate",
        &json!({"q": lines[0], "source": "auto", "target": "eng_Latn"}),
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(wants[0][0]));
    assert_eq!(got["detectedLanguage"]["language"], "deu_Latn");
    let (status, got) = post(addr, "/detect", &json!({"q": "Hallo"}));
    assert_eq!((status, &got[0]["language"]), (200, &json!("deu_Latn")));
    for (body, field) in [
        (
            json!({"q": "x", "source": "deu_Latn", "target": "xx_Latn"}),
            "target",
        ),
        (
            json!({"q": "x", "source": "en", "target": "eng_Latn"}),
            "source",
        ),
    ] {
        let (status, got) = post(addr, "/translate", &body);
        assert_eq!(status, 400, "{got}");
        let error = got["error"].as_str().unwrap();
        assert!(
            error.contains(field) && error.contains("GET /languages"),
            "{error}"
        );
    }
}

/// A converted NLLB model (CTranslate2's directory, tests/fixtures/ct2/nllb) behind
/// LibreTranslate's API: its 202 languages in `/languages`, each request translated between
/// the languages it names, greedy and with alternatives (CTranslate2's beam rules), as the
/// library translates.
#[test]
fn a_converted_nllb_model_serves_its_languages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ct2/nllb");
    let mut direct = Translator::load(&dir).unwrap();
    // Prepared as the server prepares its translators (every weight in one form).
    direct
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let server = serve_pair(&dir, "src", "tgt");
    let (status, _, text) = request(server.addr, "GET", "/languages", None, T).unwrap();
    assert_eq!(status, 200);
    let langs: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(langs.as_array().unwrap().len(), 202);
    let lines = vec!["Das Haus ist alt.".to_string()];
    let languages = direct
        .languages_of(Some("eng_Latn"), Some("spa_Latn"))
        .unwrap();
    let want = (direct.translate_in(languages, &lines, &GreedyOptions::default())).unwrap();
    let body = json!({"q": lines[0], "source": "eng_Latn", "target": "spa_Latn"});
    let (status, got) = post(server.addr, "/translate", &body);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(want[0]));
    let beam = BeamOptions {
        beam_size: 4,
        nbest: 2,
        ..BeamOptions::default()
    };
    let want = (direct.translate_nbest_in(languages, &lines, &beam)).unwrap();
    let body =
        json!({"q": lines[0], "source": "eng_Latn", "target": "spa_Latn", "alternatives": 1});
    let (status, got) = post(server.addr, "/translate", &body);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["translatedText"], json!(want[0][0].1));
    assert_eq!(got["alternatives"], json!([want[0][1].1]));
}
