//! The allocator tuning of `src/alloc.rs`. `mallopt` may run only while no other thread
//! allocates (its safety condition), and this binary runs many tests at once: the test runs this
//! binary again as a child process that runs only this test, on one test thread, and checks
//! there.

/// Set in the child process, which applies the settings.
const CHILD: &str = "TRANSFORMER_ALLOC_TEST_CHILD";
/// This test's name as the harness lists it (the crate name left out).
const NAME: &str = "alloc::allocator_settings_are_accepted_and_allocation_still_works";

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn allocator_settings_are_accepted_and_allocation_still_works() {
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child process failed or did not run the test:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    use transformer::alloc::{keep_freed_buffers, MMAP_THRESHOLD};
    // SAFETY: in the child process, this is the only test and runs on the only test thread;
    // the harness's main thread only waits for it.
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
