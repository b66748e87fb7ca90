//! How the bytes of a GGUF file are held while a model runs from them (`TRANSFORMER_GGUF_MEMORY`).
//!
//! The block products read every weight once per decoded token, streaming the whole file
//! (100 MB for SmolLM2-135M at 4 bits, gigabytes for the models people download). Held in 4 KiB
//! pages, that stream crosses a page, and so a TLB miss, every 4096 bytes, more pages than any
//! TLB holds. Held in 2 MiB pages it crosses 512 times fewer.
//!
//! - [`FileMemory::Map`] (the default): the file mapped read-only, as llama.cpp maps it
//!   (`llama_mmap`), advised for huge pages (`madvise(MADV_HUGEPAGE)`) and then populated at
//!   once (`MADV_POPULATE_READ`, as llama.cpp's `MAP_POPULATE`). Nothing is copied: the
//!   tensors are read in the page cache's own pages, shared with every process that maps the
//!   file. Where the file system keeps files in large folios (ext4 and XFS on Linux ≥ 6.16),
//!   the advice makes a cold read fill the cache in 2 MiB folios, which the map then maps
//!   whole (`FilePmdMapped` in `/proc/PID/smaps`): the huge pages of the copy, without the copy.
//!   Populating also checks the file against the length it was opened with: a file that
//!   shrank in between is an error (`EFAULT`), not a `SIGBUS` at the first read of a missing
//!   page.
//! - [`FileMemory::HugePages`] (`TRANSFORMER_GGUF_MEMORY=hugepages`): the file read into a
//!   private anonymous mapping advised for transparent huge pages, then made read-only. It
//!   costs the file's size in fresh private memory, which the kernel zeroes before the read
//!   overwrites it (on a 2-core VM, 0.92 s for an 810 MB file already in the page cache, where
//!   the map takes 0.03 s), and the pages are not shared; its huge pages do not depend on the
//!   file system, and no later change to the file can reach it. Where the mapping or the
//!   advice fails, the file is mapped instead (the bytes are the same; only the speed differs).
//!
//! Measured in BENCHMARKS.md ("Huge pages for the weights", "Loading by the map").

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use crate::kernels::lowp::raw_bytes::SharedBuffer;

/// The environment variable that chooses how a GGUF file's bytes are held: `map` (the default)
/// or `hugepages` (a private copy).
pub const GGUF_MEMORY_ENV: &str = "TRANSFORMER_GGUF_MEMORY";

/// Where a GGUF file's bytes live while they are read (see the module's description).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileMemory {
    /// A private copy in memory advised for transparent huge pages.
    HugePages,
    /// The file mapped read-only, its pages the page cache's, advised for huge pages and
    /// populated at once.
    Map,
}

impl FileMemory {
    /// [`GGUF_MEMORY_ENV`] when set, else [`Map`](FileMemory::Map). A value other than
    /// `hugepages` or `map` is an error naming it.
    pub fn from_env() -> Result<FileMemory, String> {
        match std::env::var(GGUF_MEMORY_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(FileMemory::Map),
            Ok(v) if v == "hugepages" => Ok(FileMemory::HugePages),
            Ok(v) if v == "map" => Ok(FileMemory::Map),
            Ok(v) => Err(format!("{GGUF_MEMORY_ENV}={v}: expected hugepages or map")),
            Err(e) => Err(format!("{GGUF_MEMORY_ENV}: {e}")),
        }
    }
}

/// The `len` bytes of `file` held as `memory` says. Errors are the reads' and the map's; a
/// file shorter than `len` is an error either way (`UnexpectedEof` from the read, `EFAULT`,
/// as [`std::io::Error::raw_os_error`] 14, from populating the map).
pub fn hold(file: &File, len: usize, memory: FileMemory) -> std::io::Result<SharedBuffer> {
    if memory == FileMemory::HugePages && len > 0 {
        if let Some(mut anon) = advised_anonymous(len) {
            let mut reader = file;
            reader.read_exact(&mut anon[..])?;
            // Nothing past `len` may follow: a file that grew since its length was read is
            // read as it was then, as the map would see it.
            return Ok(Arc::new(anon.make_read_only()?));
        }
    }
    // SAFETY: `Mmap::map` is unsafe because the mapped bytes could change, or vanish, if the
    // file were modified or truncated by another process while it is mapped: the `&[u8]` read
    // from it would then not be immutable, or a read would fault. The map is read-only (this
    // crate never writes a GGUF file, through the map or otherwise), and, as llama.cpp, we
    // assume nobody truncates or rewrites the file in place while it is loaded (see
    // `super::gguf`'s description). The map's length is fixed when it is made, the parser
    // checks every range it reads against that length, and `populate` below refuses a file
    // that is shorter than it by the time it is mapped, so no read lands past its end.
    let map = unsafe { memmap2::MmapOptions::new().len(len).map(file)? };
    populate(&map)?;
    Ok(Arc::new(map))
}

