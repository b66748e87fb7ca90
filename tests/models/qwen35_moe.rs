//! Qwen3.5's hybrid stack with mixtures of experts, and the multimodal checkpoints read as
//! text models, against transformers (`tests/fixtures/qwen35`: `make_moe.py`, `make_next.py`,
//! `make_multimodal.py`): a tiny random `Qwen3_5MoeForCausalLM` (every FFN 8 experts of 32,
//! 2 a token, renormalised, and a shared expert of 48 behind its sigmoid gate), a tiny random
//! `Qwen3NextForCausalLM` (the same with fused Gated DeltaNet projections, 3 value heads per
//! key head, weights not renormalised), and `Qwen3_5ForConditionalGeneration` /
//! `Qwen3_5MoeForConditionalGeneration` checkpoints whose language models are the text
//! fixtures (a tiny vision tower beside them, not loaded). Logits at every position and along
//! the greedy path within the bound of [`crate::qwen35`] (1e-4, or 3× transformers' own float32
//! distance from its float64 where that is larger), greedy ids equal to `generate`'s where the
//! margin exceeds 1e-3, prefill-then-decode equal to the full forward, what is not computed
//! refused by name.

use crate::families::{load_hf, logits, max_diff};
use crate::moe::refused_hf_config;
use crate::qwen35::{check_against_float64, check_prefill_then_decode};
use std::path::{Path, PathBuf};
use transformer::model::ExpertsConfig;
use transformer::pipeline::generate::{ModelPrecision, TextGenerator};
use transformer::store::{read_hf_weights, tensors_to_bytes};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35")
}

/// 8 experts of 32 units, 2 a token, a shared expert of 48.
fn experts(normalise: bool) -> ExpertsConfig {
    ExpertsConfig {
        n_experts: 8,
        top_k: 2,
        d_ff: 32,
        normalise,
        shared_d_ff: Some(48),
        bias: false,
        swiglu_clamp: None,
    }
}

/// The model of `dir` against the float64 reference in `reference`: its experts `want`; the
/// largest difference and its share of the bound, printed.
fn check(name: &str, dir: &Path, reference: &Path, want: Option<ExpertsConfig>) {
    let m = load_hf(dir);
    assert_eq!(m.config.experts, want, "{name}");
    assert!(m.config.gated_delta.is_some(), "{name}");
    let (d, ratio) = check_against_float64(&m, reference);
    eprintln!("{name}: max |Δ| to transformers (float64) {d:.2e}, at most {ratio:.2} of the bound");
    // It loads with its tokenizer and readied for inference, as `generate` loads it (the
    // shared expert's gate a product of one output row): the same logits.
    let g = TextGenerator::load_prepared(dir, ModelPrecision::F32)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(g.model.config.experts, want);
    let ids = [10u32, 200, 33, 481, 7, 95, 300, 12];
    let d = max_diff(&logits(&g.model, &ids), &logits(&m, &ids));
    assert!(d < 1e-5, "{name}: prepared vs loaded {d:e}");
}

#[test]
fn qwen35_moe_matches_transformers() {
    let dir = fixture().join("moe");
    check(
        "qwen3.5-moe",
        &dir.join("hf"),
        &dir.join("reference-hf"),
        Some(experts(true)),
    );
}

#[test]
fn qwen3_next_matches_transformers() {
    let dir = fixture().join("next");
    let m = load_hf(&dir.join("hf"));
    let g = m.config.gated_delta.as_ref().unwrap();
    assert_eq!(
        (g.key_heads, g.value_heads),
        (2, 6),
        "three value heads per key head"
    );
    check(
        "qwen3-next",
        &dir.join("hf"),
        &dir.join("reference-hf"),
        Some(experts(false)),
    );
}

/// The multimodal checkpoints give their text fixture's reference logits (the language model's
/// weights are the same bf16 values), the vision tower's tensors skipped.
#[test]
fn multimodal_checkpoints_run_as_their_text_models() {
    let root = fixture();
    check(
        "qwen3.5 multimodal",
        &root.join("multimodal"),
        &root.join("reference-hf"),
        None,
    );
    check(
        "qwen3.5-moe multimodal",
        &root.join("moe/multimodal"),
        &root.join("moe/reference-hf"),
        Some(experts(true)),
    );
    // The top level's eos_token_id is absent: the text_config's (0) ends a generation.
    let g = TextGenerator::load(&root.join("multimodal")).unwrap();
    assert_eq!(g.tokenizer.end_tokens().first(), Some(&0));
}

