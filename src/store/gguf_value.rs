//! GGUF metadata values: the 13 value types (their codes are the `ValueType` discriminants) and
//! typed reading of a value ([`FromValue`], used by [`super::gguf::GgufFile::get`]).
//!
//! Integers of any GGUF integer type read as any Rust integer type that holds them; floats of
//! either width read as f64; a value of another type reads as nothing, and the caller's error
//! names the key, the value ([`Value::describe`]) and what was expected.

/// The type of a metadata value, with its GGUF code as discriminant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type of GGUF code `code`, if there is one.
    pub fn from_code(code: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The type's name as in messages (`u32`, `string`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes a value of this type occupies (a string's or array's header).
    pub(super) fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// The element type (kept for empty arrays) and the elements.
    Array(ValueType, Vec<Value>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
        }
    }

    /// Any integer type, as i128 (holds every u64 and i64).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An f32 or f64, as f64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array's element type and elements.
    pub fn as_array(&self) -> Option<(ValueType, &[Value])> {
        match self {
            Value::Array(t, items) => Some((*t, items)),
            _ => None,
        }
    }

    /// A short description for messages: `u32 30`, `string "llama"`, `array of 3 i32`.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(t, items) => format!("array of {} {}", items.len(), t.name()),
            Value::String(s) if s.chars().count() > 40 => {
                format!("string {:?}...", s.chars().take(40).collect::<String>())
            }
            Value::String(s) => format!("string {s:?}"),
            v => {
                let shown = v
                    .as_integer()
                    .map(|i| i.to_string())
                    .or_else(|| v.as_float().map(|f| f.to_string()))
                    .or_else(|| v.as_bool().map(|b| b.to_string()))
                    .unwrap_or_default();
                format!("{} {shown}", v.value_type().name())
            }
        }
    }
}

/// A Rust type a metadata value can be read as (see [`super::gguf::GgufFile::get`]).
pub trait FromValue<'a>: Sized {
    /// What the value must be, for messages.
    const EXPECTED: &'static str;
    fn from_value(value: &'a Value) -> Option<Self>;
}

impl FromValue<'_> for usize {
    const EXPECTED: &'static str = "a non-negative integer";
    fn from_value(v: &Value) -> Option<usize> {
        v.as_integer().and_then(|i| usize::try_from(i).ok())
    }
}

impl FromValue<'_> for u32 {
    const EXPECTED: &'static str = "an integer in u32's range";
    fn from_value(v: &Value) -> Option<u32> {
        v.as_integer().and_then(|i| u32::try_from(i).ok())
    }
}

impl FromValue<'_> for f64 {
    const EXPECTED: &'static str = "a float (f32 or f64)";
    fn from_value(v: &Value) -> Option<f64> {
        v.as_float()
    }
}

impl FromValue<'_> for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_value(v: &Value) -> Option<bool> {
        v.as_bool()
    }
}

impl<'a> FromValue<'a> for &'a str {
    const EXPECTED: &'static str = "a string";
    fn from_value(v: &'a Value) -> Option<&'a str> {
        v.as_str()
    }
}

impl<'a> FromValue<'a> for Vec<&'a str> {
    const EXPECTED: &'static str = "an array of strings";
    fn from_value(v: &'a Value) -> Option<Vec<&'a str>> {
        v.as_array()?.1.iter().map(Value::as_str).collect()
    }
}

impl FromValue<'_> for Vec<i64> {
    const EXPECTED: &'static str = "an array of integers";
    fn from_value(v: &Value) -> Option<Vec<i64>> {
        let items = v.as_array()?.1.iter();
        items
            .map(|x| x.as_integer().and_then(|i| i64::try_from(i).ok()))
            .collect()
    }
}
