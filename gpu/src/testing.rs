//! Test helpers: the device the tests run on, and seeded inputs.

use std::sync::OnceLock;

use crate::device::Gpu;

/// The first adapter, opened once for all tests; `None` (with the reason printed) where this
/// machine has none — unless `CI` is set, where a missing adapter fails the test: CI installs
/// Mesa's lavapipe so that these tests run.
pub fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::open(None) {
        Ok(g) => Some(g),
        Err(e) => {
            if std::env::var_os("CI").is_some_and(|v| v != "false" && !v.is_empty()) {
                panic!("CI is set and {e}");
            }
            eprintln!("skipped: {e}");
            None
        }
    })
    .as_ref()
}

/// `n` values in [-1, 1) from a seeded xorshift generator.
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Asserts `|got − want| ≤ rel·|want| + abs` element by element, naming the first miss.
pub fn assert_close(got: &[f32], want: &[f64], rel: f64, abs: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= rel * w.abs() + abs,
            "{what}: at {i} got {g}, want {w} (error {err:e})"
        );
    }
}
