//! cargo fuzz target: model.safetensors through the model loader (first byte odd: a language model), then used.
#![no_main]
#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;
use fuzz_common::{judge, readers, setup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (seeds, dir) = setup();
    let Some((&kind, weights)) = data.split_first() else {
        return;
    };
    judge(readers::model_weights(dir, seeds, kind & 1 == 1, weights));
});
