//! Random grammars and JSON schemas (`fuzz_common::grammars`: rule chains, deep nesting,
//! recursion, `$ref` chains and cycles, wide `anyOf`, long literals) compiled as the server
//! compiles a request's: every case compiles or is refused with a short clean sentence, within
//! 2 s, and nothing panics or overflows a stack (an overflow would abort this test binary).
//! Seeded; runs for `TRANSFORMER_FUZZ_SECONDS` (default 3 s). `fuzz/fuzz_targets/grammars.rs`
//! runs the same generator coverage-guided.

use crate::fuzz_common::grammars::{byte_vocab, case, clean, Choices};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use transformer::rng::Rng;

#[test]
fn random_grammars_compile_or_are_refused_cleanly_in_time() {
    let seconds: f64 = std::env::var("TRANSFORMER_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let vocab = byte_vocab();
    let mut rng = Rng::new(44);
    // Per kind: (compiled, refused, slowest).
    let mut seen: BTreeMap<&str, (usize, usize, Duration)> = BTreeMap::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let data: Vec<u8> = (0..48).map(|_| rng.next_u64() as u8).collect();
        let Some((kind, grammar)) = case(&mut Choices::new(&data)) else {
            continue;
        };
        let t = Instant::now();
        let result = vocab.compile(&grammar);
        let took = t.elapsed();
        let shown = format!("{grammar:?}");
        let shown: String = shown.chars().take(300).collect();
        assert!(
            took < Duration::from_secs(2),
            "{kind} took {took:?}: {shown}"
        );
        let entry = seen.entry(kind).or_default();
        entry.2 = entry.2.max(took);
        match result {
            Ok(_) => entry.0 += 1,
            Err(e) => {
                let message = e.to_string();
                assert!(clean(&message), "{kind}: unclean {message:?} for {shown}");
                entry.1 += 1;
            }
        }
    }
    for (kind, (compiled, refused, slowest)) in &seen {
        println!(
            "fuzz grammars {kind}: {compiled} compiled, {refused} refused, slowest {slowest:?}"
        );
    }
    assert_eq!(seen.len(), 7, "every kind of case ran: {seen:?}");
    let total: usize = seen.values().map(|(c, r, _)| c + r).sum();
    assert!(total >= 30, "only {total} cases");
}
