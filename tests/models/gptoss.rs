//! gpt-oss against transformers: a tiny random `GptOssForCausalLM` (`tests/fixtures/gptoss`,
//! made by its `make.py`: 3 layers alternating a sliding window of 8 and full attention, 4
//! heads of 16 over 2 key/value heads with biases and sinks, YaRN, 4 experts of 32 units with
//! biases and the clamped SwiGLU, 2 a token) as a Hugging Face directory (bf16). Logits within
//! 1e-4 of transformers' float32 at every position of three sequences (5, 24 and 40 tokens: two
//! exceed the window) and along the greedy path; greedy ids through the KV cache equal to
//! `generate`'s wherever the reference's margin exceeds 1e-2; a prefill then steps equal to the
//! whole sequence's forward; what is not computed is refused by name.
//!
//! GGUF: llama.cpp's converter's F16 file (`gpt_oss.f16.gguf`) within 1e-3 of transformers, and
//! `llama-quantize … MXFP4_MOE`'s file (`gpt_oss.mxfp4.gguf`: experts in MXFP4, attention in
//! Q8_0) within a stated bound of transformers, its blocks multiplied as stored giving its
//! dequantised logits. llama.cpp's own logits of both files (`reference-llamacpp-*`, by
//! `../shared/tools/fixtures/ref_gguf.py`) are printed beside ours.

use crate::families::{
    check_against_hf, greedy, load_gguf_file, load_hf, logits, max_diff, prefill_then_decode,
    reference, with_key, GGUF_TOL, HF_TOL,
};
use std::path::{Path, PathBuf};
use transformer::model::config::RopeScaling;
use transformer::model::families::{load_gguf, GgufWeights};
use transformer::model::LanguageModel;
use transformer::model::{ExpertsConfig, SwigluClamp};
use transformer::pipeline::generate::TextGenerator;
use transformer::store::gguf::{GgufFile, Value};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gptoss")
}

/// `reference-hf/generate.json`: the ids of transformers' `generate` (greedy, with its cache).
#[derive(serde::Deserialize)]
struct Generated {
    generate_ids: Vec<Vec<u32>>,
}

/// gpt-oss's experts in the fixture's config.
fn experts() -> ExpertsConfig {
    ExpertsConfig {
        n_experts: 4,
        top_k: 2,
        d_ff: 32,
        normalise: true,
        shared_d_ff: None,
        bias: true,
        swiglu_clamp: Some(SwigluClamp {
            alpha: 1.702,
            limit: 7.0,
        }),
    }
}

/// What every file of the fixture computes: biases, sinks, alternating windows, YaRN.
fn check_config(m: &LanguageModel<f32>, what: &str) {
    let c = &m.config;
    assert_eq!(c.experts, Some(experts()), "{what}");
    assert!(c.attention_sinks && c.bias, "{what}");
    assert_eq!(c.layer_windows, [Some(8), None, Some(8)], "{what}");
    assert!(
        matches!(
            c.rope_scaling,
            Some(RopeScaling::Yarn { factor, truncate: false, .. }) if factor == 4.0
        ),
        "{what}: {:?}",
        c.rope_scaling
    );
    let sinks = m.blocks.layers[1].self_attn.sinks.as_ref().unwrap();
    assert_eq!(sinks.value.data.len(), 4, "{what}");
}

#[test]
fn gpt_oss_matches_transformers() {
    let dir = fixture();
    let hf_ref = reference(&dir.join("reference-hf"));
    let m = load_hf(&dir.join("hf"));
    check_config(&m, "hf");
    let want = experts();
    let d = check_against_hf("gpt_oss hf", &m, &hf_ref, HF_TOL);
    eprintln!("gpt_oss: max |Δ| to transformers: HF {d:.2e}");
    // Greedy through the KV cache against `generate`'s ids, while the margin exceeds 1e-2.
    let generated: Generated =
        serde_json::from_slice(&std::fs::read(dir.join("reference-hf/generate.json")).unwrap())
            .unwrap();
    for (s, want) in hf_ref.0.sequences.iter().zip(&generated.generate_ids) {
        let ours = greedy(&m, &s.input_ids, want.len());
        for (k, (&id, &margin)) in want.iter().zip(&s.greedy_top1_margins).enumerate() {
            if margin <= 1e-2 {
                break;
            }
            assert_eq!(
                ours[k], id,
                "{} generate step {k} (margin {margin})",
                s.name
            );
        }
    }
    // It loads with its tokenizer, as `generate` and `serve` load it.
    let g = TextGenerator::load(&dir.join("hf")).unwrap();
    assert_eq!(g.model.config.experts, Some(want));
}

