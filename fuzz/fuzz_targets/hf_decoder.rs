//! cargo fuzz target: a Hugging Face decoder directory (../shared's tiny Llama and GPT-2, one file replaced).
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

// First byte: which seed directory; second: which of its files the rest replaces.
fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    let dirs = &seeds.hf_decoders;
    let [d, f, bytes @ ..] = data else { return };
    if dirs.is_empty() {
        return;
    }
    let files = &dirs[*d as usize % dirs.len()];
    let name = files[*f as usize % files.len()].0;
    judge(readers::hf_decoder(dir, files, name, bytes));
});
