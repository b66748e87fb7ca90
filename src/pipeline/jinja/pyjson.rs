//! `tojson` as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, byte for
//! byte (Jinja2's own `tojson`, which escapes `<`, `>`, `&` and `'` for HTML, is replaced).
//!
//! Python's layout: without `indent`, items are separated by `", "` and keys by `": "`; with it,
//! by `","` and `": "`, every item on its own line indented by `indent` per level. `separators`
//! replaces the two. Strings escape `"`, `\`, and control characters (`\n`, `\u001b`, …); with
//! `ensure_ascii` every character outside ASCII too, as `\uXXXX` (surrogate pairs above U+FFFF).
//! Floats print as Python's `repr` (`1.0`, `1e-07`, `1e+16`), NaN and infinities as `NaN`,
//! `Infinity`, `-Infinity`; keys keep the order they were given in unless `sort_keys`.

use super::pystr::{py_float_repr, type_name};
use super::python_none::is_none;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Deeper nesting than this is refused (Python stops at its recursion limit, ~1000 frames).
const MAX_DEPTH: usize = 512;

/// The arguments of `json.dumps` that a template can pass.
#[derive(Clone, Debug)]
pub struct JsonStyle {
    /// Escape every non-ASCII character (`\uXXXX`).
    pub ensure_ascii: bool,
    /// The text of one level of indentation (`indent=2` is two spaces); `None`: one line.
    pub indent: Option<String>,
    /// Between items (`", "`, or `","` with an indent).
    pub item_separator: String,
    /// Between a key and its value (`": "`).
    pub key_separator: String,
    /// Keys in sorted order instead of as given.
    pub sort_keys: bool,
}

impl JsonStyle {
    /// `json.dumps`'s defaults for `indent` and `separators` (`None`: Python's default).
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> JsonStyle {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        JsonStyle {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        }
    }
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "Object of type {} is not JSON serializable",
            type_name(value)
        ),
    )
}

/// `value` as `json.dumps` writes it.
pub fn dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

/// A JSON string literal of `s`.
pub fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return Ok(());
    }
    let x = f64::try_from(value.clone()).map_err(|_| not_serializable(value))?;
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&py_float_repr(x));
    }
    Ok(())
}

/// A key as `json.dumps` converts it: strings as they are, numbers, booleans and None as
/// their JSON text; anything else is refused as Python refuses it.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                type_name(key)
            ),
        )),
    }
}

fn newline(out: &mut String, indent: &str, depth: usize) {
    out.push('\n');
    for _ in 0..depth {
        out.push_str(indent);
    }
}

fn write_value(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: nesting deeper than {MAX_DEPTH} levels"),
        ));
    }
    if is_none(value) {
        out.push_str("null");
        return Ok(());
    }
    match value.kind() {
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', &items, |out, item, depth| {
                write_value(out, item, style, depth)
            })?;
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                pairs.push((key_text(&key)?, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                style,
                depth,
                '{',
                '}',
                &pairs,
                |out, (key, item), depth| {
                    write_string(out, key, style.ensure_ascii);
                    out.push_str(&style.key_separator);
                    write_value(out, item, style, depth)
                },
            )?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// `open`, the items (each written by `write_item` at `depth + 1`), `close`: on one line, or
/// one item a line with an indent.
fn write_container<T>(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    write_item: impl Fn(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        if let Some(indent) = &style.indent {
            newline(out, indent, depth + 1);
        }
        write_item(out, item, depth + 1)?;
    }
    if let Some(indent) = &style.indent {
        newline(out, indent, depth);
    }
    out.push(close);
    Ok(())
}
