//! Tool-call parsing on each format, whole and streamed (pieces of every size reassembled),
//! malformed calls and unknown names read as prose; the format chosen from the real templates
//! of ../shared.

use super::*;

fn known() -> Vec<String> {
    vec!["get_weather".to_string(), "add".to_string()]
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// The cases: (format, reply, expected content and calls or `None` for prose).
/// A reply and what it reads as: its prose and calls, or `None` for prose.
type Case = (
    ToolFormat,
    &'static str,
    Option<(&'static str, Vec<ToolCall>)>,
);

fn cases() -> Vec<Case> {
    let weather = || call("get_weather", r#"{"city":"Paris"}"#);
    vec![
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            Some(("", vec![weather()])),
        ),
        (
            ToolFormat::Hermes,
            "Let me check. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}</tool_call>",
            Some(("Let me check.", vec![weather(), call("add", r#"{"a":1,"b":2}"#)])),
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            Some(("", vec![weather()])),
        ),
        // Cut by the end of the reply before the closing tag: still a call.
        (
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            Some(("", vec![weather()])),
        ),
        (ToolFormat::Hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>", None),
        (ToolFormat::Hermes, "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>", None),
        (ToolFormat::Hermes, "Paris is sunny.", None),
        (
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            Some(("", vec![weather()])),
        ),
        (
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"add\", \"parameters\": {\"a\": 1}}",
            Some(("", vec![weather(), call("add", r#"{"a":1}"#)])),
        ),
        (ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": [1]}", None),
        (ToolFormat::Llama3, "The answer is {\"name\": \"add\"}", None),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            Some(("", vec![weather()])),
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[CALL_ID]x1[ARGS]{\"a\": 2}",
            Some(("", vec![weather(), call("add", r#"{"a":2}"#)])),
        ),
        (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\"", None),
        (
            ToolFormat::Granite,
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            Some(("", vec![weather()])),
        ),
        (
            ToolFormat::Functionary31,
            "<function=get_weather>{\"city\": \"Paris\"}</function>",
            Some(("", vec![weather()])),
        ),
        (ToolFormat::Functionary31, "<function=get_weather>{city: Paris}</function>", None),
    ]
}

#[test]
fn whole_replies_parse_or_stay_prose() {
    for (format, text, want) in cases() {
        let got = parse(format, text, &known());
        let want = want.map(|(content, calls)| ParsedReply {
            content: content.into(),
            calls,
        });
        assert_eq!(got, want, "{format:?} {text:?}");
    }
}

#[test]
fn streamed_replies_reassemble_to_the_whole() {
    for (format, text, want) in cases() {
        for size in [1, 2, 3, 5, 8, 1000] {
            let mut stream = ToolStream::new(format);
            let mut prose = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                prose.push_str(&stream.push(&piece.iter().collect::<String>()));
            }
            let (rest, parsed) = stream.finish(&known());
            prose.push_str(&rest);
            match &want {
                None => {
                    assert_eq!(prose, text, "{format:?} {text:?} in pieces of {size}");
                    assert_eq!(parsed, None);
                }
                Some((content, calls)) => {
                    assert_eq!(
                        prose.trim(),
                        *content,
                        "{format:?} {text:?} in pieces of {size}"
                    );
                    assert_eq!(&parsed.expect("calls").calls, calls);
                }
            }
        }
    }
}

#[test]
fn formats_are_chosen_from_the_real_templates() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/chat-templates");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let expect = [
        (
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
            Some(ToolFormat::Hermes),
        ),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", Some(ToolFormat::Hermes)),
        ("Qwen-Qwen3-0.6B.jinja", Some(ToolFormat::Hermes)),
        ("Qwen3-Coder.jinja", Some(ToolFormat::Hermes)),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            Some(ToolFormat::Llama3),
        ),
        (
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            Some(ToolFormat::Llama3),
        ),
        (
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
            Some(ToolFormat::Llama3),
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            Some(ToolFormat::Mistral),
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            Some(ToolFormat::Mistral),
        ),
        (
            "ibm-granite-granite-3.3-2B-Instruct.jinja",
            Some(ToolFormat::Granite),
        ),
        (
            "meetkai-functionary-medium-v3.1.jinja",
            Some(ToolFormat::Functionary31),
        ),
        ("microsoft-Phi-3.5-mini-instruct.jinja", None),
        ("google-gemma-2-2b-it.jinja", None),
    ];
    for (name, format) in expect {
        assert_eq!(ToolFormat::of_template(&read(name)), format, "{name}");
    }
}
