//! Every reader of the crate, run on one (possibly damaged) input as the command line would
//! run it: the file is parsed, and what loads is used (a model translates, a tokenizer encodes,
//! a trainer state resumes and trains one update). A reader must return `Ok` or an error that
//! names the file; a panic is the fuzzer's finding. Each function returns `Err` only for an
//! error that does not name its file (an unclear message).
//!
//! Shared by `tests/robustness/fuzz_readers.rs` (mutations of valid files) and the `cargo fuzz`
//! targets in `fuzz/` (libFuzzer's inputs), which include this file and `seeds.rs`.
#![allow(dead_code)]

use super::seeds::{self, Files, Seeds, SAMPLE};
use std::path::Path;
use transformer::decode::greedy::GreedyOptions;
use transformer::decode::sample::SamplingOptions;
use transformer::kernels::lowp::{is_block_product, pack_ggml};
use transformer::model::checkpoint::{load, parse_config};
use transformer::model::families::by_gguf_architecture;
use transformer::model::families::gguf::{load_gguf, GgufWeights};
use transformer::model::{LanguageModel, Seq2Seq};
use transformer::pipeline::generate::{generate_ids, TextGenerator};
use transformer::pipeline::translate::Translator;
use transformer::rng::Rng;
use transformer::store::gguf::GgufFile;
use transformer::store::gguf_llama::LlamaGgufConfig;
use transformer::text::bpe::Bpe;
use transformer::text::corpus::{parse_pairs, read_lines};
use transformer::text::gguf_tokenizer::GgufTokenizer;
use transformer::text::vocab::Vocab;
use transformer::train::pairs::TrainConfig;
use transformer::train::state::TrainerState;
use transformer::train::trainer::PairTrainer;
use transformer::train::windows::LmTrainConfig;

/// How a reader ended: the input loaded, or was refused with a clear error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Loaded,
    Refused,
}

/// `Ok(Refused)` for an error whose message contains `name`, `Err` for one that does not.
fn clear<T, E: std::fmt::Display>(
    result: Result<T, E>,
    name: &str,
) -> Result<Result<T, Outcome>, String> {
    match result {
        Ok(v) => Ok(Ok(v)),
        Err(e) => {
            let msg = e.to_string();
            if msg.trim().is_empty() || !msg.contains(name) {
                Err(format!("unclear error (does not name {name}): {msg:?}"))
            } else {
                Ok(Err(Outcome::Refused))
            }
        }
    }
}

/// `?` for [`clear`]: returns `Ok(Refused)` from the caller on a clear error.
macro_rules! must {
    ($result:expr, $name:expr) => {
        match clear($result, $name)? {
            Ok(v) => v,
            Err(outcome) => return Ok(outcome),
        }
    };
}

/// Writes `files` into `dir` (emptied first), replacing `name` by `bytes`; without
/// `keep_manifest` the directory has no `checkpoint.json` (a directory written by another
/// tool), so the damaged file reaches its parser.
fn lay_out(dir: &Path, files: &Files, name: &str, bytes: &[u8], keep_manifest: bool) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    for (n, b) in files {
        if *n == "checkpoint.json" && !keep_manifest {
            continue;
        }
        std::fs::write(dir.join(n), if *n == name { bytes } else { b }).unwrap();
    }
    if !files.iter().any(|(n, _)| *n == name) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Translates one line with the model directory `dir` (what `translate` does).
fn translate(dir: &Path) -> Result<Outcome, String> {
    let name = dir.to_str().unwrap();
    let mut t = must!(Translator::load(dir), name);
    t.prepare_inference();
    let options = GreedyOptions {
        max_len_extra: 4,
        batch_size: 2,
        forced_first: None,
        min_len: 0,
        forced_end: false,
    };
    let lines = [SAMPLE.to_string(), String::new(), "red 1".into()];
    must!(t.translate(&lines, &options), "");
    Ok(Outcome::Loaded)
}

