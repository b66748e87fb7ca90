//! Models by name from the Hugging Face Hub: `hf:ORG/REPO[@REVISION][:QUANT or FILE]` becomes
//! a local path, through the Hub's cache as `huggingface_hub` lays it out
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`:
//! `models--ORG--REPO/{blobs,snapshots/COMMIT,refs/REVISION}`), so a file transformers or
//! llama.cpp fetched is used as it is, and ours are theirs.
//!
//! What a name resolves to:
//!
//! | name | files fetched | path given |
//! |---|---|---|
//! | `hf:ORG/REPO` with a `config.json` | the model directory's files ([`wanted_in_directory`]) | the snapshot directory |
//! | `hf:ORG/REPO` of GGUF files only | the `Q4_K_M` file (llama.cpp's `-hf` default), or the only one | the file |
//! | `hf:ORG/REPO:Q8_0` | the GGUF file of that quantisation | the file |
//! | `hf:ORG/REPO:FILE` | that file | the file |
//!
//! Each file comes from the cache when the snapshot of the revision holds it; otherwise it is
//! downloaded (`hf-hub`: an interrupted download leaves a `.incomplete` blob that the next
//! try, three more in the same run and then the next run, continues with an HTTP range), then
//! checked against the Hub's checksum before use: an LFS file's etag is the SHA-256 of its
//! bytes, a small file's the git blob SHA-1. A mismatch
//! deletes the blob and its snapshot link and is an error. `HF_TOKEN` (or the cache's `token`
//! file) authorises private and gated repositories, `HF_ENDPOINT` names another Hub,
//! `HF_HUB_OFFLINE=1` uses the cache only.

use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A model name that could not be made a local path.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The name is not `hf:ORG/REPO[@REVISION][:QUANT or FILE]`.
    #[error("model name {name:?}: {reason}")]
    Name { name: String, reason: String },
    /// The repository has no file (or no GGUF file) that the name selects.
    #[error("{repo}: {reason}")]
    Select { repo: String, reason: String },
    /// Offline (`HF_HUB_OFFLINE`) and the file is not in the cache.
    #[error("{repo}: {file} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: fetch it once online, or unset HF_HUB_OFFLINE")]
    NotCached {
        repo: String,
        file: String,
        cache: PathBuf,
    },
    /// The download's bytes do not hash to the Hub's checksum: the blob was deleted.
    #[error("{repo}: {file} is corrupt: the Hub's checksum is {kind} {expected}, the download's is {actual} (deleted it: fetch again)")]
    Checksum {
        repo: String,
        file: String,
        kind: &'static str,
        expected: String,
        actual: String,
    },
    /// The Hub refused or the transfer failed.
    #[error("{repo}: {file}: {reason}")]
    Download {
        repo: String,
        file: String,
        reason: String,
    },
    /// The cache could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `hf:ORG/REPO[@REVISION][:QUANT or FILE]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubName {
    /// `ORG/REPO`.
    pub repo: String,
    /// A branch, tag or commit; `main` when not given.
    pub revision: String,
    /// A GGUF quantisation (`Q4_K_M`) or a file in the repository.
    pub selector: Option<String>,
}

/// The prefix of a model name on the Hub.
pub const PREFIX: &str = "hf:";

impl HubName {
    /// Whether `arg` names a model on the Hub (starts with `hf:`).
    pub fn is_hub_name(arg: &str) -> bool {
        arg.starts_with(PREFIX)
    }

