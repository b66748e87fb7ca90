//! The device step (`--device gpu`) on real files against the CPU path, on the GPU the tests
//! find (Mesa's lavapipe in CI; skipped without a Vulkan device unless `CI` is set):
//!
//! - every quantisation of `../shared/reference/kquants` (llama256), loaded as `generate
//!   --device gpu` loads it (blocks as stored): logits at every position of the three
//!   reference sequences within 1e-3 (relative to the largest) of the CPU's f32 path on the
//!   dequantised weights, and the same arg-max wherever the CPU's top-two margin exceeds 1e-2;
//! - every family of `../shared/reference/families` (Llama, Phi-3, Qwen2, Qwen3, Mistral,
//!   Gemma 2, Gemma 3: sliding windows, soft caps, query/key norms, post-norms), from the
//!   Hugging Face directory and the GGUF file, the same way;
//! - SmolLM2-135M Q4_1: the CPU's greedy ids (lavapipe takes seconds a token: a few tokens).

use crate::families::{families_dir, load_gguf_file, load_hf};
use std::path::Path;
use transformer::backend::{Device, GpuDevice};
use transformer::model::device_lm::{DeviceLm, StepOut, Want};
use transformer::model::families::GgufWeights;
use transformer::model::LanguageModel;
use transformer::store::gguf::GgufFile;

/// A GPU, or `None` (skipped, or a failure under CI: `transformer_gpu::testing`'s rule).
fn gpu() -> Option<GpuDevice> {
    transformer_gpu::testing::gpu()?;
    Some(GpuDevice::open(None).unwrap())
}

/// The logits `[len, vocab]` of every position of `ids` in one step.
fn device_logits<D: Device>(lm: &DeviceLm<D>, ids: &[u32]) -> Vec<f32> {
    let mut state = lm.start(1, ids.len()).unwrap();
    let all: Vec<usize> = (0..ids.len()).collect();
    match lm
        .step(&mut state, ids, &vec![0; ids.len()], &all, Want::Logits)
        .unwrap()
    {
        StepOut::Logits(l) => l,
        StepOut::Ids(_) => unreachable!("logits asked"),
    }
}

/// Asserts `got` within `rel` of the largest |logit| of `want`, and the same arg-max at every
/// position whose top-two margin in `want` exceeds 1e-2; returns the largest |Δ|.
fn check(got: &[f32], want: &[f32], vocab: usize, rel: f64, what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1f64, |m, v| m.max(f64::from(v.abs())));
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from(a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        diff <= rel * scale,
        "{what}: max |Δ| {diff} > {rel} × {scale}"
    );
    for (p, (g, w)) in got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .enumerate()
    {
        let best = |row: &[f32]| (0..row.len()).fold(0, |b, j| if row[j] > row[b] { j } else { b });
        let top = best(w);
        let second = (0..vocab)
            .filter(|&j| j != top)
            .map(|j| w[j])
            .fold(f32::MIN, f32::max);
        if w[top] - second > 1e-2 {
            assert_eq!(best(g), top, "{what}: position {p}'s arg-max");
        }
    }
    diff
}

#[derive(serde::Deserialize)]
struct Sequence {
    input_ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Sequences {
    sequences: Vec<Sequence>,
}

fn sequences(reference: &Path) -> Vec<Vec<u32>> {
    let json = std::fs::read(reference.join("reference.json")).unwrap();
    let r: Sequences = serde_json::from_slice(&json).unwrap();
    r.sequences.into_iter().map(|s| s.input_ids).collect()
}

/// The GPU step of `on_gpu` against the CPU's f32 forward of `cpu` on `seqs`.
fn compare(
    on_gpu: &LanguageModel<f32>,
    cpu: &LanguageModel<f32>,
    seqs: &[Vec<u32>],
    what: &str,
) -> f64 {
    let lm = DeviceLm::new(gpu().unwrap(), on_gpu).unwrap();
    let vocab = cpu.config.vocab_size;
    seqs.iter()
        .map(|ids| {
            let want = cpu.forward(ids, 1, None).0;
            check(&device_logits(&lm, ids), &want, vocab, 1e-3, what)
        })
        .fold(0.0, f64::max)
}

#[test]
fn every_quantisation_on_the_gpu_is_the_cpu_f32_path() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/kquants");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    }
    if gpu().is_none() {
        return;
    }
    let seqs = sequences(&dir.join("reference-hf"));
    for ty in [
        "f16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q5_1", "Q5_0", "Q4_1", "Q4_0",
    ] {
        let open = || GgufFile::open(&dir.join(format!("llama256.{ty}.gguf"))).unwrap();
        let blocks = load_gguf_file(&open(), GgufWeights::Blocks);
        let dequantised = load_gguf_file(&open(), GgufWeights::Dequantised);
        let diff = compare(&blocks, &dequantised, &seqs, ty);
        eprintln!("{ty:<7} GPU vs CPU f32: max |Δ| {diff:.2e}");
    }
}