/// The prompts through the decoding state (40 positions of two rows at once), then one token at
/// a time to 72, past the window many times over: every position's logits equal the whole
/// sequence's forward; with only the last outputs, the same last rows.
#[test]
fn prefill_then_decode_equals_the_full_forward() {
    let m = load_hf(&fixture().join("hf"));
    let worst = prefill_then_decode(&m, (2, 72, 40), 128, 1e-4);
    eprintln!("gpt_oss prefill and steps vs the forward: {worst:.2e}");
    assert!(worst < 1e-4, "prefill and steps vs the forward: {worst:e}");
}

/// `config.json` with `edit` applied, loaded through the table: the error.
fn refused(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    crate::moe::refused_hf_config(&fixture().join("hf"), edit)
}

#[test]
fn what_gpt_oss_does_not_compute_is_refused_by_name() {
    let mxfp4 = serde_json::json!({"quant_method": "mxfp4", "modules_to_not_convert": []});
    for (key, value, named) in [
        (
            "quantization_config",
            mxfp4,
            "quantization_config (quant_method mxfp4",
        ),
        (
            "layer_types",
            serde_json::json!(["sliding_attention", "linear_attention", "full_attention"]),
            "\"linear_attention\"",
        ),
        ("num_experts_per_tok", serde_json::json!(5), "top_k 5"),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "longrope", "rope_theta": 150000.0}),
            "\"longrope\"",
        ),
    ] {
        let e = refused(|j| j[key] = value.clone());
        assert!(e.contains(named), "{key}: {e}");
    }
    // GGUF: sliding layers laid out otherwise than every other one, or rotated by a base of
    // their own.
    let file = GgufFile::open(&fixture().join("gpt_oss.f16.gguf")).unwrap();
    for (key, value, named) in [
        (
            "gpt-oss.attention.sliding_window_pattern",
            Value::U32(3),
            "sliding_window_pattern 3",
        ),
        (
            "gpt-oss.rope.freq_base_swa",
            Value::F32(10000.0),
            "freq_base_swa 10000",
        ),
    ] {
        let bytes = with_key(&file, key, value);
        let edited = GgufFile::from_bytes(bytes, Path::new("edited.gguf")).unwrap();
        let e = load_gguf(&edited, GgufWeights::Dequantised)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(named), "{key}: {e}");
    }
}

/// The largest difference of llama.cpp's logits of `file` to transformers' (`against`: `hf`,
/// the checkpoint as configured, or `hf_truncate`, with YaRN's `truncate` true as llama.cpp
/// computes it), as `ref_gguf.py --vs` recorded it.
fn llama_cpp_distance(file: &str, against: &str) -> f64 {
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture().join(format!("reference-llamacpp-{file}/reference.json")))
            .unwrap(),
    )
    .unwrap();
    json["max_abs_diff"][against]["max_abs_diff"]
        .as_f64()
        .unwrap()
}