    /// Parses `hf:ORG/REPO[@REVISION][:QUANT or FILE]`.
    pub fn parse(name: &str) -> Result<HubName, HubError> {
        let bad = |reason: &str| HubError::Name {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        let rest = name
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("a Hub name starts with hf:"))?;
        let (repo_rev, selector) = match rest.split_once(':') {
            Some((r, s)) if !s.is_empty() => (r, Some(s.to_string())),
            Some(_) => return Err(bad("nothing after ':' (give a quantisation or a file)")),
            None => (rest, None),
        };
        let (repo, revision) = match repo_rev.split_once('@') {
            Some((r, v)) if !v.is_empty() => (r, v.to_string()),
            Some(_) => return Err(bad("nothing after '@' (give a branch, tag or commit)")),
            None => (repo_rev, "main".to_string()),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let valid = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if parts.len() != 2 || !parts.iter().all(|p| valid(p)) {
            return Err(bad(
                "the repository must be ORG/REPO (letters, digits, '-', '_', '.')",
            ));
        }
        if let Some(s) = &selector {
            if s.split('/').any(|p| p.is_empty() || p == "..") {
                return Err(bad("the file must be a path inside the repository"));
            }
        }
        Ok(HubName {
            repo: repo.to_string(),
            revision,
            selector,
        })
    }
}

/// The files of a model directory worth fetching from `files` (the repository's file list):
/// configs, tokenizers, vocabularies and the weights, safetensors where there are any, else
/// PyTorch's or CTranslate2's `.bin`; nothing in subfolders (ONNX, OpenVINO exports), no other
/// frameworks' weights.
pub fn wanted_in_directory(files: &[String]) -> Vec<String> {
    let has_safetensors = files.iter().any(|f| f.ends_with(".safetensors"));
    files
        .iter()
        .filter(|f| !f.contains('/'))
        .filter(|f| {
            let ext = Path::new(f.as_str())
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("");
            match ext {
                "json" | "safetensors" | "model" | "spm" | "txt" | "jinja" | "tiktoken" => true,
                "bin" => !has_safetensors,
                _ => false,
            }
        })
        .filter(|f| !(f.starts_with("tf_") || f.starts_with("flax_") || f.starts_with("rust_")))
        .cloned()
        .collect()
}

/// The GGUF file of `files` that `quant` names (`Q4_K_M`, case ignored): a `.gguf` whose
/// name ends in it, or has it followed by `.` or `-`.
pub fn gguf_for_quant(repo: &str, files: &[String], quant: &str) -> Result<String, HubError> {
    let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
    let q = quant.to_ascii_lowercase();
    let matching: Vec<&&String> = ggufs
        .iter()
        .filter(|f| {
            let lower = f.to_ascii_lowercase();
            let stem = lower.trim_end_matches(".gguf");
            let base = stem.rsplit('/').next().unwrap_or(stem);
            base.match_indices(&q).any(|(at, _)| {
                let before = base[..at].chars().last();
                let after = base[at + q.len()..].chars().next();
                matches!(before, None | Some('-' | '.' | '_'))
                    && matches!(after, None | Some('-' | '.'))
            })
        })
        .collect();
    let select = |reason: String| HubError::Select {
        repo: repo.to_string(),
        reason,
    };
    match matching.as_slice() {
        [one] if is_split_gguf(one) => Err(select(format!(
            "{one} is one part of a split GGUF file, which is not supported: merge the parts \
             with llama.cpp's llama-gguf-split --merge"
        ))),
        [one] => Ok((**one).clone()),
        [] => Err(select(format!(
            "no GGUF file of quantisation {quant}; it has {}",
            list_or_none(&ggufs)
        ))),
        many if many.iter().all(|f| is_split_gguf(f)) => Err(select(format!(
            "the {quant} file is split into parts ({}), which is not supported: merge them \
             with llama.cpp's llama-gguf-split --merge",
            many.len()
        ))),
        many => Err(select(format!(
            "{} GGUF files match {quant} ({}): name the file instead",
            many.len(),
            list_or_none(&many.iter().map(|f| **f).collect::<Vec<_>>())
        ))),
    }
}

fn is_split_gguf(name: &str) -> bool {
    let stem = name.trim_end_matches(".gguf");
    match stem.rsplit_once("-of-") {
        Some((head, total)) => {
            total.len() == 5
                && total.chars().all(|c| c.is_ascii_digit())
                && head.len() >= 5
                && head[head.len() - 5..].chars().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn list_or_none(files: &[&String]) -> String {
    if files.is_empty() {
        "none".to_string()
    } else {
        files
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where names are resolved: the cache, and the Hub unless offline.
pub struct Hub {
    cache: Cache,
    api: Option<Api>,
}

impl Hub {
    /// From the environment: `HF_HUB_CACHE` / `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` (else the
    /// cache's token file), `HF_HUB_OFFLINE`; a progress bar on stderr while downloading when
    /// `progress`.
    pub fn from_env(progress: bool) -> Result<Hub, HubError> {
        let cache = match std::env::var_os("HF_HUB_CACHE") {
            Some(dir) if !dir.is_empty() => Cache::new(PathBuf::from(dir)),
            _ => Cache::from_env(),
        };
        let offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        if offline {
            return Ok(Hub { cache, api: None });
        }
        let token = std::env::var("HF_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| cache.token());
        let mut builder = ApiBuilder::from_cache(cache.clone())
            .with_progress(progress)
            .with_token(token)
            .with_retries(2)
            .with_user_agent("transformer", env!("CARGO_PKG_VERSION"));
        if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        let api = builder.build().map_err(|e| HubError::Download {
            repo: String::new(),
            file: String::new(),
            reason: format!("cannot start the Hub client: {e}"),
        })?;
        Ok(Hub {
            cache,
            api: Some(api),
        })
    }

    /// The cache's folder.
    pub fn cache_dir(&self) -> &Path {
        self.cache.path()
    }

    /// `name` as a local path: the model directory (its snapshot) or the file.
    pub fn resolve(&self, name: &HubName) -> Result<PathBuf, HubError> {
        let repo = Repo::with_revision(name.repo.clone(), RepoType::Model, name.revision.clone());
        let remote = self.api.as_ref().map(|api| api.repo(repo.clone()));
        let files = self.files(name, &repo, remote.as_ref())?;
        let select = |reason: String| HubError::Select {
            repo: name.repo.clone(),
            reason,
        };
        match &name.selector {
            Some(s) if files.iter().any(|f| f == s) => self.fetch(name, &repo, remote.as_ref(), s),
            Some(s) if s.contains('.') && !s.to_ascii_lowercase().starts_with('q') => {
                Err(select(format!("has no file {s}")))
            }
            Some(quant) => {
                let file = gguf_for_quant(&name.repo, &files, quant)?;
                self.fetch(name, &repo, remote.as_ref(), &file)
            }
            None if files.iter().any(|f| f == "config.json") => {
                let wanted = wanted_in_directory(&files);
                let mut dir = None;
                for file in &wanted {
                    let path = self.fetch(name, &repo, remote.as_ref(), file)?;
                    dir = path.parent().map(Path::to_path_buf);
                }
                dir.ok_or_else(|| select("has no model files".into()))
            }
            None => {
                let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
                let file = match ggufs.as_slice() {
                    [] => {
                        return Err(select(
                            "has neither a config.json (a model directory) nor a GGUF file"
                                .into(),
                        ))
                    }
                    [one] => (*one).clone(),
                    _ => gguf_for_quant(&name.repo, &files, "Q4_K_M").map_err(|_| {
                        select(format!(
                            "has {} GGUF files and none is Q4_K_M: name one with \
                             hf:{}:QUANT or hf:{}:FILE ({})",
                            ggufs.len(),
                            name.repo,
                            name.repo,
                            list_or_none(&ggufs)
                        ))
                    })?,
                };
                self.fetch(name, &repo, remote.as_ref(), &file)
            }
        }
    }

    /// The repository's files: from the Hub, or (offline) the cached snapshot's.
    fn files(
        &self,
        name: &HubName,
        repo: &Repo,
        remote: Option<&ApiRepo>,
    ) -> Result<Vec<String>, HubError> {
        if let Some(remote) = remote {
            let info = remote
                .info()
                .map_err(|e| download_error(name, "the file list", e))?;
            return Ok(info.siblings.into_iter().map(|s| s.rfilename).collect());
        }
        let snapshot = self.cached_snapshot(repo).ok_or_else(|| HubError::NotCached {
            repo: name.repo.clone(),
            file: format!("revision {}", name.revision),
            cache: self.cache.path().clone(),
        })?;
        let mut files = Vec::new();
        list_files(&snapshot, &snapshot, &mut files).map_err(|source| HubError::Io {
            path: snapshot.clone(),
            source,
        })?;
        files.sort();
        Ok(files)
    }

    /// The snapshot folder the cache's ref of `repo`'s revision points at.
    fn cached_snapshot(&self, repo: &Repo) -> Option<PathBuf> {
        let folder = self.cache.path().join(repo.folder_name());
        let commit = std::fs::read_to_string(folder.join("refs").join(repo.revision()))
            .ok()
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|| repo.revision().to_string());
        let snapshot = folder.join("snapshots").join(commit);
        snapshot.is_dir().then_some(snapshot)
    }

    /// `file` from the cache, else downloaded and checked.
    fn fetch(
        &self,
        name: &HubName,
        repo: &Repo,
        remote: Option<&ApiRepo>,
        file: &str,
    ) -> Result<PathBuf, HubError> {
        if let Some(path) = self.cache.repo(repo.clone()).get(file) {
            return Ok(path);
        }
        let Some(remote) = remote else {
            return Err(HubError::NotCached {
                repo: name.repo.clone(),
                file: file.to_string(),
                cache: self.cache.path().clone(),
            });
        };
        let pointer = remote
            .download(file)
            .map_err(|e| download_error(name, file, e))?;
        verify(name, file, &pointer)?;
        Ok(pointer)
    }
}

/// Every file under `dir`, as paths relative to `root` with `/`.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            list_files(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

fn download_error(name: &HubName, file: &str, e: ApiError) -> HubError {
    let reason = match &e {
        ApiError::RequestError(inner) => match inner.as_ref() {
            ureq::Error::StatusCode(401) => {
                "the Hub answered 401: the repository is private or gated; set HF_TOKEN to a \
                 token with access"
                    .to_string()
            }
            ureq::Error::StatusCode(403) => {
                "the Hub answered 403: this token has no access (accept the model's terms on \
                 its page, or use another token)"
                    .to_string()
            }
            ureq::Error::StatusCode(404) => format!(
                "the Hub answered 404: no such repository, revision {} or file",
                name.revision
            ),
            other => format!("{other} (no network? HF_HUB_OFFLINE=1 uses the cache only)"),
        },
        other => other.to_string(),
    };
    HubError::Download {
        repo: name.repo.clone(),
        file: file.to_string(),
        reason,
    }
}

/// Checks the downloaded blob `pointer` links to against its name, the Hub's etag: 64 hex
/// digits are an LFS file's SHA-256, 40 a git blob's SHA-1 (of `blob LEN\0` and the bytes).
/// A mismatch deletes the blob and the link.
fn verify(name: &HubName, file: &str, pointer: &Path) -> Result<(), HubError> {
    let io = |source| HubError::Io {
        path: pointer.to_path_buf(),
        source,
    };
    let blob = std::fs::canonicalize(pointer).map_err(io)?;
    let etag = blob
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let hex = etag.chars().all(|c| c.is_ascii_hexdigit());
    let (kind, algorithm, prefix) = match etag.len() {
        64 if hex => ("sha256", &ring::digest::SHA256, None),
        40 if hex => {
            let len = std::fs::metadata(&blob).map_err(io)?.len();
            (
                "git sha1",
                &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
                Some(format!("blob {len}\0")),
            )
        }
        // An etag that is no checksum (another Hub's): nothing to compare.
        _ => return Ok(()),
    };
    let mut context = ring::digest::Context::new(algorithm);
    if let Some(p) = prefix {
        context.update(p.as_bytes());
    }
    let mut reader = std::fs::File::open(&blob).map_err(io)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        context.update(&buf[..n]);
    }
    let actual: String = context
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual == etag {
        return Ok(());
    }
    let _ = std::fs::remove_file(pointer);
    let _ = std::fs::remove_file(&blob);
    Err(HubError::Checksum {
        repo: name.repo.clone(),
        file: file.to_string(),
        kind,
        expected: etag,
        actual,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_parse_and_bad_ones_are_refused() {
        let n = HubName::parse("hf:bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").unwrap();
        assert_eq!(n.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
        assert_eq!(n.revision, "main");
        assert_eq!(n.selector.as_deref(), Some("Q4_K_M"));
        let n = HubName::parse("hf:org/repo@v1.0").unwrap();
        assert_eq!((n.revision.as_str(), n.selector), ("v1.0", None));
        for bad in [
            "org/repo",
            "hf:repo",
            "hf:a/b/c",
            "hf:org/repo:",
            "hf:org/repo@:x",
            "hf:../x",
            "hf:org/re po",
            "hf:org/repo:../etc/passwd",
        ] {
            assert!(HubName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantisations_select_one_gguf_and_say_what_there_is() {
        let files = names(&[
            "README.md",
            "m-Q4_K_M.gguf",
            "m-Q4_K_S.gguf",
            "m-Q8_0.gguf",
            "m-q6_k.gguf",
            "big-Q5_K_M-00001-of-00002.gguf",
            "big-Q5_K_M-00002-of-00002.gguf",
        ]);
        assert_eq!(gguf_for_quant("r", &files, "Q4_K_M").unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(gguf_for_quant("r", &files, "q8_0").unwrap(), "m-Q8_0.gguf");
        assert_eq!(gguf_for_quant("r", &files, "Q6_K").unwrap(), "m-q6_k.gguf");
        // Q4_K is a prefix of Q4_K_M and Q4_K_S, not a match of either.
        let e = gguf_for_quant("r", &files, "Q4_K").unwrap_err().to_string();
        assert!(e.contains("no GGUF file of quantisation Q4_K") && e.contains("m-Q8_0.gguf"), "{e}");
        let e = gguf_for_quant("r", &files, "Q5_K_M").unwrap_err().to_string();
        assert!(e.contains("split"), "{e}");
    }

    #[test]
    fn a_directory_fetches_configs_tokenizers_and_one_kind_of_weights() {
        let files = names(&[
            "config.json",
            "model.safetensors",
            "pytorch_model.bin",
            "tf_model.h5",
            "tokenizer.json",
            "spiece.model",
            "onnx/model.onnx",
            "generation_config.json",
            "README.md",
            ".gitattributes",
        ]);
        assert_eq!(
            wanted_in_directory(&files),
            names(&[
                "config.json",
                "model.safetensors",
                "tokenizer.json",
                "spiece.model",
                "generation_config.json"
            ])
        );
        let ct2 = names(&["config.json", "model.bin", "shared_vocabulary.json"]);
        assert_eq!(wanted_in_directory(&ct2), ct2);
    }
}
