//! SmolLM2-135M-Instruct computed from its Q4_1 GGUF blocks directly (Q4_1 × Q8 products, as
//! llama.cpp does) and in bf16 / int8, against the float32 path of the same file (whose
//! fidelity to transformers `tests/pretrained.rs` checks).
//!
//! The bounds are measured (see [`BOUNDS`]), with room: the block path rounds every activation
//! entering a linear layer to 8 bits per 32-block (an error up to 1/254 of the block's largest
//! value per element) in each of 30 layers, which moves logits by tenths where the float32
//! path agrees with transformers to 1e-4; the decode steps' top-1 token, fed the float32
//! greedy run's tokens, must agree wherever float32's margin exceeds 1 logit.

use std::path::{Path, PathBuf};
use transformer::kernels::lowp::PackedWeight;
use transformer::model::StepLayout;
use transformer::pipeline::generate::{ModelPrecision, TextGenerator};

fn smollm2() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: {} is absent", path.display());
        None
    }
}

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer",
];

/// Logits `[len, vocab]` of every prompt position.
fn logits(g: &TextGenerator, text: &str) -> Vec<f32> {
    let ids = g.tokenizer.encode(text).unwrap();
    g.model.forward(&ids, 1, None).0
}

/// Feeds `text`, then `forced` one token at a time through the KV cache (the decode path), or,
/// with `forced` empty, `n` greedy tokens; returns the top-1 token and its margin over the
/// second at each step.
fn decode_top1(g: &TextGenerator, text: &str, forced: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let v = g.model.config.vocab_size;
    let ids = g.tokenizer.encode(text).unwrap();
    let mut state = g.model.start(1, ids.len() + n);
    let mut last = g.model.step(&mut state, &ids, &StepLayout::dense());
    let (mut out, mut margins) = (Vec::new(), Vec::new());
    for step in 0..n {
        let row = &last[last.len() - v..];
        let best = (0..v).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        let second = (0..v)
            .filter(|&i| i != best)
            .fold(f32::NEG_INFINITY, |m, i| m.max(row[i]));
        out.push(best as u32);
        margins.push(row[best] - second);
        let next = forced.get(step).copied().unwrap_or(best as u32);
        last = g.model.step(&mut state, &[next], &StepLayout::dense());
    }
    (out, margins)
}

struct Stats {
    max_abs: f64,
    mean_abs: f64,
    max_kl: f64,
}

/// Differences of `ours` from `base` (`[rows, vocab]`): the largest and mean |logit
/// difference|, the largest KL(base ‖ ours) of a row's softmax, in f64.
fn compare(base: &[f32], ours: &[f32], vocab: usize) -> Stats {
    let mut s = Stats {
        max_abs: 0.0,
        mean_abs: 0.0,
        max_kl: 0.0,
    };
    for (b, o) in base.chunks_exact(vocab).zip(ours.chunks_exact(vocab)) {
        let log_softmax = |x: &[f32]| {
            let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let z: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
            x.iter().map(|&v| v as f64 - m - z.ln()).collect::<Vec<_>>()
        };
        let (lb, lo) = (log_softmax(b), log_softmax(o));
        let kl: f64 = lb.iter().zip(&lo).map(|(p, q)| p.exp() * (p - q)).sum();
        s.max_kl = s.max_kl.max(kl);
        for (x, y) in b.iter().zip(o) {
            let d = (*x as f64 - *y as f64).abs();
            s.max_abs = s.max_abs.max(d);
            s.mean_abs += d;
        }
    }
    s.mean_abs /= base.len() as f64;
    s
}

/// (precision, largest |logit difference|, mean, largest KL, f32 margin above which the top-1
/// token must agree, least fraction of decode steps whose top-1 agrees). Measured on this file
/// (PROMPTS, 32 decode steps each; x86-64 with AVX-512 VNNI/BF16 and the portable kernels give
/// the same to float32 rounding):
///
/// | precision | max abs | mean abs | max KL | top-1 agrees |
/// |---|---|---|---|---|
/// | ggml blocks (Q4_1 × Q8) | 4.27 | 0.433 | 0.031 | 122/128 |
/// | int8 (per row) | 9.17 | 1.65 | 0.76 | 109/128 |
/// | bf16 | 0.441 | 0.097 | 0.0022 | 126/128 |
///
/// Bounds are these with about 1.5x room. int8 with one scale per activation row is far off:
/// a few hidden channels of this model carry values hundreds of times the rest, so one scale
/// per row leaves most channels 2–3 bits (the outlier problem of LLM.int8); the 32-element
/// blocks of ggml confine an outlier's damage to its block.
const BOUNDS: &[(ModelPrecision, f64, f64, f64, f32, f64)] = &[
    (ModelPrecision::Ggml, 6.5, 0.65, 0.05, 1.0, 0.9),
    (ModelPrecision::Int8, 14.0, 2.5, 1.2, 1.0, 0.8),
    (ModelPrecision::Bf16, 0.7, 0.15, 0.004, 1.0, 0.95),
];

