//! How the bytes of a GGUF file are held while a model runs from them (`TRANSFORMER_GGUF_MEMORY`).
//!
//! The block products read every weight once per decoded token, streaming the whole file
//! (100 MB for SmolLM2-135M at 4 bits, gigabytes for the models people download). Held in 4 KiB
//! pages, that stream crosses a page, and so a TLB miss, every 4096 bytes, more pages than any
//! TLB holds. Held in 2 MiB transparent huge pages it crosses 512 times fewer.
//!
//! - [`FileMemory::HugePages`] (the default where the kernel offers transparent huge pages):
//!   the file is read into a private anonymous mapping advised with `madvise(MADV_HUGEPAGE)`,
//!   then made read-only. It costs one read of the file at load (from the page cache when it is
//!   there) and the file's size in private memory; the pages are not shared with other
//!   processes that load the same file. Where the mapping or the advice fails, the file is
//!   mapped instead (the bytes are the same; only the speed differs).
//! - [`FileMemory::Map`]: the file mapped read-only, as llama.cpp maps it by default
//!   (`llama_mmap`): nothing is read at load, and the page cache's pages are shared with every
//!   process that maps the file.
//!
//! Measured in BENCHMARKS.md ("Huge pages for the weights").

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use crate::kernels::lowp::raw_bytes::SharedBuffer;

/// The environment variable that chooses how a GGUF file's bytes are held: `hugepages` or `map`.
pub const GGUF_MEMORY_ENV: &str = "TRANSFORMER_GGUF_MEMORY";

/// Where a GGUF file's bytes live while they are read (see the module's description).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileMemory {
    /// A private copy in memory advised for transparent huge pages.
    HugePages,
    /// The file mapped read-only, its pages the page cache's.
    Map,
}

impl FileMemory {
    /// [`GGUF_MEMORY_ENV`] when set, else [`HugePages`](FileMemory::HugePages) where the
    /// kernel offers transparent huge pages to `madvise` (Linux, not `never`), else
    /// [`Map`](FileMemory::Map). A value other than `hugepages` or `map` is an error naming it.
    pub fn from_env() -> Result<FileMemory, String> {
        match std::env::var(GGUF_MEMORY_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(FileMemory::default_here()),
            Ok(v) if v == "hugepages" => Ok(FileMemory::HugePages),
            Ok(v) if v == "map" => Ok(FileMemory::Map),
            Ok(v) => Err(format!("{GGUF_MEMORY_ENV}={v}: expected hugepages or map")),
            Err(e) => Err(format!("{GGUF_MEMORY_ENV}: {e}")),
        }
    }

    /// Huge pages where `/sys/kernel/mm/transparent_hugepage/enabled` allows them to an
    /// advised mapping (`[always]` or `[madvise]`), else the map.
    fn default_here() -> FileMemory {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        match setting {
            Ok(s) if s.contains("[always]") || s.contains("[madvise]") => FileMemory::HugePages,
            _ => FileMemory::Map,
        }
    }
}

/// The `len` bytes of `file` held as `memory` says. Errors are the reads' and the map's.
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
    // `super::gguf`'s description). The map's length is fixed when it is made, and the parser
    // checks every range it reads against that length, so no read lands past its end.
    let map = unsafe { memmap2::MmapOptions::new().len(len).map(file)? };
    Ok(Arc::new(map))
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
        // A length past the file's end is an error when read (a map would fault on the
        // missing pages instead, so the caller takes the length from the file).
        if advised_anonymous(1).is_some() {
            let file = File::open(&path).unwrap();
            let err = hold(&file, bytes.len() + 10, FileMemory::HugePages).err();
            assert_eq!(
                err.map(|e| e.kind()),
                Some(std::io::ErrorKind::UnexpectedEof)
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
