//! Models by name (`--model hf:ORG/REPO[:QUANT]`, `transformer pull`) against a Hub served on
//! loopback by the test: the Hub's file list (`/api/models/ORG/REPO/revision/REV`) and files
//! (`/ORG/REPO/resolve/REV/FILE`, with HTTP ranges, `x-repo-commit` and the checksum etags the
//! Hub sends). Checked: the cache's layout (huggingface_hub's), a directory and a quantisation
//! chosen from a repository, a download cut off and resumed (in the same run and in the next),
//! a corrupt download refused and deleted, offline use of the cache, private repositories and
//! HF_TOKEN, and the errors of names that select nothing.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Hub's etag of a file: an LFS file's SHA-256, a small file's git blob SHA-1.
fn etag(bytes: &[u8], lfs: bool) -> String {
    if lfs {
        hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
    } else {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        ctx.update(format!("blob {}\0", bytes.len()).as_bytes());
        ctx.update(bytes);
        hex(ctx.finish().as_ref())
    }
}

#[derive(Clone)]
struct HubFile {
    bytes: Vec<u8>,
    /// What the Hub says the bytes hash to.
    etag: String,
    lfs: bool,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Vec<(String, HubFile)>>,
    /// Repositories that answer 401 without `Authorization: Bearer secret`.
    private: Vec<String>,
    /// Per file URL path: how many more transfers to cut off halfway.
    cut: HashMap<String, usize>,
    /// Every file transfer's (path, first byte asked for), the metadata probes left out.
    transfers: Vec<(String, u64)>,
}

struct FakeHub {
    url: String,
    state: Arc<Mutex<State>>,
}

impl FakeHub {
    fn start() -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = answer(stream, &state);
                });
            }
        });
        FakeHub { url, state }
    }

    fn add(&self, repo: &str, name: &str, bytes: &[u8], lfs: bool) {
        let file = HubFile {
            bytes: bytes.to_vec(),
            etag: etag(bytes, lfs),
            lfs,
        };
        self.state
            .lock()
            .unwrap()
            .repos
            .entry(repo.to_string())
            .or_default()
            .push((name.to_string(), file));
    }

    /// The files of a model directory on disk, as a repository.
    fn add_dir(&self, repo: &str, dir: &Path) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for name in names {
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            self.add(repo, &name, &bytes, name.ends_with(".safetensors"));
        }
    }

    fn transfers(&self) -> Vec<(String, u64)> {
        self.state.lock().unwrap().transfers.clone()
    }
}

fn answer(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut out = stream;
    let reply = |out: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
            body.len()
        );
        out.write_all(head.as_bytes())?;
        out.write_all(body)
    };
    let mut st = state.lock().unwrap();
    // /api/models/ORG/REPO/revision/REV
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let repo = rest.split("/revision/").next().unwrap_or("");
        if st.private.iter().any(|p| p == repo)
            && headers.get("authorization").map(String::as_str) != Some("Bearer secret")
        {
            return reply(&mut out, "401 Unauthorized", "", b"{\"error\":\"private\"}");
        }
        let Some(files) = st.repos.get(repo) else {
            return reply(&mut out, "404 Not Found", "", b"{\"error\":\"no repo\"}");
        };
        let siblings: Vec<String> = files
            .iter()
            .map(|(n, _)| format!("{{\"rfilename\":\"{n}\"}}"))
            .collect();
        let body = format!(
            "{{\"sha\":\"{COMMIT}\",\"siblings\":[{}]}}",
            siblings.join(",")
        );
        return reply(
            &mut out,
            "200 OK",
            "content-type: application/json\r\n",
            body.as_bytes(),
        );
    }
    // /ORG/REPO/resolve/REV/FILE
    let Some((repo, file)) =
        path.trim_start_matches('/')
            .split_once("/resolve/")
            .map(|(r, rest)| {
                (
                    r.to_string(),
                    rest.split_once('/').map(|x| x.1).unwrap_or("").to_string(),
                )
            })
    else {
        return reply(&mut out, "404 Not Found", "", b"");
    };
    if st.private.contains(&repo)
        && headers.get("authorization").map(String::as_str) != Some("Bearer secret")
    {
        return reply(&mut out, "401 Unauthorized", "", b"");
    }
    let Some(hf) = st
        .repos
        .get(&repo)
        .and_then(|fs| fs.iter().find(|(n, _)| *n == file))
        .map(|(_, f)| f.clone())
    else {
        return reply(&mut out, "404 Not Found", "", b"");
    };
    let len = hf.bytes.len() as u64;
    let (start, end) = match headers.get("range").and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: u64 = a.parse().unwrap();
            let b: u64 = if b.is_empty() {
                len - 1
            } else {
                b.parse().unwrap()
            };
            (a, b.min(len - 1))
        }
        None => (0, len - 1),
    };
    let probe = start == 0 && end == 0;
    if !probe {
        st.transfers.push((path.clone(), start));
    }
    let body = &hf.bytes[start as usize..=end as usize];
    let tag = if hf.lfs {
        format!(
            "x-linked-etag: \"{}\"\r\netag: \"{}\"\r\n",
            hf.etag, "weak-pointer"
        )
    } else {
        format!("etag: \"{}\"\r\n", hf.etag)
    };
    let extra = format!(
        "x-repo-commit: {COMMIT}\r\naccept-ranges: bytes\r\ncontent-range: bytes {start}-{end}/{len}\r\n{tag}"
    );
    let cut = !probe
        && st
            .cut
            .get_mut(&path)
            .filter(|n| **n > 0)
            .map(|n| *n -= 1)
            .is_some();
    drop(st);
    if cut {
        // Headers for the whole rest, then half of it, then the connection closes.
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
            body.len()
        );
        out.write_all(head.as_bytes())?;
        out.write_all(&body[..body.len() / 2])?;
        out.flush()?;
        return out.shutdown(std::net::Shutdown::Both);
    }
    reply(&mut out, "206 Partial Content", &extra, body)
}

