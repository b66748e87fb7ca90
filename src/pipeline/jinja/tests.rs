//! The environment against Jinja2 3.1 with transformers' settings: each expected text below
//! is what Python rendered (`ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)`, loop controls, transformers' `tojson`, `raise_exception`,
//! `strftime_now` at 2026-12-01 12:00, its `generation` extension).

use super::pyjson::{dumps, JsonStyle};
use super::pystr::{py_float_repr, py_str_repr, to_py_string};
use super::*;
use std::time::{Duration, Instant};

fn clock() -> Clock {
    Clock::Fixed(DateTime::parse("2026-12-01T12:00:00").unwrap())
}

fn context() -> Value {
    let json = r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
        "x": "é", "n": 3, "b": true, "f": 2.5, "d": {"k": "v", "a": [1, null]}, "l": [1, "two", null],
        "u": "ü"}"#;
    let parsed: Value = serde_json::from_str(json).unwrap();
    let mut variables: Vec<(String, Value)> = parsed
        .try_iter()
        .unwrap()
        .map(|k| (k.to_string(), parsed.get_item(&k).unwrap()))
        .collect();
    variables.push(("tools".into(), python_none::python_none()));
    Value::from_iter(variables)
}

fn render(source: &str) -> Result<String> {
    ChatTemplateEngine::new(source, clock(), Limits::default())?.render(&context())
}

#[test]
fn renders_as_jinja2_with_transformers_settings() {
    let cases = [
        (
            "{% for m in messages %}\n  {% if m.role == 'user' %}\n    U:{{ m.content }}\n  {% endif %}\n{% endfor %}\nend",
            "    U:Hi\nend",
        ),
        (
            "{{ x }} {{ n }} {{ b }} {{ f }} {{ d }} {{ l }} {{ x | string }}|{{ l | join(',') }}",
            "é 3 True 2.5 {'k': 'v', 'a': [1, None]} [1, 'two', None] é|1,two,None",
        ),
        (
            "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ u | tojson }}|{{ u | tojson(ensure_ascii=True) }}",
            "{\"k\": \"v\", \"a\": [1, null]}|{\n  \"k\": \"v\",\n  \"a\": [\n    1,\n    null\n  ]\n}|\"ü\"|\"\\u00fc\"",
        ),
        (
            "{{ 'a\nb\n' | indent(2) }}|{{ 'a\n\nb' | indent(2, first=true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}",
            "a\n  b\n|  a\n\n  b|a\n> \n> b",
        ),
        (
            "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
            "02",
        ),
        (
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
            "2",
        ),
        ("{{ strftime_now('%d %B %Y') }}", "01 December 2026"),
        (
            "{{ tools is none }} {{ tools is defined }} {{ tools | tojson }} {{ tools }} {% if not tools %}none{% endif %}",
            "True True null None none",
        ),
        (
            "{{ messages | map(attribute='role') | join('+') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
            "user+assistant 1",
        ),
        ("{%- generation -%}\n  {{ 'x' }}\n{%- endgeneration %}\ny", "xy"),
        (
            "{% macro f(m) %}[{{ m.role }}]{% endmacro %}{% for m in messages %}{{ f(m) }}{% endfor %}",
            "[user][assistant]",
        ),
        (
            "{{ l is sequence }} {{ x is sequence }} {{ d is sequence }} {{ d is mapping }} {{ b is number }} {{ n is iterable }} {{ d is iterable }}",
            "True True True True True False True",
        ),
    ];
    for (source, want) in cases {
        assert_eq!(render(source).unwrap(), want, "{source}");
    }
}

#[test]
fn refuses_what_jinja2_refuses() {
    let cases = [
        // Jinja2: TypeError: Object of type generator is not JSON serializable
        (
            "{{ messages | map(attribute='role') | tojson }}",
            "generator is not JSON serializable",
        ),
        // TypeError: 'NoneType' object is not iterable
        ("{% for t in tools %}{% endfor %}", "not iterable"),
        // SecurityError: access to attribute 'append' of 'list' object is unsafe.
        (
            "{% set l2 = l.append(1) %}",
            "access to attribute 'append' of 'list' object is unsafe",
        ),
        (
            "{{ d.update({'x': 1}) }}",
            "access to attribute 'update' of 'dict' object is unsafe",
        ),
        // TemplateError: nope
        ("{{ raise_exception('nope') }}", "nope"),
        ("{{ strftime_now('%Q') }}", "%Q"),
        ("{{ d | tojson(indent=[1]) }}", "indent"),
        ("{% for %}", "syntax error"),
    ];
    for (source, want) in cases {
        let e = render(source).unwrap_err().to_string();
        assert!(e.contains(want), "{source}: {e}");
    }
}

