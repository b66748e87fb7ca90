//! Valid files of every format we read, built with the library (tiny models, small
//! tokenizers): the seeds of the mutation fuzzing (`tests/robustness/fuzz_readers.rs`) and the
//! companion files of the `cargo fuzz` targets (`fuzz/`), which include this file.
#![allow(dead_code)]

use super::gguf_common::{gguf, tensor, TensorSpec};
use std::path::Path;
use transformer::model::checkpoint::save;
use transformer::model::{LanguageModel, ModelConfig, NormPlacement, Positions};
use transformer::rng::Rng;
use transformer::store::gguf::{Value, ValueType};
use transformer::text::bpe::Bpe;
use transformer::text::vocab::{Vocab, VocabLevel};
use transformer::train::batching::BatchOrder;
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::state::TrainerState;
use transformer::train::trainer::PairTrainer;
use transformer::train::windows::LmTrainConfig;

/// Sentences with a little of everything (digits, accents, CJK, a spelled special).
pub const TEXTS: [&str; 6] = [
    "red 1 apples",
    "rot 2 Äpfel",
    "zwölf grüne Häuser, 12 €!",
    "naïve café 東京",
    "the </s> <unk> house",
    "a  b\tc",
];

/// The text every tokenizer encodes and decodes once it loads.
pub const SAMPLE: &str = "red 12 zwölf 東京 </s> <|endoftext|> naïve";

/// The files of one directory, by name.
pub type Files = Vec<(&'static str, Vec<u8>)>;

/// All seed files.
pub struct Seeds {
    /// A translation model directory (char vocabulary): config, weights, optimizer, state,
    /// vocab, manifest.
    pub translation: Files,
    /// A language model directory (byte-level BPE): config, weights, tokenizer, manifest.
    pub language_model: Files,
    /// Vocabularies: char level, word level (`vocab.json` only).
    pub vocabs: Vec<Vec<u8>>,
    /// A translation BPE vocabulary: `vocab.json` and its `tokenizer.json`.
    pub bpe_vocab: (Vec<u8>, Vec<u8>),
    /// A byte-level BPE `tokenizer.json` with `<|endoftext|>` (the language model's).
    pub tokenizer: Vec<u8>,
    /// Trainer states: sentence pairs, language model.
    pub states: Vec<Vec<u8>>,
    /// Corpora: TSV pairs, plain lines.
    pub corpora: Vec<Vec<u8>>,
    /// A GGUF file: llama metadata, a byte-level BPE tokenizer, one tensor of each type.
    pub gguf: Vec<u8>,
    /// Hugging Face decoder directories (the tiny Llama and GPT-2 of `../shared`, each also
    /// with its weights as a one-shard index); empty where `../shared` is absent.
    pub hf_decoders: Vec<Files>,
}

/// The files of a Hugging Face decoder directory that its loader reads.
pub const HF_FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// The shard of the one-shard variants.
pub const HF_SHARD: &str = "model-00001-of-00001.safetensors";
/// The index of the one-shard variants.
pub const HF_INDEX: &str = "model.safetensors.index.json";

/// `../shared/reference/hf-decoders` beside the crate (tests) or beside `fuzz/`.
fn hf_reference_dir() -> Option<std::path::PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    [here.join("../shared"), here.join("../../shared")]
        .into_iter()
        .map(|d| d.join("reference/hf-decoders"))
        .find(|d| d.is_dir())
}

/// The tiny Hugging Face decoders, as they are and with their weights moved into a one-shard
/// index (`model.safetensors.index.json` naming [`HF_SHARD`] for every tensor).
fn hf_decoder_seeds() -> Vec<Files> {
    let Some(root) = hf_reference_dir() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in ["llama-tiny", "gpt2-tiny"] {
        let files = read_dir(&root.join(name), &HF_FILES);
        if files.is_empty() {
            continue;
        }
        let weights = Seeds::file(&files, "model.safetensors");
        let tensors = safetensors::SafeTensors::deserialize(&weights).unwrap();
        let weight_map: serde_json::Map<String, serde_json::Value> = tensors
            .names()
            .into_iter()
            .map(|n| (n.to_string(), serde_json::Value::from(HF_SHARD)))
            .collect();
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        let mut sharded: Files = files
            .iter()
            .filter(|(n, _)| *n != "model.safetensors")
            .cloned()
            .collect();
        sharded.push((HF_SHARD, weights));
        sharded.push((HF_INDEX, serde_json::to_vec_pretty(&index).unwrap()));
        out.push(files);
        out.push(sharded);
    }
    out
}

fn tiny(vocab_size: usize, encoder_layers: usize) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", vocab_size).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 16, 64);
    c.n_encoder_layers = encoder_layers;
    c.n_decoder_layers = 1;
    c
}

