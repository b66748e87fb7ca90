//! The llama-style families (Llama 3 with its rope scaling, Qwen2's Q/K/V biases, Qwen3's
//! Q/K norms, Mistral's sliding window, Phi-3's fused projections) against transformers and
//! llama.cpp: the tiny random checkpoints of `../shared/reference/families/<family>`, each as a
//! Hugging Face directory (bf16 safetensors) and an F16 GGUF file. Logits within 1e-4 (HF) and
//! 1e-3 (GGUF) of transformers' float32 at every position of the three sequences and along
//! the greedy path, greedy ids identical wherever the reference's top-1 margin exceeds 1e-3,
//! and the largest difference to llama.cpp's logits printed per family.

use std::path::{Path, PathBuf};
use transformer::decode::sample::SamplingOptions;
use transformer::model::config::RopeScaling;
use transformer::model::families::{self, load_gguf, GgufWeights};
use transformer::model::{LanguageModel, StepLayout};
use transformer::pipeline::generate::{generate_ids, TextGenerator};
use transformer::rng::Rng;
use transformer::store::gguf::{GgufFile, Value};
use transformer::store::{read_tensors, TensorMap};

/// `../shared/reference/families`, or `None` with the reason printed.
pub(super) fn families_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/families");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: ../shared/reference/families is absent (it holds the references)");
        None
    }
}

/// One id sequence of a reference (`reference.json`).
#[derive(serde::Deserialize)]
pub(super) struct Sequence {
    pub(super) name: String,
    pub(super) input_ids: Vec<u32>,
    pub(super) greedy_ids: Vec<u32>,
    pub(super) greedy_top1_margins: Vec<f64>,
}

/// A reference's `reference.json`.
#[derive(serde::Deserialize)]
pub(super) struct Reference {
    pub(super) sequences: Vec<Sequence>,
}

/// A family's reference (`reference-hf` or `reference-gguf`): the sequences and the logits.
pub(super) fn reference(dir: &Path) -> (Reference, TensorMap) {
    let r = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    (r, read_tensors(&dir.join("logits.safetensors")).unwrap())
}

/// The largest |ours - theirs|, in float64.
pub(super) fn max_diff(ours: &[f32], theirs: &[f32]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max)
}

/// The logits of every position of `ids`, `[len, vocab]`.
pub(super) fn logits(model: &LanguageModel<f32>, ids: &[u32]) -> Vec<f32> {
    model.forward(ids, 1, None).0
}

/// Decoding against the forward: `rows` rows of `len` tokens (a fixed pattern over the
/// vocabulary), the first `prefill` of each through a decoding state of `capacity` positions
/// at once, then one token at a time. Returns the largest difference of any position's logits
/// to the whole sequence's forward; a second state given the same prompt with only its last
/// outputs must give the same last rows (within `last_bound`).
pub(super) fn prefill_then_decode(
    m: &LanguageModel<f32>,
    (rows, len, prefill): (usize, usize, usize),
    capacity: usize,
    last_bound: f64,
) -> f64 {
    let v = m.config.vocab_size;
    let seqs: Vec<Vec<u32>> = (0..rows)
        .map(|r| {
            (0..len)
                .map(|t| ((t * 37 + r * 101 + 11) % (v - 8) + 8) as u32)
                .collect()
        })
        .collect();
    let full: Vec<Vec<f32>> = seqs.iter().map(|s| logits(m, s)).collect();
    let mut state = m.start(rows, capacity);
    let prompt: Vec<u32> = seqs.iter().flat_map(|s| s[..prefill].to_vec()).collect();
    let first = m.step_logits(&mut state, &prompt, &StepLayout::dense());
    let mut worst = 0.0f64;
    for r in 0..rows {
        let ours = &first[r * prefill * v..(r + 1) * prefill * v];
        worst = worst.max(max_diff(ours, &full[r][..prefill * v]));
    }
    for t in prefill..len {
        let tokens: Vec<u32> = seqs.iter().map(|s| s[t]).collect();
        let step = m.step_logits(&mut state, &tokens, &StepLayout::dense());
        for r in 0..rows {
            let want = &full[r][t * v..(t + 1) * v];
            worst = worst.max(max_diff(&step[r * v..(r + 1) * v], want));
        }
    }
    assert_eq!(state.len(), len);
    // Only the last outputs of a prompt: the last rows.
    let mut last = m.start(rows, capacity);
    let lasts = m.step_logits(&mut last, &prompt, &StepLayout::last());
    for r in 0..rows {
        let want = &full[r][(prefill - 1) * v..prefill * v];
        let d = max_diff(&lasts[r * v..(r + 1) * v], want);
        assert!(d < last_bound, "row {r} last output: {d:e}");
    }
    worst
}

