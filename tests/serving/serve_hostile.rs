//! Issue 44, "one request never takes the server down", for grammars and schemas: the hostile
//! requests that once aborted the server with a stack overflow (a GBNF chain of 1,000 rules,
//! 5,000 nested parentheses, a Lark chain of 1,000 rules, 500 chained `$defs`) or answered with
//! a panic's backtrace or a parser dump (an `anyOf` of 3,000 objects, a self-referencing `$ref`)
//! are each a 400 within 2 s, in one short sentence, `param` naming the field; `/health`
//! answers all the while, and a normal request is served afterwards.

use super::serve_options::{ok, post, shared, start};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use transformer::serve::client::request;

/// Sets its flag when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn gbnf_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{} \"a\"\n", i + 1));
    }
    g + &format!("r{n} ::= \"b\"\n")
}

fn schema(schema: Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

/// `(route, extra fields, the field the 400 names)`.
fn hostile() -> Vec<(&'static str, Value, &'static str)> {
    let parens = format!("root ::= {}\"x\"{}", "(".repeat(5000), ")".repeat(5000));
    let lark = gbnf_chain(1000)
        .replace("root ::=", "start:")
        .replace(" ::=", ":");
    let mut defs = serde_json::Map::new();
    for i in 0..500 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d500".into(), json!({"type": "integer"}));
    let chained = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let any_of: Vec<Value> = (0..3000)
        .map(|i| json!({"type": "object", "properties": {format!("k{i}"): {"type": "integer"}}, "required": [format!("k{i}")]}))
        .collect();
    let chat = "/v1/chat/completions";
    vec![
        (
            chat,
            json!({"response_format": {"type": "gbnf", "grammar": gbnf_chain(1000)}}),
            "response_format",
        ),
        (
            chat,
            json!({"response_format": {"type": "gbnf", "grammar": parens}}),
            "response_format",
        ),
        ("/completion", json!({"grammar": parens}), "grammar"),
        (
            chat,
            json!({"response_format": {"type": "lark", "grammar": lark}}),
            "response_format",
        ),
        (chat, schema(chained.clone()), "response_format"),
        (
            "/completion",
            json!({"json_schema": chained}),
            "json_schema",
        ),
        (chat, schema(json!({"anyOf": any_of})), "response_format"),
        (chat, schema(json!({"$ref": "#"})), "response_format"),
    ]
}

#[test]
fn hostile_grammars_are_short_400s_while_the_server_serves() {
    let Some(dir) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Stops the /health poller however this closure ends (a failed assertion included).
        let _stop = Done(&done);
        // /health, polled all the while: always 200, each answer quick.
        let health = scope.spawn(|| {
            let mut polls = 0;
            while !done.load(Ordering::Acquire) {
                let t = Instant::now();
                let (status, _, _) =
                    request(addr, "GET", "/health", None, Duration::from_secs(10)).unwrap();
                assert_eq!(status, 200);
                assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
                polls += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            polls
        });
        for (route, extra, field) in hostile() {
            let mut request = match route {
                "/completion" => json!({"prompt": "x", "n_predict": 4}),
                _ => json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}),
            };
            for (k, v) in extra.as_object().unwrap() {
                request[k] = v.clone();
            }
            let t = Instant::now();
            let (status, body) = post(addr, route, &request);
            let took = t.elapsed();
            let shown: String = extra.to_string().chars().take(80).collect();
            assert_eq!(status, 400, "{shown} -> {body}");
            assert!(took < Duration::from_secs(2), "{shown}: {took:?}");
            let message = body["error"]["message"].as_str().unwrap_or_default();
            // The field is named by `param`, and by the message where compiling refused it (a
            // 3,000-way `anyOf` compiles, then its row fails at its second step: the engine's
            // `constraint_failed`, whose message names llguidance's limit).
            assert_eq!(body["error"]["param"], field, "{shown}: {body}");
            assert!(
                message.starts_with(field) || message.starts_with("constrained decoding:"),
                "{shown}: {message}"
            );
            assert!(message.len() < 500, "{shown}: {} chars", message.len());
            for bad in ["panic", "/root/.cargo", "backtrace", "<state>", "\n"] {
                assert!(!message.contains(bad), "{shown}: {message}");
            }
            if extra.to_string().contains(r##"{"$ref":"#"}"##) {
                assert!(message.contains("no text satisfies it"), "{message}");
            }
            println!("{route} {shown}: 400 in {took:?}: {message}");
        }
        done.store(true, Ordering::Release);
        assert!(health.join().unwrap() > 0, "/health was polled");
    });
    // Still serving, constrained and not.
    let messages = json!([{"role": "user", "content": "x"}]);
    let body = ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 20, "response_format": {"type": "gbnf", "grammar": gbnf_chain(5)}}),
    );
    assert_eq!(body["choices"][0]["message"]["content"], "baaaaa");
    ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4}),
    );
}
