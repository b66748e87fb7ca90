//! Fuzzing of every reader in the normal test suite (stable Rust, seeded, bounded time):
//! structured random mutations (`fuzz_common::mutate`) of valid files (`fuzz_common::seeds`)
//! fed to each reader as the command line uses it (`fuzz_common::readers`): safetensors
//! weights through `model::checkpoint::load`, `config.json`, `vocab.json`, `tokenizer.json`,
//! `trainer_state.json`, the checkpoint manifest, TSV/line corpora and GGUF files. Every case
//! must load or be refused with an error naming its file; a panic fails the test, and the input
//! is written to `target/fuzz-failures/`.
//!
//! Each reader runs until its case count or its time budget, whichever comes first (by default
//! 3000 cases, 30000 for the fast corpus and GGUF readers, or 2.5 s); `TRANSFORMER_FUZZ_CASES`
//! and `TRANSFORMER_FUZZ_SECONDS` set both for a longer run (`tests/fuzz/fuzz.sh`). `fuzz/` holds a `cargo fuzz` target per reader for
//! coverage-guided runs on a nightly toolchain.

use crate::fuzz_common;

use fuzz_common::mutate;
use fuzz_common::readers::{self, Outcome};
use fuzz_common::seeds::{self, gguf_parts, write_gguf, Seeds};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;
use transformer::rng::Rng;
use transformer::store::gguf::{Value, ValueType};

fn seeds() -> &'static Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    SEEDS.get_or_init(Seeds::build)
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

thread_local! {
    /// Inside a fuzz case: the message of its panic, if any.
    static PANIC: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// A panic hook that keeps the message (with its location) of a panic inside a fuzz case for
/// the fuzzer instead of printing it; other panics print as usual.
fn quiet_panics() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_case = PANIC.with(|p| match &mut *p.borrow_mut() {
                Some(slot) => {
                    *slot = Some(info.to_string());
                    true
                }
                None => false,
            });
            if !in_case {
                default(info);
            }
        }))
    });
}

/// Runs `reader` on inputs made by `make` (a list of files) until the case count or the time
/// budget; fails on the first panic or unclear error, saving its input.
fn fuzz(
    name: &str,
    seed: u64,
    default_cases: usize,
    make: impl Fn(&mut Rng) -> Vec<Vec<u8>>,
    reader: impl Fn(&Path, &[Vec<u8>]) -> Result<Outcome, String>,
) {
    quiet_panics();
    let seeds = seeds();
    let _ = seeds;
    let cases: usize = env("TRANSFORMER_FUZZ_CASES").unwrap_or(default_cases);
    let seconds: f64 = env("TRANSFORMER_FUZZ_SECONDS").unwrap_or(2.5);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let (mut loaded, mut refused, mut slowest) = (0usize, 0usize, 0f64);
    let mut n = 0;
    while n < cases && started.elapsed().as_secs_f64() < seconds {
        let input = make(&mut rng);
        let t0 = Instant::now();
        PANIC.with(|p| *p.borrow_mut() = Some(None));
        let result = catch_unwind(AssertUnwindSafe(|| reader(dir.path(), &input)));
        let panic = PANIC.with(|p| p.borrow_mut().take()).flatten();
        slowest = slowest.max(t0.elapsed().as_secs_f64());
        let failure = match result {
            Ok(Ok(Outcome::Loaded)) => {
                loaded += 1;
                None
            }
            Ok(Ok(Outcome::Refused)) => {
                refused += 1;
                None
            }
            Ok(Err(unclear)) => Some(unclear),
            Err(_) => Some(format!("panic: {}", panic.unwrap_or_default())),
        };
        if let Some(failure) = failure {
            let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../fuzz-failures");
            std::fs::create_dir_all(&saved).unwrap();
            for (i, file) in input.iter().enumerate() {
                std::fs::write(saved.join(format!("{name}-{n}-{i}.bin")), file).unwrap();
            }
            panic!(
                "fuzz {name}, case {n} (seed {seed}): {failure}\ninput saved to {}/{name}-{n}-*.bin",
                saved.display()
            );
        }
        n += 1;
    }
    eprintln!(
        "fuzz {name}: {n} cases in {:.1} s ({loaded} loaded, {refused} refused with a clear \
         error, 0 panics; slowest case {:.3} s)",
        started.elapsed().as_secs_f64(),
        slowest
    );
    assert!(n > 0);
}

/// A mutation: the seed, the splice sources, the mutated copy.
type Mutation = fn(&mut Rng, &[u8], &[Vec<u8>]) -> Vec<u8>;

