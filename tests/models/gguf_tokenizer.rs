//! The tokenizer of a GGUF file: a small byte-level BPE written here (control and user-defined
//! tokens, both pre-tokenizers, damaged vocabularies), then SmolLM2's, which must give exactly
//! the ids transformers computed for the reference prompts in `../shared/reference/smollm2`
//! (skipped, with the reason, where they are absent).

use crate::gguf_common;

use gguf_common::{gguf, parse, shared, smollm2};
use serde::Deserialize;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::Decoder;
use transformer::store::gguf::{Value, ValueType};
use transformer::text::gguf_tokenizer::GgufTokenizer;

/// A small vocabulary: two control tokens, bytes and merges, two user-defined tokens (plain
/// text, one with a character that the byte-level alphabet would read as a byte).
const TOKENS: [(&str, i32); 17] = [
    ("<|s|>", 3),
    ("<|e|>", 3),
    ("a", 1),
    ("b", 1),
    ("Ġ", 1),
    ("ab", 1),
    ("Ġab", 1),
    ("1", 1),
    ("2", 1),
    ("12", 1),
    ("Ċ", 1),
    ("!", 1),
    ("<x y>", 4),
    ("Ã", 1),
    ("©", 1),
    ("Ã©", 1), // "é"
    ("ü!", 4),
];

