//! What the kernel benchmarks share: the median time of a closure.

use std::time::Instant;

/// The median of `reps` timed calls of `f`, after one untimed warm-up call, in seconds.
pub fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

/// A pseudo-random byte stream (xorshift; no rand dependency in benches). Not every benchmark
/// that shares this module uses it.
#[allow(dead_code)]
pub fn pseudo_random_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as u8
        })
        .collect()
}
