//! Chat templates rendered as transformers renders them: the 70 real templates of
//! `../shared/reference/chat-templates` on three conversations (a user turn; a system message
//! and several turns; a tool definition, an assistant tool call and the tool's result), each
//! byte-identical to what transformers 5.24's `render_jinja_template` wrote, or refused where it
//! raised. Then templates that never end, stopped within seconds, and the `template` command.
//! Skipped, with the reason printed, where `../shared` is absent.

use minijinja::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use transformer::pipeline::chat::{ChatContext, ChatMessage, ChatTemplate};
use transformer::pipeline::jinja::{Clock, DateTime};

fn templates_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/chat-templates");
    if dir.join("expected.json").is_file() {
        Some(dir)
    } else {
        eprintln!("skipping: {} not found (needs ../shared)", dir.display());
        None
    }
}

/// `expected.json`, keys in file order (a tool's schema is written in the order given).
fn expected(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn items(map: &Value) -> Vec<(String, Value)> {
    map.try_iter()
        .unwrap()
        .map(|k| (k.as_str().unwrap().to_string(), map.get_item(&k).unwrap()))
        .collect()
}

/// The case's conversation with transformers' arguments (`kwargs` of expected.json), as the
/// JSON object the `template` command reads.
fn case_json(case: &Value, kwargs: &Value) -> String {
    let mut all = items(case);
    for (name, value) in items(kwargs) {
        if name != "strftime_now" {
            all.push((name, value));
        }
    }
    serde_json::to_string(&Value::from_iter(all)).unwrap()
}

/// Where two texts first differ, with some text around it.
fn first_difference(got: &str, want: &str) -> String {
    let pos = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |s: &str| {
        let mut start = pos.saturating_sub(40).min(s.len());
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (pos + 60).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        s[start..end].to_string()
    };
    format!(
        "first difference at byte {pos}: got {:?}, want {:?}",
        around(got),
        around(want)
    )
}

#[test]
fn seventy_real_templates_render_as_transformers_renders_them() {
    let Some(dir) = templates_dir() else { return };
    let expected = expected(&dir);
    let kwargs = expected.get_attr("kwargs").unwrap();
    let cases = expected.get_attr("cases").unwrap();
    let now = kwargs.get_attr("strftime_now").unwrap();
    let clock = Clock::Fixed(DateTime::parse(now.as_str().unwrap()).unwrap());
    let (mut identical, mut refused, mut failures) = (0, 0, Vec::new());
    let templates = items(&expected.get_attr("templates").unwrap());
    assert_eq!(templates.len(), 70);
    for (name, per_case) in &templates {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        // bos and eos come from the case's kwargs, as transformers was called.
        let template = ChatTemplate {
            template: source,
            bos: String::new(),
            eos: String::new(),
        };
        for (case_name, want) in items(per_case) {
            let case = cases.get_attr(&case_name).unwrap();
            let context = ChatContext::from_json(&case_json(&case, &kwargs)).unwrap();
            let got = template.render(&context, clock);
            let label = format!("{name} / {case_name}");
            match (got, want.get_attr("text").unwrap().as_str()) {
                (Ok(got), Some(want)) if got == want => identical += 1,
                (Ok(got), Some(want)) => {
                    failures.push(format!("{label}: {}", first_difference(&got, want)))
                }
                (Ok(_), None) => failures.push(format!(
                    "{label}: rendered, but transformers raised {}",
                    want.get_attr("error").unwrap()
                )),
                (Err(e), Some(_)) => failures.push(format!("{label}: refused: {e}")),
                (Err(e), None) => {
                    // A template's own refusal (raise_exception) says what transformers said.
                    let error = want.get_attr("error").unwrap();
                    let error = error.as_str().unwrap();
                    if let Some(message) = error.strip_prefix("TemplateError: ") {
                        assert!(e.to_string().contains(message), "{label}: {e} / {error}");
                    }
                    refused += 1;
                }
            }
        }
    }
    eprintln!(
        "chat templates: {identical} renderings identical, {refused} refused as transformers \
         refused them, {} different",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(identical + refused, 70 * 3);
}

/// `f` runs and fails within `seconds`; its error.
fn stopped_within(seconds: u64, f: impl FnOnce() -> transformer::error::Result<String>) -> String {
    let start = Instant::now();
    let e = f().expect_err("a template without end rendered");
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(seconds),
        "stopped after {took:?}"
    );
    e.to_string()
}

#[test]
fn templates_without_end_are_stopped_within_seconds() {
    let template = |source: &str| ChatTemplate {
        template: source.to_string(),
        bos: String::new(),
        eos: String::new(),
    };
    let hi = [ChatMessage::new("user", "Hi")];
    // The loop that hung `generate --chat`: 10^10 iterations.
    let nested = template(
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    );
    let e = stopped_within(10, || nested.prompt(&hi));
    assert!(e.contains("stopped after") && e.contains("steps"), "{e}");
    // Recursion without end.
    let recursive = template("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    let e = stopped_within(10, || recursive.prompt(&hi));
    assert!(e.contains("recursion"), "{e}");
    // Output without bound: 100 MB wanted.
    let growing = template("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    let e = stopped_within(10, || growing.prompt(&hi));
    assert!(e.contains("output exceeds"), "{e}");
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn transformer(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails before reading its input closes the pipe first.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

#[test]
fn template_command_prints_the_prompt_exactly() {
    let Some(dir) = templates_dir() else { return };
    let expected = expected(&dir);
    let kwargs = expected.get_attr("kwargs").unwrap();
    let tools = expected
        .get_attr("cases")
        .unwrap()
        .get_attr("tools")
        .unwrap();
    let stdin = case_json(&tools, &kwargs);
    // Hermes 3: tools as JSON schemas, the tool call's arguments, the tool's reply.
    let name = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja";
    let file = dir.join(name);
    let file = file.to_str().unwrap();
    let want = expected
        .get_attr("templates")
        .unwrap()
        .get_attr(name)
        .unwrap();
    let want = want.get_attr("tools").unwrap().get_attr("text").unwrap();
    let run = transformer(
        &[
            "template",
            "--template",
            file,
            "--now",
            "2026-12-01T12:00:00",
        ],
        &stdin,
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, want.as_str().unwrap());
    // Llama 3.2 writes the date of strftime_now when no date_string is given.
    let name = "meta-llama-Llama-3.2-3B-Instruct.jinja";
    let file = dir.join(name);
    let hi = r#"{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true}"#;
    let run = transformer(
        &[
            "template",
            "--template",
            file.to_str().unwrap(),
            "--now",
            "2025-02-03T04:05:06",
        ],
        hi,
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("Today Date: 03 Feb 2025\n"),
        "{}",
        run.stdout
    );
    // Bad input, named.
    for (args, stdin, says) in [
        (
            vec!["template", "--template", file.to_str().unwrap()],
            "{",
            "invalid JSON",
        ),
        (
            vec!["template", "--template", file.to_str().unwrap()],
            "[]",
            "expected a JSON object",
        ),
        (
            vec!["template", "--template", file.to_str().unwrap()],
            "{}",
            "no \"messages\"",
        ),
        (
            vec![
                "template",
                "--template",
                file.to_str().unwrap(),
                "--now",
                "2025-02-30T00:00:00",
            ],
            hi,
            "no such date",
        ),
        (
            vec!["template", "--template", "/nonexistent.jinja"],
            hi,
            "/nonexistent.jinja",
        ),
        (vec!["template"], hi, "--model"),
    ] {
        let run = transformer(&args, stdin);
        assert_ne!(run.code, Some(0), "{args:?} {stdin}");
        assert!(
            run.stderr.contains(says),
            "{args:?} {stdin}: {}",
            run.stderr
        );
    }
}

#[test]
fn template_command_reads_a_gguf_files_template_and_tokens() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    let gguf = root.join("models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let reference = root.join("reference/smollm2/reference.json");
    if !gguf.is_file() || !reference.is_file() {
        eprintln!("skipping: {} not found (needs ../shared)", gguf.display());
        return;
    }
    // The text transformers fed SmolLM2 for its first chat prompt.
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let want = reference["prompts"][0]["text"].as_str().unwrap();
    let stdin = r#"{"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "add_generation_prompt": true}"#;
    let run = transformer(&["template", "--model", gguf.to_str().unwrap()], stdin);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, want);
}
