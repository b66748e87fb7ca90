//! CTranslate2's `model.bin`, as its Python specs write it (`ModelSpec._serialize` in
//! `ctranslate2/specs/model_spec.py`) and its C++ `models::Model::load` reads it, all
//! little-endian:
//!
//! ```text
//! u32 binary version (1 ..= 6)
//! version ≥ 2: string spec name (e.g. "TransformerSpec"), u32 spec revision
//! u32 variable count, then per variable:
//!     string name, u8 rank, u32 × rank dims,
//!     version ≥ 4: u8 dtype id (float32, int8, int16, int32, float16, bfloat16), u32 byte count
//!     version < 4: u8 item size (4: float32, 2: int16, 1: int8), u32 item count
//!     the bytes
//! version ≥ 3: u32 alias count, then per alias: string alias, string variable name
//! string = u16 length (the terminating NUL included), the UTF-8 bytes, NUL
//! ```
//!
//! Every read is bounds-checked: a truncated or damaged file, an unknown version or dtype, a
//! byte count that does not match the shape, an alias of a missing variable is an error naming
//! the file and what is wrong (never a panic). Scalars hold the spec's options (booleans as
//! int8, enums as int8 / int16, strings as int8 arrays of UTF-8).

use crate::error::Result;
use crate::kernels::lowp::ggml::f16_to_f32;
use crate::store::ckpt_err;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The newest binary version CTranslate2 writes (4.x: 6).
pub const CURRENT_BINARY_VERSION: u32 = 6;

/// The element type of a variable, in the order of CTranslate2's `DataType` enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    I8,
    I16,
    I32,
    F16,
    Bf16,
}

impl Dtype {
    /// The dtype of CTranslate2's id (`_dtype_to_type_id`).
    fn of_id(id: u8) -> Option<Dtype> {
        [
            Dtype::F32,
            Dtype::I8,
            Dtype::I16,
            Dtype::I32,
            Dtype::F16,
            Dtype::Bf16,
        ]
        .get(id as usize)
        .copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 => 1,
            Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    /// The name CTranslate2 gives it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
        }
    }
}

/// One stored variable: its shape, element type and little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Variable {
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    pub bytes: Vec<u8>,
}

impl Variable {
    /// Elements (1 for a scalar).
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Every element widened to f32 (float16 / bfloat16 exactly; integers as their values).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.bytes;
        match self.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::Bf16 => b
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
            Dtype::I8 => b.iter().map(|&v| f32::from(v as i8)).collect(),
            Dtype::I16 => b
                .chunks_exact(2)
                .map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect(),
        }
    }

    /// The int8 values of an int8 variable.
    pub fn as_i8(&self) -> Option<Vec<i8>> {
        (self.dtype == Dtype::I8).then(|| self.bytes.iter().map(|&v| v as i8).collect())
    }

    /// A one-element variable as a number.
    pub fn scalar(&self) -> Option<f64> {
        (self.elements() == 1).then(|| f64::from(self.to_f32()[0]))
    }

    /// An int8 array read as UTF-8 text (how the specs store strings).
    #[cfg(test)]
    pub fn text(&self) -> Option<String> {
        (self.dtype == Dtype::I8)
            .then(|| String::from_utf8(self.bytes.clone()).ok())
            .flatten()
    }
}

/// A parsed `model.bin`.
#[derive(Clone, Debug)]
pub struct ModelBin {
    /// The file read (for error messages).
    #[cfg_attr(not(test), allow(dead_code))]
    pub path: PathBuf,
    /// The binary format's version (1 to 6; read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub version: u32,
    /// The spec's name (empty before version 2: a `TransformerBase`).
    pub spec: String,
    pub revision: u32,
    /// Variables by name.
    pub variables: HashMap<String, Variable>,
    /// Alias -> the variable it names.
    pub aliases: HashMap<String, String>,
}

impl ModelBin {
    /// Reads and parses `path`.
    #[cfg(test)]
    pub fn read(path: &Path) -> Result<ModelBin> {
        let bytes = crate::store::read_file(path)?;
        ModelBin::parse(path, &bytes)
    }

    /// Parses the bytes of a `model.bin` (`path` names it in errors).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ModelBin> {
        Reader { bytes, at: 0 }
            .model(path)
            .map_err(|e| ckpt_err(path, e))
    }

    /// The variable `name`, through an alias when it is one.
    pub fn get(&self, name: &str) -> Option<&Variable> {
        let name = self.aliases.get(name).map_or(name, String::as_str);
        self.variables.get(name)
    }

    /// Whether `name` is stored (as a variable or an alias).
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A one-element variable as a number, or `None` when absent; an error when it is not
    /// one element.
    pub fn scalar(&self, name: &str) -> std::result::Result<Option<f64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => (v.scalar().map(Some))
                .ok_or_else(|| format!("{name} has shape {:?}, not a scalar", v.shape)),
        }
    }
}

