//! GGUF files (llama.cpp's model format), version 3: metadata, tensor infos and tensor data.
//!
//! The layout, all integers little-endian (ggml's `gguf.cpp` and the GGUF specification):
//!
//! ```text
//! magic "GGUF" | version: u32 (= 3) | tensor_count: u64 | kv_count: u64
//! kv_count × { key: string | value_type: u32 | value }
//! tensor_count × { name: string | n_dims: u32 (≤ 4) | ne: [u64; n_dims] | ggml_type: u32 | offset: u64 }
//! padding to `general.alignment` (a u32 power of two; 32 when absent)
//! data section: each tensor at data_start + offset (a multiple of the alignment)
//! ```
//!
//! A string is `len: u64` then `len` UTF-8 bytes (no terminator). Value types: 0 u8, 1 i8,
//! 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (one byte, non-zero = true), 8 string,
//! 9 array (`element_type: u32 | count: u64 | count` values, arrays may nest), 10 u64,
//! 11 i64, 12 f64.
//!
//! Tensor dimensions are listed fastest-varying first: `ne[0]` is the length of a row, so a
//! PyTorch `Linear` weight `[out, in]` is stored with `ne = [in, out]`. [`TensorInfo::dims`]
//! keeps that order; [`TensorInfo::shape`] is the reverse, the row-major shape the rest of the
//! crate uses (slowest first: `[rows, cols]` for a matrix). The element types and their block
//! layouts are in [`super::ggml`].
//!
//! [`GgufFile::open`] holds the file's bytes as [`super::file_memory`] says: by default mapped
//! read-only as llama.cpp maps it (`llama_mmap`), advised for huge pages and populated at once:
//! the tensors' bytes are read in place from the page cache, shared with every process that
//! maps the same file, and nothing is copied; or, with `TRANSFORMER_GGUF_MEMORY=hugepages`,
//! read once into private memory in transparent huge pages. A map assumes, as llama.cpp does,
//! that nobody truncates or rewrites the file while it is mapped (a page cut off by a
//! truncation would fault with SIGBUS when read); what guards the rest: the length is taken
//! from the opened file, every tensor's range is checked against it before anything is read
//! (a truncated file is an error naming the file and the tensor), and populating the map
//! refuses a file that shrank between that length and the map. Replacing a file by a rename,
//! as our own saves and most downloaders do, leaves the mapped file intact. Either way the
//! tensors are read where the bytes are held, never copied again (except the few forms that
//! a block product regroups, see [`GgufFile::release`]).
//! [`GgufFile::from_bytes`] parses bytes already in memory (tests, fuzzing).
//!
//! Every count, length and offset is checked against the bytes that remain before it is used,
//! and every tensor's range against the file's length before any tensor is read, so a
//! truncated or corrupt file gives an error that names the field, never a panic or a fault;
//! lists grow as their items are actually read, so a count the file claims never reserves
//! memory its bytes do not back.

use super::ckpt_err;
use super::file_memory::{self, FileMemory};
pub use super::gguf_value::{FromValue, Value, ValueType};
use crate::error::Result;
use crate::kernels::lowp::ggml::{self, GgmlType};
use crate::kernels::lowp::RawBytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The file's first four bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The only version read.
pub const VERSION: u32 = 3;
/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's limit on a tensor's dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays read (GGUF sets none; this keeps a crafted file from exhausting
/// the stack).
const MAX_ARRAY_DEPTH: usize = 8;

/// Where one tensor is and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF's dimensions, fastest-varying first (`dims[0]` is the row length, ggml's `ne[0]`).
    pub dims: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Start of the data, relative to the data section (a multiple of the alignment).
    pub offset: usize,
    /// Number of elements (the product of `dims`; 1 for no dimensions).
    pub n_elements: usize,
    /// Bytes of data; `None` for a type this reader does not decode (its size is not known
    /// here, so its data is neither bounds-checked nor readable).
    pub n_bytes: Option<usize>,
}

impl TensorInfo {
    /// The row-major shape, slowest-varying first: `dims` reversed (`[rows, cols]` for a
    /// matrix, `[out, in]` for a linear layer's weight, `[vocab, d_model]` for an embedding).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// The tensor as a matrix of rows of `dims[0]` elements: `(rows, cols)`.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1);
        (self.n_elements.checked_div(cols).unwrap_or(0), cols)
    }
}

