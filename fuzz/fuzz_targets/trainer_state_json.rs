//! cargo fuzz target: trainer_state.json, parsed for both recipes, then resumed for one update.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    judge(readers::trainer_state(dir, seeds, data));
});