#[test]
fn json_dumps_as_python_writes_it() {
    let v: Value = serde_json::from_str(
        r#"{"a": [1, 2, {"b": null}], "é": "ü\n\u0001\"\\", "e": [], "f": {}}"#,
    )
    .unwrap();
    // json.dumps(v, ensure_ascii=False)
    let plain = JsonStyle::new(false, None, None, false);
    assert_eq!(
        dumps(&v, &plain).unwrap(),
        r#"{"a": [1, 2, {"b": null}], "é": "ü\n\u0001\"\\", "e": [], "f": {}}"#
    );
    let v: Value =
        serde_json::from_str(r#"{"a": [1, 2, {"b": null}], "é": "ü😀\u007f", "e": [], "f": {}}"#)
            .unwrap();
    // json.dumps(v, ensure_ascii=True, indent=2)
    let ascii = JsonStyle::new(true, Some("  ".into()), None, false);
    assert_eq!(
        dumps(&v, &ascii).unwrap(),
        "{\n  \"a\": [\n    1,\n    2,\n    {\n      \"b\": null\n    }\n  ],\n  \"\\u00e9\": \"\\u00fc\\ud83d\\ude00\\u007f\",\n  \"e\": [],\n  \"f\": {}\n}"
    );
    // json.dumps({'b': 1, 'a': [True, False]}, sort_keys=True, separators=(',', ':'))
    let v: Value = serde_json::from_str(r#"{"b": 1, "a": [true, false]}"#).unwrap();
    let compact = JsonStyle::new(false, None, Some((",".into(), ":".into())), true);
    assert_eq!(dumps(&v, &compact).unwrap(), r#"{"a":[true,false],"b":1}"#);
    // json.dumps([1, [2]], indent='\t')
    let v: Value = serde_json::from_str("[1, [2]]").unwrap();
    let tab = JsonStyle::new(false, Some("\t".into()), None, false);
    assert_eq!(dumps(&v, &tab).unwrap(), "[\n\t1,\n\t[\n\t\t2\n\t]\n]");
    assert!(dumps(&Value::UNDEFINED, &plain)
        .unwrap_err()
        .to_string()
        .contains("Undefined"));
}

#[test]
fn floats_and_strings_as_python_prints_them() {
    // repr(x) in Python 3 (json.dumps writes the same, and Infinity for inf).
    let floats = [
        (1.0, "1.0"),
        (0.1, "0.1"),
        (1e16, "1e+16"),
        (1.5e-7, "1.5e-07"),
        (123456789012345.6, "123456789012345.6"),
        (1e-4, "0.0001"),
        (0.0001234, "0.0001234"),
        (-0.0, "-0.0"),
        (2.5e-5, "2.5e-05"),
        (1e22, "1e+22"),
        (3.0e15, "3000000000000000.0"),
        (9999999999999998.0, "9999999999999998.0"),
        (f64::INFINITY, "inf"),
    ];
    for (x, want) in floats {
        assert_eq!(py_float_repr(x), want, "{x}");
    }
    let repr = |s: &str| {
        let mut out = String::new();
        py_str_repr(s, &mut out);
        out
    };
    assert_eq!(repr("it's \"x\""), r#"'it\'s "x"'"#);
    assert_eq!(repr("it's"), r#""it's""#);
    assert_eq!(repr("a\0\u{a0}\u{2028}\té"), r"'a\x00\xa0\u2028\té'");
    let v: Value = serde_json::from_str(r#"{"k": [1, 2.5, null, true, "x"]}"#).unwrap();
    assert_eq!(to_py_string(&v), "{'k': [1, 2.5, None, True, 'x']}");
}

#[test]
fn splitlines_as_python_splits() {
    // 'a\r\nb\rc\x0bd\u2028e\n\nf\n'.splitlines()
    assert_eq!(
        filters::splitlines("a\r\nb\rc\u{0b}d\u{2028}e\n\nf\n"),
        ["a", "b", "c", "d", "e", "", "f"]
    );
    assert!(filters::splitlines("").is_empty());
}

/// Runs `source` with the default limits and returns its error and how long it took.
fn stopped(source: &str) -> (String, Duration) {
    let start = Instant::now();
    let e = render(source).expect_err("a template without end rendered");
    (e.to_string(), start.elapsed())
}

#[test]
fn markup_plus_a_string_escapes_the_string_as_jinja2_does() {
    // Jinja2: `Markup + str` and `str + Markup` escape the str (markupsafe) and give Markup;
    // `~` joins as plain text; plain + plain is plain.
    let cases = [
        (
            r#"{{ "<b>"|safe + '"x" & <y>' }}"#,
            r#"<b>&#34;x&#34; &amp; &lt;y&gt;"#,
        ),
        (r#"{{ "it's" + "<i>"|safe }}"#, "it&#39;s<i>"),
        (r#"{{ "<a>"|safe + "<b>"|safe }}"#, "<a><b>"),
        (r#"{{ "<a>"|safe ~ '"' }}"#, r#"<a>""#),
        (r#"{{ "<a>" + '"' }}"#, r#"<a>""#),
        (
            r#"{{ "f('"|safe + "n" + "')\n"|safe + {"a": 1} | tojson }}"#,
            "f('n')\n{&#34;a&#34;: 1}",
        ),
    ];
    for (source, want) in cases {
        assert_eq!(render(source).unwrap(), want, "{source}");
    }
}

#[test]
fn templates_without_end_are_stopped() {
    // 10^10 iterations: out of fuel after 2·10^7 instructions.
    let (e, took) = stopped(
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    );
    assert!(e.contains("stopped after 20000000 steps"), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Recursion without end.
    let (e, took) = stopped("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(e.contains("recursion"), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Output without bound: 100,000 × 1000 bytes = 100 MB, stopped at 16 MiB.
    let (e, took) = stopped("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    assert!(e.contains("output exceeds 16777216 bytes"), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Values doubled in place, never written: bounded at 10^8 bytes / 10^7 items.
    let ns =
        "{% set ns = namespace(v=VALUE) %}{% for i in range(64) %}{% set ns.v = ns.v OP ns.v %}\
              {% endfor %}{{ ns.v|length }}";
    for (value, op) in [("'ab'", "~"), ("'ab'", "+"), ("[1]", "+")] {
        let doubling = ns.replace("VALUE", value).replace("OP", op);
        let (e, took) = stopped(&doubling);
        assert!(e.contains("is too large"), "{doubling}: {e}");
        assert!(took < Duration::from_secs(10), "{doubling}: {took:?}");
    }
    // The same limits let a real conversation through.
    let limits = Limits {
        fuel: 100,
        ..Limits::default()
    };
    let t =
        ChatTemplateEngine::new("{% for i in range(1000) %}{% endfor %}", clock(), limits).unwrap();
    assert!(t.render(&context()).is_err());
}
