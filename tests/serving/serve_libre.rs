//! `transformer serve` with a translation model (a small random one saved here) as
//! LibreTranslate's clients call it: form bodies and JSON give the same translations, the API
//! key as a header or as the `api_key` field (401 otherwise, in LibreTranslate's shape), a
//! repeated `q` as a list, `/detect`, content types refused by name, a named pair refusing
//! other codes and an unnamed one taking them; `/attention` bounded with a 400 naming the limit.

use super::serve_surface::{assert_error, json_of, T};
use serde_json::json;
use std::path::Path;
use transformer::model::{ModelConfig, Seq2Seq};
use transformer::rng::Rng;
use transformer::serve::client::request_with;
use transformer::serve::{ServeConfig, Server};
use transformer::text::vocab::{Vocab, VocabLevel};

/// A translation server over a small random model saved in `tmp`, with the pair `pair` (None:
/// unnamed) and the API key `s3cret`.
fn translation_server(tmp: &Path, pair: Option<(&str, &str)>, max_len: usize) -> Server {
    let vocab = Vocab::build(
        ["the cat sat on the mat", "die katze sass auf der matte"],
        VocabLevel::Char,
        1,
    );
    let mut config = ModelConfig::preset("tiny", vocab.len()).unwrap();
    config.max_len = max_len;
    let mut model = Seq2Seq::<f32>::new(config, &mut Rng::new(11));
    let mut writer = transformer::store::CheckpointWriter::begin(tmp).unwrap();
    transformer::model::checkpoint::write_model(&mut writer, &mut model).unwrap();
    vocab.write(&mut writer).unwrap();
    writer.commit().unwrap();
    let mut config = ServeConfig::new(tmp.to_path_buf(), "127.0.0.1:0".parse().unwrap());
    if let Some((src, tgt)) = pair {
        (config.source_lang, config.target_lang) = (src.into(), tgt.into());
    }
    config.api_key = Some("s3cret".into());
    let server = Server::start(config).unwrap();
    server.wait_ready().unwrap();
    server
}

#[test]
fn libre_translate_forms_detect_keys_and_bounded_attention() {
    let tmp = tempfile::tempdir().unwrap();
    let server = translation_server(tmp.path(), Some(("en", "de")), 400);
    let addr = server.addr;
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let json_ct = ("Content-Type", "application/json");
    let bearer = ("Authorization", "Bearer s3cret");
    let libre = |headers: &[(&str, &str)], path: &str, body: &str| {
        let (status, _, text) = request_with(addr, "POST", path, headers, Some(body), T).unwrap();
        (status, json_of(&text))
    };
    // The same sentence as JSON with the key in a header, and as libretranslatepy sends it: a
    // form with the key as a field.
    let (status, by_json) = libre(
        &[json_ct, bearer],
        "/translate",
        &json!({"q": "the cat", "source": "en", "target": "de"}).to_string(),
    );
    assert_eq!(status, 200, "{by_json}");
    let (status, by_form) = libre(
        &[form],
        "/translate",
        "q=the+cat&source=en&target=de&format=text&api_key=s3cret",
    );
    assert_eq!(status, 200, "{by_form}");
    assert_eq!(by_form, by_json);
    assert!(by_json["translatedText"].is_string());
    // A repeated q is a list; alternatives from a form are a number.
    let (status, listed) = libre(
        &[form, bearer],
        "/translate",
        "q=the+cat&q=the+mat&source=auto&target=de&alternatives=1",
    );
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["translatedText"].as_array().unwrap().len(), 2);
    assert_eq!(listed["translatedText"][0], by_json["translatedText"]);
    assert_eq!(listed["alternatives"][0].as_array().unwrap().len(), 1);
    // Wrong or missing keys: 401 in LibreTranslate's shape.
    for body in ["q=the+cat&target=de&api_key=wrong", "q=the+cat&target=de"] {
        let (status, err) = libre(&[form], "/translate", body);
        assert_eq!(status, 401, "{err}");
        assert!(err["error"].as_str().unwrap().contains("API key"), "{err}");
    }
    // A form elsewhere is refused; text/plain here too.
    let (status, _, text) = request_with(
        addr,
        "POST",
        "/v1/completions",
        &[form, bearer],
        Some("prompt=x"),
        T,
    )
    .unwrap();
    assert_error(status, &json_of(&text), 415, "unsupported_media_type", None);
    let (status, err) = libre(
        &[("Content-Type", "text/plain"), bearer],
        "/translate",
        "q=x",
    );
    assert_eq!(status, 415, "{err}");
    assert!(err["error"]
        .as_str()
        .unwrap()
        .contains("x-www-form-urlencoded"));
    // The pair is named: de -> en is refused naming it.
    let (status, err) = libre(
        &[form, bearer],
        "/translate",
        "q=the+cat&source=de&target=en",
    );
    assert_eq!(status, 400);
    assert!(err["error"].as_str().unwrap().contains("en to de"), "{err}");

    // /detect: the served source language.
    let (status, detected) = libre(&[form], "/detect", "q=the+cat&api_key=s3cret");
    assert_eq!(status, 200, "{detected}");
    assert_eq!(detected, json!([{"confidence": 100.0, "language": "en"}]));
    let (status, _) = libre(&[json_ct], "/detect", &json!({"q": "x"}).to_string());
    assert_eq!(status, 401);

    // /attention: a short sentence answers; one whose maps would pass the bound is a 400
    // naming the limit, and the server goes on.
    let attention = |q: &str| {
        libre(
            &[json_ct, bearer],
            "/attention",
            &json!({"q": q}).to_string(),
        )
    };
    let (status, maps) = attention("the cat");
    assert_eq!(status, 200, "{maps}");
    // 320 source tokens (within the context of 400): 4 heads x (2 x 320² + 2 x (370² + 370 x
    // 320)) = 2.86 million weights.
    let (status, err) = attention(&"the mat ".repeat(40));
    assert_eq!(status, 400, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("1000000"), "{message}");
    let (status, _) = attention("the cat");
    assert_eq!(status, 200);
}

#[test]
fn an_unnamed_pair_takes_the_codes_a_client_sends() {
    let tmp = tempfile::tempdir().unwrap();
    let server = translation_server(tmp.path(), None, 40);
    let body = "q=the+cat&source=de&target=en&api_key=s3cret";
    let (status, _, text) = request_with(
        server.addr,
        "POST",
        "/translate",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some(body),
        T,
    )
    .unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(json_of(&text)["translatedText"].is_string());
}
