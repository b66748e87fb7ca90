//! cargo fuzz target: vocab.json (with the seed BPE tokenizer beside it), loaded, used and translated with.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    judge(readers::vocab(dir, seeds, data, &seeds.bpe_vocab.1));
});