/// 16 greedy tokens after `ids`, through the KV cache.
pub(super) fn greedy(model: &LanguageModel<f32>, ids: &[u32], n: usize) -> Vec<u32> {
    let opts = SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    };
    generate_ids(model, ids, n, opts, &mut Rng::new(1), &[], |_| {
        Ok::<(), ()>(())
    })
    .unwrap()
}

/// Tolerances against transformers' float32 logits: the bf16 checkpoint upcast exactly, and
/// the F16 GGUF (whose weights were rounded to float16).
pub(super) const HF_TOL: f64 = 1e-4;
pub(super) const GGUF_TOL: f64 = 1e-3;

/// Our model against transformers' reference: every position of every sequence and the
/// greedy path's logits within `tol`, greedy ids equal while the reference's margin exceeds
/// 1e-3. Returns the largest logit difference.
pub(super) fn check_against_hf(
    label: &str,
    model: &LanguageModel<f32>,
    hf: &(Reference, TensorMap),
    tol: f64,
) -> f64 {
    let (r, want) = hf;
    let mut worst = 0.0f64;
    for s in &r.sequences {
        let d = max_diff(&logits(model, &s.input_ids), &want[&s.name].1);
        assert!(d < tol, "{label} {}: logits differ by {d:e}", s.name);
        worst = worst.max(d);
        // The greedy path: the logits of the sequence extended by the reference's greedy ids
        // (row k chose greedy id k).
        let v = model.config.vocab_size;
        let mut path = s.input_ids.clone();
        path.extend(&s.greedy_ids[..s.greedy_ids.len() - 1]);
        let ours = logits(model, &path);
        let rows = &ours[(s.input_ids.len() - 1) * v..];
        let d = max_diff(rows, &want[&format!("{}_greedy", s.name)].1);
        assert!(
            d < tol,
            "{label} {} greedy path: logits differ by {d:e}",
            s.name
        );
        worst = worst.max(d);
        let ours = greedy(model, &s.input_ids, s.greedy_ids.len());
        for (k, (&id, &margin)) in s.greedy_ids.iter().zip(&s.greedy_top1_margins).enumerate() {
            if margin <= 1e-3 {
                break;
            }
            assert_eq!(
                ours[k], id,
                "{label} {} greedy step {k} (margin {margin})",
                s.name
            );
        }
    }
    worst
}

/// The largest difference to llama.cpp's logits (every position of every sequence).
fn diff_to_llama_cpp(model: &LanguageModel<f32>, gguf_ref: &(Reference, TensorMap)) -> f64 {
    let (r, want) = gguf_ref;
    r.sequences
        .iter()
        .map(|s| max_diff(&logits(model, &s.input_ids), &want[&s.name].1))
        .fold(0.0, f64::max)
}

/// A family's Hugging Face directory through the family table.
pub(super) fn load_hf(dir: &Path) -> LanguageModel<f32> {
    let config_path = dir.join("config.json");
    let bytes = std::fs::read(&config_path).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let family = families::by_model_type(json["model_type"].as_str().unwrap()).unwrap();
    let mut m = families::load_hf_decoder(family, dir, &bytes, &config_path).unwrap();
    m.prepare_inference();
    m
}