#[test]
fn every_family_on_the_gpu_is_the_cpu_f32_path() {
    let Some(dir) = families_dir() else { return };
    if gpu().is_none() {
        return;
    }
    for family in [
        "llama", "phi3", "qwen2", "qwen3", "mistral", "gemma2", "gemma3",
    ] {
        let hf = load_hf(&dir.join(family).join("hf"));
        let seqs = sequences(&dir.join(family).join("reference-hf"));
        let diff = compare(&hf, &hf, &seqs, family);
        let gguf = dir.join(family).join(format!("{family}.f16.gguf"));
        let m = load_gguf_file(&GgufFile::open(&gguf).unwrap(), GgufWeights::Blocks);
        let f32 = load_gguf_file(&GgufFile::open(&gguf).unwrap(), GgufWeights::Dequantised);
        let diff_gguf = compare(&m, &f32, &seqs, &format!("{family} gguf"));
        eprintln!("{family}: GPU vs CPU max |Δ| {diff:.2e} (HF), {diff_gguf:.2e} (GGUF)");
    }
}

#[test]
fn smollm2_greedy_ids_on_the_gpu_are_the_cpus() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        eprintln!("skipped: {} is absent", path.display());
        return;
    }
    let Some(device) = gpu() else { return };
    let blocks = load_gguf_file(&GgufFile::open(&path).unwrap(), GgufWeights::Blocks);
    let cpu = load_gguf_file(&GgufFile::open(&path).unwrap(), GgufWeights::Dequantised);
    // "The capital of France is"
    let prompt = [504u32, 3575, 282, 4649, 314];
    let want = crate::families::greedy(&cpu, &prompt, 2);
    let lm = DeviceLm::new(device, &blocks).unwrap();
    let mut state = lm.start(1, 8).unwrap();
    let mut feed = prompt.to_vec();
    let mut got = Vec::new();
    while got.len() < want.len() {
        let rows = vec![0; feed.len()];
        let StepOut::Ids(ids) = lm
            .step(&mut state, &feed, &rows, &[feed.len() - 1], Want::Argmax)
            .unwrap()
        else {
            unreachable!("ids asked")
        };
        got.push(ids[0]);
        feed = ids;
    }
    assert_eq!(got, want);
}

/// `perplexity --device`: windows with a stride, several a step, each a row of one state, on
/// the host device and the GPU, against the CPU's scoring of the same text.
#[test]
fn perplexity_on_a_device_is_the_cpus() {
    use transformer::backend::Host;
    use transformer::pipeline::device::score_document_on_device;
    use transformer::pipeline::generate::TextGenerator;
    let Some(dir) = families_dir() else { return };
    let mut g = TextGenerator::load(&dir.join("llama").join("hf")).unwrap();
    g.model.prepare_inference();
    let text = "The quick brown fox jumps over the lazy dog. It was the best of times, it was \
                the worst of times, it was the age of wisdom, it was the age of foolishness.";
    let windows = (16, 6, 3);
    let cpu = g.perplexity_in_windows(text, windows, false).unwrap();
    let host = DeviceLm::new(Host, &g.model).unwrap();
    let mut devices = vec![(
        "host",
        score_document_on_device(&host, &g.tokenizer, text, windows).unwrap(),
    )];
    if let Some(gpu) = gpu() {
        let lm = DeviceLm::new(gpu, &g.model).unwrap();
        devices.push((
            "gpu",
            score_document_on_device(&lm, &g.tokenizer, text, windows).unwrap(),
        ));
    }
    assert!(cpu.tokens > 16, "{} tokens: several windows", cpu.tokens);
    for (name, s) in devices {
        assert_eq!((s.tokens, s.chars), (cpu.tokens, cpu.chars), "{name}");
        let rel = (s.nats_per_token - cpu.nats_per_token).abs() / cpu.nats_per_token;
        assert!(
            rel < 1e-5,
            "{name}: {} vs {} nats/token",
            s.nats_per_token,
            cpu.nats_per_token
        );
    }
}

/// `embed --device gpu`: all-MiniLM-L6-v2's sentence embeddings on the GPU (every sentence of
/// a batch in one step, unpadded) are the CPU's.
#[test]
fn minilm_embeddings_on_the_gpu_are_the_cpus() {
    use transformer::model::device_encoder::DeviceBert;
    use transformer::pipeline::embed::SentenceEncoder;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models/all-MiniLM-L6-v2");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    }
    let Some(device) = gpu() else { return };
    let encoder = SentenceEncoder::load(&dir, None).unwrap();
    let sentences: Vec<String> = [
        "A man is eating food.",
        "The new movie is awesome, and the acting is superb in every single scene of it.",
        "Hi",
        "Attention is all you need.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let want = encoder.embed(&sentences, 3).unwrap();
    let bert = DeviceBert::new(device, &encoder.model).unwrap();
    let got = encoder.embed_on_device(&bert, &sentences, 3).unwrap();
    for (s, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), 384);
        let diff = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "sentence {s}: max |Δ| {diff}");
    }
}
