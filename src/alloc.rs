//! Allocator tuning for training loops, and giving memory back once weights are released.
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

/// Gives the heap's free pages back to the system (glibc's `malloc_trim(0)`), which
/// [`keep_freed_buffers`] otherwise keeps mapped for reuse: for memory that will not be asked
/// for again, such as the float32 weights a translator releases once it holds each weight in
/// one form (`Seq2Seq::prepare_alone`). Returns whether any memory was given back (never
/// elsewhere than glibc on Linux).
pub fn give_back_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes a plain integer (the padding to keep) and touches only
        // the allocator's own free chunks, under its arenas' locks (glibc documents it
        // "MT-Safe"), so it may run beside other threads' allocations.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Freed heap blocks (64 KiB each, under glibc's default mmap threshold) are given back.
    #[test]
    fn freed_heap_memory_is_given_back() {
        let blocks: Vec<Vec<u8>> = (0..2048).map(|i| vec![i as u8; 64 << 10]).collect();
        let kept = blocks.last().cloned();
        drop(blocks);
        assert!(super::give_back_free_memory());
        assert_eq!(kept.map(|b| b[0]), Some(255));
    }
}
