//! PyTorch checkpoints (`pytorch_model.bin`: `torch.save` of a state dict, the zip format of
//! torch ≥ 1.6) read without Python: the archive's `data.pkl` is run by our pickle reader
//! ([`super::pickle`]), each tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size,
//! stride, ...)` (or an `nn.Parameter` around one), and each storage is the archive's
//! `data/<key>`, little-endian. Float tensors (float32, float16, bfloat16) become f32, strided
//! views gathered (a tied or transposed tensor reads its shared storage); integer and boolean
//! buffers (`position_ids`, masks) are left out, as they are no weights. Refused by name: the
//! legacy format of `torch.save(..., _use_new_zipfile_serialization=False)`, float64 and other
//! storage types, a file whose pickle is not a dict of tensors, a big-endian archive.

use super::pickle::{self, Value};
use super::{ckpt_err, TensorMap};
use crate::error::Result;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// The PyTorch checkpoint of a Hugging Face directory.
pub const TORCH_FILE: &str = "pytorch_model.bin";
/// The index of a sharded one.
pub const TORCH_INDEX_FILE: &str = "pytorch_model.bin.index.json";

/// The element types of the storages we read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    F32,
    F16,
    Bf16,
    /// Integer and boolean storages: their tensors are left out.
    Other,
}

impl Storage {
    fn of(name: &str) -> std::result::Result<Storage, String> {
        Ok(match name {
            "FloatStorage" => Storage::F32,
            "HalfStorage" => Storage::F16,
            "BFloat16Storage" => Storage::Bf16,
            "LongStorage" | "IntStorage" | "ShortStorage" | "CharStorage" | "ByteStorage"
            | "BoolStorage" => Storage::Other,
            other => return Err(format!("storage type {other} is not supported")),
        })
    }

    fn width(self) -> usize {
        match self {
            Storage::F32 => 4,
            Storage::F16 | Storage::Bf16 => 2,
            Storage::Other => 1,
        }
    }

    fn value(self, b: &[u8]) -> f32 {
        match self {
            Storage::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Storage::F16 => super::ggml::f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            Storage::Bf16 => {
                crate::kernels::lowp::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
            }
            Storage::Other => unreachable!("left out"),
        }
    }
}

/// One tensor of the pickle: where its values are.
struct TensorRef {
    storage: Storage,
    key: String,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

/// The float tensors of the PyTorch checkpoint `path` as f32 (names `skip` accepts left out).
pub fn read_torch_tensors(path: &Path, skip: impl Fn(&str) -> bool) -> Result<TensorMap> {
    let bad = |reason: String| ckpt_err(path, reason);
    let mut file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(|e| bad(format!("cannot read: {e}")))?;
    if n == 2 && magic == [0x80, 0x02] {
        return Err(bad("a PyTorch file in the legacy format (torch.save with \
                        _use_new_zipfile_serialization=False, or torch < 1.6) is not \
                        supported: save it again with torch >= 1.6, or as safetensors"
            .into()));
    }
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| bad(format!("not a PyTorch checkpoint (a zip archive): {e}")))?;
    let pkl_name = (archive.file_names())
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("data.pkl") && n.matches('/').count() == 1)
        .ok_or_else(|| bad("no data.pkl in the archive (not a torch.save file)".into()))?;
    let prefix = pkl_name.trim_end_matches("data.pkl").to_string();
    let read_entry = |archive: &mut zip::ZipArchive<std::fs::File>, name: &str| {
        let mut entry = archive
            .by_name(name)
            .map_err(|e| bad(format!("{name}: {e}")))?;
        // (An entry cannot be larger than the archive: a corrupt header asks for no more.)
        let mut bytes = Vec::with_capacity(entry.size().min(file_len) as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("{name}: cannot read (truncated?): {e}")))?;
        Ok::<_, crate::error::Error>(bytes)
    };
    if archive.index_for_name(&format!("{prefix}byteorder")).is_some() {
        let order = read_entry(&mut archive, &format!("{prefix}byteorder"))?;
        if order != b"little" {
            return Err(bad(format!(
                "byteorder {:?}: only little-endian archives are read",
                String::from_utf8_lossy(&order)
            )));
        }
    }
    let pickled = read_entry(&mut archive, &pkl_name)?;
    let value = pickle::parse(&pickled).map_err(|e| bad(format!("{pkl_name}: {e}")))?;
    let refs = state_dict(value).map_err(|e| bad(format!("{pkl_name}: {e}")))?;
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut out = TensorMap::new();
    for (name, t) in refs {
        if t.storage == Storage::Other || skip(&name) {
            continue;
        }
        if !storages.contains_key(&t.key) {
            let bytes = read_entry(&mut archive, &format!("{prefix}data/{}", t.key))?;
            storages.insert(t.key.clone(), bytes);
        }
        let values = gather(&storages[&t.key], &t).map_err(|e| bad(format!("{name}: {e}")))?;
        out.insert(name, (t.shape, values));
    }
    Ok(out)
}