/// The training examples of the translation seed (all ids inside `vocab`).
pub fn examples(vocab: &Vocab) -> Vec<Example> {
    TEXTS
        .iter()
        .zip(TEXTS.iter().rev())
        .map(|(s, t)| Example {
            src: vocab.encode(s),
            tgt: vocab.encode(t),
        })
        .collect()
}

fn read_dir(dir: &Path, names: &[&'static str]) -> Files {
    names
        .iter()
        .filter(|n| dir.join(n).is_file())
        .map(|&n| (n, std::fs::read(dir.join(n)).unwrap()))
        .collect()
}

const ALL_FILES: [&str; 7] = [
    "config.json",
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
    "vocab.json",
    "tokenizer.json",
    "checkpoint.json",
];

/// The char vocabulary of [`TEXTS`].
pub fn char_vocab() -> Vocab {
    Vocab::build(TEXTS.iter().copied(), VocabLevel::Char, 1)
}

/// The byte-level BPE of [`TEXTS`] with `<|endoftext|>` (260-ish tokens).
pub fn lm_bpe() -> Bpe {
    Bpe::train(TEXTS.iter().copied().cycle().take(60), 270).unwrap()
}

impl Seeds {
    pub fn build() -> Seeds {
        let tmp = tempdir();
        // A translation run after one update, saved with its vocabulary.
        let vocab = char_vocab();
        let recipe = TrainConfig {
            tokens_per_batch: 60,
            warmup: 2,
            ..TrainConfig::default()
        };
        let mut trainer = PairTrainer::new(tiny(vocab.len(), 1), recipe, examples(&vocab)).unwrap();
        trainer.step().unwrap();
        let tdir = tmp.join("translation");
        let mut writer = transformer::store::CheckpointWriter::begin(&tdir).unwrap();
        trainer.write(&mut writer).unwrap();
        vocab.write(&mut writer).unwrap();
        writer.commit().unwrap();
        // A language model with its tokenizer.
        let bpe = lm_bpe();
        let mut lm_config = tiny(bpe.vocab_size(), 0);
        lm_config.norm = NormPlacement::PreLn;
        lm_config.positions = Positions::Rotary;
        let mut lm = LanguageModel::<f32>::new(lm_config, &mut Rng::new(2));
        let ldir = tmp.join("lm");
        save(&ldir, &mut lm).unwrap();
        bpe.save(&ldir.join("tokenizer.json")).unwrap();
        let words = Vocab::build(TEXTS.iter().copied(), VocabLevel::Word, 1);
        let bpe_vocab = Vocab::build_bpe(TEXTS.iter().copied().cycle().take(60), 280).unwrap();
        let files = bpe_vocab.files().unwrap();
        let find = |name: &str| files.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        let lm_state = TrainerState {
            step: 7,
            rng: Rng::new(5),
            order: None,
            config: LmTrainConfig {
                context: 16,
                batch: 2,
                ..LmTrainConfig::default()
            },
            data_fingerprint: 42,
        };
        let pair_state = TrainerState {
            step: 3,
            rng: Rng::new(4),
            order: Some(BatchOrder::new(1)),
            config: TrainConfig::default(),
            data_fingerprint: 41,
        };
        let tsv: String = TEXTS
            .iter()
            .zip(TEXTS.iter().rev())
            .enumerate()
            .map(|(i, (s, t))| format!("{s}\t{t}{}", if i % 2 == 0 { "\n" } else { "\r\n" }))
            .collect();
        Seeds {
            translation: read_dir(&tdir, &ALL_FILES),
            language_model: read_dir(&ldir, &ALL_FILES),
            vocabs: vec![
                serde_json::to_vec_pretty(&vocab).unwrap(),
                serde_json::to_vec_pretty(&words).unwrap(),
            ],
            bpe_vocab: (find("vocab.json"), find("tokenizer.json")),
            tokenizer: bpe.to_bytes().unwrap(),
            states: vec![
                std::fs::read(tdir.join("trainer_state.json")).unwrap(),
                pair_state.to_bytes(),
                lm_state.to_bytes(),
            ],
            corpora: vec![
                [b"\xEF\xBB\xBF".as_slice(), tsv.as_bytes()].concat(),
                TEXTS.join("\n").into_bytes(),
            ],
            gguf: gguf_seed(),
            hf_decoders: hf_decoder_seeds(),
        }
    }

    /// The file `name` of a seed directory.
    pub fn file(files: &Files, name: &str) -> Vec<u8> {
        files
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_default()
    }
}

/// A fresh scratch directory under the system's temporary directory (left for the OS to
/// clean: the fuzz targets have no place to delete it).
pub fn tempdir() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "transformer-fuzz-{}-{n}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tensor of a GGUF file: name, dims (fastest first), ggml type code, data.
pub type GgufTensor = (String, Vec<u64>, u32, Vec<u8>);

/// A version-3 GGUF file (each tensor aligned to 32 bytes), written by the GGUF tests' writer.
pub fn write_gguf(kvs: &[(String, Value)], tensors: &[GgufTensor]) -> Vec<u8> {
    let kvs: Vec<(&str, Value)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(name, dims, code, data)| tensor(name, dims, *code, data.clone()))
        .collect();
    gguf(&kvs, &specs, 32)
}

