//! The stored rows of a [`KvCache`](super::KvCache)'s keys (or values): `[stored rows, d]` in
//! the cache's storage type ([`KvType`], packed by [`Backend::kv_quantise_row`]): floats of
//! the model's type (`f32`, the exact default), or packed (`f16`, `bf16`, `q8_0`, `q4_0`), each
//! row `d / block_values` blocks. A row is packed once, when its position is written; every
//! later read (the step kernel through `kernels::kv_dots`, a dense copy for matrix products)
//! sees its unpacked values `deq(pack(x))`. The block types `q8_0` and `q4_0` store a row
//! rotated as llama.cpp does (`kernels::hadamard`: `R deq(pack(R x))` is read back, the same
//! attention with a smaller quantisation error).

use crate::backend::{kv_key_rotation, kv_value_rotation};
use crate::backend::{Backend, KvSlice, KvType, PackedRows, CPU};
use crate::Float;
use std::borrow::Cow;

/// The storage types of a cache's keys and values (llama.cpp's `--cache-type-k` and
/// `--cache-type-v`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Both exact (the model's float).
    pub fn is_exact(&self) -> bool {
        self.k == KvType::F32 && self.v == KvType::F32
    }

    /// Bytes of one position's keys and values over a layer of width `d_kv`, the model's
    /// float being `float_bytes` wide.
    pub fn position_bytes(&self, d_kv: usize, float_bytes: usize) -> f64 {
        d_kv as f64 * (self.k.bytes_per_value(float_bytes) + self.v.bytes_per_value(float_bytes))
    }

    /// The rotations (`kernels::hadamard`) of keys and values stored in heads of `d_head`.
    pub fn rotations(&self, d_head: usize) -> (Option<usize>, Option<usize>) {
        (
            kv_key_rotation(self.k, d_head),
            kv_value_rotation(self.v, d_head),
        )
    }

    /// `Err` naming the type and width when a head of `d_head` values (or a row of `d_kv`) is
    /// not whole blocks of a type.
    pub fn check_widths(&self, d_head: usize, d_kv: usize) -> Result<(), String> {
        for (what, ty) in [("--cache-type-k", self.k), ("--cache-type-v", self.v)] {
            if !d_head.is_multiple_of(ty.block_values()) || ty.row_bytes(d_kv).is_none() {
                return Err(format!(
                    "{what} {ty}: blocks of {} values do not divide a head of {d_head} values",
                    ty.block_values()
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "K {} V {}", self.k, self.v)
    }
}

/// Stored rows of one kind (keys or values): see the module docs.
#[derive(Clone, Debug)]
pub enum StoredRows<T> {
    /// `[rows, d]` floats.
    Float(Vec<T>),
    /// `[rows, row_bytes]`.
    Packed {
        ty: KvType,
        row_bytes: usize,
        bytes: Vec<u8>,
        /// `Some(n)`: rows stored rotated by `R_n` (`kernels::hadamard`).
        rotation: Option<usize>,
    },
}

impl<T: Float> StoredRows<T> {
    /// No rows yet, of type `ty` and width `d` (whole blocks of `ty`), packed rows stored
    /// rotated by `R_n` with `rotation` `Some(n)` (`n` dividing `d`).
    pub fn new(ty: KvType, d: usize, rotation: Option<usize>) -> Self {
        match ty {
            KvType::F32 => StoredRows::Float(Vec::new()),
            ty => StoredRows::Packed {
                ty,
                row_bytes: ty
                    .row_bytes(d)
                    .unwrap_or_else(|| panic!("rows of {d} values are not whole {ty} blocks")),
                bytes: Vec::new(),
                rotation: rotation.inspect(|n| {
                    assert!(d.is_multiple_of(*n), "a rotation of {n} over rows of {d}")
                }),
            },
        }
    }

    /// No rows yet, stored as `self` stores them (type, width `d`, rotation).
    pub fn new_like(&self, d: usize) -> Self {
        match self {
            StoredRows::Float(_) => StoredRows::Float(Vec::new()),
            StoredRows::Packed { ty, rotation, .. } => Self::new(*ty, d, *rotation),
        }
    }

    /// Its type.
    pub fn ty(&self) -> KvType {
        match self {
            StoredRows::Float(_) => KvType::F32,
            StoredRows::Packed { ty, .. } => *ty,
        }
    }

    /// Appends `n` zero rows of `d` values.
    pub fn grow(&mut self, n: usize, d: usize) {
        match self {
            StoredRows::Float(x) => x.resize(x.len() + n * d, T::zero()),
            StoredRows::Packed {
                row_bytes, bytes, ..
            } => bytes.resize(bytes.len() + n * *row_bytes, 0),
        }
    }

    /// Copies rows `from .. from + n` over rows `to .. to + n`.
    pub fn copy_rows(&mut self, from: usize, to: usize, n: usize, d: usize) {
        match self {
            StoredRows::Float(x) => x.copy_within(from * d..(from + n) * d, to * d),
            StoredRows::Packed {
                row_bytes, bytes, ..
            } => {
                let rb = *row_bytes;
                bytes.copy_within(from * rb..(from + n) * rb, to * rb)
            }
        }
    }

    /// Stores `x` (`[d]`) as row `r`, packed if the type packs.
    pub fn write(&mut self, r: usize, x: &[T], d: usize) {
        match self {
            StoredRows::Float(rows) => rows[r * d..(r + 1) * d].copy_from_slice(x),
            StoredRows::Packed {
                ty,
                row_bytes,
                bytes,
                rotation,
            } => {
                let out = &mut bytes[r * *row_bytes..(r + 1) * *row_bytes];
                match T::as_f32(x) {
                    Some(x) => CPU.kv_quantise_row(*ty, *rotation, x, out),
                    None => {
                        let x: Vec<f32> = x.iter().map(|v| v.f64() as f32).collect();
                        CPU.kv_quantise_row(*ty, *rotation, &x, out)
                    }
                }
            }
        }
    }

    /// Row `r` (`[d]`), unpacked if packed.
    pub fn read(&self, r: usize, d: usize) -> Cow<'_, [T]> {
        match self {
            StoredRows::Float(rows) => Cow::Borrowed(&rows[r * d..(r + 1) * d]),
            StoredRows::Packed {
                ty,
                row_bytes,
                bytes,
                rotation,
            } => {
                let mut x = vec![0f32; d];
                let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                CPU.kv_dequantise_row(*ty, *rotation, row, &mut x);
                Cow::Owned(x.into_iter().map(|v| T::of(v as f64)).collect())
            }
        }
    }

    /// Row `from` of `src` (of this type and width) stored as row `to`, bytes as they are.
    pub fn copy_row_from(&mut self, to: usize, src: &StoredRows<T>, from: usize, d: usize) {
        match (self, src) {
            (StoredRows::Float(x), StoredRows::Float(y)) => {
                x[to * d..(to + 1) * d].copy_from_slice(&y[from * d..(from + 1) * d])
            }
            (
                StoredRows::Packed {
                    row_bytes, bytes, ..
                },
                StoredRows::Packed { bytes: theirs, .. },
            ) => {
                let rb = *row_bytes;
                bytes[to * rb..(to + 1) * rb].copy_from_slice(&theirs[from * rb..(from + 1) * rb])
            }
            _ => panic!("rows copied between storage types"),
        }
    }

    /// The rows as the attention kernels read them.
    pub fn view(&self) -> KvSlice<'_, T> {
        match self {
            StoredRows::Float(x) => KvSlice::Float(x),
            StoredRows::Packed {
                ty,
                row_bytes,
                bytes,
                rotation,
            } => KvSlice::Packed(PackedRows {
                ty: *ty,
                bytes,
                row_bytes: *row_bytes,
                rotation: *rotation,
            }),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            StoredRows::Float(x) => std::mem::size_of_val(&x[..]),
            StoredRows::Packed { bytes, .. } => bytes.len(),
        }
    }
}
