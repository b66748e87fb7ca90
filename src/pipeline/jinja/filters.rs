//! Jinja2's filters where minijinja's differ in what a template can see.
//!
//! - `indent(width=4, first=False, blank=False)`: Jinja2 appends a newline before splitting
//!   into lines, so a text ending in a newline keeps it; `width` may be a string.
//! - `map`, `select`, `reject`, `selectattr`, `rejectattr`, `unique` return generators in
//!   Jinja2: iterable once, true, without a length, refused by `tojson`. minijinja's results
//!   (lists) are handed out as such one-shot iterators. A false input (`None`) gives an empty
//!   one, as Jinja2's `if seq:` guard does.
//! - `join(d='', attribute=None)` and `string`: Python's `str()` of each value.

use super::pystr::{py_str, to_py_string};
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

/// Python's `str.splitlines()` (no line ends kept).
pub fn splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if is_break {
            lines.push(&s[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(j, '\n')) = chars.peek() {
                    chars.next();
                    end = j + 1;
                }
            }
            start = end;
        }
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// Jinja2's `indent`.
pub fn indent(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let names = ["width", "first", "blank"];
    if args.len() > names.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "indent takes at most 3 arguments (width, first, blank)",
        ));
    }
    let mut given: Vec<Option<Value>> = args.iter().cloned().map(Some).collect();
    given.resize(names.len(), None);
    for (i, name) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let indention = match &given[0] {
        None => "    ".to_string(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_string(),
        Some(w) => match w.as_i64() {
            Some(n) => " ".repeat(n.clamp(0, 1 << 16) as usize),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "indent: width {} is not a number or a string",
                        to_py_string(w)
                    ),
                ))
            }
        },
    };
    let first = given[1].as_ref().is_some_and(|v| v.is_true());
    let blank = given[2].as_ref().is_some_and(|v| v.is_true());
    let text = format!("{}\n", to_py_string(value));
    let lines = splitlines(&text);
    let mut out = String::new();
    if blank {
        out = lines.join(&format!("\n{indention}"));
    } else if let Some((head, rest)) = lines.split_first() {
        out.push_str(head);
        for line in rest {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&indention);
            }
            out.push_str(line);
        }
    }
    if first {
        out.insert_str(0, &indention);
    }
    Ok(out)
}

/// A list handed out as a Python generator.
fn generator(items: Vec<Value>) -> Value {
    Value::make_one_shot_iterator(items.into_iter())
}

/// Jinja2's `map` and `select` families skip a false sequence (`if seq: for item in seq`):
/// `None | selectattr(...)` is empty, not an error.
fn truthy(value: Value) -> Value {
    if value.is_true() {
        value
    } else {
        Value::from(Vec::<Value>::new())
    }
}

/// Jinja2's `map` (a generator).
pub fn map(state: &State, value: Value, args: Rest<Value>) -> Result<Value, Error> {
    minijinja::filters::map(state, truthy(value), args).map(generator)
}

/// Jinja2's `select` (a generator).
pub fn select(
    state: &State,
    value: Value,
    test: Option<String>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    minijinja::filters::select(state, truthy(value), test.map(Into::into), args).map(generator)
}

/// Jinja2's `reject` (a generator).
pub fn reject(
    state: &State,
    value: Value,
    test: Option<String>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    minijinja::filters::reject(state, truthy(value), test.map(Into::into), args).map(generator)
}

/// Jinja2's `selectattr` (a generator).
pub fn selectattr(
    state: &State,
    value: Value,
    attr: String,
    test: Option<String>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    minijinja::filters::selectattr(
        state,
        truthy(value),
        attr.into(),
        test.map(Into::into),
        args,
    )
    .map(generator)
}

/// Jinja2's `rejectattr` (a generator).
pub fn rejectattr(
    state: &State,
    value: Value,
    attr: String,
    test: Option<String>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    minijinja::filters::rejectattr(
        state,
        truthy(value),
        attr.into(),
        test.map(Into::into),
        args,
    )
    .map(generator)
}

/// Jinja2's `unique` (a generator).
pub fn unique(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let unique = minijinja::filters::unique(state, value, kwargs)?;
    Ok(generator(unique.try_iter()?.collect()))
}

/// Jinja2's attribute path `a.b.0`: keys, or indices where a part is a number.
fn attribute_of(mut item: Value, path: &str) -> Result<Value, Error> {
    for part in path.split('.') {
        let key = match part.parse::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from(part),
        };
        item = item.get_item(&key)?;
    }
    Ok(item)
}

/// Jinja2's `join(d='', attribute=None)` with Python's `str()` of each item.
pub fn join(value: &Value, separator: Option<String>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let separator = separator.unwrap_or_default();
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(&separator);
        }
        let item = match &attribute {
            Some(path) => attribute_of(item, path)?,
            None => item,
        };
        py_str(&item, &mut out);
    }
    Ok(out)
}
