//! A small JSON-schema validator for the constrained-decoding tests, independent of llguidance:
//! `type` (one or a list), `enum`, `const`, `properties` / `required` /
//! `additionalProperties: false`, `items`, `minItems` / `maxItems`, `minimum` / `maximum` /
//! `exclusiveMinimum` / `exclusiveMaximum`, `minLength` / `maxLength` (in characters),
//! `pattern` (the `regex` crate, unanchored as JSON schema has it), `anyOf`, `oneOf`, `allOf`,
//! and `$ref` to `#/$defs/...` or `#/definitions/...`. A keyword it does not know fails the
//! check (so a schema it cannot judge is never passed silently).

use regex::Regex;
use serde_json::Value;

const KNOWN: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "title",
    "description",
];

/// Why `value` does not follow `schema` (`root` resolves `$ref`), or `Ok`.
pub fn check(root: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    let fail = |why: String| Err(format!("{why}: {value}"));
    let Some(s) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => Ok(()),
            _ => fail(format!("schema {schema} is not an object")),
        };
    };
    if let Some(unknown) = s.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return fail(format!("keyword {unknown} is not checked here"));
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let path = r
            .strip_prefix('#')
            .ok_or_else(|| format!("$ref {r} not local"))?;
        let target = root
            .pointer(path)
            .ok_or_else(|| format!("$ref {r} not found"))?;
        check(root, target, value)?;
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return fail(format!("type {t}")),
        };
        let is = |t: &str| match t {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            _ => false,
        };
        if !types.iter().any(|t| is(t)) {
            return fail(format!("not of type {t}"));
        }
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            return fail("not in the enum".into());
        }
    }
    if let Some(c) = s.get("const") {
        if c != value {
            return fail(format!("not the const {c}"));
        }
    }
    if let Some(x) = value.as_f64() {
        let bound = |k: &str| s.get(k).and_then(Value::as_f64);
        if bound("minimum").is_some_and(|m| x < m)
            || bound("maximum").is_some_and(|m| x > m)
            || bound("exclusiveMinimum").is_some_and(|m| x <= m)
            || bound("exclusiveMaximum").is_some_and(|m| x >= m)
        {
            return fail("outside the bounds".into());
        }
    }
    if let Some(text) = value.as_str() {
        let n = text.chars().count() as u64;
        if s.get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return fail("length outside the bounds".into());
        }
        if let Some(p) = s.get("pattern").and_then(Value::as_str) {
            let rx = Regex::new(p).map_err(|e| format!("pattern {p}: {e}"))?;
            if !rx.is_match(text) {
                return fail(format!("does not match {p}"));
            }
        }
    }
    if let Some(items) = value.as_array() {
        let n = items.len() as u64;
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| n < m)
            || s.get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
        {
            return fail("item count outside the bounds".into());
        }
        if let Some(item) = s.get("items") {
            for v in items {
                check(root, item, v)?;
            }
        }
    }
    if let Some(object) = value.as_object() {
        let properties = s.get("properties").and_then(Value::as_object);
        for key in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !object.contains_key(key.as_str().unwrap_or_default()) {
                return fail(format!("required {key} missing"));
            }
        }
        for (k, v) in object {
            match properties.and_then(|p| p.get(k)) {
                Some(sub) => check(root, sub, v)?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return fail(format!("property {k} not allowed"))
                }
                None => {}
            }
        }
    }
    for (k, need) in [("anyOf", 1..usize::MAX), ("oneOf", 1..2)] {
        if let Some(options) = s.get(k).and_then(Value::as_array) {
            let n = options
                .iter()
                .filter(|o| check(root, o, value).is_ok())
                .count();
            if !need.contains(&n) {
                return fail(format!("{n} of {k} match"));
            }
        }
    }
    for o in s
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        check(root, o, value)?;
    }
    Ok(())
}

#[test]
fn the_checker_passes_and_fails_what_it_should() {
    use serde_json::json;
    let schema = json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "exclusiveMaximum": 10},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "x": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/p"}]}
        },
        "required": ["n"],
        "additionalProperties": false,
        "$defs": {"p": {"type": "number", "maximum": 0.5}}
    });
    let good = [
        json!({"n": 1}),
        json!({"n": 9, "tags": ["a", "b"], "code": "ABC", "x": null}),
        json!({"n": 2, "x": 0.25}),
    ];
    for v in &good {
        check(&schema, &schema, v).unwrap();
    }
    let bad = [
        json!({"n": 10}),
        json!({"n": 0}),
        json!({"n": 1.5}),
        json!({}),
        json!({"n": 1, "extra": 1}),
        json!({"n": 1, "tags": ["c"]}),
        json!({"n": 1, "tags": ["a", "a", "a"]}),
        json!({"n": 1, "code": "ABCD"}),
        json!({"n": 1, "x": 0.75}),
        json!([1]),
    ];
    for v in &bad {
        assert!(check(&schema, &schema, v).is_err(), "{v} passed");
    }
    assert!(check(
        &json!({"format": "email"}),
        &json!({"format": "email"}),
        &json!("x")
    )
    .is_err());
}
