//! Real-model parity: our BERT encoder and tokenizer run the pretrained all-MiniLM-L6-v2 from
//! `../shared/models` and must reproduce what the reference implementation (sentence-transformers
//! on PyTorch, float32, CPU) computed in `../shared/reference/minilm`: the same word-piece ids,
//! every last hidden state within 1e-4 and every sentence embedding at cosine > 0.99999.
//! Skipped, with the reason printed, where `shared/` is absent.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use transformer::model::bert::{Bert, BertConfig};
use transformer::pipeline::embed::SentenceEncoder;
use transformer::rng::Rng;
use transformer::store::read_tensors;

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    sentences: Vec<RefSentence>,
}

#[derive(Deserialize)]
struct RefSentence {
    text: String,
    input_ids: Vec<u32>,
    embedding: Vec<f64>,
}

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

fn model_dir() -> PathBuf {
    shared().join("models/all-MiniLM-L6-v2")
}

fn reference_dir() -> PathBuf {
    shared().join("reference/minilm")
}

/// The reference material, or `None` (with the reason printed) where it is not there.
fn available() -> bool {
    for p in [
        model_dir().join("model.safetensors"),
        reference_dir().join("reference.json"),
    ] {
        if !p.is_file() {
            eprintln!("skipping: {} not found (needs ../shared)", p.display());
            return false;
        }
    }
    true
}

fn reference() -> &'static Reference {
    static R: OnceLock<Reference> = OnceLock::new();
    R.get_or_init(|| {
        let text = std::fs::read_to_string(reference_dir().join("reference.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// Loaded once per test binary (the weights are 90 MB).
fn encoder() -> &'static SentenceEncoder {
    static E: OnceLock<SentenceEncoder> = OnceLock::new();
    E.get_or_init(|| SentenceEncoder::load(&model_dir(), None).unwrap())
}

fn texts() -> Vec<String> {
    reference()
        .sentences
        .iter()
        .map(|s| s.text.clone())
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn token_ids_match_the_reference() {
    if !available() {
        return;
    }
    let r = reference();
    assert_eq!(r.max_seq_length, 256);
    assert_eq!(encoder().tokenizer.max_len(), 256);
    for s in &r.sentences {
        assert_eq!(
            encoder().tokenizer.encode(&s.text).unwrap(),
            s.input_ids,
            "{:?}",
            s.text
        );
    }
    // Long inputs are cut to 256 word pieces, [CLS] first and [SEP] last.
    let long = "the cat sat on the mat. ".repeat(60);
    let ids = encoder().tokenizer.encode(&long).unwrap();
    assert_eq!(ids.len(), 256);
    assert_eq!((ids[0], ids[255]), (101, 102));
}

#[test]
fn last_hidden_states_match_the_reference() {
    if !available() {
        return;
    }
    let hidden = read_tensors(&reference_dir().join("hidden_states.safetensors")).unwrap();
    let model = &encoder().model;
    let d = model.config.hidden_size;
    let mut worst = 0.0f64;
    for (i, s) in reference().sentences.iter().enumerate() {
        let (shape, want) = &hidden[&format!("last_hidden_state.{i}")];
        let n = s.input_ids.len();
        assert_eq!(shape, &vec![n, d]);
        let got = model.forward(&s.input_ids, None, 1, n, &[n]).unwrap();
        let diff = got
            .iter()
            .zip(want)
            .map(|(&a, &b)| (a as f64 - b as f64).abs())
            .fold(0.0, f64::max);
        assert!(
            diff <= 1e-4,
            "sentence {i} {:?}: max |diff| {diff:e}",
            s.text
        );
        worst = worst.max(diff);
    }
    eprintln!("largest |hidden state - reference|: {worst:e}");
}

#[test]
fn sentence_embeddings_match_the_reference() {
    if !available() {
        return;
    }
    let embeddings = encoder().embed(&texts(), 32).unwrap();
    let mut worst = 1.0f64;
    for (e, s) in embeddings.iter().zip(&reference().sentences) {
        assert_eq!(e.len(), s.embedding.len());
        let c = cosine(e, &s.embedding);
        assert!(c > 0.99999, "{:?}: cosine {c}", s.text);
        worst = worst.min(c);
        let norm: f64 = e.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "not normalised: {norm}");
    }
    eprintln!("smallest cosine with the reference: {worst}");
}

#[test]
fn batched_embeddings_equal_one_at_a_time() {
    if !available() {
        return;
    }
    // Sentences of different lengths padded into one batch, against each alone.
    let texts = texts();
    let batched = encoder().embed(&texts, 32).unwrap();
    let mut worst = 0.0f32;
    for (t, b) in texts.iter().zip(&batched) {
        let alone = encoder().embed(std::slice::from_ref(t), 1).unwrap();
        for (x, y) in alone[0].iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= 1e-5, "batched vs alone: {worst:e}");
    eprintln!("batched vs one at a time: max |diff| {worst:e}");
}

// ---------------------------------------------------------------------------------------------
// Loading: configs we cannot compute are refused; names, buffers and shapes are checked. These
// use a tiny random model and do not need ../shared.

const TINY: &str = r#"{"model_type": "bert", "vocab_size": 30, "hidden_size": 8,
    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12,
    "max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu",
    "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
    "hidden_dropout_prob": 0.1, "architectures": ["BertModel"]}"#;

fn with_field(key: &str, value: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(TINY).unwrap();
    v[key] = value;
    v.to_string()
}

#[test]
fn unsupported_configs_are_rejected_naming_the_field() {
    use serde_json::json;
    let path = Path::new("config.json");
    assert!(BertConfig::from_json(TINY.as_bytes(), path).is_ok());
    for (key, value) in [
        ("hidden_act", json!("silu")),
        ("position_embedding_type", json!("relative_key")),
        ("is_decoder", json!(true)),
        ("add_cross_attention", json!(true)),
        ("model_type", json!("roberta")),
        ("num_attention_heads", json!(3)),
        ("hidden_size", json!(0)),
    ] {
        let err = BertConfig::from_json(with_field(key, value).as_bytes(), path)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains("config.json"), "{key}: {err}");
    }
    // Through Bert::load as well: the message names the file and the field.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        with_field("hidden_act", serde_json::json!("swish")),
    )
    .unwrap();
    let err = Bert::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("hidden_act") && err.contains("config.json"),
        "{err}"
    );
}

