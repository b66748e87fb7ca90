//! Speculative decoding on real checkpoints (`../shared`): the verification forward's rows
//! are bit-identical to one-token steps (the condition for exact greedy output), and greedy
//! generation with prompt lookup and with a draft model gives plain greedy's ids exactly, on
//! SmolLM2-135M (f32, bf16, int8, its Q4_1 blocks) and the tiny family checkpoints (sliding
//! windows, soft-capping, Q/K norms, K-quants), with drafts accepted.

use std::path::{Path, PathBuf};
use transformer::decode::drafters::PromptLookup;
use transformer::decode::sample::SamplingOptions;
use transformer::decode::speculative::{SpeculativeOptions, SpeculativeStats};
use transformer::kernels::row_exact::row_exact;
use transformer::model::StepLayout;
use transformer::pipeline::generate::{generate_ids, ModelPrecision, TextGenerator};
use transformer::pipeline::speculative::{
    check_same_tokenizer, generate_ids_speculative, Drafting, Speculation,
};
use transformer::rng::Rng;

fn shared(rel: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipped: {} is absent", path.display());
        None
    }
}

const SMOLLM2: &str = "models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Checkpoints of several layouts: (path under ../shared, precision).
fn tiny_checkpoints() -> Vec<(&'static str, ModelPrecision)> {
    vec![
        ("reference/hf-decoders/llama-tiny", ModelPrecision::F32),
        ("reference/hf-decoders/gpt2-tiny", ModelPrecision::F32),
        ("reference/families/mistral/hf", ModelPrecision::F32),
        (
            "reference/families/gemma2/gemma2.f16.gguf",
            ModelPrecision::F32,
        ),
        (
            "reference/families/qwen3/qwen3.f16.gguf",
            ModelPrecision::Bf16,
        ),
        (
            "reference/kquants/llama256.Q4_K_M.gguf",
            ModelPrecision::Ggml,
        ),
        ("reference/kquants/llama256.Q8_0.gguf", ModelPrecision::Ggml),
        ("reference/kquants/llama256.Q4_0.gguf", ModelPrecision::Int8),
    ]
}

/// Feeds `prompt`, then `next` (12 tokens: past the row counts where f32 products, the ggml
/// blocks and attention change kernels) one token at a time and, from the same state, in one
/// row-exact forward: every row bit for bit equal.
fn assert_rows_bit_identical(g: &TextGenerator, prompt: &[u32], next: &[u32], name: &str) {
    let v = g.model.config.vocab_size;
    let mut state = g.model.start(1, prompt.len() + next.len());
    g.model.step(&mut state, prompt, &StepLayout::last());
    let mut batched_state = state.clone();
    let one_by_one: Vec<f32> = next
        .iter()
        .flat_map(|&t| g.model.step(&mut state, &[t], &StepLayout::last()))
        .collect();
    let batched = row_exact(|| g.model.step(&mut batched_state, next, &StepLayout::dense()));
    assert_eq!(batched.len(), next.len() * v);
    for (i, (a, b)) in one_by_one.chunks(v).zip(batched.chunks(v)).enumerate() {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(same, "{name}: row {i} differs (max |Δ| {diff})");
    }
}

#[test]
fn verification_rows_equal_one_token_steps_bit_for_bit() {
    let mut cases: Vec<(String, ModelPrecision)> = tiny_checkpoints()
        .into_iter()
        .map(|(p, m)| (p.to_string(), m))
        .collect();
    for m in [
        ModelPrecision::F32,
        ModelPrecision::Bf16,
        ModelPrecision::Int8,
        ModelPrecision::Ggml,
    ] {
        cases.push((SMOLLM2.to_string(), m));
    }
    for (rel, precision) in cases {
        let Some(path) = shared(&rel) else { continue };
        let g = TextGenerator::load_prepared(&path, precision).unwrap();
        let prompt = g
            .tokenizer
            .document("The quick brown fox jumps over")
            .unwrap();
        let next: Vec<u32> = (0..12u32)
            .map(|i| (i * 37 + 5) % g.model.config.vocab_size as u32)
            .collect();
        assert_rows_bit_identical(&g, &prompt, &next, &format!("{rel} {precision:?}"));
    }
}