/// One seed of `pool` mutated by `how`, the other seeds as splice sources.
fn one_of(rng: &mut Rng, pool: &[Vec<u8>], how: Mutation) -> Vec<u8> {
    let seed = &pool[rng.below(pool.len())];
    how(rng, seed, pool)
}

#[test]
fn safetensors_weights_through_the_model_loader() {
    let s = seeds();
    let pool = [
        Seeds::file(&s.translation, "model.safetensors"),
        Seeds::file(&s.language_model, "model.safetensors"),
        Seeds::file(&s.translation, "optimizer.safetensors"),
    ];
    fuzz(
        "safetensors",
        1,
        3000,
        |rng| {
            let lm = rng.below(2) as u8;
            let weights = mutate::safetensors(rng, &pool[lm as usize], &pool);
            vec![vec![lm], weights]
        },
        |dir, input| readers::model_weights(dir, seeds(), input[0][0] == 1, &input[1]),
    );
}

#[test]
fn config_json() {
    let s = seeds();
    let pool = [
        Seeds::file(&s.translation, "config.json"),
        Seeds::file(&s.language_model, "config.json"),
    ];
    fuzz(
        "config.json",
        2,
        3000,
        |rng| {
            let lm = rng.below(2) as u8;
            vec![vec![lm], mutate::json(rng, &pool[lm as usize], &pool)]
        },
        |dir, input| readers::config(dir, seeds(), input[0][0] == 1, &input[1]),
    );
}

#[test]
fn vocab_json() {
    let s = seeds();
    let mut pool = s.vocabs.clone();
    pool.push(s.bpe_vocab.0.clone());
    fuzz(
        "vocab.json",
        3,
        3000,
        |rng| {
            let (vocab, tokenizer) = &s.bpe_vocab;
            match rng.below(3) {
                // The BPE tokenizer of a translation vocabulary.
                0 => vec![vocab.clone(), mutate::json(rng, tokenizer, &pool)],
                _ => vec![one_of(rng, &pool, mutate::json), tokenizer.clone()],
            }
        },
        |dir, input| readers::vocab(dir, seeds(), &input[0], &input[1]),
    );
}

#[test]
fn tokenizer_json() {
    let s = seeds();
    let pool = [s.tokenizer.clone(), s.bpe_vocab.1.clone()];
    fuzz(
        "tokenizer.json",
        4,
        3000,
        |rng| vec![one_of(rng, &pool, mutate::json)],
        |dir, input| readers::tokenizer(dir, seeds(), &input[0]),
    );
}

#[test]
fn trainer_state_json() {
    let pool = seeds().states.clone();
    fuzz(
        "trainer_state.json",
        5,
        3000,
        |rng| vec![one_of(rng, &pool, mutate::json)],
        |dir, input| readers::trainer_state(dir, seeds(), &input[0]),
    );
}

#[test]
fn checkpoint_manifest() {
    let pool = [Seeds::file(&seeds().translation, "checkpoint.json")];
    fuzz(
        "checkpoint.json",
        6,
        3000,
        |rng| vec![one_of(rng, &pool, mutate::json)],
        |dir, input| readers::manifest(dir, seeds(), &input[0]),
    );
}

#[test]
fn tsv_and_line_corpora() {
    let pool = seeds().corpora.clone();
    fuzz(
        "corpus",
        7,
        30000,
        |rng| vec![one_of(rng, &pool, mutate::bytes)],
        |_, input| readers::corpus(&input[0]),
    );
}

/// A random GGUF value of any type (arrays nested at most `depth` deep).
fn gguf_value(rng: &mut Rng, depth: usize) -> Value {
    let big =
        |rng: &mut Rng| [0, 1, u64::MAX, 1 << 32, 1 << 31, rng.below(100) as u64][rng.below(6)];
    match rng.below(if depth > 0 { 13 } else { 12 }) {
        0 => Value::U8(rng.below(256) as u8),
        1 => Value::I8(rng.below(256) as u8 as i8),
        2 => Value::U16(big(rng) as u16),
        3 => Value::I16(big(rng) as i16),
        4 => Value::U32(big(rng) as u32),
        5 => Value::I32(big(rng) as i32),
        6 => Value::U64(big(rng)),
        7 => Value::I64(big(rng) as i64),
        8 => Value::F32([0.0, -1.0, f32::NAN, f32::INFINITY, 1e-5][rng.below(5)]),
        9 => Value::F64([0.0, -1.0, f64::NAN, 1e300][rng.below(4)]),
        10 => Value::Bool(rng.below(2) == 1),
        11 => Value::String(["", "llama", "gpt2", "a b", "Ġ ab", "<s>"][rng.below(6)].into()),
        _ => {
            let item = gguf_value(rng, depth - 1);
            let t = item.value_type();
            let n = rng.below(5);
            let items = (0..n)
                .map(|_| {
                    let v = gguf_value(rng, depth - 1);
                    if v.value_type() == t {
                        v
                    } else {
                        item.clone()
                    }
                })
                .collect();
            Value::Array(t, items)
        }
    }
}