#[test]
fn moe_prefill_then_decode_equals_the_full_forward() {
    check_prefill_then_decode(&load_hf(&fixture().join("moe/hf")));
    check_prefill_then_decode(&load_hf(&fixture().join("next/hf")));
}

#[test]
fn what_the_hybrid_mixtures_do_not_compute_is_refused_by_name() {
    let moe = fixture().join("moe/hf");
    let e = refused_hf_config(&moe, |j| {
        j.as_object_mut()
            .unwrap()
            .remove("shared_expert_intermediate_size");
    });
    assert!(
        e.contains("shared_expert_intermediate_size is missing"),
        "{e}"
    );
    let e = refused_hf_config(&moe, |j| j["num_experts_per_tok"] = serde_json::json!(9));
    assert!(e.contains("top_k 9"), "{e}");
    let next = fixture().join("next/hf");
    let e = refused_hf_config(&next, |j| j["mlp_only_layers"] = serde_json::json!([1]));
    assert!(e.contains("mlp_only_layers [1]"), "{e}");
    let e = refused_hf_config(&next, |j| j["decoder_sparse_step"] = serde_json::json!(2));
    assert!(e.contains("decoder_sparse_step 2"), "{e}");
    // Fused projections of another grouping: named with their parts.
    let e = refused_hf_config(&next, |j| {
        j["linear_num_value_heads"] = serde_json::json!(4)
    });
    assert!(e.contains("in_proj_qkvz.weight has 160 rows"), "{e}");
    // A multimodal checkpoint: a text_config field not computed, and another model's text.
    let multimodal = fixture().join("multimodal");
    let e = refused_hf_config(&multimodal, |j| {
        j["text_config"]["attention_bias"] = serde_json::json!(true)
    });
    assert!(e.contains("attention_bias"), "{e}");
    let e = refused_hf_config(&multimodal, |j| {
        j["text_config"]["model_type"] = serde_json::json!("qwen3_5_moe_text")
    });
    assert!(
        e.contains("text_config.model_type \"qwen3_5_moe_text\""),
        "{e}"
    );
}

/// Experts stored whole, as transformers 5 holds them (`mlp.experts.gate_up_proj [E, 2·d_ff,
/// d_model]`, each expert's gate rows then its up rows; `mlp.experts.down_proj [E, d_model,
/// d_ff]`), load as the same model as experts stored one by one: the fixture's tensors merged
/// so give identical logits; whole tensors of another shape than the config's are refused.
#[test]
fn experts_stored_whole_load_as_stored_one_by_one() {
    let src = fixture().join("moe/hf");
    let dir = std::env::temp_dir().join(format!("qwen35-moe-whole-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut tensors = read_hf_weights(&src, |_| false).unwrap();
    for i in 0..4 {
        let stem = format!("model.layers.{i}.mlp.experts");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..8 {
            let mut take = |part: &str| {
                tensors
                    .remove(&format!("{stem}.{e}.{part}.weight"))
                    .unwrap()
                    .1
            };
            gate_up.extend(take("gate_proj"));
            gate_up.extend(take("up_proj"));
            down.extend(take("down_proj"));
        }
        tensors.insert(format!("{stem}.gate_up_proj"), (vec![8, 64, 64], gate_up));
        tensors.insert(format!("{stem}.down_proj"), (vec![8, 64, 32], down));
    }
    let list: Vec<(String, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), &v[..]))
        .collect();
    let path = dir.join("model.safetensors");
    std::fs::write(&path, tensors_to_bytes(&list, &path).unwrap()).unwrap();
    let whole = load_hf(&dir);
    let e = refused_hf_config(&dir, |j| j["moe_intermediate_size"] = serde_json::json!(16));
    std::fs::remove_dir_all(&dir).unwrap();
    let ids = [10u32, 200, 33, 481, 7, 95, 300, 12];
    let d = max_diff(&logits(&whole, &ids), &logits(&load_hf(&src), &ids));
    assert_eq!(d, 0.0, "whole experts vs one by one");
    assert!(
        e.contains(
            "tensor model.layers.0.mlp.experts.gate_up_proj has shape [8, 64, 64], not [8, 32, 64]"
        ),
        "{e}"
    );
}
