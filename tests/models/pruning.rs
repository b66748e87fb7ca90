//! Head pruning of pretrained decoders (Michel et al. 2019; `transformer prune`): the small
//! random Hugging Face Llama of `../shared/reference/hf-decoders/llama-tiny` (4 query heads in 2
//! key/value groups, 2 layers) saved in this crate's format with its own tokenizer, pruned,
//! reloaded and fine-tuned; SmolLM2's GGUF tokenizer carried over in a tensor-less GGUF.

use std::path::{Path, PathBuf};
use transformer::heads::fine_tune::{fine_tune_lm, FineTune};
use transformer::heads::prune::{prune, HeadId};
use transformer::heads::run::lm_windows;
use transformer::model::checkpoint::write_model;
use transformer::model::config::AttentionSite;
use transformer::model::{LanguageModel, Module};
use transformer::pipeline::generate::{ModelSource, TextGenerator};
use transformer::pipeline::lm_dir::{tokenizer_files, PRETRAINED_FILE, TOKENIZER_GGUF_FILE};
use transformer::store::gguf::GgufFile;
use transformer::store::CheckpointWriter;
use transformer::text::gguf_tokenizer::GgufTokenizer;

fn shared() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if dir.join("reference").is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: ../shared/reference is absent (it holds the pretrained models)");
        None
    }
}

fn llama_tiny(shared: &Path) -> (PathBuf, TextGenerator) {
    let dir = shared.join("reference/hf-decoders/llama-tiny");
    let g = TextGenerator::load(&dir).unwrap();
    (dir, g)
}

