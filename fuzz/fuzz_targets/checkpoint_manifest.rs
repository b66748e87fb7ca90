//! cargo fuzz target: the checkpoint manifest (checkpoint.json) of a translation checkpoint.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    judge(readers::manifest(dir, seeds, data));
});
