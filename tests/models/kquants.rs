//! The llama256 model of `../shared/reference/kquants` in every quantisation llama-quantize
//! writes (`Q8_0`, `Q6_K`, `Q5_K_M`, `Q4_K_M`, `Q3_K_M`, `Q2_K`, `Q5_1`, `Q5_0`, `Q4_1`,
//! `Q4_0`; the `_M` files mix K-quant types tensor by tensor), at every position of the three
//! reference sequences:
//!
//! - `--precision f32` (every tensor dequantised): within 1e-3 of transformers run on gguf-py's
//!   dequantisation of the same file (`reference-<T>/dequant_f32_logits.safetensors`; for f16,
//!   `reference-hf`, whose weights the f16 file holds exactly). This is the check of the
//!   dequantisers on a whole model. (transformers on the *unquantised* weights,
//!   `reference-hf`, is 0.4 to 19 away from any quantised file: the weights' own rounding.)
//! - `--precision ggml` (blocks multiplied as stored, activations quantised to 8 bits as
//!   llama.cpp does): the largest |Δ| and the largest KL divergence of a position's softmax to
//!   llama.cpp's logits (`reference-<T>/logits.safetensors`) are printed per type, and our
//!   distance to transformers on the unquantised weights (`reference-hf`) must be no larger
//!   than llama.cpp's own, up to a slack (see [`SLACK`]).

use std::path::{Path, PathBuf};
use transformer::model::families::{load_gguf, GgufWeights};
use transformer::model::LanguageModel;
use transformer::store::gguf::GgufFile;
use transformer::store::read_tensors;

/// The files and their reference directories.
const TYPES: &[&str] = &[
    "f16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q5_1", "Q5_0", "Q4_1", "Q4_0",
];

/// How much farther from transformers (on the unquantised weights) our block products may be
/// than llama.cpp's: both are the weights' rounding (0.4 to 19, the same for both) plus the
/// activations' 8-bit rounding, which differs in detail (llama.cpp's AVX2 kernels, repacked
/// Q4_K/Q4_0 weights and f16 KV cache against our f32 one); the latter moves logits by up to
/// 0.7 against the dequantised model (`families/MAKE.md`), so a 10 % slack on a distance of
/// that size, plus 0.05, covers it without excusing a wrong layout (which moves logits by
/// whole units).
const SLACK: (f64, f64) = (1.10, 0.05);

fn kquants_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/kquants");
    if dir.join("reference-hf").is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

#[derive(serde::Deserialize)]
struct Sequence {
    name: String,
    input_ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Reference {
    vocab_size: usize,
    sequences: Vec<Sequence>,
}

/// The reference's sequences and their logits `[len, vocab]` from `file` in `dir`.
fn sequences(dir: &Path, file: &str) -> (Reference, Vec<Vec<f32>>) {
    let json = std::fs::read(dir.join("reference.json")).unwrap();
    let r: Reference = serde_json::from_slice(&json).unwrap();
    let tensors = read_tensors(&dir.join(file)).unwrap();
    let logits = r
        .sequences
        .iter()
        .map(|s| {
            let t = &tensors[&s.name];
            assert_eq!(t.1.len(), s.input_ids.len() * r.vocab_size, "{}", s.name);
            t.1.clone()
        })
        .collect();
    (r, logits)
}

/// Our logits `[len, vocab]` of each sequence.
fn our_logits(model: &LanguageModel<f32>, r: &Reference) -> Vec<Vec<f32>> {
    r.sequences
        .iter()
        .map(|s| model.forward(&s.input_ids, 1, None).0)
        .collect()
}

/// The largest |a − b| over all sequences and positions.
fn max_abs(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter()
                .zip(y)
                .map(|(p, q)| (f64::from(*p) - f64::from(*q)).abs())
        })
        .fold(0.0, f64::max)
}