/// A parsed GGUF file, its bytes mapped or in memory (shared with the tensors taken from it by
/// [`GgufFile::tensor_bytes`], which keep them alive after this value is dropped).
pub struct GgufFile {
    path: PathBuf,
    bytes: RawBytes,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_start: usize,
    /// Whether `bytes` is the file's own mapping ([`file_memory::hold`]), whose pages
    /// [`GgufFile::release`] may give back.
    held: bool,
    /// Byte ranges given back by [`GgufFile::release`]: no longer readable here.
    released: std::sync::Mutex<Vec<std::ops::Range<usize>>>,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field in the error.
    fn take(&mut self, n: u64, what: &str) -> std::result::Result<&'a [u8], String> {
        if n > self.remaining() as u64 {
            return Err(format!(
                "truncated file: {what} needs {n} bytes at offset {}, but only {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| format!("{what}: string is not valid UTF-8 ({e})"))
    }

    /// A value of type code `code` for key `key` (arrays nested `depth` deep).
    fn value(&mut self, code: u32, key: &str, depth: usize) -> std::result::Result<Value, String> {
        let ty = ValueType::from_code(code)
            .ok_or_else(|| format!("key {key}: unknown value type {code}"))?;
        let v = match ty {
            ValueType::U8 => Value::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(key)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(key)?[0] != 0),
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "key {key}: arrays nested more than {MAX_ARRAY_DEPTH} deep"
                    ));
                }
                let code = self.u32(key)?;
                let elem = ValueType::from_code(code)
                    .ok_or_else(|| format!("key {key}: array of unknown value type {code}"))?;
                let count = self.u64(key)?;
                let need = count.checked_mul(elem.min_size());
                if need.is_none_or(|need| need > self.remaining() as u64) {
                    return Err(format!(
                        "key {key}: array of {count} {} values needs at least {} bytes, but only \
                         {} remain in the file",
                        elem.name(),
                        need.map_or("more than 2^64".to_string(), |n| n.to_string()),
                        self.remaining()
                    ));
                }
                // Grows as elements are read (each consumes bytes), whatever `count` claims.
                let mut items = Vec::with_capacity((count as usize).min(1 << 16));
                for _ in 0..count {
                    items.push(self.value(code, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        };
        Ok(v)
    }
}

impl GgufFile {
    /// Holds the GGUF file at `path` in memory (in huge pages or mapped, see the module's
    /// description) and parses it: tensors are then read where the bytes are held.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let memory = FileMemory::from_env().map_err(|e| ckpt_err(path, e))?;
        GgufFile::open_with(path, memory)
    }

    /// [`GgufFile::open`], its bytes held as `memory` says (whatever the environment says).
    pub fn open_with(path: &Path, memory: FileMemory) -> Result<GgufFile> {
        let mut file = GgufFile::from_shared(hold_file(path, memory)?, path)?;
        file.held = true;
        Ok(file)
    }

    /// Parses a GGUF file's bytes; `path` is only used in messages.
    pub fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<GgufFile> {
        GgufFile::from_shared(RawBytes::owned(bytes), path)
    }

