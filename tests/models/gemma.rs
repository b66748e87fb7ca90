//! Gemma 2 and Gemma 3 (text) from Hugging Face directories and llama.cpp GGUF files against
//! the references of `../shared/reference/families` (tiny random checkpoints: soft-capping,
//! alternating windows, 5 local + 1 global layers, query/key norms, `query_pre_attn_scalar`):
//! logits at every position of three sequences within 1e-4 (Hugging Face) / 1e-3 (GGUF, F16
//! weights) of transformers' float32, and 16 greedy steps decoded incrementally through the KV
//! cache: each step's log-probabilities against those of transformers' logits, the chosen ids
//! identical at every step up to the first whose reference margin is 1e-3 or less. The largest
//! difference to llama.cpp's own logits is printed.

use super::families::{max_diff, reference};
use std::path::{Path, PathBuf};
use transformer::model::families::{self, load_gguf, GgufWeights};
use transformer::model::step_layout::StepLayout;
use transformer::model::LanguageModel;
use transformer::store::gguf::GgufFile;

fn families_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/families");
    if dir.join("gemma2").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipped: ../shared/reference/families is absent (it holds the Gemma references)"
        );
        None
    }
}

/// `row` as log-probabilities, in float64.
fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The model against `reference-hf` (`tol` on every logit of the full forward, `2·tol` on the
/// step path's log-probabilities) and, when given, prints its largest difference to
/// `reference-gguf`. Returns the largest difference to `reference-hf`.
fn check(label: &str, model: &LanguageModel<f32>, hf: &Path, gguf: Option<&Path>, tol: f64) -> f64 {
    let (r, want) = reference(hf);
    let theirs = gguf.map(reference);
    let vocab = model.config.vocab_size;
    let (mut worst, mut to_llama_cpp, mut compared) = (0.0f64, 0.0f64, 0);
    for s in &r.sequences {
        let (ours, _) = model.forward(&s.input_ids, 1, None);
        let d = max_diff(&ours, &want[&s.name].1);
        assert!(d < tol, "{label} {}: logits differ by {d:e}", s.name);
        worst = worst.max(d);
        if let Some((_, l)) = &theirs {
            to_llama_cpp = to_llama_cpp.max(max_diff(&ours, &l[&s.name].1));
        }
        // Greedy, incrementally: the prompt at once, then one token a step through the cache.
        let greedy_rows = &want[&format!("{}_greedy", s.name)].1;
        let mut state = model.start(1, s.input_ids.len() + s.greedy_ids.len());
        let mut log_probs = model.step(&mut state, &s.input_ids, &StepLayout::last());
        for (k, (&id, &margin)) in s.greedy_ids.iter().zip(&s.greedy_top1_margins).enumerate() {
            let row = &greedy_rows[k * vocab..(k + 1) * vocab];
            let d = max_diff(&log_probs, &log_softmax(row));
            assert!(
                d < 2.0 * tol,
                "{label} {} greedy step {k}: log-probabilities differ by {d:e}",
                s.name
            );
            if margin <= 1e-3 {
                break; // float32 rounding may pick the other token: the paths part here
            }
            assert_eq!(argmax(&log_probs), id, "{label} {} greedy step {k}", s.name);
            compared += 1;
            if k + 1 < s.greedy_ids.len() {
                log_probs = model.step(&mut state, &[id], &StepLayout::dense());
            }
        }
    }
    assert!(
        compared >= 16,
        "{label}: only {compared} greedy steps compared"
    );
    eprintln!("{label}: largest logit difference to transformers {worst:.2e}, {compared} greedy steps compared");
    if gguf.is_some() {
        eprintln!("{label}: largest logit difference to llama.cpp {to_llama_cpp:.3e}");
    }
    worst
}

fn hf_model(dir: &Path) -> LanguageModel<f32> {
    let config_path = dir.join("config.json");
    let bytes = std::fs::read(&config_path).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let family = families::by_model_type(json["model_type"].as_str().unwrap()).unwrap();
    let mut m = families::load_hf_decoder(family, dir, &bytes, &config_path).unwrap();
    m.prepare_inference();
    m
}

fn gguf_model(path: &Path) -> LanguageModel<f32> {
    let file = GgufFile::open(path).unwrap();
    let mut m = load_gguf(&file, GgufWeights::Dequantised).unwrap();
    m.prepare_inference();
    m
}

fn check_hf(family: &str) {
    let Some(dir) = families_dir() else { return };
    let dir = dir.join(family);
    let m = hf_model(&dir.join("hf"));
    let gguf = dir.join("reference-gguf");
    let gguf = gguf.is_dir().then_some(gguf.as_path());
    check(
        &format!("{family} (HF)"),
        &m,
        &dir.join("reference-hf"),
        gguf,
        1e-4,
    );
}

fn check_gguf(family: &str) {
    let Some(dir) = families_dir() else { return };
    let dir = dir.join(family);
    let m = gguf_model(&dir.join(format!("{family}.f16.gguf")));
    let gguf = dir.join("reference-gguf");
    check(
        &format!("{family} (GGUF F16)"),
        &m,
        &dir.join("reference-hf"),
        Some(&gguf),
        1e-3,
    );
}

#[test]
fn gemma2_from_hugging_face_matches_transformers() {
    check_hf("gemma2");
}

#[test]
fn gemma2_from_gguf_matches_transformers() {
    check_gguf("gemma2");
}

#[test]
fn gemma3_from_hugging_face_matches_transformers() {
    check_hf("gemma3");
}

#[test]
fn gemma3_from_gguf_matches_transformers() {
    check_gguf("gemma3");
}

/// The same weights as gemma2 with `query_pre_attn_scalar` 64 instead of the head size 32: the
/// logits move by about 8, and ours with them.
#[test]
fn gemma2_query_pre_attn_scalar_matches_transformers() {
    check_hf("variants/gemma2_qpas64");
}