/// The tensor references of a pickled state dict.
fn state_dict(value: Value) -> std::result::Result<Vec<(String, TensorRef)>, String> {
    let Value::Dict(items) = value else {
        return Err("the pickle is not a dict of tensors (a state dict)".into());
    };
    let mut out = Vec::with_capacity(items.len());
    for (key, value) in items {
        let Value::Str(name) = key else {
            return Err(format!("a key that is not a string: {key:?}"));
        };
        let t = tensor(value).map_err(|e| format!("{name}: {e}"))?;
        out.push((name, t));
    }
    Ok(out)
}

fn int(v: &Value) -> std::result::Result<usize, String> {
    match v {
        Value::Int(n) => usize::try_from(*n).map_err(|_| format!("{n} is not a size")),
        other => Err(format!("{other:?} is not an integer")),
    }
}

fn ints(v: &Value) -> std::result::Result<Vec<usize>, String> {
    match v {
        Value::Tuple(items) => items.iter().map(int).collect(),
        other => Err(format!("{other:?} is not a tuple of integers")),
    }
}

/// A tensor's reference from `_rebuild_tensor_v2(storage, offset, size, stride, ...)`, or from
/// `_rebuild_parameter(tensor, requires_grad, hooks)` around one.
fn tensor(value: Value) -> std::result::Result<TensorRef, String> {
    let Value::Call(callable, args) = value else {
        return Err("not a tensor".into());
    };
    let Value::Global(module, function) = *callable else {
        return Err("not a tensor".into());
    };
    match (module.as_str(), function.as_str(), &args[..]) {
        ("torch._utils", "_rebuild_parameter", [inner, ..]) => tensor(inner.clone()),
        ("torch._utils", "_rebuild_tensor_v2", [storage, offset, size, stride, ..]) => {
            let Value::Persistent(id) = storage else {
                return Err("a tensor whose storage is not in the archive".into());
            };
            let Value::Tuple(id) = id.as_ref() else {
                return Err("a storage id that is not a tuple".into());
            };
            let (storage, key) = match &id[..] {
                [Value::Str(kind), Value::Global(_, ty), Value::Str(key), ..] if kind == "storage" => {
                    (Storage::of(ty)?, key.clone())
                }
                _ => return Err(format!("an unknown storage id {id:?}")),
            };
            let (shape, stride) = (ints(size)?, ints(stride)?);
            if shape.len() != stride.len() {
                return Err(format!("size {shape:?} and stride {stride:?} differ in rank"));
            }
            let offset = int(offset)?;
            Ok(TensorRef {
                storage,
                key,
                offset,
                shape,
                stride,
            })
        }
        _ => Err(format!("{module}.{function} is not a tensor this reader builds")),
    }
}

/// The values of `t` in row-major order, read from its storage's bytes by its strides.
fn gather(bytes: &[u8], t: &TensorRef) -> std::result::Result<Vec<f32>, String> {
    let width = t.storage.width();
    let numel = (t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)))
        .ok_or("its size overflows")?;
    let elements = bytes.len() / width;
    if numel == 0 {
        return Ok(Vec::new());
    }
    // The last element read: offset + Σ (size_i − 1) · stride_i.
    let last = (t.shape.iter().zip(&t.stride))
        .try_fold(t.offset, |acc, (&d, &s)| acc.checked_add((d - 1).checked_mul(s)?))
        .ok_or("its strides overflow")?;
    if last >= elements {
        return Err(format!(
            "it reads element {last} of a storage of {elements} (truncated archive?)"
        ));
    }
    let value = |at: usize| t.storage.value(&bytes[at * width..(at + 1) * width]);
    // Row-major strides (the common case, every state dict's own tensors): one run of bytes.
    let mut row_major = true;
    let mut expected = 1usize;
    for (&d, &s) in t.shape.iter().zip(&t.stride).rev() {
        row_major &= d == 1 || s == expected;
        expected *= d;
    }
    if row_major {
        return Ok((t.offset..t.offset + numel).map(value).collect());
    }
    let mut out = Vec::with_capacity(numel);
    let mut index = vec![0usize; t.shape.len()];
    for _ in 0..numel {
        let at = t.offset + index.iter().zip(&t.stride).map(|(i, s)| i * s).sum::<usize>();
        out.push(value(at));
        for axis in (0..index.len()).rev() {
            index[axis] += 1;
            if index[axis] < t.shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Ok(out)
}
