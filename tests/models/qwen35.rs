//! Qwen3.5's hybrid stack against transformers: a tiny random `Qwen3_5ForCausalLM`
//! (`tests/fixtures/qwen35`, made by its `make.py`: Gated DeltaNet layers around one gated,
//! partially rotated full-attention layer) as a Hugging Face directory (bf16). Logits at every
//! position of four sequences (the longest spans three of the chunked form's chunks) and along
//! the greedy path within 1e-4 of transformers computed in float64 — or, where transformers'
//! own float32 is farther than a third of that from its float64 (up to 7.7e-4 on this
//! fixture), within 3× its distance; greedy ids through our decoding state (the prompt chunked, then one
//! recurrent step a token) equal to transformers' `generate` wherever the reference's margin
//! exceeds 1e-3; a prefill then steps equal to the whole sequence's forward; what is not
//! computed refused by name.

use crate::families::{greedy, load_hf, logits, max_diff, prefill_then_decode, HF_TOL};
use std::path::{Path, PathBuf};
use transformer::model::config::GatedDeltaConfig;
use transformer::model::LanguageModel;
use transformer::pipeline::generate::TextGenerator;
use transformer::store::read_tensors;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35")
}

/// Our logits at every position of each sequence and along its greedy path against
/// transformers' float64, within 1e-4 or, where transformers' own float32 is farther from its
/// float64 than a third of that (`float32_max_diff`), within 3× that distance: this fixture
/// amplifies rounding (in float64, one float32 ulp of noise on the embeddings moves its logits
/// by up to 1.3e-4), so any float32 computation of it is that far from exact; greedy ids through our decoding state equal to `generate`'s while the margin exceeds
/// 1e-3. Returns the largest difference and the largest ratio to the sequence's bound.
pub fn check_against_float64(m: &LanguageModel<f32>, dir: &Path) -> (f64, f64) {
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let want = read_tensors(&dir.join("logits.safetensors")).unwrap();
    let v = m.config.vocab_size;
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    let (mut worst, mut ratio) = (0.0f64, 0.0f64);
    for s in json["sequences"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let (input, greedy_ids) = (ids(&s["input_ids"]), ids(&s["greedy_ids"]));
        let tol = HF_TOL.max(3.0 * s["float32_max_diff"].as_f64().unwrap());
        let d = max_diff(&logits(m, &input), &want[name].1);
        let mut path = input.clone();
        path.extend(&greedy_ids[..greedy_ids.len() - 1]);
        let ours = logits(m, &path);
        let g = max_diff(
            &ours[(input.len() - 1) * v..],
            &want[&format!("{name}_greedy")].1,
        );
        eprintln!("{name}: {d:.2e}, greedy path {g:.2e} (bound {tol:.2e})");
        assert!(
            d < tol && g < tol,
            "{name}: logits differ by {d:e}, greedy path {g:e}"
        );
        (worst, ratio) = (worst.max(d).max(g), ratio.max(d.max(g) / tol));
        let ours = greedy(m, &input, greedy_ids.len());
        let margins = s["greedy_top1_margins"].as_array().unwrap();
        for (k, (&id, margin)) in greedy_ids.iter().zip(margins).enumerate() {
            if margin.as_f64().unwrap() <= 1e-3 {
                break;
            }
            assert_eq!(ours[k], id, "{name} greedy step {k}");
        }
    }
    (worst, ratio)
}

#[test]
fn qwen35_matches_transformers() {
    let dir = fixture();
    let m = load_hf(&dir.join("hf"));
    let c = &m.config;
    let want = GatedDeltaConfig {
        layers: vec![true, true, false, true],
        key_heads: 2,
        d_key: 16,
        value_heads: 4,
        d_value: 8,
        conv_kernel: 4,
    };
    assert_eq!(c.gated_delta.as_ref(), Some(&want));
    assert_eq!(
        (c.rotary_dim, c.attn_output_gate, c.norm_weight_offset),
        (Some(4), true, 1.0)
    );
    assert!(!m.can_roll_back(), "a recurrent state cannot be cut back");
    let (d, ratio) = check_against_float64(&m, &dir.join("reference-hf"));
    eprintln!(
        "qwen3.5: max |Δ| to transformers (float64) {d:.2e}, at most {ratio:.2} of the bound"
    );
    // It loads with its tokenizer, as `generate` loads it.
    let g = TextGenerator::load(&dir.join("hf")).unwrap();
    assert!(g.model.config.gated_delta.is_some());
}

/// The prompt through the decoding state (its first 70 positions at once: the chunked form
/// over two chunks), then one token at a time (the recurrent form), two rows at once: every
/// position's logits equal the whole sequence's forward (the chunked form from position 0);
/// with only the last outputs, the same last rows.
#[test]
fn prefill_then_decode_equals_the_full_forward() {
    check_prefill_then_decode(&load_hf(&fixture().join("hf")));
}

/// [`prefill_then_decode_equals_the_full_forward`] on the model `m`.
pub fn check_prefill_then_decode(m: &LanguageModel<f32>) {
    let worst = prefill_then_decode(m, (2, 90, 70), 128, 1e-4);
    // (f32 rounding of products of other shapes, amplified as the reference's bounds say)
    eprintln!("prefill and steps vs the forward: {worst:.2e}");
    assert!(worst < 3e-4, "prefill and steps vs the forward: {worst:e}");
}

/// `config.json` with `edit` applied, loaded through the table: the error.
fn refused(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    crate::moe::refused_hf_config(&fixture().join("hf"), edit)
}

#[test]
fn what_qwen35_does_not_compute_is_refused_by_name() {
    let types = serde_json::json!([
        "linear_attention",
        "sliding_attention",
        "full_attention",
        "linear_attention"
    ]);
    for (key, value, named) in [
        ("layer_types", types, "\"sliding_attention\""),
        ("attention_bias", serde_json::json!(true), "attention_bias"),
        (
            "hidden_act",
            serde_json::json!("gelu"),
            "hidden_act \"gelu\"",
        ),
        ("num_experts", serde_json::json!(8), "num_experts 8"),
        (
            "linear_num_value_heads",
            serde_json::json!(3),
            "value_heads 3",
        ),
        (
            "attn_output_gate",
            serde_json::json!(false),
            "attn_output_gate false",
        ),
    ] {
        let e = refused(|j| j[key] = value.clone());
        assert!(e.contains(named), "{key}: {e}");
    }
    let e = refused(|j| j["rope_parameters"]["rope_type"] = serde_json::json!("dynamic"));
    assert!(e.contains("dynamic"), "{e}");
    let e = refused(|j| {
        j["layer_types"].as_array_mut().unwrap().pop();
    });
    assert!(e.contains("layer_types has 3 entries for 4 layers"), "{e}");
    // The dense model refuses experts and names the family that has them.
    let e = refused(|j| j["num_experts"] = serde_json::json!(8));
    assert!(e.contains("qwen3_5_moe_text"), "{e}");
    // Training refuses the hybrid's layers by name.
    let m = load_hf(&fixture().join("hf"));
    let e = m.config.check_trainable().unwrap_err();
    assert!(e.contains("Gated DeltaNet"), "{e}");
}