/// The seed GGUF with field-level edits of its metadata and tensor infos, written anew (so
/// lengths and offsets stay consistent), then sometimes mutated byte by byte.
/// The seed's metadata retold as another architecture (its `llama.*` keys renamed) and another
/// tokenizer (model and pre-tokenizer, SentencePiece scores): every family and vocabulary
/// reader meets the mutations, including names no reader knows.
fn retarget(rng: &mut Rng, kvs: &mut [(String, Value)]) {
    const ARCHITECTURES: [&str; 10] = [
        "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "gpt2", "bert", "mamba",
    ];
    const MODELS: [&str; 5] = ["gpt2", "llama", "bert", "t5", ""];
    const PRE: [&str; 7] = [
        "smollm",
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "default",
        "tekken",
        "?",
    ];
    let arch = ARCHITECTURES[rng.below(ARCHITECTURES.len())];
    let (model, pre) = (MODELS[rng.below(MODELS.len())], PRE[rng.below(PRE.len())]);
    let n_tokens = kvs
        .iter()
        .find_map(|(k, v)| match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(_, items)) => Some(items.len()),
            _ => None,
        })
        .unwrap_or(0);
    for (key, value) in kvs.iter_mut() {
        if let Some(rest) = key.strip_prefix("llama.") {
            *key = format!("{arch}.{rest}");
        }
        match key.as_str() {
            "general.architecture" => *value = Value::String(arch.into()),
            "tokenizer.ggml.model" => *value = Value::String(model.into()),
            "tokenizer.ggml.pre" => *value = Value::String(pre.into()),
            // SentencePiece reads scores where BPE reads merges.
            "tokenizer.ggml.merges" if model == "llama" && rng.below(2) == 0 => {
                *key = "tokenizer.ggml.scores".into();
                let scores = (0..n_tokens).map(|i| Value::F32(-(i as f32))).collect();
                *value = Value::Array(ValueType::F32, scores);
            }
            _ => {}
        }
    }
}

fn mutated_gguf(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let (mut kvs, mut tensors) = gguf_parts();
    for _ in 0..1 + rng.below(3) {
        match rng.below(9) {
            0 | 1 => {
                let i = rng.below(kvs.len());
                kvs[i].1 = gguf_value(rng, 2);
            }
            8 => retarget(rng, &mut kvs),
            2 => {
                let i = rng.below(kvs.len());
                kvs.remove(i);
            }
            3 => {
                // A list value with a changed item, or items removed or duplicated.
                let i = rng.below(kvs.len());
                if let Value::Array(t, items) = &mut kvs[i].1 {
                    if !items.is_empty() {
                        let j = rng.below(items.len());
                        match rng.below(3) {
                            0 => {
                                items.remove(j);
                            }
                            1 => items.push(items[j].clone()),
                            _ => {
                                let v = gguf_value(rng, 0);
                                if v.value_type() == *t {
                                    items[j] = v;
                                }
                            }
                        }
                    }
                }
            }
            4 => {
                let i = rng.below(tensors.len());
                let n = rng.below(6);
                tensors[i].1 = (0..n)
                    .map(|_| [0, 1, 2, 32, 1 << 31, u64::MAX, 1 << 40][rng.below(7)])
                    .collect();
            }
            5 => {
                let i = rng.below(tensors.len());
                tensors[i].2 = [
                    0,
                    1,
                    2,
                    3,
                    6,
                    7,
                    8,
                    10,
                    11,
                    12,
                    13,
                    14,
                    15,
                    20,
                    30,
                    31,
                    40,
                    u32::MAX,
                ][rng.below(18)];
            }
            6 => {
                let i = rng.below(tensors.len());
                let len = tensors[i].3.len();
                tensors[i].3.truncate(rng.below(len + 1));
            }
            _ => {
                let i = rng.below(tensors.len());
                let j = rng.below(tensors.len());
                tensors[i].0 = tensors[j].0.clone();
            }
        }
    }
    let file = write_gguf(&kvs, &tensors);
    if rng.below(3) == 0 {
        mutate::bytes(rng, &file, &[seed.to_vec()])
    } else {
        file
    }
}