/// Saves `g`'s model (loaded from `from`) to `dir` as `prune` does: our config and float32
/// weights, the tokenizer files of its source.
fn save(g: &mut TextGenerator, from: &Path, dir: &Path) {
    let mut writer = CheckpointWriter::begin(dir).unwrap();
    write_model(&mut writer, &mut g.model).unwrap();
    for (name, bytes) in tokenizer_files(from, g.source).unwrap() {
        writer.add(&name, &bytes).unwrap();
    }
    writer.commit().unwrap();
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

const PROMPT: &str = "To be, or not to be, that is the question: whether 'tis nobler in the mind";

#[test]
fn a_llama_saved_in_our_format_unpruned_gives_the_same_logits_and_tokens() {
    let Some(shared) = shared() else { return };
    let (from, mut g) = llama_tiny(&shared);
    let ids = g.tokenizer.document(PROMPT).unwrap();
    let (want, _) = g.model.forward(&ids, 1, None);
    prune(&mut g.model, &[]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pruned");
    save(&mut g, &from, &dir);
    assert!(dir.join(PRETRAINED_FILE).is_file());
    let back = TextGenerator::load(&dir).unwrap();
    assert_eq!(back.source, ModelSource::HuggingFace("llama"));
    assert_eq!(back.tokenizer.document(PROMPT).unwrap(), ids);
    assert_eq!(back.tokenizer.end_tokens(), g.tokenizer.end_tokens());
    let (got, _) = back.model.forward(&ids, 1, None);
    let d = max_diff(&got, &want);
    eprintln!("llama-tiny through our format, nothing pruned: largest logit difference {d:e}");
    // The same float32 weights and the same code path: equal to the bit.
    assert_eq!(d, 0.0, "logits differ by {d:e}");
}

#[test]
fn a_pruned_llama_equals_the_llama_with_those_heads_gated_to_zero() {
    let Some(shared) = shared() else { return };
    let (from, mut g) = llama_tiny(&shared);
    let ids = g.tokenizer.document(PROMPT).unwrap();
    let (plain, _) = g.model.forward(&ids, 1, None);
    // Layer 0 loses its second key/value group (query heads 2, 3), layer 1 its first (0, 1).
    let mut gated: LanguageModel<f32> = g.model.clone();
    gated.blocks.layers[0].self_attn.gates = vec![1.0, 1.0, 0.0, 0.0];
    gated.blocks.layers[1].self_attn.gates = vec![0.0, 0.0, 1.0, 1.0];
    let (want, _) = gated.forward(&ids, 1, None);
    assert!(
        max_diff(&want, &plain) > 1e-3,
        "the gates change the logits"
    );
    let head = |layer, head| HeadId {
        site: AttentionSite::Decoder,
        layer,
        head,
    };
    let remove = [head(0, 2), head(0, 3), head(1, 0), head(1, 1)];
    prune(&mut g.model, &remove).unwrap();
    assert_eq!(g.model.config.layer_heads.decoder, vec![2, 2]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pruned");
    save(&mut g, &from, &dir);
    let back = TextGenerator::load(&dir).unwrap();
    let attn = &back.model.blocks.layers[0].self_attn;
    assert_eq!((attn.n_heads, attn.n_kv_heads), (2, 1));
    let (got, _) = back.model.forward(&ids, 1, None);
    let d = max_diff(&got, &want);
    eprintln!("llama-tiny pruned of 4 of 8 heads vs gated to 0: largest logit difference {d:e}");
    assert!(d < 1e-5, "pruned and gated logits differ by {d:e}");
    // A partial key/value group is refused by name.
    let err = prune(&mut back.model.clone(), &[head(0, 0)]).unwrap_err();
    assert!(err.to_string().contains("groups of 2"), "{err}");
}

/// The mean loss per token of `model` over `windows`.
fn mean_loss(model: &LanguageModel<f32>, windows: &[Vec<u32>]) -> f64 {
    let (mut tokens, mut targets) = (Vec::new(), Vec::new());
    for w in windows {
        tokens.extend_from_slice(&w[..w.len() - 1]);
        targets.extend_from_slice(&w[1..]);
    }
    let s = model.evaluate(&tokens, &targets, windows.len());
    s.nll_sum / s.n_tokens as f64
}

#[test]
fn fine_tuning_a_pruned_llama_lowers_its_loss_and_repeats_for_a_seed() {
    let Some(shared) = shared() else { return };
    let (_, mut g) = llama_tiny(&shared);
    let head = |layer, head| HeadId {
        site: AttentionSite::Decoder,
        layer,
        head,
    };
    prune(&mut g.model, &[head(0, 2), head(0, 3)]).unwrap();
    let text = std::fs::read_to_string(shared.join("data/en/shakespeare.en.txt")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("text.txt");
    std::fs::write(&data, &text[..20_000]).unwrap();
    let windows = lm_windows(&g, &data, 32, 16).unwrap();
    assert_eq!(windows.len(), 16);
    let before = mean_loss(&g.model, &windows);
    let plan = FineTune {
        steps: 12,
        batch: 4,
        lr: 3e-3,
        seed: 7,
    };
    let mut a = g.model.clone();
    let losses = fine_tune_lm(&mut a, &windows, plan).unwrap();
    let after = mean_loss(&a, &windows);
    eprintln!(
        "fine-tune of pruned llama-tiny: loss {before:.4} -> {after:.4} on its 16 windows; \
         batch losses {losses:.3?}"
    );
    assert!(after < before - 0.3, "loss {before} -> {after}");
    let mut b = g.model.clone();
    assert_eq!(fine_tune_lm(&mut b, &windows, plan).unwrap(), losses);
    for ((name, pa), (_, pb)) in a.params_mut().into_iter().zip(b.params_mut()) {
        assert_eq!(
            pa.value.data, pb.value.data,
            "{name} differs between equal seeds"
        );
    }
    let mut c = g.model.clone();
    let other = fine_tune_lm(&mut c, &windows, FineTune { seed: 8, ..plan }).unwrap();
    assert_ne!(
        other, losses,
        "another seed visits the windows in another order"
    );
    let bad = fine_tune_lm(&mut c, &windows, FineTune { lr: -1.0, ..plan }).unwrap_err();
    assert!(bad.to_string().contains("learning rate"), "{bad}");
}

#[test]
fn a_gguf_tokenizer_carried_in_a_tensorless_gguf_encodes_as_the_original() {
    let Some(shared) = shared() else { return };
    let gguf = shared.join("models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let files = tokenizer_files(&gguf, ModelSource::Gguf).unwrap();
    let (_, bytes) = files
        .iter()
        .find(|(n, _)| n == TOKENIZER_GGUF_FILE)
        .expect("tokenizer.gguf written");
    let original = GgufFile::open(&gguf).unwrap();
    let copy = GgufFile::from_bytes(bytes.clone(), Path::new(TOKENIZER_GGUF_FILE)).unwrap();
    assert!(copy.tensors().is_empty());
    assert_eq!(copy.metadata(), original.metadata());
    let (a, b) = (
        GgufTokenizer::from_gguf(&original).unwrap(),
        GgufTokenizer::from_gguf(&copy).unwrap(),
    );
    let text = "<|im_start|>user\nWhat is 2+2? Ünïcödé  spaces\t& tabs<|im_end|>";
    assert_eq!(a.encode(text).unwrap(), b.encode(text).unwrap());
    assert_eq!(a.chat_template(), b.chat_template());
    assert!(b.chat_template().is_some());
}
