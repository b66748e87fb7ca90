//! Real pretrained decoders against what transformers computes (the references in
//! `../shared/reference`): SmolLM2-135M-Instruct from its Q4_1 GGUF, and small random Hugging
//! Face Llama and GPT-2 checkpoints. Token ids identical, logits within the references'
//! tolerances, greedy tokens identical wherever the reference's top-1 margin exceeds 0.01 (below
//! that, float32 rounding may legitimately pick the other token, and the continuations part).

use std::path::{Path, PathBuf};
use transformer::decode::sample::SamplingOptions;
use transformer::pipeline::generate::{generate_ids, TextGenerator};
use transformer::rng::Rng;
use transformer::store::read_tensors;

fn shared() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if dir.join("reference").is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: ../shared/reference is absent (it holds the pretrained references)");
        None
    }
}

#[derive(serde::Deserialize)]
struct Prompt {
    text: String,
    input_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_step_margins: Vec<f64>,
}

#[derive(serde::Deserialize)]
struct Reference {
    prompts: Vec<Prompt>,
}

fn reference(path: &Path) -> Reference {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The largest |ours − theirs| over the rows of `ours [rows, vocab]` (the last `rows` of the
/// prompt) against `theirs`.
fn max_diff(ours: &[f32], theirs: &[f32]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max)
}

/// Greedy continuation of `ids` (temperature 0), at most `n` tokens, ending after any of
/// `until`.
fn greedy(g: &TextGenerator, ids: &[u32], n: usize, until: &[u32]) -> Vec<u32> {
    let opts = SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    };
    generate_ids(&g.model, ids, n, opts, &mut Rng::new(1), until, |_| {
        Ok::<(), ()>(())
    })
    .unwrap()
}

/// Our greedy tokens against the reference's, step by step until the first step whose
/// reference margin is 0.01 or less; returns how many steps were compared.
fn check_greedy(label: &str, ours: &[u32], p: &Prompt) -> usize {
    for (i, (&want, &margin)) in p.greedy_ids.iter().zip(&p.greedy_step_margins).enumerate() {
        if margin <= 0.01 {
            return i;
        }
        assert_eq!(
            ours.get(i),
            Some(&want),
            "{label}: greedy step {i} (margin {margin})"
        );
    }
    p.greedy_ids.len()
}

/// One Hugging Face directory: ids, all-position logits within `tol`, greedy tokens.
fn check_hf(name: &str, tol: f64) {
    let Some(shared) = shared() else { return };
    let dir = shared.join("reference/hf-decoders").join(name);
    let mut g = TextGenerator::load(&dir).unwrap();
    g.model.prepare_inference();
    let r = reference(&dir.join("reference.json"));
    let logits = read_tensors(&dir.join("logits.safetensors")).unwrap();
    let mut worst = 0.0f64;
    let mut compared = 0;
    for (i, p) in r.prompts.iter().enumerate() {
        let ids = g.tokenizer.document(&p.text).unwrap();
        assert_eq!(ids, p.input_ids, "{name} prompt {i}: token ids");
        let (ours, _) = g.model.forward(&ids, 1, None);
        let (_, want) = &logits[&format!("logits.{i}")];
        let d = max_diff(&ours, want);
        assert!(d < tol, "{name} prompt {i}: logits differ by {d:e}");
        worst = worst.max(d);
        let new = greedy(&g, &ids, p.greedy_ids.len(), &[]);
        compared += check_greedy(&format!("{name} prompt {i}"), &new, p);
    }
    eprintln!("{name}: largest logit difference {worst:.2e}, {compared} greedy steps compared");
    assert!(
        compared >= 8,
        "{name}: too few greedy steps above the margin"
    );
    // Perplexity of a prompt equals the mean NLL of transformers' logits.
    let p = &r.prompts[3];
    let (_, want) = &logits["logits.3"];
    let v = g.model.config.vocab_size;
    let mut nll = 0.0;
    for (t, row) in want.chunks_exact(v).enumerate().take(p.input_ids.len() - 1) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[p.input_ids[t + 1] as usize] as f64;
    }
    let want_ppl = (nll / (p.input_ids.len() - 1) as f64).exp();
    let got = g.perplexity(&p.text, 64, 4).unwrap();
    assert_eq!(got.tokens, p.input_ids.len() - 1);
    let rel = (got.perplexity / want_ppl - 1.0).abs();
    assert!(
        rel < 1e-4,
        "{name}: perplexity {} vs {want_ppl}",
        got.perplexity
    );
}

#[test]
fn hugging_face_llama_matches_transformers() {
    check_hf("llama-tiny", 1e-4);
}

#[test]
fn hugging_face_gpt2_matches_transformers() {
    check_hf("gpt2-tiny", 1e-4);
}

#[test]
fn smollm2_gguf_matches_transformers() {
    let Some(shared) = shared() else { return };
    let gguf = shared.join("models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let refs = shared.join("reference/smollm2");
    let mut g = TextGenerator::load(&gguf).unwrap();
    g.model.prepare_inference();
    let r = reference(&refs.join("reference.json"));
    let logits = read_tensors(&refs.join("logits.safetensors")).unwrap();
    let v = g.model.config.vocab_size;
    let until = g.tokenizer.end_tokens();
    let (mut worst, mut compared) = (0.0f64, 0);
    for (i, p) in r.prompts.iter().enumerate() {
        let ids = g.tokenizer.encode(&p.text).unwrap();
        assert_eq!(ids, p.input_ids, "prompt {i}: token ids");
        let (ours, _) = g.model.forward(&ids, 1, None);
        let (_, want) = &logits[&format!("last_logits.{i}")];
        let d = max_diff(&ours[ours.len() - v..], want);
        assert!(d < 1e-3, "prompt {i}: last logits differ by {d:e}");
        worst = worst.max(d);
        if i == 0 {
            let (_, all) = &logits["all_logits.0"];
            let d = max_diff(&ours, all);
            assert!(
                d < 1e-3,
                "prompt 0: logits at every position differ by {d:e}"
            );
            worst = worst.max(d);
        }
        let new = greedy(&g, &ids, p.greedy_ids.len(), &until);
        compared += check_greedy(&format!("SmolLM2 prompt {i}"), &new, p);
    }
    eprintln!("SmolLM2: largest logit difference {worst:.2e}, {compared} greedy steps compared");
    assert!(compared >= 20);
    // The chat template renders the reference's chat prompt exactly.
    let chat = g.chat.as_ref().expect("SmolLM2 carries a chat template");
    let messages = [transformer::pipeline::chat::ChatMessage::new(
        "user",
        "What is the capital of France?",
    )];
    assert_eq!(chat.prompt(&messages).unwrap(), r.prompts[0].text);
}
