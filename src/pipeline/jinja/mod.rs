//! Chat templates rendered as transformers renders them (`render_jinja_template` of
//! transformers 5): a Jinja2 `ImmutableSandboxedEnvironment` with `trim_blocks`,
//! `lstrip_blocks` and loop controls (`break`, `continue`); the globals `raise_exception(msg)`
//! and `strftime_now(format)`; a `tojson` filter that is Python's `json.dumps` without ASCII
//! escaping; and the `{% generation %}` block of assistant masks, which renders its body.
//!
//! Python semantics on top of minijinja: values print as Python's `str()` ([`pystr`]), the
//! tests `mapping`, `sequence`, `iterable`, `number` and `string` answer as Jinja2's do, the
//! `string` and `join` filters use `str()`, and the sandbox's refusal of methods that modify a
//! list or dict (`append`, `pop`, `update`, …) is kept: they are refused with Jinja2's message.
//! Python string methods come from minijinja-contrib's `pycompat`.
//!
//! A template cannot hang or exhaust memory: rendering runs on fuel (one unit per VM
//! instruction, so a loop without end stops with an error), a bounded depth of macro calls, and
//! a bounded output ([`Limits`]).

pub mod filters;
pub mod pyjson;
pub mod pystr;
pub mod python_none;
pub mod strftime;

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, ErrorKind, State};
use pyjson::JsonStyle;
use pystr::{py_str, to_py_string, type_name};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
pub use strftime::DateTime;

/// What one rendering may spend before it is stopped with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// VM instructions (minijinja's fuel): the most any of the 70 real templates of
    /// `../shared/reference/chat-templates` spends on its conversation with tools is ~2,000.
    pub fuel: u64,
    /// Bytes of rendered text.
    pub max_output_bytes: usize,
    /// Nested macro calls, includes and loops (minijinja's recursion limit).
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            fuel: 20_000_000,
            max_output_bytes: 16 << 20,
            max_depth: 100,
        }
    }
}

/// The moment `strftime_now` formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// The current time (UTC), read at each call.
    Now,
    /// A fixed moment, for reproducible renderings.
    Fixed(DateTime),
}

/// Methods of `list` and `dict` that modify them: the immutable sandbox refuses them.
const MUTATING_METHODS: &[&str] = &[
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
    "update",
    "setdefault",
    "popitem",
    "__setitem__",
    "__delitem__",
];

fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if matches!(value.kind(), ValueKind::Seq | ValueKind::Map) && MUTATING_METHODS.contains(&method)
    {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "SecurityError: access to attribute '{method}' of '{}' object is unsafe.",
                type_name(value)
            ),
        ));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, positionally
/// or by keyword, as transformers' filter passes them to `json.dumps`.
fn tojson(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(minijinja::Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments (ensure_ascii, indent, separators, sort_keys)",
        ));
    }
    let mut given: Vec<Value> = vec![Value::UNDEFINED; names.len()];
    for (slot, arg) in given.iter_mut().zip(args.iter()) {
        *slot = arg.clone();
    }
    for (i, name) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given[i] = v;
        }
    }
    kwargs.assert_all_used()?;
    let bad = |what: &str, v: &Value| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: {what} cannot be {} ({})",
                type_name(v),
                to_py_string(v)
            ),
        )
    };
    let flag = |v: &Value| v.is_true();
    let indent = match given[1].kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::Number if given[1].is_integer() => {
            let n = given[1].as_i64().unwrap_or(0);
            Some(" ".repeat(n.clamp(0, 1024) as usize))
        }
        ValueKind::String => Some(given[1].as_str().unwrap_or_default().to_string()),
        _ => return Err(bad("indent", &given[1])),
    };
    let separators = match given[2].kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::Seq if given[2].len() == Some(2) => {
            let item = given[2].get_item_by_index(0)?;
            let key = given[2].get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(i), Some(k)) => Some((i.to_string(), k.to_string())),
                _ => return Err(bad("separators", &given[2])),
            }
        }
        _ => return Err(bad("separators", &given[2])),
    };
    let style = JsonStyle::new(flag(&given[0]), indent, separators, flag(&given[3]));
    pyjson::dumps(value, &style)
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' extension marking the assistant's
/// tokens) as the equivalent no-op block `{% if true %}` / `{% endif %}`, whitespace control
/// (`{%-`, `-%}`) kept, so `trim_blocks` and `lstrip_blocks` treat it as Jinja2 treats the tag.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open} {r} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// An `io::Write` that holds at most `limit` bytes and fails beyond, noting that it did.
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: Arc<AtomicBool>,
}

