//! Values printed as Python prints them: `{{ x }}`, `x | string` and `x | join` in Jinja2 call
//! Python's `str(x)`, so `None`, `True`, a float's shortest `repr` (`1e-07`), and containers in
//! Python's literal syntax with `repr` of their items (`{'city': 'Paris'}`, `['a', "it's"]`).

use minijinja::value::{Value, ValueKind};

/// Python's name of a value's type, for error messages that match Python's.
pub fn type_name(value: &Value) -> &'static str {
    if super::python_none::is_none(value) {
        return "NoneType";
    }
    match value.kind() {
        ValueKind::Undefined => "Undefined",
        ValueKind::None => "NoneType",
        ValueKind::Bool => "bool",
        ValueKind::Number if value.is_integer() => "int",
        ValueKind::Number => "float",
        ValueKind::String => "str",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq => "list",
        ValueKind::Map => "dict",
        ValueKind::Iterable => "generator",
        _ => "object",
    }
}

/// Python's `repr(float)`: the shortest digits that read back to the same float, in
/// positional notation for exponents -4..16, otherwise scientific with a signed exponent of at
/// least two digits.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e16", "0e0".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e}'s exponent is a number");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if digits.len() as i32 <= point {
            format!(
                "{digits}{}.0",
                "0".repeat((point - digits.len() as i32) as usize)
            )
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{text}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exponent.abs())
    }
}

/// Whether Python's `str.isprintable()` holds for `c` (so `repr` shows it as it is): not a
/// control, format, separator (other than the space), surrogate or private-use character.
/// Covers the categories' members that occur in text; rarer unassigned code points print.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    !(u < 0x20
        || (0x7f..=0xa0).contains(&u)
        || u == 0xad
        || u == 0x1680
        || (0x2000..=0x200f).contains(&u)
        || (0x2028..=0x202f).contains(&u)
        || (0x205f..=0x2064).contains(&u)
        || (0x2066..=0x206f).contains(&u)
        || u == 0x3000
        || u == 0xfeff
        || (0xe000..=0xf8ff).contains(&u)
        || (0xfff9..=0xfffb).contains(&u)
        || (0xf0000..).contains(&u))
}

/// Python's `repr(str)`: single quotes, or double quotes when the text holds a single quote
/// and no double one; backslash escapes for the quote, `\`, `\t`, `\n`, `\r` and characters
/// that do not print.
pub fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
}

/// Python's `repr(value)` (a string quoted; everything else as [`py_str`]).
pub fn py_repr(value: &Value, out: &mut String) {
    match value.as_str() {
        Some(s) if value.kind() == ValueKind::String => py_str_repr(s, out),
        _ => py_str(value, out),
    }
}

/// Python's `str(value)` (Jinja2's undefined prints as nothing).
pub fn py_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(x) => out.push_str(&py_float_repr(x)),
            Err(_) => out.push_str(&value.to_string()),
        },
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out);
                    out.push_str(": ");
                    py_repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// [`py_str`] into a new string.
pub fn to_py_string(value: &Value) -> String {
    let mut out = String::new();
    py_str(value, &mut out);
    out
}