/// Scores and continues a text with the language-model directory `dir`.
fn generate(dir: &Path) -> Result<Outcome, String> {
    let name = dir.to_str().unwrap();
    let mut g = must!(TextGenerator::load(dir), name);
    g.model.prepare_inference();
    must!(g.perplexity(SAMPLE, 8, 2), "");
    let prompt = must!(g.tokenizer.document(SAMPLE), "");
    must!(g.model.embedding.check_ids(&prompt), "");
    let opts = SamplingOptions {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
    let ids = generate_ids::<()>(
        &g.model,
        &prompt,
        3,
        opts,
        &mut Rng::new(1),
        &[],
        |_| Ok(()),
    )
    .expect("emit never fails");
    must!(g.tokenizer.decode(&ids), "");
    Ok(Outcome::Loaded)
}

/// `model.safetensors` through `model::checkpoint::load` (and the model then used), in a
/// translation or language model directory.
pub fn model_weights(
    dir: &Path,
    seeds: &Seeds,
    lm: bool,
    weights: &[u8],
) -> Result<Outcome, String> {
    let files = if lm {
        &seeds.language_model
    } else {
        &seeds.translation
    };
    lay_out(dir, files, "model.safetensors", weights, false);
    let name = dir.join("model.safetensors");
    let name = name.to_str().unwrap();
    if lm {
        must!(load::<LanguageModel<f32>>(dir), name);
        generate(dir)
    } else {
        must!(load::<Seq2Seq<f32>>(dir), name);
        translate(dir)
    }
}

/// `config.json` parsed for both model kinds, then loaded with the seed's weights.
pub fn config(dir: &Path, seeds: &Seeds, lm: bool, bytes: &[u8]) -> Result<Outcome, String> {
    let path = Path::new("config.json");
    let _ = clear(
        parse_config::<Seq2Seq<f32>>(bytes, path, None),
        "config.json",
    )?;
    let _ = clear(
        parse_config::<LanguageModel<f32>>(bytes, path, None),
        "config.json",
    )?;
    let files = if lm {
        &seeds.language_model
    } else {
        &seeds.translation
    };
    lay_out(dir, files, "config.json", bytes, false);
    if lm {
        generate(dir)
    } else {
        translate(dir)
    }
}

/// `vocab.json` (with `tokenizer` for BPE) loaded and used: encoded, decoded, and translated
/// with the seed model (whose vocabulary size it must match).
pub fn vocab(dir: &Path, seeds: &Seeds, json: &[u8], tokenizer: &[u8]) -> Result<Outcome, String> {
    lay_out(dir, &seeds.translation, "vocab.json", json, false);
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    let v = must!(Vocab::load(&dir.join("vocab.json")), dir.to_str().unwrap());
    let ids = v.encode(SAMPLE);
    let _ = v.decode(&ids);
    let _ = v.decode(&[0, 1, 5, 99, u32::MAX, 2, 7]);
    translate(dir)
}

/// A byte-level BPE `tokenizer.json` loaded, used, and driving the seed language model
/// (the ids it produces must be refused or fit the model).
pub fn tokenizer(dir: &Path, seeds: &Seeds, bytes: &[u8]) -> Result<Outcome, String> {
    let bpe = must!(
        Bpe::from_bytes(bytes, Path::new("tokenizer.json")),
        "tokenizer.json"
    );
    let ids = must!(bpe.encode(SAMPLE), "");
    let _ = bpe.decode(&ids);
    lay_out(dir, &seeds.language_model, "tokenizer.json", bytes, false);
    generate(dir)
}

/// `trainer_state.json` parsed for both recipes; a sentence-pair state then resumes the seed
/// run and trains one update.
pub fn trainer_state(dir: &Path, seeds: &Seeds, bytes: &[u8]) -> Result<Outcome, String> {
    let path = Path::new("trainer_state.json");
    let _ = clear(
        TrainerState::<LmTrainConfig>::from_bytes(bytes, path),
        "trainer_state.json",
    )?;
    must!(
        TrainerState::<TrainConfig>::from_bytes(bytes, path),
        "trainer_state.json"
    );
    lay_out(dir, &seeds.translation, "trainer_state.json", bytes, false);
    let examples = seeds::examples(&seeds::char_vocab());
    let mut trainer = must!(PairTrainer::resume(dir, examples), "trainer_state.json");
    must!(trainer.step(), "");
    Ok(Outcome::Loaded)
}

/// A TSV corpus and a file of lines, as `train`, `score` and `translate` read them.
pub fn corpus(bytes: &[u8]) -> Result<Outcome, String> {
    let _ = clear(read_lines(bytes, "<stdin>"), "<stdin>")?;
    let (pairs, report) = must!(parse_pairs(bytes, Path::new("train.tsv")), "train.tsv");
    let _ = report.summary();
    assert!(pairs
        .iter()
        .all(|p| !p.source.is_empty() && !p.target.is_empty()));
    Ok(Outcome::Loaded)
}

/// A GGUF file: metadata, every tensor dequantised, the llama config and the tokenizer
/// (which then encodes and decodes).
pub fn gguf(bytes: &[u8]) -> Result<Outcome, String> {
    let name = "model.gguf";
    let file = must!(GgufFile::from_bytes(bytes.to_vec(), Path::new(name)), name);
    gguf_read(&file, name)
}

/// The widest block tensor the readers multiply (a mutated header can claim 2^40 columns of
/// no rows, which packs: the test's activation row would not fit in memory).
const MAX_PRODUCT_COLS: usize = 1 << 20;

/// A GGUF file written into `dir` and opened through its memory map, as the command line
/// opens one: what [`gguf`] reads, then every tensor in a ggml block format multiplied where
/// the map holds it.
pub fn gguf_mapped(dir: &Path, bytes: &[u8]) -> Result<Outcome, String> {
    let name = "mapped.gguf";
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let file = must!(GgufFile::open(&path), name);
    for info in file.tensors() {
        if !is_block_product(info.ggml_type) {
            continue;
        }
        let Ok(data) = file.tensor_bytes(info) else {
            continue;
        };
        let (rows, cols) = info.rows_cols();
        // A tensor of no rows has no bytes whatever its width: only the product's own
        // activations would be large (the file's bytes bound everything else).
        if rows == 0 || cols > MAX_PRODUCT_COLS {
            continue;
        }
        if let Ok(Some(w)) = pack_ggml(info.ggml_type, data, rows, cols) {
            let x: Vec<f32> = (0..2 * cols).map(|i| (i % 7) as f32 - 3.0).collect();
            let mut y = vec![0f32; 2 * rows];
            w.product(&mut y, &x, 2);
        }
    }
    gguf_read(&file, name)
}

/// The reads of [`gguf`] on a parsed file.
fn gguf_read(file: &GgufFile, name: &str) -> Result<Outcome, String> {
    let _ = file.architecture();
    let _ = file.chat_template();
    for info in file.tensors() {
        let _ = clear(file.dequantize_info(info), name)?;
        // Block types are also multiplied as stored (a product of one row of ones).
        if !is_block_product(info.ggml_type) {
            continue;
        }
        let Ok(bytes) = file.tensor_bytes(info) else {
            continue;
        };
        let (rows, cols) = info.rows_cols();
        let packed = pack_ggml(info.ggml_type, bytes, rows, cols)
            .map_err(|e| format!("{name}: tensor {}: {e}", info.name));
        if let Ok(Some(w)) = clear(packed, name)? {
            if w.rows() == 0 || w.cols() > MAX_PRODUCT_COLS {
                continue;
            }
            let mut y = vec![0f32; w.rows()];
            w.product(&mut y, &vec![1f32; w.cols()], 1);
        }
    }
    let _ = clear(LlamaGgufConfig::from_gguf(file), name)?;
    // The family its architecture names, as `generate --model` loads it: config, then the
    // whole model with its weights dequantised and kept in blocks.
    if let Some((_, reader)) = file.architecture().ok().and_then(by_gguf_architecture) {
        if clear((reader.config)(file), name)?.is_ok() {
            for weights in [GgufWeights::Dequantised, GgufWeights::Blocks] {
                let _ = clear(load_gguf(file, weights), name)?;
            }
        }
    }
    let tokenizer = must!(GgufTokenizer::from_gguf(file), name);
    let ids = must!(tokenizer.encode(SAMPLE), "");
    let _ = tokenizer.decode(&ids);
    let _ = tokenizer.decode_bytes(&[0, 1, 999_999]);
    Ok(Outcome::Loaded)
}

/// A Hugging Face decoder directory (`files`, with `name` replaced by `bytes`) loaded as
/// `generate --model DIR` loads it, then used: perplexity and three sampled tokens.
pub fn hf_decoder(dir: &Path, files: &Files, name: &str, bytes: &[u8]) -> Result<Outcome, String> {
    lay_out(dir, files, name, bytes, false);
    generate(dir)
}

/// A checkpoint manifest (`checkpoint.json`) in the seed translation directory: every
/// reader of the directory goes through it.
pub fn manifest(dir: &Path, seeds: &Seeds, bytes: &[u8]) -> Result<Outcome, String> {
    lay_out(dir, &seeds.translation, "checkpoint.json", bytes, true);
    let examples = seeds::examples(&seeds::char_vocab());
    let name = dir.to_str().unwrap();
    must!(PairTrainer::resume(dir, examples), name);
    translate(dir)
}
