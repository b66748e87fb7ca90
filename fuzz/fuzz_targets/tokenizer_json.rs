//! cargo fuzz target: a byte-level BPE tokenizer.json, loaded, used and driving the seed language model.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    judge(readers::tokenizer(dir, seeds, data));
});