#[test]
fn gpt_oss_gguf_f16_matches_transformers() {
    let dir = fixture();
    let hf_ref = reference(&dir.join("reference-hf"));
    let file = GgufFile::open(&dir.join("gpt_oss.f16.gguf")).unwrap();
    let m = load_gguf_file(&file, GgufWeights::Dequantised);
    check_config(&m, "gguf f16");
    let d = check_against_hf("gpt_oss gguf f16", &m, &hf_ref, GGUF_TOL);
    // The F16 rows multiplied as stored give the same logits.
    let blocks = load_gguf_file(&file, GgufWeights::Blocks);
    let s = &hf_ref.0.sequences[2];
    let b = max_diff(&logits(&blocks, &s.input_ids), &logits(&m, &s.input_ids));
    assert!(b < 1e-3, "gguf f16 blocks vs dequantised: {b:e}");
    // llama.cpp rounds YaRN's ramp ends whatever the checkpoint says: its logits are those of
    // transformers with `truncate` true, not of this config.
    eprintln!(
        "gpt_oss GGUF F16: max |Δ| to transformers {d:.2e} (llama.cpp's: {:.2e}; to transformers \
         with truncate true {:.2e})",
        llama_cpp_distance("f16", "hf"),
        llama_cpp_distance("f16", "hf_truncate")
    );
    let g = TextGenerator::load(&dir.join("gpt_oss.f16.gguf")).unwrap();
    assert_eq!(g.model.config.experts, Some(experts()));
}

/// The MXFP4 file (experts in MXFP4, attention Q8_0), dequantised at load and multiplied in its
/// blocks (activations rounded to 8 bits a block, as llama.cpp does): every position of the
/// three sequences within `MXFP4_TOL` of transformers, and the blocks no farther from
/// transformers than llama.cpp's own logits of the same file are from the transformers
/// computation llama.cpp implements (`truncate` true).
#[test]
fn gpt_oss_gguf_mxfp4_is_near_transformers() {
    // Measured 2026-12-07: 18.4 dequantised and in blocks (llama.cpp's 18.5): this fixture's
    // experts are large (their gate and up projections clamp), so 4-bit weights move its
    // logits (std 6) by that much.
    const MXFP4_TOL: f64 = 20.0;
    let dir = fixture();
    let (r, want) = reference(&dir.join("reference-hf"));
    let file = GgufFile::open(&dir.join("gpt_oss.mxfp4.gguf")).unwrap();
    let m = load_gguf_file(&file, GgufWeights::Dequantised);
    check_config(&m, "gguf mxfp4");
    let blocks = load_gguf_file(&file, GgufWeights::Blocks);
    let (mut dequantised, mut in_blocks, mut between) = (0.0f64, 0.0f64, 0.0f64);
    for s in &r.sequences {
        let (ours, theirs) = (logits(&m, &s.input_ids), &want[&s.name].1);
        let ours_blocks = logits(&blocks, &s.input_ids);
        dequantised = dequantised.max(max_diff(&ours, theirs));
        in_blocks = in_blocks.max(max_diff(&ours_blocks, theirs));
        between = between.max(max_diff(&ours_blocks, &ours));
    }
    let llama_cpp = llama_cpp_distance("mxfp4", "hf_truncate");
    eprintln!(
        "gpt_oss GGUF MXFP4: max |Δ| to transformers: dequantised {dequantised:.2e}, blocks \
         {in_blocks:.2e} (llama.cpp's: {llama_cpp:.2e}); blocks vs dequantised {between:.2e}"
    );
    assert!(
        dequantised < MXFP4_TOL,
        "mxfp4 dequantised vs transformers: {dequantised:e}"
    );
    assert!(
        in_blocks < MXFP4_TOL,
        "mxfp4 blocks vs transformers: {in_blocks:e}"
    );
    assert!(
        in_blocks <= llama_cpp,
        "mxfp4 blocks: {in_blocks:e}, llama.cpp {llama_cpp:e}"
    );
}

/// A checkpoint as transformers saves gpt-oss quantised to MXFP4 (a `quantization_config`, the
/// experts' `uint8` `*_blocks`): refused naming the quantisation, before any weight is read.
#[test]
fn an_mxfp4_hugging_face_checkpoint_is_refused_by_its_quantization() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture().join("hf");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    json["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"});
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&json).unwrap(),
    )
    .unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(file), dir.path().join(file)).unwrap();
    }
    // [E, 2·d_ff, d_model / 32, 16] bytes of e2m1 pairs, as transformers stores the blocks.
    let blocks = vec![0u8; 4 * 64 * 2 * 16];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4, 64, 2, 16], &blocks)
            .unwrap();
    let name = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    let bytes = safetensors::serialize([(name, view)], None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let e = TextGenerator::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("quantization_config (quant_method mxfp4"), "{e}");
}
