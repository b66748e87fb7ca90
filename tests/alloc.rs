//! The allocator tuning of `src/alloc.rs`. Its own test binary with one test, so no other test
//! thread allocates while `mallopt` runs (its safety condition).

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn allocator_settings_are_accepted_and_allocation_still_works() {
    use transformer::alloc::{keep_freed_buffers, MMAP_THRESHOLD};
    // SAFETY: this binary's only test; the harness's main thread only waits for it.
    assert!(
        unsafe { keep_freed_buffers() },
        "glibc refused the settings"
    );
    // Buffers around and above the threshold allocate, fill and free correctly, repeatedly
    // (the second round reuses the freed, still-mapped memory).
    for _ in 0..2 {
        for &n in &[
            1usize << 10,
            MMAP_THRESHOLD / 4 - 1,
            MMAP_THRESHOLD / 4 + 1,
            MMAP_THRESHOLD,
        ] {
            let v = vec![1.5f32; n];
            assert_eq!(v.iter().map(|&x| x as f64).sum::<f64>(), 1.5 * n as f64);
        }
    }
}
