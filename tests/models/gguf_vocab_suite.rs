//! llama.cpp's own tokenizer test suite (`../shared/reference/tokenizers`, from llama.cpp's
//! `models/ggml-vocab-*.gguf` with their `.inp` / `.out`): every test string of every vocabulary
//! must give exactly the ids llama.cpp's `test-tokenizer-0` expects (no special tokens added,
//! none parsed). The GGUF files hold only tokenizer metadata, no weights. Skipped, with the
//! reason, where the suite is absent. The same for the vocabularies of llama.cpp's sources
//! beyond ../shared's, where `../shared/tools/llama-cpp.sh` has unpacked them.

use crate::gguf_common::shared;
use std::path::{Path, PathBuf};
use transformer::store::gguf::GgufFile;
use transformer::text::gguf_tokenizer::GgufTokenizer;

/// The vocabularies of the suite, with the `tokenizer.ggml.model` each must be read as.
const VOCABS: [(&str, &str); 6] = [
    ("llama-spm", "llama"),
    ("phi-3", "llama"),
    ("llama-bpe", "gpt2"),
    ("qwen2", "gpt2"),
    ("gpt-2", "gpt2"),
    ("bert-bge", "bert"),
];

fn suite_dir() -> Option<PathBuf> {
    let dir = shared().join("reference/tokenizers");
    if dir.join("ggml-vocab-gpt-2.gguf").exists() {
        Some(dir)
    } else {
        eprintln!("skipping: {} not found (needs ../shared)", dir.display());
        None
    }
}

/// The tests of one vocabulary: (text, expected ids), read as `test-tokenizer-0` reads them.
pub fn read_suite(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    // Pieces up to the end; a trailing separator leaves no empty last test.
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(at) => {
                texts.push(rest[..at].to_string());
                rest = &rest[at + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{}", gguf.display());
    texts.into_iter().zip(ids).collect()
}

/// Runs every test of the vocabularies `vocabs` (name, `tokenizer.ggml.model`) in `dir`;
/// returns the tests run and a report of each vocabulary with differences.
fn run_suites(dir: &Path, vocabs: &[(&str, &str)]) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, model) in vocabs {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        assert!(file.tensors().is_empty(), "{name}: a vocabulary-only file");
        let tk = GgufTokenizer::from_gguf(&file).unwrap();
        assert_eq!(tk.model(), model, "{name}");
        let tests = read_suite(&path);
        assert!(tests.len() >= 40, "{name}: {} tests", tests.len());
        let mut mismatches = Vec::new();
        for (text, want) in &tests {
            let got = tk.tokenize(text, false, false).unwrap();
            if &got != want {
                mismatches.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
            }
        }
        total += tests.len();
        if !mismatches.is_empty() {
            failures.push(format!(
                "{name}: {} of {} differ; the first:\n{}",
                mismatches.len(),
                tests.len(),
                mismatches[..mismatches.len().min(5)].join("\n")
            ));
        }
    }
    (total, failures)
}

#[test]
fn llama_cpp_tokenizer_suite_is_matched_exactly() {
    let Some(dir) = suite_dir() else { return };
    let (total, failures) = run_suites(&dir, &VOCABS);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(total, 6 * 46);
}

/// llama.cpp's `models/` folder of its sources, which `../shared/tools/llama-cpp.sh [DIR]`
/// unpacks under DIR (`LLAMA_CPP_DIR`, else `$TMPDIR/llama-cpp`, else `/tmp/llama-cpp`); `None`,
/// said, where absent.
fn llama_cpp_models() -> Option<PathBuf> {
    let base = std::env::var_os("LLAMA_CPP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("TMPDIR")
                .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
                .join("llama-cpp")
        });
    let dir = base.join("llama_cpp_python-0.3.36/vendor/llama.cpp/models");
    if dir.join("ggml-vocab-starcoder.gguf").is_file() {
        return Some(dir);
    }
    eprintln!(
        "skipped: llama.cpp's vocabularies are not in {} (run ../shared/tools/llama-cpp.sh DIR \
         and set LLAMA_CPP_DIR=DIR)",
        dir.display()
    );
    None
}

/// The vocabularies of llama.cpp's suite beyond ../shared's six whose pre-tokenizers are
/// names llama.cpp gives to ours (`starcoder`, `refact`, `command-r`: single digits, then
/// GPT-2's; `mpt`: GPT-2's; `falcon`: its own three expressions; `qwen35`: Qwen2's with
/// combining marks in words; `deepseek-coder`, `deepseek-llm`: their own expressions) and
/// Gemma 4's tokenizer model (BPE on the UTF-8 of `▁`-escaped text): every test identical.
#[test]
fn llama_cpp_vocabularies_beyond_the_shared_ones() {
    let Some(dir) = llama_cpp_models() else {
        return;
    };
    let vocabs = [
        ("starcoder", "gpt2"),
        ("refact", "gpt2"),
        ("command-r", "gpt2"),
        ("mpt", "gpt2"),
        ("falcon", "gpt2"),
        ("qwen35", "gpt2"),
        ("deepseek-coder", "gpt2"),
        ("deepseek-llm", "gpt2"),
        ("gemma-4", "gemma4"),
    ];
    let (total, failures) = run_suites(&dir, &vocabs);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(total >= 9 * 40, "{total} tests");
}

