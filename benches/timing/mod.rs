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
