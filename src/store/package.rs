//! A model's files by name, from a directory or from a zip archive read into memory (an Argos
//! Translate `.argosmodel` package: one top directory holding `metadata.json`, `model/`,
//! `sentencepiece.model`, ...), so that a loader reads either without extracting anything.
//! Every error names the file (an archive's entry as `archive/entry`).

use crate::error::Result;
use crate::store::ckpt_err;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest archive entry read (a model.bin of a big model is a few GiB).
const MAX_ENTRY: u64 = 16 << 30;

/// Named files under one root.
#[derive(Clone, Debug)]
pub enum Files {
    /// The files of a directory.
    Dir(PathBuf),
    /// The entries of a zip archive (`archive`), by name without the top directory `top`.
    Zip {
        archive: PathBuf,
        top: String,
        entries: std::sync::Arc<HashMap<String, Vec<u8>>>,
    },
}

impl Files {
    /// Reads every file entry of the zip archive `path`; its entries must share one top
    /// directory (the package's), which is left out of their names.
    pub fn zip(path: &Path) -> Result<Files> {
        let file = std::fs::File::open(path).map_err(|e| ckpt_err(path, format!("cannot open: {e}")))?;
        let mut archive = zip::ZipArchive::new(file)
            .map_err(|e| ckpt_err(path, format!("not a zip archive (an .argosmodel is one): {e}")))?;
        let mut entries = HashMap::new();
        let mut top: Option<String> = None;
        for i in 0..archive.len() {
            let mut entry = archive
                .by_index(i)
                .map_err(|e| ckpt_err(path, format!("entry {i}: {e}")))?;
            let name = entry
                .name()
                .map_err(|e| ckpt_err(path, format!("entry {i}: {e}")))?
                .to_string();
            let (first, rest) = name.split_once('/').unwrap_or((&name, ""));
            match &top {
                None => top = Some(first.to_string()),
                Some(t) if t != first => {
                    return Err(ckpt_err(
                        path,
                        format!("entries {t}/... and {name}: a package holds one top directory"),
                    ))
                }
                _ => {}
            }
            if entry.is_dir() || rest.is_empty() {
                continue;
            }
            if entry.size() > MAX_ENTRY {
                return Err(ckpt_err(path, format!("entry {name} is {} bytes", entry.size())));
            }
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| ckpt_err(path, format!("entry {name}: {e}")))?;
            entries.insert(rest.to_string(), bytes);
        }
        Ok(Files::Zip {
            archive: path.to_path_buf(),
            top: top.ok_or_else(|| ckpt_err(path, "an empty archive"))?,
            entries: std::sync::Arc::new(entries),
        })
    }

    /// The files under `sub` (a directory of these files).
    pub fn sub(&self, sub: &str) -> Files {
        match self {
            Files::Dir(d) => Files::Dir(d.join(sub)),
            Files::Zip { archive, top, entries } => {
                let prefix = format!("{sub}/");
                Files::Zip {
                    archive: archive.clone(),
                    top: format!("{top}/{sub}"),
                    entries: std::sync::Arc::new(
                        entries
                            .iter()
                            .filter_map(|(n, b)| Some((n.strip_prefix(&prefix)?.to_string(), b.clone())))
                            .collect(),
                    ),
                }
            }
        }
    }

    /// Where `name` is, for messages (an archive's entry: `archive/top/name`).
    pub fn path(&self, name: &str) -> PathBuf {
        match self {
            Files::Dir(d) => d.join(name),
            Files::Zip { archive, top, .. } => archive.join(top).join(name),
        }
    }

    /// Where these files are (the directory, or `archive/top`).
    pub fn root(&self) -> PathBuf {
        match self {
            Files::Dir(d) => d.clone(),
            Files::Zip { archive, top, .. } => archive.join(top),
        }
    }

    /// Whether `name` is a file here.
    pub fn has(&self, name: &str) -> bool {
        match self {
            Files::Dir(d) => d.join(name).is_file(),
            Files::Zip { entries, .. } => entries.contains_key(name),
        }
    }

    /// The bytes of `name`, or an error naming it.
    pub fn read(&self, name: &str) -> Result<Vec<u8>> {
        match self {
            Files::Dir(d) => crate::store::read_file(&d.join(name)),
            Files::Zip { entries, .. } => entries
                .get(name)
                .cloned()
                .ok_or_else(|| ckpt_err(&self.path(name), "file not found in the package")),
        }
    }
}