const PROMPTS: &[&str] = &[
    // Repetitive: prompt lookup's drafts get accepted.
    "one two three four five, one two three four five, one two three four five, one two",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef",
    "The capital of France is",
    "Rewrite with `total` renamed to `sum`:\nfor x in items:\n    total += x\nprint(total)\n\n\
     Answer:\nfor x in items:\n",
];

fn greedy() -> SamplingOptions {
    SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Plain greedy and speculative greedy of `g` on every prompt, `n` tokens; returns the summed
/// counts.
fn assert_same_as_plain(
    g: &TextGenerator,
    drafting: Drafting<'_>,
    n: usize,
    name: &str,
) -> SpeculativeStats {
    let until = g.tokenizer.end_tokens();
    let mut total = SpeculativeStats::default();
    for text in PROMPTS {
        let prompt = g.tokenizer.document(text).unwrap();
        let want = generate_ids(
            &g.model,
            &prompt,
            n,
            greedy(),
            &mut Rng::new(1),
            &until,
            |_| Ok::<(), ()>(()),
        )
        .unwrap();
        for options in [
            SpeculativeOptions::default(),
            SpeculativeOptions {
                draft_max: 16,
                draft_min: 2,
                adaptive: false,
            },
        ] {
            let speculation = Speculation { drafting, options };
            let mut stats = SpeculativeStats::default();
            let got = generate_ids_speculative(
                &g.model,
                &prompt,
                n,
                greedy(),
                &mut Rng::new(1),
                &until,
                &speculation,
                &mut stats,
                |_| Ok::<(), ()>(()),
            )
            .unwrap();
            assert_eq!(got, want, "{name} {options:?} on {text:?}");
            total.add(&stats);
        }
    }
    total
}

#[test]
fn greedy_speculative_output_is_plain_greedy_output_on_smollm2() {
    let Some(path) = shared(SMOLLM2) else { return };
    let target = TextGenerator::load_prepared(&path, ModelPrecision::F32).unwrap();
    let draft = TextGenerator::load_prepared(&path, ModelPrecision::Ggml).unwrap();
    let lookup = assert_same_as_plain(
        &target,
        Drafting::Lookup(PromptLookup { ngram_max: 3 }),
        24,
        "SmolLM2 lookup",
    );
    assert!(lookup.accepted > 20, "{lookup:?}");
    let drafted = assert_same_as_plain(&target, Drafting::Model(&draft.model), 24, "SmolLM2 draft");
    assert!(drafted.accepted > drafted.drafted / 2, "{drafted:?}");
    // A Q4_1 target with a float32 draft of itself.
    let stats = assert_same_as_plain(&draft, Drafting::Model(&target.model), 12, "SmolLM2 ggml");
    assert!(stats.accepted > 0, "{stats:?}");
}

#[test]
fn greedy_speculative_output_is_plain_greedy_output_on_family_checkpoints() {
    for (rel, precision) in tiny_checkpoints() {
        let Some(path) = shared(rel) else { continue };
        let g = TextGenerator::load_prepared(&path, precision).unwrap();
        let draft = TextGenerator::load_prepared(&path, ModelPrecision::Bf16).unwrap();
        let lookup = assert_same_as_plain(
            &g,
            Drafting::Lookup(PromptLookup { ngram_max: 3 }),
            32,
            &format!("{rel} lookup"),
        );
        assert!(lookup.drafted > 0, "{rel}: {lookup:?}");
        let model = assert_same_as_plain(&g, Drafting::Model(&draft.model), 32, rel);
        assert!(model.accepted > 0, "{rel}: {model:?}");
    }
}

/// A draft model with another tokenizer is refused by name, with the first difference.
#[test]
fn a_draft_with_another_tokenizer_is_refused() {
    let (Some(smol), Some(tiny)) = (shared(SMOLLM2), shared("reference/hf-decoders/llama-tiny"))
    else {
        return;
    };
    let target = TextGenerator::load_prepared(&smol, ModelPrecision::Ggml).unwrap();
    let other = TextGenerator::load_prepared(&tiny, ModelPrecision::F32).unwrap();
    let err = check_same_tokenizer(&target.tokenizer, &other.tokenizer, "llama-tiny")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--draft llama-tiny: its tokenizer differs") && err.contains("against 49152"),
        "{err}"
    );
    check_same_tokenizer(&target.tokenizer, &target.tokenizer, "itself").unwrap();
}