fn run(hub: &FakeHub, home: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transformer"));
    c.args(args)
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", &hub.url)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moe/qwen3_moe/hf")
}

fn home(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("transformer-hub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_model_directory_by_name_is_fetched_into_the_hub_cache_and_runs_as_the_local_one() {
    let hub = FakeHub::start();
    hub.add_dir("org/tiny-moe", &fixture_dir());
    hub.add("org/tiny-moe", "README.md", b"# a model card\n", false);
    hub.add("org/tiny-moe", "onnx/model.onnx", b"not fetched", true);
    let home = home("dir");
    let (ok, out, err) = run(&hub, &home, &[], &["pull", "hf:org/tiny-moe"]);
    assert!(ok, "{err}");
    // huggingface_hub's layout: refs/main holds the commit, the snapshot links to the blobs.
    let repo = home.join("hub/models--org--tiny-moe");
    let snapshot = repo.join("snapshots").join(COMMIT);
    assert_eq!(out.trim(), snapshot.display().to_string());
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let name = entry.unwrap().file_name();
        let got = snapshot.join(&name);
        assert!(got.is_symlink(), "{got:?} is not a link into blobs/");
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(fixture_dir().join(&name)).unwrap()
        );
    }
    assert!(!snapshot.join("README.md").exists() && !snapshot.join("onnx").exists());
    // The same continuation from the name as from the directory.
    let gen = |model: &str| {
        let (ok, out, err) = run(
            &hub,
            &home,
            &[],
            &[
                "generate",
                "--model",
                model,
                "--prompt",
                "Hello",
                "--max-tokens",
                "6",
                "--temperature",
                "0",
                "--format",
                "json",
            ],
        );
        assert!(ok, "{err}");
        let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        j["new_ids"].clone()
    };
    let local = gen(fixture_dir().to_str().unwrap());
    assert_eq!(gen("hf:org/tiny-moe"), local);
    // Offline, from the cache; a repository not in it is named.
    let (ok, out2, err) = run(
        &hub,
        &home,
        &[("HF_HUB_OFFLINE", "1")],
        &["pull", "hf:org/tiny-moe"],
    );
    assert!(ok, "{err}");
    assert_eq!(out2, out);
    let (ok, _, err) = run(
        &hub,
        &home,
        &[("HF_HUB_OFFLINE", "1")],
        &["pull", "hf:org/other"],
    );
    assert!(
        !ok && err.contains("org/other") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_quantisation_picks_its_gguf_file_and_names_that_select_nothing_are_errors() {
    let hub = FakeHub::start();
    let gguf = std::fs::read(fixture_dir().join("../qwen3_moe.f16.gguf")).unwrap();
    for name in ["tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf", "tiny-Q4_K_S.gguf"] {
        hub.add("org/tiny-GGUF", name, &gguf, true);
    }
    let home = home("quant");
    let (ok, out, err) = run(&hub, &home, &[], &["pull", "hf:org/tiny-GGUF:q8_0"]);
    assert!(ok, "{err}");
    assert!(out.trim().ends_with("/tiny-Q8_0.gguf"), "{out}");
    // No quantisation: llama.cpp's default, Q4_K_M.
    let (ok, out, err) = run(&hub, &home, &[], &["pull", "hf:org/tiny-GGUF"]);
    assert!(ok, "{err}");
    assert!(out.trim().ends_with("/tiny-Q4_K_M.gguf"), "{out}");
    assert_eq!(std::fs::read(out.trim()).unwrap(), gguf);
    // The names given to the model commands too.
    let (ok, out, err) = run(
        &hub,
        &home,
        &[],
        &[
            "tokenize",
            "--model",
            "hf:org/tiny-GGUF:Q8_0",
            "--text",
            "Hello",
        ],
    );
    let (ok_local, out_local, _) = run(
        &hub,
        &home,
        &[],
        &[
            "tokenize",
            "--model",
            fixture_dir()
                .join("../qwen3_moe.f16.gguf")
                .to_str()
                .unwrap(),
            "--text",
            "Hello",
        ],
    );
    assert!(ok && ok_local, "{err}");
    assert_eq!(out, out_local);
    for (name, want) in [
        ("hf:org/tiny-GGUF:Q6_K", "no GGUF file of quantisation Q6_K"),
        ("hf:org/tiny-GGUF:missing.gguf", "no file missing.gguf"),
        ("hf:org/nothing-here", "404"),
        ("hf:not-a-repo", "ORG/REPO"),
    ] {
        let (ok, _, err) = run(&hub, &home, &[], &["pull", name]);
        assert!(!ok && err.contains(want), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let hub = FakeHub::start();
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    hub.add("org/big", "model-Q4_K_M.gguf", &bytes, true);
    let url_path = "/org/big/resolve/main/model-Q4_K_M.gguf".to_string();
    let home = home("resume");
    // Every try of the first run (the first and hf-hub's three more, which continue from what
    // arrived) is cut off: it fails, keeping what arrived.
    hub.state.lock().unwrap().cut.insert(url_path.clone(), 4);
    let (ok, _, err) = run(&hub, &home, &[], &["pull", "hf:org/big"]);
    assert!(!ok && err.contains("org/big"), "{err}");
    let starts: Vec<u64> = hub.transfers().iter().map(|t| t.1).collect();
    assert_eq!(starts.len(), 4, "{starts:?}");
    assert!(
        starts.windows(2).all(|w| w[1] > w[0]),
        "each retry continues: {starts:?}"
    );
    // The next run continues from there and the file is whole.
    let (ok, out, err) = run(&hub, &home, &[], &["pull", "hf:org/big"]);
    assert!(ok, "{err}");
    let transfers = hub.transfers();
    let last = transfers.last().unwrap();
    assert!(
        last.1 > *starts.last().unwrap() && last.1 < bytes.len() as u64,
        "{transfers:?}"
    );
    assert_eq!(std::fs::read(out.trim()).unwrap(), bytes);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_corrupt_download_is_refused_and_deleted() {
    let hub = FakeHub::start();
    let bytes = vec![7u8; 50_000];
    hub.add("org/bad", "model-Q4_K_M.gguf", &bytes, true);
    hub.add("org/bad", "notes.txt", b"hello", false);
    // The Hub's checksums stay those of the real bytes; what is served differs by one byte.
    {
        let mut st = hub.state.lock().unwrap();
        for (_, f) in st.repos.get_mut("org/bad").unwrap() {
            f.bytes[0] ^= 1;
        }
    }
    let home = home("corrupt");
    for (name, kind) in [
        ("hf:org/bad", "sha256"),
        ("hf:org/bad:notes.txt", "git sha1"),
    ] {
        let (ok, _, err) = run(&hub, &home, &[], &["pull", name]);
        assert!(
            !ok && err.contains("corrupt") && err.contains(kind),
            "{err}"
        );
    }
    let repo = home.join("hub/models--org--bad");
    let blobs: Vec<_> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(blobs.is_empty(), "left behind: {blobs:?}");
    assert!(!repo
        .join("snapshots")
        .join(COMMIT)
        .join("model-Q4_K_M.gguf")
        .exists());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_private_repository_needs_hf_token() {
    let hub = FakeHub::start();
    hub.add("org/private", "model-Q4_K_M.gguf", b"GGUF tiny", true);
    hub.state.lock().unwrap().private.push("org/private".into());
    let home = home("token");
    let (ok, _, err) = run(&hub, &home, &[], &["pull", "hf:org/private"]);
    assert!(
        !ok && err.contains("401") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let (ok, out, err) = run(
        &hub,
        &home,
        &[("HF_TOKEN", "secret")],
        &["pull", "hf:org/private"],
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(out.trim()).unwrap(), b"GGUF tiny");
    let _ = std::fs::remove_dir_all(&home);
}
