//! cargo fuzz target: grammars and JSON schemas drawn from the input (`fuzz_common::grammars`)
//! compiled as the server compiles a request's; a panic, an unclean error message or a compile
//! slower than 2 s is a finding (a stack overflow aborts, which libFuzzer reports too).
#![no_main]
#[path = "../../tests/fuzz_common/grammars.rs"]
mod grammars;
use grammars::{byte_vocab, case, clean, Choices};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use transformer::decode::constraint::ConstraintVocab;

fuzz_target!(|data: &[u8]| {
    static VOCAB: OnceLock<ConstraintVocab> = OnceLock::new();
    let vocab = VOCAB.get_or_init(byte_vocab);
    let Some((kind, grammar)) = case(&mut Choices::new(data)) else {
        return;
    };
    let start = Instant::now();
    if let Err(e) = vocab.compile(&grammar) {
        let message = e.to_string();
        assert!(clean(&message), "{kind}: unclean error {message:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(2), "{kind}: slow");
});