/// The tokenizer metadata with `pre` as pre-tokenizer; `edit` may change any value.
fn tokenizer_file(pre: &str, edit: impl Fn(&mut Vec<(&'static str, Value)>)) -> Vec<u8> {
    let strings = |v: Vec<&str>| {
        Value::Array(
            ValueType::String,
            v.into_iter().map(|s| Value::String(s.into())).collect(),
        )
    };
    let types = TOKENS.iter().map(|t| Value::I32(t.1)).collect();
    let mut kvs = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens",
            strings(TOKENS.iter().map(|t| t.0).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        ),
        (
            "tokenizer.ggml.merges",
            strings(vec!["a b", "Ġ ab", "1 2", "Ã ©"]),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
        (
            "tokenizer.chat_template",
            Value::String("{{ messages }}".into()),
        ),
    ];
    edit(&mut kvs);
    gguf(&kvs, &[], 32)
}

fn build(bytes: Vec<u8>) -> transformer::error::Result<GgufTokenizer> {
    GgufTokenizer::from_gguf(&parse(bytes).unwrap())
}

#[test]
fn hand_built_tokenizer() {
    let text = "<|s|>ab ab12!\n<x y>éü!<|e|>";
    for (pre, ids) in [
        ("gpt2", vec![0, 5, 6, 9, 11, 10, 12, 15, 16, 1]),
        ("smollm", vec![0, 5, 6, 7, 8, 11, 10, 12, 15, 16, 1]),
    ] {
        let tk = build(tokenizer_file(pre, |_| {})).unwrap();
        assert_eq!(tk.pre_tokenizer(), pre);
        assert_eq!(tk.encode(text).unwrap(), ids, "{pre}");
        assert_eq!(tk.decode(&ids).unwrap(), text, "{pre}");
        assert_eq!(tk.decode_bytes(&[15]).unwrap(), "é".as_bytes());
        assert_eq!(tk.decode_bytes(&[13]).unwrap(), [0xc3]);
        assert_eq!(tk.decode(&[13]).unwrap(), "\u{fffd}");
        assert_eq!(
            (tk.vocab_size(), tk.bos_id(), tk.eos_id()),
            (17, Some(0), Some(1))
        );
        assert_eq!((tk.pad_id(), tk.add_bos()), (None, false));
        assert_eq!(tk.special_ids(), [0, 1]);
        assert!(tk.is_special(1) && !tk.is_special(12));
        assert_eq!(tk.chat_template(), Some("{{ messages }}"));
        assert!(tk.decode(&[17]).is_err());
    }
}

#[test]
fn damaged_tokenizers_are_refused() {
    let set = |key: &'static str, v: Value| {
        move |kvs: &mut Vec<(&'static str, Value)>| {
            kvs.iter_mut().find(|kv| kv.0 == key).unwrap().1 = v.clone();
        }
    };
    let strings = |v: &[&str]| {
        Value::Array(
            ValueType::String,
            v.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            tokenizer_file("mystery", |_| {}),
            "tokenizer.ggml.pre is \"mystery\"; supported: default, llama-bpe, llama3",
        ),
        (
            tokenizer_file(
                "gpt2",
                set("tokenizer.ggml.model", Value::String("t5".into())),
            ),
            "tokenizer.ggml.model is \"t5\"; supported: llama (SentencePiece), gpt2",
        ),
        (
            tokenizer_file(
                "gpt2",
                set("tokenizer.ggml.merges", strings(&["a b", "ab"])),
            ),
            "merge 1 \"ab\"",
        ),
        (
            tokenizer_file("gpt2", set("tokenizer.ggml.merges", strings(&["a Ċ"]))),
            "cannot build the BPE model",
        ),
        (
            tokenizer_file(
                "gpt2",
                set("tokenizer.ggml.tokens", strings(&["a", "b", "a"])),
            ),
            "\"a\" appears twice (ids 0 and 2)",
        ),
        (
            tokenizer_file(
                "gpt2",
                set(
                    "tokenizer.ggml.token_type",
                    Value::Array(ValueType::I32, vec![]),
                ),
            ),
            "0 entries for 17 tokens",
        ),
        (
            tokenizer_file("gpt2", set("tokenizer.ggml.bos_token_id", Value::U32(17))),
            "bos_token_id is 17, past the 17 tokens",
        ),
        (
            tokenizer_file("gpt2", set("tokenizer.ggml.eos_token_id", Value::F32(1.0))),
            "eos_token_id is f32 1",
        ),
    ];
    for (bytes, want) in cases {
        let err = build(bytes)
            .err()
            .expect("a damaged tokenizer was accepted")
            .to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    input_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_text: String,
}

#[test]
fn smollm2_tokenizer_gives_transformers_ids() {
    let Some(file) = smollm2() else { return };
    let path = shared().join("reference/smollm2/reference.json");
    let Ok(json) = std::fs::read_to_string(&path) else {
        eprintln!("skipping: {} not found (needs ../shared)", path.display());
        return;
    };
    let reference: Reference = serde_json::from_str(&json).unwrap();
    let tk = GgufTokenizer::from_gguf(file).unwrap();
    assert_eq!(tk.vocab_size(), 49152);
    assert_eq!(
        (tk.bos_id(), tk.eos_id(), tk.add_bos()),
        (Some(1), Some(2), false)
    );
    assert_eq!(tk.special_ids(), (0..17).collect::<Vec<u32>>().as_slice());
    assert_eq!(tk.token_to_id("<|im_start|>"), Some(1));
    assert!(tk.chat_template().unwrap().contains("<|im_end|>"));
    assert_eq!(reference.prompts.len(), 4);
    for p in &reference.prompts {
        assert_eq!(tk.encode(&p.text).unwrap(), p.input_ids, "{:?}", p.text);
        assert_eq!(tk.decode_bytes(&p.input_ids).unwrap(), p.text.as_bytes());
        assert_eq!(tk.decode(&p.greedy_ids).unwrap(), p.greedy_text);
    }
    // smollm's pre-tokenizer: every digit on its own, the space before a number apart.
    let id = |t: &str| tk.token_to_id(t).unwrap();
    assert_eq!(
        tk.encode(" 2024!").unwrap(),
        [id("Ġ"), id("2"), id("0"), id("2"), id("4"), id("!")]
    );
    // ... and so is any numeral, as in llama.cpp (the GPT-2 split alone gives `ĠÂ` + `²`).
    assert_eq!(tk.encode(" ²").unwrap(), [id("Ġ"), id("Â²")]);
    // Decoding every token agrees with the `tokenizers` ByteLevel decoder.
    let byte_level = ByteLevel::new(false, false, true);
    for i in 0..tk.vocab_size() as u32 {
        let token = tk.token_text(i).unwrap().to_string();
        let theirs = byte_level.decode(vec![token]).unwrap();
        assert_eq!(tk.decode(&[i]).unwrap(), theirs, "token {i}");
    }
    assert!(tk.decode(&[49152]).is_err());
}