pub(super) fn load_gguf_file(file: &GgufFile, weights: GgufWeights) -> LanguageModel<f32> {
    let mut m = load_gguf(file, weights).unwrap();
    m.prepare_inference();
    m
}

/// Both files of `family` against both references; returns (HF max diff, GGUF max diff).
fn check_family(family: &str) -> Option<(f64, f64)> {
    let dir = families_dir()?.join(family);
    let hf_ref = reference(&dir.join("reference-hf"));
    let gguf_ref = reference(&dir.join("reference-gguf"));
    let hf = load_hf(&dir.join("hf"));
    let hf_diff = check_against_hf(&format!("{family} hf"), &hf, &hf_ref, HF_TOL);
    let file = GgufFile::open(&dir.join(format!("{family}.f16.gguf"))).unwrap();
    let gguf = load_gguf_file(&file, GgufWeights::Dequantised);
    let gguf_diff = check_against_hf(&format!("{family} gguf"), &gguf, &hf_ref, GGUF_TOL);
    // The F16 weights multiplied as stored give the same logits.
    let blocks = load_gguf_file(&file, GgufWeights::Blocks);
    let s = &hf_ref.0.sequences[2];
    let d = max_diff(&logits(&blocks, &s.input_ids), &logits(&gguf, &s.input_ids));
    assert!(d < 1e-3, "{family} gguf blocks vs dequantised: {d:e}");
    let cpp_hf = diff_to_llama_cpp(&hf, &gguf_ref);
    let cpp_gguf = diff_to_llama_cpp(&gguf, &gguf_ref);
    eprintln!(
        "{family}: max |Δ| to transformers: HF {hf_diff:.2e}, GGUF {gguf_diff:.2e}; \
         to llama.cpp: HF {cpp_hf:.3e}, GGUF {cpp_gguf:.3e}"
    );
    // The directory loads with its tokenizer, which stops at the end of text and at the
    // family's end of turn.
    let g = TextGenerator::load(&dir.join("hf")).unwrap();
    let want: &[u32] = match family {
        "llama" => &[1, 4],           // <|end_of_text|>, <|eot_id|>
        "qwen2" | "qwen3" => &[0, 2], // <|endoftext|>, <|im_end|>
        "phi3" => &[3, 5],            // <|endoftext|>, <|end|>
        _ => unreachable!("{family}"),
    };
    assert_eq!(g.tokenizer.end_tokens(), want, "{family}: end tokens");
    // The GGUF file with its own tokenizer (a refusal is printed, not failed: the GGUF
    // pre-tokenizers are another part's work).
    let path = dir.join(format!("{family}.f16.gguf"));
    if let Err(e) = TextGenerator::load(&path) {
        eprintln!(
            "{family}: TextGenerator::load({}) fails: {e}",
            path.display()
        );
    }
    Some((hf_diff, gguf_diff))
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    let Some(_) = check_family("llama") else {
        return;
    };
    // The GGUF's rope_freqs tensor became the config's factors.
    let dir = families_dir().unwrap().join("llama");
    let file = GgufFile::open(&dir.join("llama.f16.gguf")).unwrap();
    let m = load_gguf(&file, GgufWeights::Dequantised).unwrap();
    assert!(matches!(
        m.config.rope_scaling,
        Some(RopeScaling::FreqFactors { .. })
    ));
    let stored = &m.blocks.layers[0].self_attn.rope_freq_factors;
    // Ours from the HF config's llama3 parameters against the factors llama.cpp's converter
    // wrote (float32): all three bands occur, and they agree.
    let hf = load_hf(&dir.join("hf"));
    assert!(matches!(
        hf.config.rope_scaling,
        Some(RopeScaling::Llama3 { .. })
    ));
    let ours = &hf.blocks.layers[1].self_attn.rope_freq_factors;
    assert_eq!((ours.len(), stored.len()), (16, 16));
    for (i, (a, b)) in ours.iter().zip(stored).enumerate() {
        assert!((a / b - 1.0).abs() < 1e-6, "factor {i}: {a} vs {b}");
    }
    assert!(ours[0] == 1.0 && ours[15] == 8.0, "{ours:?}");
    assert!(ours.iter().any(|&f| f > 1.0 && f < 8.0), "{ours:?}");
}

