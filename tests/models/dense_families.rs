//! The dense families people run now against transformers: tiny random SmolLM3 (a NoPE layer
//! every fourth), Granite 3 (embedding, residual, attention and logit multipliers), OLMo 2
//! (norms after the sublayers, whole-projection query/key norms) and OLMo 3 (OLMo 2 with
//! sliding layers) checkpoints (`tests/fixtures/dense`, made by its `make.sh`: hidden 96, 6
//! query / 3 key-value heads of 16) as Hugging Face directories (bf16) and F16 GGUF files from
//! llama.cpp's converter (OLMo 3's as architecture `olmo2`). Logits within 1e-4 (HF) / 1e-3
//! (GGUF) of transformers' float32 at every position of three sequences and along the greedy
//! path, greedy ids equal wherever the reference's margin exceeds 1e-3; the GGUF's weights
//! multiplied as stored give the dequantised logits; a prompt through the decoding state and
//! then token by token gives the full forward's logits; what is not computed is refused by
//! name.

use crate::families::{
    check_against_hf, load_gguf_file, load_hf, logits, max_diff, prefill_then_decode, reference,
    with_key, GGUF_TOL, HF_TOL,
};
use crate::moe::refused_hf_config;
use serde_json::json;
use std::path::{Path, PathBuf};
use transformer::model::families::{load_gguf, GgufWeights};
use transformer::model::LanguageModel;
use transformer::pipeline::generate::TextGenerator;
use transformer::store::gguf::{GgufFile, Value};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dense")
        .join(family)
}

/// The GGUF file of `family` (OLMo 3's is written as `olmo2`, its own name kept).
fn gguf_path(family: &str) -> PathBuf {
    fixture(family).join(format!("{family}.f16.gguf"))
}

/// Both files of `family` against transformers; `check` sees each loaded model's config.
/// Returns the two models (HF, GGUF dequantised).
fn check_family(
    family: &str,
    check: impl Fn(&LanguageModel<f32>),
) -> (LanguageModel<f32>, LanguageModel<f32>) {
    let dir = fixture(family);
    let hf_ref = reference(&dir.join("reference-hf"));
    let hf = load_hf(&dir.join("hf"));
    check(&hf);
    let hf_diff = check_against_hf(&format!("{family} hf"), &hf, &hf_ref, HF_TOL);
    let file = GgufFile::open(&gguf_path(family)).unwrap();
    let gguf = load_gguf_file(&file, GgufWeights::Dequantised);
    check(&gguf);
    let gguf_diff = check_against_hf(&format!("{family} gguf"), &gguf, &hf_ref, GGUF_TOL);
    // The F16 rows multiplied as stored give the same logits.
    let blocks = load_gguf_file(&file, GgufWeights::Blocks);
    let s = &hf_ref.0.sequences[2];
    let d = max_diff(&logits(&blocks, &s.input_ids), &logits(&gguf, &s.input_ids));
    assert!(d < 1e-3, "{family} gguf blocks vs dequantised: {d:e}");
    eprintln!("{family}: max |Δ| to transformers: HF {hf_diff:.2e}, GGUF {gguf_diff:.2e}");
    // Both load with their tokenizers, as `generate` and `serve` load them.
    for path in [dir.join("hf"), gguf_path(family)] {
        let g = TextGenerator::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check(&g.model);
    }
    (hf, gguf)
}

/// Two rows of 30 tokens: the first 20 through the decoding state at once, then one token at a
/// time; every position's logits equal the whole sequence's forward.
fn prefill_then_decode_equals_the_full_forward(m: &LanguageModel<f32>) {
    let worst = prefill_then_decode(m, (2, 30, 20), 64, 1e-4);
    assert!(worst < 1e-4, "prefill and steps vs the forward: {worst:e}");
}

#[test]
fn smollm3_matches_transformers() {
    let (hf, gguf) = check_family("smollm3", |m| {
        assert_eq!(m.config.layer_rope, [true, true, true, false]);
        let rotary: Vec<bool> = m.blocks.layers.iter().map(|l| l.self_attn.rotary).collect();
        assert_eq!(rotary, [true, true, true, false]);
        assert!(m.config.tie_embeddings);
        assert_eq!(m.config.n_kv_heads, Some(3));
    });
    prefill_then_decode_equals_the_full_forward(&hf);
    prefill_then_decode_equals_the_full_forward(&gguf);
}

#[test]
fn granite_matches_transformers() {
    let (hf, gguf) = check_family("granite", |m| {
        let c = &m.config;
        assert_eq!(c.embedding_scale, Some(12.0));
        assert!((c.residual_scale.unwrap() - 0.22).abs() < 1e-7);
        assert_eq!(c.logit_divisor, Some(3.0));
        let scale = m.blocks.layers[0].self_attn.scores.scale.unwrap();
        assert!((scale - 0.1).abs() < 1e-7, "{scale}");
    });
    prefill_then_decode_equals_the_full_forward(&hf);
    prefill_then_decode_equals_the_full_forward(&gguf);
}

#[test]
fn olmo2_matches_transformers() {
    let (hf, gguf) = check_family("olmo2", |m| {
        let c = &m.config;
        assert!(c.qk_norm && c.qk_norm_whole && c.post_norms && !c.input_norms);
        assert!(c.layer_windows.is_empty());
        let q_norm = m.blocks.layers[0].self_attn.q_norm.as_ref().unwrap();
        assert_eq!(q_norm.gain.value.data.len(), 96);
        assert!(m.blocks.layers[0].self_attn_res.norm.is_identity());
    });
    prefill_then_decode_equals_the_full_forward(&hf);
    prefill_then_decode_equals_the_full_forward(&gguf);
}