/// Writes `tensors` (f32, plus an i64 `position_ids` buffer) as a safetensors file.
fn write_checkpoint(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], n_pos: usize) {
    use safetensors::tensor::{Dtype, TensorView};
    let mut bytes: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            let b = d.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.clone(), s.clone(), Dtype::F32, b)
        })
        .collect();
    let pos: Vec<u8> = (0..n_pos as i64).flat_map(|i| i.to_le_bytes()).collect();
    bytes.push((
        "bert.embeddings.position_ids".into(),
        vec![1, n_pos],
        Dtype::I64,
        pos,
    ));
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, t, b)| (n.clone(), TensorView::new(*t, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn checkpoints_load_with_prefix_and_buffers_and_shapes_are_checked() {
    let config = BertConfig::from_json(TINY.as_bytes(), Path::new("config.json")).unwrap();
    let mut model = Bert::<f32>::new(config, &mut Rng::new(5));
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = model
        .hf_params()
        .into_iter()
        .map(|(n, p)| {
            (
                format!("bert.{n}"),
                p.value.shape.clone(),
                p.value.data.clone(),
            )
        })
        .collect();
    // A head on top of the encoder, not part of it.
    tensors.push(("bert.pooler.dense.bias".into(), vec![8], vec![0.5; 8]));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), TINY).unwrap();
    let weights = dir.path().join("model.safetensors");
    write_checkpoint(&weights, &tensors, 16);
    let loaded = Bert::load(dir.path()).unwrap();
    let (ids, lens) = ([3u32, 7, 1, 2, 9, 0], [3usize, 2]);
    assert_eq!(
        loaded.forward(&ids, None, 2, 3, &lens).unwrap(),
        model.forward(&ids, None, 2, 3, &lens).unwrap()
    );

    // A transposed weight (same size, wrong shape) is named in the error.
    let i = tensors
        .iter()
        .position(|(n, _, _)| n == "bert.encoder.layer.1.intermediate.dense.weight")
        .unwrap();
    tensors[i].1 = vec![8, 12];
    write_checkpoint(&weights, &tensors, 16);
    let err = Bert::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("encoder.layer.1.intermediate.dense.weight")
            && err.contains("model.safetensors"),
        "{err}"
    );

    // An unknown tensor of the right total size is named as well.
    tensors[i].1 = vec![12, 8];
    tensors[i].0 = "bert.encoder.layer.1.intermediate.dense.kernel".into();
    write_checkpoint(&weights, &tensors, 16);
    let err = Bert::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("intermediate.dense"), "{err}");
}