#[test]
fn smollm2_low_precision_stays_close_to_float32() {
    let Some(path) = smollm2() else { return };
    let base = TextGenerator::load_prepared(&path, ModelPrecision::F32).unwrap();
    assert!(base.model.head.packed().is_none());
    let v = base.model.config.vocab_size;
    let reference: Vec<_> = PROMPTS
        .iter()
        .map(|p| (logits(&base, p), decode_top1(&base, p, &[], 32)))
        .collect();
    for &(precision, max_abs, mean_abs, max_kl, margin, min_agree) in BOUNDS {
        let g = TextGenerator::load_prepared(&path, precision).unwrap();
        // Every linear layer and the output projection multiply packed weights.
        let packed = |p: Option<&PackedWeight>| {
            matches!(
                (precision, p),
                (ModelPrecision::Ggml, Some(PackedWeight::Blocks(_)))
                    | (ModelPrecision::Int8, Some(PackedWeight::Int8(_)))
                    | (ModelPrecision::Bf16, Some(PackedWeight::Bf16(_)))
            )
        };
        assert!(packed(g.model.head.packed()), "{precision:?}: output head");
        // ggml: the Q8_0 token table is looked up in its blocks, without a float32 table.
        assert_eq!(
            g.model.embedding.has_stored_rows(),
            precision == ModelPrecision::Ggml
        );
        assert_eq!(
            g.model.embedding.weight.value.data.is_empty(),
            precision == ModelPrecision::Ggml
        );
        for block in &g.model.blocks.layers {
            assert!(
                packed(block.self_attn.q_proj.packed()),
                "{precision:?}: q_proj"
            );
            // The blocks are the weights: no float32 copy is kept beside them.
            let f32_values = block.ffn.dense().unwrap().linear1.weight.value.data.len();
            match precision {
                ModelPrecision::Ggml => assert_eq!(f32_values, 0, "ggml: ffn_up in f32"),
                _ => assert_eq!(f32_values, 576 * 1536),
            }
            assert!(
                packed(block.ffn.dense().unwrap().linear2.packed()),
                "{precision:?}: ffn_down"
            );
        }
        let (mut worst_abs, mut worst_mean, mut worst_kl) = (0f64, 0f64, 0f64);
        let (mut compared, mut agree, mut steps) = (0, 0, 0);
        for (p, (base_logits, (base_tokens, base_margins))) in PROMPTS.iter().zip(&reference) {
            let s = compare(base_logits, &logits(&g, p), v);
            worst_abs = worst_abs.max(s.max_abs);
            worst_mean = worst_mean.max(s.mean_abs);
            worst_kl = worst_kl.max(s.max_kl);
            // The same context as the f32 greedy run (its tokens fed back): the top-1 token
            // must agree wherever f32's margin is large.
            let (tokens, _) = decode_top1(&g, p, base_tokens, base_tokens.len());
            for (i, (&want, &m)) in base_tokens.iter().zip(base_margins).enumerate() {
                if m > margin {
                    assert_eq!(
                        tokens[i], want,
                        "{precision:?} {p:?}: step {i} (margin {m})"
                    );
                    compared += 1;
                }
                agree += usize::from(tokens[i] == want);
                steps += 1;
            }
        }
        eprintln!(
            "SmolLM2 {precision:?} vs f32: max |dlogit| {worst_abs:.3e}, mean {worst_mean:.3e}, \
             max KL {worst_kl:.3e}, top-1 agrees at {agree}/{steps} decode steps, \
             {compared} with f32 margin > {margin}"
        );
        assert!(
            worst_abs <= max_abs,
            "{precision:?}: max |dlogit| {worst_abs}"
        );
        assert!(
            worst_mean <= mean_abs,
            "{precision:?}: mean |dlogit| {worst_mean}"
        );
        assert!(worst_kl <= max_kl, "{precision:?}: KL {worst_kl}");
        assert!(
            compared >= 40,
            "{precision:?}: only {compared} steps compared"
        );
        assert!(
            agree as f64 >= min_agree * steps as f64,
            "{precision:?}: top-1 agrees at {agree}/{steps} steps"
        );
    }
}