/// What `--add-special` and `--parse-special` add, per vocabulary, as llama.cpp does: BOS for
/// SentencePiece and Llama 3, nothing for GPT-2 and Qwen2, `[CLS]`/`[SEP]` for WordPiece; a
/// control token written in the text is one token only when parsed.
#[test]
fn specials_added_and_parsed_as_llama_cpp_does() {
    let Some(dir) = suite_dir() else { return };
    let open = |name: &str| {
        let file = GgufFile::open(&dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        GgufTokenizer::from_gguf(&file).unwrap()
    };
    let spm = open("llama-spm");
    let plain = spm.tokenize("Hello", false, false).unwrap();
    assert_eq!(plain, [15043]);
    assert_eq!(spm.tokenize("Hello", true, false).unwrap(), [1, 15043]);
    // `</s>` parsed is EOS (and the text after it gets the leading space again) ...
    assert_eq!(
        spm.tokenize("Hello</s>Hello", false, true).unwrap(),
        [15043, 2, 15043]
    );
    // ... and, unparsed, just characters.
    let unparsed = spm.tokenize("</s>", false, false).unwrap();
    assert!(unparsed.len() > 1 && !unparsed.contains(&2), "{unparsed:?}");
    assert_eq!(spm.decode(&[15043, 2]).unwrap(), " Hello</s>");

    let llama3 = open("llama-bpe");
    assert_eq!(
        llama3.tokenize("Hello", true, false).unwrap(),
        [128000, 9906]
    );
    assert_eq!(
        llama3.tokenize("<|begin_of_text|>Hi", false, true).unwrap()[0],
        128000
    );
    let gpt2 = open("gpt-2");
    assert_eq!(gpt2.tokenize("Hello", true, false).unwrap(), [15496]);
    let bert = open("bert-bge");
    assert_eq!(
        bert.tokenize("Hello", true, false).unwrap(),
        [101, 7592, 102]
    );
    assert_eq!(bert.decode(&[7592]).unwrap(), " hello");
}

/// Runs the binary with `args`, `stdin` on its standard input: (exit code, stdout, stderr).
fn run_cli(args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
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
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

/// `transformer tokenize --json` end to end on one vocabulary of the suite (Qwen2): every
/// test string in one JSON array in, exactly the expected id arrays out; `--text`,
/// `--add-special`, `--parse-special`, and bad input refused with a message.
#[test]
fn tokenize_command_gives_the_suites_ids() {
    let Some(dir) = suite_dir() else { return };
    let path = dir.join("ggml-vocab-qwen2.gguf");
    let model = path.to_str().unwrap();
    let tests = read_suite(&path);
    let texts: Vec<&str> = tests.iter().map(|t| t.0.as_str()).collect();
    let (code, stdout, stderr) = run_cli(
        &["tokenize", "--model", model, "--json"],
        &serde_json::to_string(&texts).unwrap(),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let got: Vec<Vec<u32>> = serde_json::from_str(stdout.trim()).unwrap();
    let want: Vec<Vec<u32>> = tests.iter().map(|t| t.1.clone()).collect();
    assert_eq!(got, want);

    let one = |args: &[&str]| {
        let mut all = vec!["tokenize", "--model", model];
        all.extend_from_slice(args);
        let (code, stdout, stderr) = run_cli(&all, "");
        assert_eq!(code, Some(0), "{stderr}");
        serde_json::from_str::<Vec<u32>>(stdout.trim()).unwrap()
    };
    assert_eq!(one(&["--text", "Hello world"]), [9707, 1879]);
    // Qwen2 adds nothing around a text; `<|im_start|>` (151644) is one token only when parsed.
    assert_eq!(one(&["--text", "Hello", "--add-special"]), [9707]);
    assert_eq!(
        one(&["--text", "<|im_start|>", "--parse-special"]),
        [151644]
    );
    assert!(one(&["--text", "<|im_start|>"]).len() > 1);

    for (args, stdin, want) in [
        (vec!["--json"], "{\"a\": 1}", "not a JSON array of strings"),
        (vec![], "", "--json"),
    ] {
        let mut all = vec!["tokenize", "--model", model];
        all.extend(args);
        let (code, _, stderr) = run_cli(&all, stdin);
        assert_ne!(code, Some(0));
        assert!(stderr.contains(want), "{stderr}");
    }
    let (code, _, stderr) = run_cli(
        &["tokenize", "--model", "/nonexistent.gguf", "--text", "a"],
        "",
    );
    assert_ne!(code, Some(0));
    assert!(stderr.contains("/nonexistent.gguf"), "{stderr}");
}
