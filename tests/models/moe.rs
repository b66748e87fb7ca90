//! Mixtures of experts against transformers: tiny random Qwen3-MoE, Mixtral and OLMoE checkpoints
//! (`tests/fixtures/moe`, made by its `make.sh`: 2 layers, 8 SwiGLU experts of 32 units, 2 a
//! token) as Hugging Face directories (bf16) and F16 GGUF files from llama.cpp's converter
//! (merged `ffn_*_exps` tensors). Logits within 1e-4 (HF) / 1e-3 (GGUF) of transformers'
//! float32 at every position of three sequences and along the greedy path, greedy ids equal
//! wherever the reference's margin exceeds 1e-3; the GGUF's experts multiplied in their
//! stored form give the dequantised logits; what is not computed is refused by name.

use crate::families::{
    check_against_hf, load_gguf_file, load_hf, logits, max_diff, reference, with_key, GGUF_TOL,
    HF_TOL,
};
use std::path::{Path, PathBuf};
use transformer::model::families::{self, load_gguf, GgufWeights};
use transformer::model::ExpertsConfig;
use transformer::pipeline::generate::TextGenerator;
use transformer::store::gguf::{GgufFile, Value};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/moe")
        .join(family)
}

/// Both files of `family` against transformers; the config's experts as `want`.
fn check_family(family: &str, want: ExpertsConfig) {
    let dir = fixture(family);
    let hf_ref = reference(&dir.join("reference-hf"));
    let hf = load_hf(&dir.join("hf"));
    assert_eq!(hf.config.experts, Some(want), "{family} hf");
    let hf_diff = check_against_hf(&format!("{family} hf"), &hf, &hf_ref, HF_TOL);
    let file = GgufFile::open(&dir.join(format!("{family}.f16.gguf"))).unwrap();
    let gguf = load_gguf_file(&file, GgufWeights::Dequantised);
    assert_eq!(gguf.config.experts, Some(want), "{family} gguf");
    let gguf_diff = check_against_hf(&format!("{family} gguf"), &gguf, &hf_ref, GGUF_TOL);
    // The experts' F16 rows multiplied as stored give the same logits.
    let blocks = load_gguf_file(&file, GgufWeights::Blocks);
    let s = &hf_ref.0.sequences[2];
    let d = max_diff(&logits(&blocks, &s.input_ids), &logits(&gguf, &s.input_ids));
    assert!(d < 1e-3, "{family} gguf blocks vs dequantised: {d:e}");
    eprintln!("{family}: max |Δ| to transformers: HF {hf_diff:.2e}, GGUF {gguf_diff:.2e}");
    // Both load with their tokenizers, as `generate` and `serve` load them.
    for path in [dir.join("hf"), dir.join(format!("{family}.f16.gguf"))] {
        let g = TextGenerator::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(g.model.config.experts, Some(want));
    }
}

#[test]
fn qwen3_moe_matches_transformers() {
    let want = ExpertsConfig {
        n_experts: 8,
        top_k: 2,
        d_ff: 32,
        normalise: true,
        shared_d_ff: None,
        bias: false,
        swiglu_clamp: None,
    };
    check_family("qwen3_moe", want);
}

#[test]
fn mixtral_matches_transformers() {
    let want = ExpertsConfig {
        n_experts: 8,
        top_k: 2,
        d_ff: 32,
        normalise: true,
        shared_d_ff: None,
        bias: false,
        swiglu_clamp: None,
    };
    check_family("mixtral", want);
}

#[test]
fn olmoe_matches_transformers() {
    // Softmax weights used as they are; query and key norms over the whole projection.
    let want = ExpertsConfig {
        n_experts: 8,
        top_k: 2,
        d_ff: 32,
        normalise: false,
        shared_d_ff: None,
        bias: false,
        swiglu_clamp: None,
    };
    check_family("olmoe", want);
    let m = load_hf(&fixture("olmoe").join("hf"));
    assert!(m.config.qk_norm && m.config.qk_norm_whole);
    let q_norm = m.blocks.layers[0].self_attn.q_norm.as_ref().unwrap();
    assert_eq!(q_norm.gain.value.data.len(), 64);
}

/// `config.json` of `family` with `edit` applied, loaded through the table: the error.
fn refused_config(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    refused_hf_config(&fixture(family).join("hf"), edit)
}

/// The `config.json` of the Hugging Face directory `dir` with `edit` applied, loaded through
/// the family table: the error (an edited config that loads fails the test).
pub fn refused_hf_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut json);
    let bytes = serde_json::to_vec(&json).unwrap();
    let family = families::by_model_type(json["model_type"].as_str().unwrap()).unwrap();
    match families::load_hf_decoder(family, dir, &bytes, &dir.join("config.json")) {
        Ok(_) => panic!("{}: the edited config loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_the_mixtures_do_not_compute_is_refused_by_name() {
    for (key, value, named) in [
        (
            "shared_expert_intermediate_size",
            serde_json::json!(64),
            "shared_expert_intermediate_size 64",
        ),
        (
            "mlp_only_layers",
            serde_json::json!([1]),
            "mlp_only_layers [1]",
        ),
        (
            "decoder_sparse_step",
            serde_json::json!(2),
            "decoder_sparse_step 2",
        ),
        ("num_experts_per_tok", serde_json::json!(9), "top_k 9"),
    ] {
        let e = refused_config("qwen3_moe", |j| j[key] = value.clone());
        assert!(e.contains(named), "{key}: {e}");
    }
    // transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts`: either name.
    let e = refused_config("qwen3_moe", |j| {
        j.as_object_mut().unwrap().remove("num_local_experts");
    });
    assert!(e.contains("num_experts is missing"), "{e}");
    let e = refused_config("olmoe", |j| j["clip_qkv"] = serde_json::json!(8.0));
    assert!(e.contains("clip_qkv 8"), "{e}");
    let e = refused_config("mixtral", |j| {
        j.as_object_mut().unwrap().remove("num_local_experts");
    });
    assert!(e.contains("num_local_experts is missing"), "{e}");

    // GGUF: a count of experts the merged tensors do not hold, and routing llama.cpp would
    // compute otherwise.
    let file = GgufFile::open(&fixture("mixtral").join("mixtral.f16.gguf")).unwrap();
    for (key, value, named) in [
        (
            "llama.expert_count",
            Value::U32(4),
            "not [cols, rows, 4] for 4 experts",
        ),
        (
            "llama.expert_shared_count",
            Value::U32(1),
            "llama.expert_shared_count 1",
        ),
        (
            "llama.expert_gating_func",
            Value::U32(2),
            "llama.expert_gating_func 2",
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