    /// Parses a GGUF file's bytes held in a shared buffer (a memory map, say); `path` is only
    /// used in messages.
    pub fn from_shared(bytes: RawBytes, path: &Path) -> Result<GgufFile> {
        parse(bytes, path).map_err(|reason| ckpt_err(path, reason))
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data-section alignment (`general.alignment`, or 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The raw value of `key`.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key` as `T`: `None` when absent, an error naming the key, its type and
    /// what was expected when present but not a `T`.
    pub fn get<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>> {
        let Some(v) = self.value(key) else {
            return Ok(None);
        };
        T::from_value(v).map(Some).ok_or_else(|| {
            ckpt_err(
                &self.path,
                format!(
                    "metadata key {key} is {}, expected {}",
                    v.describe(),
                    T::EXPECTED
                ),
            )
        })
    }

    /// Like [`GgufFile::get`], but the key must be there.
    pub fn require<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T> {
        self.get(key)?
            .ok_or_else(|| ckpt_err(&self.path, format!("metadata key {key} is missing")))
    }

    /// `general.architecture` (`llama`, ...).
    pub fn architecture(&self) -> Result<&str> {
        self.require("general.architecture")
    }

    /// The chat template (`tokenizer.chat_template`, a Jinja template), if the file has one.
    pub fn chat_template(&self) -> Result<Option<&str>> {
        self.get("tokenizer.chat_template")
    }

    /// Every tensor's info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| ckpt_err(&self.path, format!("no tensor named {name}")))
    }

    /// The stored bytes of a tensor (an error for a type this reader does not decode).
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        let n_bytes = info.n_bytes.ok_or_else(|| {
            ckpt_err(
                &self.path,
                format!(
                    "tensor {} has ggml type {}, which this reader cannot decode \
                     (supported: {})",
                    info.name,
                    info.ggml_type,
                    ggml::SUPPORTED
                ),
            )
        })?;
        // In bounds: checked when the file was parsed.
        let start = self.data_start + info.offset;
        let released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        if released.iter().any(|r| r.start < start + n_bytes && start < r.end) {
            return Err(ckpt_err(
                &self.path,
                format!(
                    "tensor {}: its bytes were given back after a block product took its own \
                     copy of them",
                    info.name
                ),
            ));
        }
        Ok(&self.bytes[start..start + n_bytes])
    }

    /// Gives back the memory of the tensor of `info` (the whole pages inside its bytes), once
    /// what multiplies it holds its own copy (`Q5_0` / `Q5_1` regrouped at load): the bytes
    /// are not read again, and [`GgufFile::tensor_data`] refuses them from now on. Returns the
    /// bytes given back (none for a file not held by [`GgufFile::open`]).
    ///
    /// # Safety
    /// Nothing read from this tensor's bytes ([`GgufFile::tensor_data`],
    /// [`GgufFile::tensor_bytes`], of it or of a tensor overlapping it) may be alive: the
    /// pages given back read as zeros, or as the file's bytes again, afterwards.
    pub unsafe fn release(&self, info: &TensorInfo) -> usize {
        let Ok(data) = self.tensor_data(info) else {
            return 0;
        };
        let start = self.data_start + info.offset;
        let range = start..start + data.len();
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        released.push(range.clone());
        if !self.held {
            return 0;
        }
        // SAFETY: `range` lies in the file's mapping (bounds checked at parse), which `bytes`
        // keeps alive and which starts on a page (a map); nothing read from it is alive (the
        // caller's contract), and `released` refuses every read of it from now on (the lock
        // held here orders this with them).
        unsafe { file_memory::give_back(self.bytes.as_ptr(), range) }
    }

    /// Like [`GgufFile::tensor_data`], but the bytes shared with the file's buffer (no copy),
    /// so that they outlive this value.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<RawBytes> {
        let n_bytes = self.tensor_data(info)?.len();
        let start = self.data_start + info.offset;
        Ok(self
            .bytes
            .slice(start..start + n_bytes)
            .expect("tensor bounds checked when the file was parsed"))
    }

    /// The tensor `name` decoded to f32, row-major in [`TensorInfo::shape`] order.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        self.dequantize_info(self.tensor(name)?)
    }

    /// Like [`GgufFile::dequantize`], given the tensor's info.
    pub fn dequantize_info(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let data = self.tensor_data(info)?;
        ggml::dequantize(info.ggml_type, data, info.n_elements)
            .map_err(|e| ckpt_err(&self.path, format!("tensor {}: {e}", info.name)))
    }

    /// The tensor of `info` decoded into `out` (which must hold exactly its elements), e.g.
    /// straight into a model's parameter.
    pub fn dequantize_into(&self, info: &TensorInfo, out: &mut [f32]) -> Result<()> {
        if out.len() != info.n_elements {
            return Err(ckpt_err(
                &self.path,
                format!(
                    "tensor {} has {} elements, not the {} asked for",
                    info.name,
                    info.n_elements,
                    out.len()
                ),
            ));
        }
        let data = self.tensor_data(info)?;
        ggml::dequantize_into(info.ggml_type, data, out)
            .map_err(|e| ckpt_err(&self.path, format!("tensor {}: {e}", info.name)))
    }
}

/// The whole file at `path`, held as `memory` says ([`super::file_memory`]: mapped read-only,
/// or in huge pages); errors name the file (missing, a directory, unreadable, shorter than when
/// opened).
pub(crate) fn hold_file(path: &Path, memory: FileMemory) -> Result<RawBytes> {
    let cannot = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ckpt_err(path, "file not found")
        } else if path.is_dir() {
            ckpt_err(path, "is a directory, not a file")
        } else {
            ckpt_err(path, format!("cannot read: {e}"))
        }
    };
    let file = std::fs::File::open(path).map_err(cannot)?;
    let metadata = file.metadata().map_err(cannot)?;
    if metadata.is_dir() {
        return Err(ckpt_err(path, "is a directory, not a file"));
    }
    let len = usize::try_from(metadata.len())
        .map_err(|_| ckpt_err(path, "is larger than this machine's address space"))?;
    let held = file_memory::hold(&file, len, memory).map_err(cannot)?;
    Ok(RawBytes::shared(held, 0..len).expect("the whole file is inside it"))
}

/// Rounds `pos` up to a multiple of `align` (a power of two).
fn align_up(pos: usize, align: usize) -> Option<usize> {
    pos.checked_add(align - 1).map(|p| p & !(align - 1))
}

fn parse(bytes: RawBytes, path: &Path) -> std::result::Result<GgufFile, String> {
    let mut r = Reader {
        bytes: &bytes,
        pos: 0,
    };
    let magic = r.take(4, "the magic number")?;
    if magic != MAGIC {
        return Err(format!(
            "not a GGUF file: it starts with {magic:02x?}, not \"GGUF\" (47 47 55 46)"
        ));
    }
    let version = r.u32("the version")?;
    if version != VERSION {
        let hint = if version & 0xffff == 0 {
            " (a big-endian file?)"
        } else {
            ""
        };
        return Err(format!(
            "GGUF version {version} is not supported{hint}: only version {VERSION} is read"
        ));
    }
    let n_tensors = r.u64("the tensor count")?;
    let n_kv = r.u64("the metadata key count")?;
    // Lower bounds on what the counts need: a key/value is at least a key length, a type and
    // a one-byte value; a tensor info at least a name length, n_dims, a type and an offset.
    check_count(&r, n_kv, 13, "metadata key/value pairs")?;

    let mut metadata = Vec::with_capacity((n_kv as usize).min(1 << 12));
    let mut key_index = HashMap::new();
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key {i}"))?;
        if key.is_empty() {
            return Err(format!("metadata key {i} is empty"));
        }
        if key_index.contains_key(&key) {
            return Err(format!("metadata key {key} appears twice"));
        }
        let code = r.u32(&key)?;
        let value = r.value(code, &key, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a as usize,
        Some(v) => {
            return Err(format!(
                "general.alignment is {}, expected a u32 power of two",
                v.describe()
            ))
        }
    };

    check_count(&r, n_tensors, 24, "tensor infos")?;
    let mut tensors = Vec::with_capacity((n_tensors as usize).min(1 << 12));
    let mut tensor_index = HashMap::new();
    for i in 0..n_tensors {
        let info = tensor_info(&mut r, i)?;
        if tensor_index
            .insert(info.name.clone(), tensors.len())
            .is_some()
        {
            return Err(format!("tensor name {} appears twice", info.name));
        }
        tensors.push(info);
    }

    let data_start = align_up(r.pos, alignment).ok_or("data section offset overflows")?;
    if !tensors.is_empty() && data_start > bytes.len() {
        return Err(format!(
            "truncated file: the data section would start at offset {data_start}, past the end \
             of the file ({} bytes)",
            bytes.len()
        ));
    }
    for t in &tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor {}: data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        if let Some(n_bytes) = t.n_bytes {
            let end = data_start
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(n_bytes));
            if end.is_none_or(|end| end > bytes.len()) {
                return Err(format!(
                    "tensor {}: its {n_bytes} bytes at data offset {} (file offset {}) lie past \
                     the end of the file ({} bytes)",
                    t.name,
                    t.offset,
                    data_start as u128 + t.offset as u128,
                    bytes.len()
                ));
            }
        }
    }

    Ok(GgufFile {
        path: path.to_path_buf(),
        bytes,
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
        held: false,
        released: Default::default(),
    })
}

/// Refuses a count of items of at least `min_size` bytes each that the rest of the file cannot
/// hold.
fn check_count(
    r: &Reader,
    count: u64,
    min_size: u64,
    what: &str,
) -> std::result::Result<(), String> {
    if count
        .checked_mul(min_size)
        .is_none_or(|n| n > r.remaining() as u64)
    {
        return Err(format!(
            "the header declares {count} {what}, which need at least {min_size} bytes each, but \
             only {} bytes remain in the file",
            r.remaining()
        ));
    }
    Ok(())
}

/// Reads tensor info number `i`.
fn tensor_info(r: &mut Reader, i: u64) -> std::result::Result<TensorInfo, String> {
    let name = r.string(&format!("the name of tensor {i}"))?;
    let what = format!("the info of tensor {name}");
    let n_dims = r.u32(&what)?;
    if n_dims as usize > MAX_DIMS {
        return Err(format!(
            "tensor {name} has {n_dims} dimensions, more than ggml's {MAX_DIMS}"
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let d = r.u64(&what)?;
        dims.push(
            usize::try_from(d)
                .ok()
                .filter(|&d| d <= i64::MAX as usize)
                .ok_or_else(|| format!("tensor {name} has dimension {d}, out of range"))?,
        );
    }
    let n_elements = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("tensor {name}: element count of dims {dims:?} overflows"))?;
    let ggml_type = GgmlType::from_code(r.u32(&what)?);
    let offset = r.u64(&what)?;
    let offset = usize::try_from(offset)
        .map_err(|_| format!("tensor {name}: data offset {offset} is out of range"))?;
    let n_bytes = match ggml_type.block() {
        None => None,
        Some((block_n, block_bytes)) => {
            let row = dims.first().copied().unwrap_or(1);
            if !row.is_multiple_of(block_n) {
                return Err(format!(
                    "tensor {name}: rows of {row} {ggml_type} elements are not a whole number of \
                     {block_n}-element blocks"
                ));
            }
            Some(
                (n_elements / block_n)
                    .checked_mul(block_bytes)
                    .ok_or_else(|| format!("tensor {name}: byte size overflows"))?,
            )
        }
    };
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}