impl Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A chat template compiled in transformers' environment, ready to render contexts.
pub struct ChatTemplateEngine {
    env: Environment<'static>,
    limits: Limits,
}

const NAME: &str = "chat_template";

impl ChatTemplateEngine {
    /// Compiles `source`; a syntax error is reported with its line.
    pub fn new(source: &str, clock: Clock, limits: Limits) -> Result<ChatTemplateEngine> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.max_depth);
        env.set_unknown_method_callback(unknown_method);
        env.set_formatter(|out, _state, value| {
            let mut text = String::new();
            py_str(value, &mut text);
            out.write_str(&text).map_err(minijinja::Error::from)
        });
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("TemplateError: {message}"),
                ))
            },
        );
        env.add_function(
            "strftime_now",
            move |format: String| -> std::result::Result<String, minijinja::Error> {
                let now = match clock {
                    Clock::Now => DateTime::now_utc(),
                    Clock::Fixed(t) => t,
                };
                now.strftime(&format)
                    .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| to_py_string(v));
        env.add_filter("join", filters::join);
        env.add_filter("indent", filters::indent);
        env.add_filter("map", filters::map);
        env.add_filter("select", filters::select);
        env.add_filter("reject", filters::reject);
        env.add_filter("selectattr", filters::selectattr);
        env.add_filter("rejectattr", filters::rejectattr);
        env.add_filter("unique", filters::unique);
        env.add_test("none", |v: &Value| python_none::is_none(v));
        env.add_test("mapping", |v: &Value| v.kind() == ValueKind::Map);
        env.add_test("string", |v: &Value| v.kind() == ValueKind::String);
        // Python's numbers include booleans.
        env.add_test("number", |v: &Value| {
            matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
        });
        // Jinja2: whatever has a length and items by index (strings and dicts too; undefined
        // has both).
        env.add_test("sequence", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Seq | ValueKind::Map | ValueKind::String | ValueKind::Undefined
            )
        });
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Seq
                    | ValueKind::Map
                    | ValueKind::String
                    | ValueKind::Iterable
                    | ValueKind::Undefined
            )
        });
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|e| Error::Input(format!("chat template: {e:#}")))?;
        Ok(ChatTemplateEngine { env, limits })
    }

    /// Renders with `context` (a map of the template's variables).
    pub fn render(&self, context: &Value) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::Input(format!("chat template: {e}")))?;
        let overflowed = Arc::new(AtomicBool::new(false));
        let mut out = BoundedOutput {
            bytes: Vec::new(),
            limit: self.limits.max_output_bytes,
            overflowed: overflowed.clone(),
        };
        match template.render_captured_to(context, &mut out) {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| Error::Input("chat template: the rendered text is not UTF-8".into())),
            Err(_) if overflowed.load(Ordering::Relaxed) => Err(Error::Input(format!(
                "chat template: stopped: its output exceeds {} bytes",
                self.limits.max_output_bytes
            ))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::Input(format!(
                "chat template: stopped after {} steps, a loop that does not end? ({e})",
                self.limits.fuel
            ))),
            Err(e) => Err(Error::Input(format!("chat template: {e}"))),
        }
    }
}
#[cfg(test)]
mod tests;
