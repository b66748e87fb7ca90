//! cargo fuzz target: config.json for both model kinds (first byte odd: loaded as a language model).
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    let Some((&kind, json)) = data.split_first() else {
        return;
    };
    judge(readers::config(dir, seeds, kind & 1 == 1, json));
});