/// The largest KL(softmax(base) ‖ softmax(ours)) over the positions, in f64.
fn max_kl(base: &[Vec<f32>], ours: &[Vec<f32>], vocab: usize) -> f64 {
    let log_softmax = |row: &[f32]| -> Vec<f64> {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        row.iter().map(|&v| f64::from(v) - max - sum.ln()).collect()
    };
    let mut worst = 0f64;
    for (b, o) in base.iter().zip(ours) {
        for (rb, ro) in b.chunks_exact(vocab).zip(o.chunks_exact(vocab)) {
            let (lb, lo) = (log_softmax(rb), log_softmax(ro));
            let kl: f64 = lb.iter().zip(&lo).map(|(p, q)| p.exp() * (p - q)).sum();
            worst = worst.max(kl);
        }
    }
    worst
}

#[test]
fn every_quantisation_matches_its_references() {
    let Some(dir) = kquants_dir() else { return };
    let (hf_ref, hf) = sequences(&dir.join("reference-hf"), "logits.safetensors");
    let vocab = hf_ref.vocab_size;
    let mut failures = Vec::new();
    eprintln!(
        "{:<8} {:>12} | {:>12} {:>10} | {:>12} {:>12}",
        "type", "f32 vs deq", "ggml vs cpp", "KL", "ggml vs hf", "cpp vs hf"
    );
    for ty in TYPES {
        let refs = dir.join(format!("reference-{ty}"));
        let path = dir.join(format!("llama256.{ty}.gguf"));
        let (cpp_ref, cpp) = sequences(&refs, "logits.safetensors");
        for (a, b) in cpp_ref.sequences.iter().zip(&hf_ref.sequences) {
            assert_eq!(
                a.input_ids, b.input_ids,
                "{ty}: the references' sequences differ"
            );
        }
        let dequantised = match *ty {
            "f16" => hf.clone(),
            _ => sequences(&refs, "dequant_f32_logits.safetensors").1,
        };

        // The model alone (the ids are the references'): as `--precision f32` and `ggml` load it.
        let file = GgufFile::open(&path).unwrap();
        let f32_model = match load_gguf(&file, GgufWeights::Dequantised) {
            Ok(m) => m,
            // These files carry llama3 rotary scaling as llama.cpp's `rope_freqs.weight`;
            // where the llama reader does not take it yet, nothing here can be compared.
            Err(e) if e.to_string().contains("rope_freqs") => {
                eprintln!("skipped: {} does not load: {e}", path.display());
                return;
            }
            Err(e) => panic!("{}: {e}", path.display()),
        };
        let ours_f32 = our_logits(&f32_model, &hf_ref);
        drop(f32_model);
        let f32_gap = max_abs(&ours_f32, &dequantised);

        let ggml_model = load_gguf(&file, GgufWeights::Blocks).unwrap();
        if matches!(*ty, "Q5_0" | "Q5_1") {
            // Their tensors were regrouped into copies and the file's pages given back: the
            // same file refuses a second load by name (never zeros read as weights).
            let again = load_gguf(&file, GgufWeights::Blocks).err();
            let err = again.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                err.contains("given back"),
                "{ty}: a second load gave {err:?}"
            );
        }
        let ours = our_logits(&ggml_model, &hf_ref);
        let (to_cpp, kl) = (max_abs(&ours, &cpp), max_kl(&cpp, &ours, vocab));
        let (ours_to_hf, cpp_to_hf) = (max_abs(&ours, &hf), max_abs(&cpp, &hf));
        eprintln!(
            "{ty:<8} {f32_gap:>12.2e} | {to_cpp:>12.4} {kl:>10.2e} | {ours_to_hf:>12.4} \
             {cpp_to_hf:>12.4}"
        );
        if f32_gap > 1e-3 {
            failures.push(format!(
                "{ty}: dequantised logits are {f32_gap} from transformers on the same weights"
            ));
        }
        if ours_to_hf > cpp_to_hf * SLACK.0 + SLACK.1 {
            failures.push(format!(
                "{ty}: block products are {ours_to_hf} from transformers, llama.cpp {cpp_to_hf}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