/// Advises `map` for huge pages and reads every page of it in at once (Linux; nothing
/// elsewhere). The advice comes first: a page not yet in the page cache is then read into a
/// 2 MiB folio where the file system allows, and mapped whole. Either step the kernel does not
/// offer (`EINVAL`: no transparent huge pages, a kernel before 5.14) is skipped, the pages are
/// then faulted in as they are first read; a page past the file's end (it shrank since its
/// length was read) is an error (`EFAULT`).
fn populate(map: &memmap2::Mmap) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    if !map.is_empty() {
        let _ = map.advise(memmap2::Advice::HugePage);
        match map.advise(memmap2::Advice::PopulateRead) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file is shorter than the {} bytes it had when opened (was it \
                         truncated or rewritten while loading?)",
                        map.len()
                    ),
                ))
            }
            other => other?,
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = map;
    Ok(())
}

/// Gives back the memory of the whole pages inside `range` of the mapping that starts at
/// `base` (`madvise(MADV_DONTNEED)`): a mapped file's pages read as the file again if touched,
/// an anonymous mapping's as zeros. Returns the bytes given back (0 where `madvise` fails, which
/// changes nothing, and off Linux).
///
/// # Safety
/// `base` starts a mapping made by [`hold`] (on a page) that holds `range`; nothing may read
/// the bytes of `range` afterwards, nor hold a reference into them meanwhile.
pub unsafe fn give_back(base: *const u8, range: std::ops::Range<usize>) -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if page == 0 {
            return 0;
        }
        let (start, end) = (range.start.next_multiple_of(page), range.end / page * page);
        if start >= end {
            return 0;
        }
        // SAFETY: whole pages inside the caller's mapping (`base` is on a page, so `base +
        // start` is), which nobody reads again (the caller's contract); MADV_DONTNEED on a
        // private mapping only drops pages, the mapping stays.
        let done = unsafe {
            libc::madvise(base.add(start) as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
        };
        if done == 0 {
            end - start
        } else {
            0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (base, range);
        0
    }
}

/// A writable anonymous mapping of `len` bytes advised for transparent huge pages, or `None`
/// where either step fails (then the caller maps the file).
fn advised_anonymous(len: usize) -> Option<memmap2::MmapMut> {
    let anon = memmap2::MmapOptions::new().len(len).map_anon().ok()?;
    #[cfg(target_os = "linux")]
    anon.advise(memmap2::Advice::HugePage).ok()?;
    Some(anon)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn both_ways_hold_the_file_s_bytes() {
        let dir = std::env::temp_dir().join(format!("file-memory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bytes.bin");
        // Three huge pages and a bit: whole pages and a tail.
        let bytes: Vec<u8> = (0..(3 << 21) + 4099).map(|i| (i * 7 % 251) as u8).collect();
        File::create(&path).unwrap().write_all(&bytes).unwrap();
        for memory in [FileMemory::HugePages, FileMemory::Map] {
            let file = File::open(&path).unwrap();
            let held = hold(&file, bytes.len(), memory).unwrap();
            assert!((*held).as_ref() == &bytes[..], "{memory:?}");
        }
        // A length past the file's end (a file that shrank after its length was read) is an
        // error, not a fault: from the read of the copy, and from populating the map, which
        // would otherwise fault with SIGBUS at the first read of the page past the end.
        let longer = (bytes.len() + 4096).next_multiple_of(4096) + 10;
        for memory in [FileMemory::HugePages, FileMemory::Map] {
            if memory == FileMemory::HugePages && advised_anonymous(1).is_none() {
                continue;
            }
            if memory == FileMemory::Map && !cfg!(target_os = "linux") {
                continue;
            }
            let file = File::open(&path).unwrap();
            let err = hold(&file, longer, memory).err();
            assert_eq!(
                err.as_ref().map(|e| e.kind()),
                Some(std::io::ErrorKind::UnexpectedEof),
                "{memory:?}: {err:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