#[test]
fn qwen2_qkv_biases_match_transformers() {
    check_family("qwen2");
}

#[test]
fn qwen3_qk_norms_match_transformers() {
    check_family("qwen3");
}

#[test]
fn phi3_fused_projections_match_transformers() {
    check_family("phi3");
}

/// The file with the key `key` set to `value` (replaced or added), tensors as stored.
pub(super) fn with_key(file: &GgufFile, key: &str, value: Value) -> Vec<u8> {
    use crate::gguf_common::{gguf, TensorSpec};
    let mut kvs: Vec<(&str, Value)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k != key)
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    kvs.push((key, value));
    let tensors: Vec<TensorSpec> = file
        .tensors()
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.iter().map(|&d| d as u64).collect(),
            code: match t.ggml_type {
                transformer::kernels::lowp::ggml::GgmlType::F32 => 0,
                transformer::kernels::lowp::ggml::GgmlType::F16 => 1,
                other => panic!("{other} in a fixture"),
            },
            data: file.tensor_data(t).unwrap().to_vec(),
            offset: None,
        })
        .collect();
    gguf(&kvs, &tensors, file.alignment())
}

/// Mistral: the HF directory (window 8 from `sliding_window`) matches transformers; its GGUF
/// has no window (llama.cpp's converter keeps none): it matches llama.cpp (whose reference is
/// unwindowed) up to float16, and transformers below position 8 only; the same file with a
/// `llama.attention.sliding_window` key of 8 matches transformers everywhere.
#[test]
fn mistral_sliding_window_matches_transformers() {
    let Some(dir) = families_dir() else { return };
    let dir = dir.join("mistral");
    let hf_ref = reference(&dir.join("reference-hf"));
    let gguf_ref = reference(&dir.join("reference-gguf"));
    let hf = load_hf(&dir.join("hf"));
    assert_eq!(hf.config.layer_windows, [Some(8), Some(8)]);
    let g = TextGenerator::load(&dir.join("hf")).unwrap();
    assert_eq!(g.tokenizer.end_tokens(), [2], "mistral: </s>");
    let hf_diff = check_against_hf("mistral hf", &hf, &hf_ref, HF_TOL);

    let file = GgufFile::open(&dir.join("mistral.f16.gguf")).unwrap();
    let plain = load_gguf_file(&file, GgufWeights::Dequantised);
    assert!(plain.config.layer_windows.is_empty());
    let unwindowed_to_cpp = diff_to_llama_cpp(&plain, &gguf_ref);
    assert!(unwindowed_to_cpp < 0.05, "{unwindowed_to_cpp}");
    let v = plain.config.vocab_size;
    for s in &hf_ref.0.sequences {
        let early = s.input_ids.len().min(8) * v;
        let ours = logits(&plain, &s.input_ids);
        let d = max_diff(&ours[..early], &hf_ref.1[&s.name].1[..early]);
        assert!(d < 1e-3, "mistral gguf {} before the window: {d:e}", s.name);
    }

    let keyed = with_key(&file, "llama.attention.sliding_window", Value::U32(8));
    let keyed = GgufFile::from_bytes(keyed, Path::new("mistral-window.gguf")).unwrap();
    let windowed = load_gguf_file(&keyed, GgufWeights::Dequantised);
    assert_eq!(windowed.config.layer_windows, [Some(8), Some(8)]);
    let gguf_diff = check_against_hf("mistral windowed gguf", &windowed, &hf_ref, GGUF_TOL);
    eprintln!(
        "mistral: max |Δ| to transformers: HF {hf_diff:.2e}, GGUF with window key \
         {gguf_diff:.2e}; to llama.cpp (unwindowed reference): GGUF without key \
         {unwindowed_to_cpp:.3e}, HF {:.3e}",
        diff_to_llama_cpp(&hf, &gguf_ref)
    );
}