/// A cursor over the file's bytes; every read says what it was reading when the file ends.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

type Parse<T> = std::result::Result<T, String>;

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Parse<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {}, the file has {}",
                self.at,
                self.bytes.len()
            ));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Parse<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Parse<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Parse<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A u16-length string ending with a NUL.
    fn string(&mut self, what: &str) -> Parse<String> {
        let n = self.u16(what)? as usize;
        let at = self.at;
        let b = self.take(n, what)?;
        let Some((&0, text)) = b.split_last() else {
            return Err(format!("{what} at offset {at} does not end with a NUL byte"));
        };
        String::from_utf8(text.to_vec()).map_err(|_| format!("{what} at offset {at} is not UTF-8"))
    }

    fn model(&mut self, path: &Path) -> Parse<ModelBin> {
        let version = self.u32("the binary version")?;
        if !(1..=CURRENT_BINARY_VERSION).contains(&version) {
            return Err(format!(
                "binary version {version} is not one CTranslate2 writes (1 to \
                 {CURRENT_BINARY_VERSION}): not a CTranslate2 model, or a newer one"
            ));
        }
        let (spec, revision) = if version >= 2 {
            (self.string("the spec name")?, self.u32("the spec revision")?)
        } else {
            (String::new(), 1)
        };
        let count = self.u32("the variable count")?;
        let mut variables = HashMap::new();
        for i in 0..count {
            let name = self.string(&format!("the name of variable {i}"))?;
            let (shape, dtype, bytes) = self.variable(version, &name)?;
            if variables
                .insert(name.clone(), Variable { shape, dtype, bytes })
                .is_some()
            {
                return Err(format!("variable {name} is stored twice"));
            }
        }
        let mut aliases = HashMap::new();
        if version >= 3 {
            let count = self.u32("the alias count")?;
            for i in 0..count {
                let alias = self.string(&format!("alias {i}"))?;
                let target = self.string(&format!("the variable of alias {alias}"))?;
                if !variables.contains_key(&target) {
                    return Err(format!("alias {alias} names {target}, which is not stored"));
                }
                aliases.insert(alias, target);
            }
        }
        if self.at != self.bytes.len() {
            return Err(format!(
                "{} bytes after the last alias (offset {}): damaged",
                self.bytes.len() - self.at,
                self.at
            ));
        }
        Ok(ModelBin {
            path: path.to_path_buf(),
            version,
            spec,
            revision,
            variables,
            aliases,
        })
    }

    /// One variable's shape, dtype and bytes (after its name).
    fn variable(&mut self, version: u32, name: &str) -> Parse<(Vec<usize>, Dtype, Vec<u8>)> {
        let rank = self.u8(&format!("the rank of {name}"))?;
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            shape.push(self.u32(&format!("the shape of {name}"))? as usize);
        }
        let (dtype, n_bytes) = if version >= 4 {
            let id = self.u8(&format!("the dtype of {name}"))?;
            let dtype = Dtype::of_id(id)
                .ok_or_else(|| format!("{name} has dtype id {id}, not one CTranslate2 knows (0 to 5)"))?;
            (dtype, self.u32(&format!("the byte count of {name}"))? as usize)
        } else {
            let size = self.u8(&format!("the item size of {name}"))?;
            let dtype = match size {
                4 => Dtype::F32,
                2 => Dtype::I16,
                1 => Dtype::I8,
                s => return Err(format!("{name} has item size {s}, not 1, 2 or 4")),
            };
            let items = self.u32(&format!("the item count of {name}"))? as usize;
            (dtype, items * size as usize)
        };
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| format!("{name} has shape {shape:?}, too large"))?;
        if elements.checked_mul(dtype.size()) != Some(n_bytes) {
            return Err(format!(
                "{name} ({}, shape {shape:?}) has {n_bytes} bytes, not {elements} × {}",
                dtype.name(),
                dtype.size()
            ));
        }
        let bytes = self.take(n_bytes, &format!("the values of {name}"))?.to_vec();
        Ok((shape, dtype, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model.bin of version `version` written as `_serialize` writes one.
    fn write(version: u32, vars: &[(&str, &[usize], u8, &[u8])], aliases: &[(&str, &str)]) -> Vec<u8> {
        let mut out = version.to_le_bytes().to_vec();
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend(((s.len() + 1) as u16).to_le_bytes());
            out.extend(s.as_bytes());
            out.push(0);
        };
        if version >= 2 {
            string(&mut out, "TransformerSpec");
            out.extend(7u32.to_le_bytes());
        }
        out.extend((vars.len() as u32).to_le_bytes());
        for (name, shape, id, bytes) in vars {
            string(&mut out, name);
            out.push(shape.len() as u8);
            for d in *shape {
                out.extend((*d as u32).to_le_bytes());
            }
            out.push(*id);
            out.extend((bytes.len() as u32).to_le_bytes());
            out.extend(*bytes);
        }
        if version >= 3 {
            out.extend((aliases.len() as u32).to_le_bytes());
            for (a, v) in aliases {
                string(&mut out, a);
                string(&mut out, v);
            }
        }
        out
    }

    fn sample() -> Vec<u8> {
        let f: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        // float16 1.0 and -0.5; bfloat16 2.0.
        let h = [0x00, 0x3c, 0x00, 0xb8];
        let b = [0x00, 0x40];
        write(
            6,
            &[
                ("a/weight", &[2], 0, &f),
                ("a/half", &[1, 2], 4, &h),
                ("a/brain", &[], 5, &b),
                ("a/q", &[2], 1, &[0xff, 0x7f]),
                ("a/name", &[3], 1, b"gelu"[..3].as_ref()),
            ],
            &[("b/weight", "a/weight")],
        )
    }

    #[test]
    fn variables_dtypes_and_aliases_are_read() {
        let m = ModelBin::parse(Path::new("m.bin"), &sample()).unwrap();
        assert_eq!((m.version, m.spec.as_str(), m.revision), (6, "TransformerSpec", 7));
        assert_eq!(m.get("b/weight").unwrap().to_f32(), [1.5, -2.0]);
        assert_eq!(m.get("a/half").unwrap().to_f32(), [1.0, -0.5]);
        assert_eq!(m.scalar("a/brain").unwrap(), Some(2.0));
        assert_eq!(m.get("a/q").unwrap().as_i8().unwrap(), [-1, 127]);
        assert_eq!(m.get("a/name").unwrap().text().unwrap(), "gel");
        assert!(m.scalar("a/weight").is_err());
        assert_eq!(m.scalar("absent").unwrap(), None);
    }

    #[test]
    fn every_truncation_and_damage_is_an_error_naming_the_file() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            let e = ModelBin::parse(Path::new("m.bin"), &bytes[..cut]).unwrap_err().to_string();
            assert!(e.contains("m.bin") && e.contains("truncated"), "cut {cut}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ModelBin::parse(Path::new("m.bin"), &longer).is_err());
        for (version, wanted) in [(0u32, "binary version 0"), (7, "binary version 7")] {
            let mut b = bytes.clone();
            b[..4].copy_from_slice(&version.to_le_bytes());
            let e = ModelBin::parse(Path::new("m.bin"), &b).unwrap_err().to_string();
            assert!(e.contains(wanted), "{e}");
        }
        let bad = write(6, &[("x", &[1], 9, &[0])], &[]);
        let e = ModelBin::parse(Path::new("m.bin"), &bad).unwrap_err().to_string();
        assert!(e.contains("x has dtype id 9"), "{e}");
        let bad = write(6, &[("x", &[3], 0, &[0; 8])], &[]);
        let e = ModelBin::parse(Path::new("m.bin"), &bad).unwrap_err().to_string();
        assert!(e.contains("has 8 bytes, not 3 × 4"), "{e}");
        let bad = write(6, &[("x", &[1], 1, &[0])], &[("y", "z")]);
        let e = ModelBin::parse(Path::new("m.bin"), &bad).unwrap_err().to_string();
        assert!(e.contains("alias y names z"), "{e}");
    }

    #[test]
    fn old_versions_have_no_spec_name_or_aliases_and_item_sizes() {
        let mut bytes = 1u32.to_le_bytes().to_vec();
        bytes.extend(1u32.to_le_bytes());
        bytes.extend(2u16.to_le_bytes());
        bytes.extend(b"w\0");
        bytes.push(1);
        bytes.extend(2u32.to_le_bytes());
        bytes.push(2); // item size 2: int16
        bytes.extend(2u32.to_le_bytes());
        bytes.extend([1, 0, 0xff, 0xff]);
        let m = ModelBin::parse(Path::new("old.bin"), &bytes).unwrap();
        assert_eq!((m.spec.as_str(), m.revision), ("", 1));
        assert_eq!(m.get("w").unwrap().to_f32(), [1.0, -1.0]);
    }
}
