//! Whole models and what runs them: decoding (greedy, beam, sampling, the incremental
//! interface), the language model, BLEU, GGUF files and their tokenizers, and the pretrained
//! models of `../shared` against their references.
//!
//! One test binary (cargo builds `tests/models/main.rs` as the target `models`); each module was
//! its own binary before. Run one module with `cargo test --test models MODULE::`.

#[path = "../gguf_common/mod.rs"]
mod gguf_common;

mod beam;
mod bleu;
mod chat_templates;
mod ctranslate2;
mod ctranslate2_nllb;
mod decode_interface;
mod decoding;
mod dense_families;
mod device;
mod families;
mod gemma;
mod generation_config;
mod gguf;
mod gguf_tokenizer;
mod gguf_vocab_suite;
mod gptoss;
mod kquants;
mod kv_quant;
mod lm;
mod long_context;
mod marian;
mod minilm;
mod moe;
mod nllb;
mod pretrained;
mod pretrained_lowp;
mod pruning;
mod qwen35;
mod qwen35_moe;
mod seq2seq_reference;
mod speculative;
mod t5;
mod torch_file;