#[test]
fn gguf_files() {
    let seed = seeds().gguf.clone();
    let _ = ValueType::U8;
    fuzz(
        "gguf",
        8,
        30000,
        |rng| {
            vec![if rng.below(2) == 0 {
                mutated_gguf(rng, &seed)
            } else {
                mutate::bytes(rng, &seed, &[])
            }]
        },
        |_, input| readers::gguf(&input[0]),
    );
}

/// GGUF files written to disk and opened through their memory map (truncations among the
/// mutations): refused with a clear error, never a fault from reading past the mapped end.
#[test]
fn gguf_files_mapped() {
    let seed = seeds().gguf.clone();
    fuzz(
        "gguf mapped",
        9,
        3000,
        |rng| {
            let file = match rng.below(3) {
                0 => mutated_gguf(rng, &seed),
                1 => mutate::bytes(rng, &seed, &[]),
                _ => seed.clone(),
            };
            // Often cut short: anywhere, or inside the data section.
            let keep = match rng.below(3) {
                0 => rng.below(file.len() + 1),
                1 => file.len() - rng.below(file.len().min(160) + 1),
                _ => file.len(),
            };
            vec![file[..keep].to_vec()]
        },
        |dir, input| readers::gguf_mapped(dir, &input[0]),
    );
}

/// The seeds themselves load: the mutations start from valid files.
#[test]
fn hugging_face_decoder_directories() {
    let dirs = &seeds().hf_decoders;
    if dirs.is_empty() {
        eprintln!("skipped: ../shared/reference/hf-decoders is absent (the Hugging Face seeds)");
        return;
    }
    let pool: Vec<Vec<u8>> = dirs
        .iter()
        .flat_map(|files| files.iter().map(|(_, b)| b.clone()))
        .filter(|b| b.first() == Some(&b'{'))
        .collect();
    fuzz(
        "hugging face directory",
        8,
        3000,
        |rng| {
            let d = rng.below(dirs.len());
            let files = &dirs[d];
            let f = rng.below(files.len());
            let (name, bytes) = &files[f];
            let mutated = if name.ends_with(".safetensors") {
                mutate::safetensors(rng, bytes, &pool)
            } else {
                mutate::json(rng, bytes, &pool)
            };
            vec![vec![d as u8, f as u8], mutated]
        },
        |dir, input| {
            let files = &seeds().hf_decoders[input[0][0] as usize];
            let name = files[input[0][1] as usize].0;
            readers::hf_decoder(dir, files, name, &input[1])
        },
    );
}

#[test]
fn every_seed_loads() {
    let s = seeds();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ok = |r: Result<Outcome, String>, what: &str| {
        assert_eq!(r, Ok(Outcome::Loaded), "{what}");
    };
    ok(
        readers::model_weights(
            d,
            s,
            false,
            &Seeds::file(&s.translation, "model.safetensors"),
        ),
        "translation weights",
    );
    ok(
        readers::model_weights(
            d,
            s,
            true,
            &Seeds::file(&s.language_model, "model.safetensors"),
        ),
        "language-model weights",
    );
    ok(
        readers::config(d, s, false, &Seeds::file(&s.translation, "config.json")),
        "config",
    );
    ok(readers::vocab(d, s, &s.vocabs[0], b""), "char vocab");
    ok(readers::tokenizer(d, s, &s.tokenizer), "tokenizer");
    ok(readers::trainer_state(d, s, &s.states[0]), "trainer state");
    ok(
        readers::manifest(d, s, &Seeds::file(&s.translation, "checkpoint.json")),
        "manifest",
    );
    ok(readers::corpus(&s.corpora[0]), "tsv");
    ok(readers::gguf(&s.gguf), "gguf");
    ok(readers::gguf_mapped(d, &s.gguf), "gguf mapped");
    for files in &s.hf_decoders {
        let (name, bytes) = &files[0];
        ok(
            readers::hf_decoder(d, files, name, bytes),
            "hugging face directory",
        );
    }
    let _ = seeds::SAMPLE;
    // `TRANSFORMER_FUZZ_CORPUS=DIR`: also write the starting corpus of the cargo fuzz targets.
    if let Ok(root) = std::env::var("TRANSFORMER_FUZZ_CORPUS") {
        fuzz_common::write_corpus(Path::new(&root), s).unwrap();
    }
}