/// The metadata and tensors of the GGUF seed.
pub fn gguf_parts() -> (Vec<(String, Value)>, Vec<GgufTensor>) {
    let strings = |v: &[&str]| {
        Value::Array(
            ValueType::String,
            v.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    };
    let tokens = [
        "<s>", "</s>", "a", "b", "Ġ", "ab", "Ġab", "1", "2", "12", "Ċ", "!", "Ã", "©", "Ã©",
    ];
    let types = Value::Array(
        ValueType::I32,
        tokens
            .iter()
            .enumerate()
            .map(|(i, _)| Value::I32(if i < 2 { 3 } else { 1 }))
            .collect(),
    );
    let kv = |k: &str, v: Value| (k.to_string(), v);
    let kvs = vec![
        kv("general.architecture", Value::String("llama".into())),
        kv("llama.block_count", Value::U32(1)),
        kv("llama.embedding_length", Value::U32(64)),
        kv("llama.feed_forward_length", Value::U32(128)),
        kv("llama.attention.head_count", Value::U32(4)),
        kv("llama.attention.head_count_kv", Value::U32(2)),
        kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        kv("llama.rope.freq_base", Value::F32(10000.0)),
        kv("llama.context_length", Value::U32(128)),
        kv("tokenizer.ggml.model", Value::String("gpt2".into())),
        kv("tokenizer.ggml.pre", Value::String("smollm".into())),
        kv("tokenizer.ggml.tokens", strings(&tokens)),
        kv("tokenizer.ggml.token_type", types),
        kv(
            "tokenizer.ggml.merges",
            strings(&["a b", "Ġ ab", "1 2", "Ã ©"]),
        ),
        kv("tokenizer.ggml.bos_token_id", Value::U32(0)),
        kv("tokenizer.ggml.eos_token_id", Value::U32(1)),
        kv("tokenizer.chat_template", Value::String("{{ x }}".into())),
    ];
    let f32s: Vec<u8> = (0..64)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..32u16)
        .flat_map(|i| (0x3c00 + i).to_le_bytes())
        .collect();
    let mut q8 = Vec::new();
    for b in 0..2u8 {
        q8.extend_from_slice(&0x2c00u16.to_le_bytes());
        q8.extend((0..32).map(|i| (i as u8).wrapping_sub(16).wrapping_add(b)));
    }
    let mut q4_0 = 0x3800u16.to_le_bytes().to_vec();
    q4_0.extend((0..16).map(|i| i as u8 * 17));
    let mut q4_1 = [0x3800u16.to_le_bytes(), 0xb800u16.to_le_bytes()].concat();
    q4_1.extend((0..16).map(|i| 0xf0 - i as u8));
    let tensors = vec![
        ("token_embd.weight".to_string(), vec![4, 16], 0, f32s),
        ("output_norm.weight".to_string(), vec![32], 1, f16s.clone()),
        ("blk.0.attn_q.weight".to_string(), vec![32, 2], 8, q8),
        ("blk.0.attn_k.weight".to_string(), vec![32], 2, q4_0),
        ("blk.0.attn_v.weight".to_string(), vec![32], 3, q4_1),
        ("blk.0.ffn_up.weight".to_string(), vec![16, 2], 30, f16s),
    ];
    let mut tensors = tensors;
    // One tensor of each other block type: (name, ggml code, elements per row, bytes per
    // block, where its f16 scales sit).
    let blocks: [(&str, u32, u64, usize, &[usize]); 8] = [
        ("extra.q5_0.weight", 6, 32, 22, &[0]),
        ("extra.q5_1.weight", 7, 32, 24, &[0, 2]),
        ("extra.q2_k.weight", 10, 256, 84, &[80, 82]),
        ("extra.q3_k.weight", 11, 256, 110, &[108]),
        ("blk.0.ffn_gate.weight", 12, 256, 144, &[0, 2]),
        ("extra.q5_k.weight", 13, 256, 176, &[0, 2]),
        ("blk.0.ffn_down.weight", 14, 256, 210, &[208]),
        ("extra.iq4_nl.weight", 20, 32, 18, &[0]),
    ];
    for (i, (name, code, row, size, scales)) in blocks.into_iter().enumerate() {
        let mut data: Vec<u8> = (0..2 * size).map(|j| (j * 37 + i * 11) as u8).collect();
        for block in data.chunks_exact_mut(size) {
            for &at in scales {
                block[at..at + 2].copy_from_slice(&0x2c00u16.to_le_bytes());
            }
        }
        tensors.push((name.to_string(), vec![row, 2], code, data));
    }
    (kvs, tensors)
}

fn gguf_seed() -> Vec<u8> {
    let (kvs, tensors) = gguf_parts();
    write_gguf(&kvs, &tensors)
}
