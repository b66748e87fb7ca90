//! cargo fuzz target: a GGUF file: metadata, every tensor dequantised, llama config and tokenizer.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    judge(readers::gguf(data));
});