#[test]
fn olmo3_matches_transformers() {
    let (hf, gguf) = check_family("olmo3", |m| {
        let c = &m.config;
        assert!(c.qk_norm_whole && c.post_norms && !c.input_norms);
        assert_eq!(c.layer_windows, [Some(5), Some(5), None]);
    });
    prefill_then_decode_equals_the_full_forward(&hf);
    prefill_then_decode_equals_the_full_forward(&gguf);
}

/// `config.json` of `family` with `edit` applied, loaded through the table: the error.
fn refused(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    refused_hf_config(&fixture(family).join("hf"), edit)
}

/// The GGUF file of `family` with `key` set to `value`, loaded: the error.
fn refused_gguf(family: &str, key: &str, value: Value) -> String {
    let file = GgufFile::open(&gguf_path(family)).unwrap();
    let edited = GgufFile::from_bytes(with_key(&file, key, value), Path::new("edited.gguf"));
    match load_gguf(&edited.unwrap(), GgufWeights::Dequantised) {
        Ok(_) => panic!("{family}: the edited GGUF file with {key} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_the_dense_families_do_not_compute_is_refused_by_name() {
    for (family, key, value, named) in [
        (
            "smollm3",
            "use_sliding_window",
            json!(true),
            "use_sliding_window true",
        ),
        (
            "smollm3",
            "no_rope_layers",
            json!([1, 1]),
            "no_rope_layers has 2 entries for 4 layers",
        ),
        (
            "smollm3",
            "no_rope_layers",
            json!([1, 2, 1, 0]),
            "no_rope_layers[1] is 2",
        ),
        ("granite", "attention_bias", json!(true), "attention_bias"),
        (
            "granite",
            "residual_multiplier",
            json!(0.0),
            "residual_multiplier 0 must be a positive number",
        ),
        ("olmo2", "clip_qkv", json!(8.0), "clip_qkv 8"),
        ("olmo2", "hidden_act", json!("gelu"), "hidden_act \"gelu\""),
        (
            "olmo3",
            "layer_types",
            json!(["sliding_attention", "local", "full_attention"]),
            "layer_types entry \"local\"",
        ),
    ] {
        let e = refused(family, |j| j[key] = value.clone());
        assert!(e.contains(named), "{family} {key}: {e}");
    }
    let e = refused("olmo3", |j| {
        j["rope_parameters"]["sliding_attention"]["rope_type"] = json!("linear")
    });
    assert!(
        e.contains("rope_parameters.sliding_attention.rope_type \"linear\""),
        "{e}"
    );
    // GGUF: a missing or bad key llama.cpp reads.
    let e = refused_gguf("granite", "granite.logit_scale", Value::F32(-1.0));
    assert!(e.contains("granite.logit_scale -1"), "{e}");
    let e = refused_gguf(
        "olmo3",
        "olmo2.attention.sliding_window_pattern",
        Value::String("x".into()),
    );
    assert!(
        e.contains("olmo2.attention.sliding_window_pattern is string"),
        "{e}"
    );
    let e = refused_gguf("olmo3", "olmo2.rope.freq_base_swa", Value::F32(10000.0));
    assert!(e.contains("olmo2.rope.freq_base_swa 10000 differs"), "{e}");
}

/// Granite's `rope.scaling.finetuned` false turns the rotation off in every layer, as
/// llama.cpp reads it; the file then computes other logits.
#[test]
fn granite_gguf_without_rotation_is_nope_everywhere() {
    let file = GgufFile::open(&gguf_path("granite")).unwrap();
    let bytes = with_key(&file, "granite.rope.scaling.finetuned", Value::Bool(false));
    let edited = GgufFile::from_bytes(bytes, Path::new("edited.gguf")).unwrap();
    let nope = load_gguf_file(&edited, GgufWeights::Dequantised);
    assert_eq!(nope.config.layer_rope, [false; 3]);
    assert!(nope.blocks.layers.iter().all(|l| !l.self_attn.rotary));
    let rotary = load_gguf_file(&file, GgufWeights::Dequantised);
    let ids = [20, 31, 42, 53, 64];
    assert!(max_diff(&logits(&nope, &ids), &logits(&rotary, &ids)) > 1e-3);
}

/// llama.cpp's other form of `olmo2.attention.sliding_window_pattern`, a period `p` (layer `i`
/// slides when `i mod p < p − 1`): 3 gives the fixture's layers (two sliding, then a full one)
/// and transformers' logits; 0 makes every layer slide, and the logits differ.
#[test]
fn olmo3_gguf_sliding_pattern_as_a_period() {
    let file = GgufFile::open(&gguf_path("olmo3")).unwrap();
    let hf_ref = reference(&fixture("olmo3").join("reference-hf"));
    let key = "olmo2.attention.sliding_window_pattern";
    let with_period = |p: u32| {
        let bytes = with_key(&file, key, Value::U32(p));
        let edited = GgufFile::from_bytes(bytes, Path::new("edited.gguf")).unwrap();
        load_gguf_file(&edited, GgufWeights::Dequantised)
    };
    let three = with_period(3);
    assert_eq!(three.config.layer_windows, [Some(5), Some(5), None]);
    check_against_hf("olmo3 gguf, period 3", &three, &hf_ref, GGUF_TOL);
    let all = with_period(0);
    assert_eq!(all.config.layer_windows, [Some(5); 3]);
    let s = &hf_ref.0.sequences[2];
    let d = max_diff(&logits(&all, &s.input_ids), &hf_ref.1[&s.name].1);
    assert!(d > 1e-2, "every layer sliding: {d:e}");
}
