//! Allocator tuning for training loops.
//!
//! A training step allocates and frees the same large activation buffers (megabytes each) every
//! step. glibc serves blocks above its mmap threshold with fresh `mmap` calls and returns them
//! with `munmap`, so each step faults every page in again (zeroed by the kernel, with TLB
//! shoot-downs across threads): about 15% of a base-model step in `perf`. Raising the mmap
//! threshold to its maximum and never trimming the heap makes freed buffers stay mapped and be
//! reused by the next step, which is what preallocated buffers would achieve, without threading
//! buffers through every layer.

/// Largest mmap threshold glibc accepts on 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX`).
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Tunes the process's allocator for training (glibc on Linux; elsewhere nothing happens).
/// Returns whether the settings were applied.
///
/// # Safety
/// Call it while the process has a single thread (first thing in `main`): glibc documents
/// `mallopt` as "MT-Unsafe const:mallopt", i.e. it writes settings that other threads' `malloc`
/// calls read without synchronisation.
pub unsafe fn keep_freed_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` takes plain integers and touches no memory of ours; the caller
        // guarantees no other thread runs (so no malloc races the settings it writes). The
        // values are within the documented ranges: M_MMAP_THRESHOLD at most
        // DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit), M_TRIM_THRESHOLD any int.
        unsafe {
            let mmap = libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
            let trim = libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
            mmap == 1 && trim == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
