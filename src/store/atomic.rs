//! All-or-nothing checkpoint directories: a save becomes visible whole or not at all, and a
//! reader never pairs files of two saves.
//!
//! A save ([`CheckpointWriter`]) writes every file of the checkpoint into a staging directory,
//! fsyncs each, writes the manifest [`MANIFEST_FILE`] (every file's size and 64-bit
//! [`content_hash`]) last, fsyncs the staging directory, and then publishes the set:
//!
//! - into a directory that does not exist yet (a step checkpoint, `average --out`): the staging
//!   directory is `PARENT/.NAME.saving`, renamed to `PARENT/NAME` in one step;
//! - into a directory that exists (the run directory, which also holds the metrics log and the
//!   step checkpoints; an in-place `--resume D --out D`): the staging directory is
//!   `DIR/.saving`, and renaming it to `DIR/.commit` is the commit point. Then every file moves
//!   from `.commit` into `DIR` (the manifest last), files of the old checkpoint that the new
//!   one does not have are deleted, and `.commit` is removed.
//!
//! Readers ([`read_file`], which every checkpoint loader goes through) take the manifest in
//! force, `DIR/.commit/checkpoint.json` while it exists and `DIR/checkpoint.json` otherwise, read
//! each file from `.commit` while it is still there, and check its size and hash against that
//! manifest: they see the old checkpoint or the new one, never a mix. The next writer
//! ([`recover`], called by every save) finishes an interrupted commit and deletes an
//! interrupted staging directory, so a kill at any moment leaves a loadable directory. A
//! directory without a manifest (written before this scheme, or by another tool) is read as it
//! is.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest of a checkpoint directory: the files of the last complete save.
pub const MANIFEST_FILE: &str = "checkpoint.json";
/// The staging directory of a save into an existing directory.
pub const STAGING_DIR: &str = ".saving";
/// A staged save that is committed but whose files are not all moved into place yet.
pub const COMMIT_DIR: &str = ".commit";
/// The suffix of the staging directory `PARENT/.NAME.saving` of a save into a new directory.
const NEW_DIR_SUFFIX: &str = ".saving";

/// The files a checkpoint may hold; in an existing directory, a save deletes those it does not
/// write, so no file of an older save survives beside a newer one.
pub const CHECKPOINT_FILES: [&str; 6] = [
    super::CONFIG_FILE,
    super::MODEL_FILE,
    super::OPTIMIZER_FILE,
    super::TRAINER_STATE_FILE,
    super::VOCAB_FILE,
    super::TOKENIZER_FILE,
];

/// One file of a [`Manifest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Size in bytes.
    pub bytes: u64,
    /// [`content_hash`] of the contents, 16 hex digits.
    pub hash: String,
}

/// `checkpoint.json`: the files of one complete save.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The layout version (1).
    pub format: u32,
    /// File name -> size and hash.
    pub files: BTreeMap<String, FileEntry>,
}

/// A 64-bit hash of `bytes` for the manifest (FNV-1a over little-endian 8-byte words, the
/// tail bytes and the length): it tells files of different saves apart, it is no defence
/// against a forger.
pub fn content_hash(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(PRIME);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    (h ^ bytes.len() as u64).wrapping_mul(PRIME)
}

fn io_err(path: &Path, cause: std::io::Error) -> Error {
    Error::Write {
        path: path.to_path_buf(),
        cause,
    }
}

fn not_found(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
}

/// fsync of a directory, so that the renames and creations in it are durable.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

/// Creates `path` with `bytes` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(|e| io_err(path, e))
}

fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if !not_found(&e) => Err(io_err(dir, e)),
        _ => Ok(()),
    }
}

fn remove_file_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if !not_found(&e) => Err(io_err(path, e)),
        _ => Ok(()),
    }
}

/// The parent of `dir` (`.` for a bare name) and its final name.
fn parent_and_name(dir: &Path) -> Result<(PathBuf, String)> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Error::Input(format!(
                "{}: not a directory name to save a checkpoint under",
                dir.display()
            ))
        })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_string()))
}

/// Reads and parses a manifest (`None` when the file does not exist).
fn read_manifest(path: &Path) -> Result<Option<Manifest>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(super::ckpt_err(path, format!("cannot read: {e}"))),
    };
    let manifest: Manifest = serde_json::from_slice(super::strip_bom(&bytes))
        .map_err(|e| super::ckpt_err(path, format!("invalid checkpoint manifest: {e}")))?;
    if manifest.format != 1 {
        return Err(super::ckpt_err(
            path,
            format!("manifest format {} is not 1", manifest.format),
        ));
    }
    for name in manifest.files.keys() {
        check_name(name).map_err(|e| super::ckpt_err(path, e))?;
    }
    Ok(Some(manifest))
}

/// A file name a checkpoint may hold: one plain path component.
fn check_name(name: &str) -> std::result::Result<(), String> {
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && name != MANIFEST_FILE;
    if plain {
        Ok(())
    } else {
        Err(format!("{name:?} is not a file name a checkpoint can hold"))
    }
}

/// The manifest in force in `dir` and whether its files may still sit in `.commit` (a commit
/// under way or interrupted); `None` for a directory without a manifest.
pub fn manifest_in_force(dir: &Path) -> Result<Option<(Manifest, bool)>> {
    if let Some(m) = read_manifest(&dir.join(COMMIT_DIR).join(MANIFEST_FILE))? {
        return Ok(Some((m, true)));
    }
    Ok(read_manifest(&dir.join(MANIFEST_FILE))?.map(|m| (m, false)))
}

/// Whether `dir` holds a complete checkpoint: a manifest in force whose files are all there,
/// or (written before manifests) `config.json`, `model.safetensors` and `trainer_state.json`.
pub fn is_complete(dir: &Path) -> bool {
    match manifest_in_force(dir) {
        Ok(Some((manifest, overlay))) => manifest.files.keys().all(|name| {
            dir.join(name).is_file() || (overlay && dir.join(COMMIT_DIR).join(name).is_file())
        }),
        Ok(None) => [
            super::CONFIG_FILE,
            super::MODEL_FILE,
            super::TRAINER_STATE_FILE,
        ]
        .iter()
        .all(|f| dir.join(f).is_file()),
        Err(_) => false,
    }
}

/// Reads the file at `path` of a checkpoint directory, checked against the directory's
/// manifest when it has one (see the module's description): a file the manifest lists must
/// have its size and hash; a checkpoint file ([`CHECKPOINT_FILES`]) it does not list is
/// reported missing. Other files, and files of directories without a manifest, are read as
/// they are.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    let plain = |p: &Path| {
        std::fs::read(p).map_err(|e| {
            if not_found(&e) {
                super::ckpt_err(path, "file not found")
            } else if p.is_dir() {
                super::ckpt_err(path, "is a directory, not a file")
            } else {
                super::ckpt_err(path, format!("cannot read: {e}"))
            }
        })
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return plain(path);
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if name == MANIFEST_FILE {
        return plain(path);
    }
    let Some((manifest, overlay)) = manifest_in_force(dir)? else {
        return plain(path);
    };
    let Some(entry) = manifest.files.get(name) else {
        if CHECKPOINT_FILES.contains(&name) {
            return Err(super::ckpt_err(
                path,
                format!(
                    "file not found (not part of the checkpoint: {} does not list it)",
                    dir.join(MANIFEST_FILE).display()
                ),
            ));
        }
        return plain(path);
    };
    let bytes = if overlay {
        match std::fs::read(dir.join(COMMIT_DIR).join(name)) {
            Ok(b) => b,
            Err(e) if not_found(&e) => plain(path)?,
            Err(e) => return Err(super::ckpt_err(path, format!("cannot read: {e}"))),
        }
    } else {
        plain(path)?
    };
    let hash = format!("{:016x}", content_hash(&bytes));
    if bytes.len() as u64 != entry.bytes || hash != entry.hash {
        return Err(super::ckpt_err(
            path,
            format!(
                "does not match the checkpoint's manifest {} ({} bytes with hash {hash}, \
                 expected {} bytes with hash {}): the file was changed after the save, or \
                 the directory was being saved into while it was read",
                dir.join(MANIFEST_FILE).display(),
                bytes.len(),
                entry.bytes,
                entry.hash
            ),
        ));
    }
    Ok(bytes)
}

/// Brings `dir` (an existing checkpoint directory) to a clean state before a save: finishes a
/// commit that was interrupted (its files are complete), deletes a staging directory that was
/// interrupted (the previous checkpoint is still in place) and the temporary files of single
/// writes (`NAME.tmp`).
pub fn recover(dir: &Path) -> Result<()> {
    let commit = dir.join(COMMIT_DIR);
    if commit.is_dir() {
        roll_forward(dir)?;
    }
    remove_dir_if_present(&dir.join(STAGING_DIR))?;
    for name in CHECKPOINT_FILES.iter().chain(&[MANIFEST_FILE]) {
        remove_file_if_present(&dir.join(format!("{name}.tmp")))?;
    }
    Ok(())
}

/// Moves the committed files of `dir/.commit` into `dir` (the manifest last), deletes the
/// checkpoint files the new manifest does not list, and removes `.commit`. Idempotent: a kill
/// in the middle leaves a state it finishes from.
fn roll_forward(dir: &Path) -> Result<()> {
    let commit = dir.join(COMMIT_DIR);
    let staged_manifest = commit.join(MANIFEST_FILE);
    if let Some(manifest) = read_manifest(&staged_manifest)? {
        for name in manifest.files.keys() {
            let from = commit.join(name);
            if from.exists() {
                std::fs::rename(&from, dir.join(name)).map_err(|e| io_err(&dir.join(name), e))?;
            }
        }
        for name in CHECKPOINT_FILES {
            if !manifest.files.contains_key(name) {
                remove_file_if_present(&dir.join(name))?;
            }
        }
        sync_dir(dir)?;
        std::fs::rename(&staged_manifest, dir.join(MANIFEST_FILE))
            .map_err(|e| io_err(&dir.join(MANIFEST_FILE), e))?;
        sync_dir(dir)?;
    }
    remove_dir_if_present(&commit)?;
    sync_dir(dir)
}

/// The suffix of a checkpoint directory being deleted ([`remove_checkpoint`]).
const REMOVING_SUFFIX: &str = ".removing";

/// Deletes the staging directories `.NAME.saving` that interrupted saves of new directories
/// left in `parent` (a run's `checkpoints/`), and the remains `.NAME.removing` of interrupted
/// deletions.
pub fn remove_stale_staging(parent: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let ours = name.ends_with(NEW_DIR_SUFFIX) || name.ends_with(REMOVING_SUFFIX);
        if name.starts_with('.') && ours && name.len() > 9 {
            remove_dir_if_present(&entry.path())?;
        }
    }
    Ok(())
}

/// Deletes the checkpoint directory `dir` all at once: renamed to `.NAME.removing` first
/// (one step, after which it is no longer a checkpoint), then deleted, so that a kill during
/// the deletion never leaves a checkpoint with files missing.
pub fn remove_checkpoint(dir: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(dir)?;
    let doomed = parent.join(format!(".{name}{REMOVING_SUFFIX}"));
    remove_dir_if_present(&doomed)?;
    std::fs::rename(dir, &doomed).map_err(|e| io_err(dir, e))?;
    remove_dir_if_present(&doomed)
}

/// One all-or-nothing save of a checkpoint directory: [`CheckpointWriter::begin`], a
/// [`CheckpointWriter::add`] per file, [`CheckpointWriter::commit`]. Dropped without a commit
/// (an error on the way), it deletes what it staged and leaves the directory as it was.
pub struct CheckpointWriter {
    dir: PathBuf,
    staging: PathBuf,
    /// The directory did not exist: the staging directory becomes it by one rename.
    fresh: bool,
    manifest: Manifest,
    done: bool,
}

impl CheckpointWriter {
    /// Starts a save into `dir` (created when missing, with its parents); an existing `dir`
    /// is first `recover`ed.
    pub fn begin(dir: &Path) -> Result<CheckpointWriter> {
        let (parent, name) = parent_and_name(dir)?;
        let fresh = match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => false,
            Ok(_) => {
                return Err(Error::Input(format!(
                    "{} is a file, not a directory: cannot save a checkpoint into it",
                    dir.display()
                )))
            }
            Err(e) if not_found(&e) => true,
            Err(e) => return Err(io_err(dir, e)),
        };
        let staging = if fresh {
            std::fs::create_dir_all(&parent).map_err(|e| io_err(&parent, e))?;
            parent.join(format!(".{name}{NEW_DIR_SUFFIX}"))
        } else {
            recover(dir)?;
            dir.join(STAGING_DIR)
        };
        remove_dir_if_present(&staging)?;
        std::fs::create_dir(&staging).map_err(|e| io_err(&staging, e))?;
        Ok(CheckpointWriter {
            dir: dir.to_path_buf(),
            staging,
            fresh,
            manifest: Manifest {
                format: 1,
                files: BTreeMap::new(),
            },
            done: false,
        })
    }

    /// The directory being saved.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stages the file `name` (a plain file name) with `bytes`, fsynced.
    pub fn add(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        check_name(name).map_err(|e| super::ckpt_err(&self.dir.join(name), e))?;
        if self.manifest.files.contains_key(name) {
            return Err(super::ckpt_err(
                &self.dir.join(name),
                "written twice in one save",
            ));
        }
        write_synced(&self.staging.join(name), bytes)?;
        self.manifest.files.insert(
            name.to_string(),
            FileEntry {
                bytes: bytes.len() as u64,
                hash: format!("{:016x}", content_hash(bytes)),
            },
        );
        Ok(())
    }

    /// Writes the manifest and publishes the staged files at once (see the module's
    /// description).
    pub fn commit(mut self) -> Result<()> {
        let json = serde_json::to_string_pretty(&self.manifest).expect("a manifest serialises");
        write_synced(&self.staging.join(MANIFEST_FILE), json.as_bytes())?;
        sync_dir(&self.staging)?;
        let (parent, _) = parent_and_name(&self.dir)?;
        if self.fresh {
            std::fs::rename(&self.staging, &self.dir).map_err(|e| io_err(&self.dir, e))?;
            self.done = true;
            return sync_dir(&parent);
        }
        let commit = self.dir.join(COMMIT_DIR);
        std::fs::rename(&self.staging, &commit).map_err(|e| io_err(&commit, e))?;
        self.done = true;
        sync_dir(&self.dir)?;
        roll_forward(&self.dir)
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(dir: &Path, files: &[(&str, &str)]) -> Result<()> {
        let mut w = CheckpointWriter::begin(dir)?;
        for (n, b) in files {
            w.add(n, b.as_bytes())?;
        }
        w.commit()
    }

    fn read(dir: &Path, name: &str) -> Result<String> {
        Ok(String::from_utf8(read_file(&dir.join(name))?).unwrap())
    }

    #[test]
    fn new_and_existing_directories_are_replaced_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        save(
            &dir,
            &[("config.json", "a1"), ("optimizer.safetensors", "o1")],
        )
        .unwrap();
        assert_eq!(read(&dir, "config.json").unwrap(), "a1");
        std::fs::write(dir.join("metrics.jsonl"), "m").unwrap();
        save(&dir, &[("config.json", "a2"), ("model.safetensors", "w2")]).unwrap();
        assert_eq!(read(&dir, "config.json").unwrap(), "a2");
        assert_eq!(read(&dir, "model.safetensors").unwrap(), "w2");
        // The old optimizer is gone with the old save; other files stay.
        assert!(!dir.join("optimizer.safetensors").exists());
        assert!(read(&dir, "optimizer.safetensors").is_err());
        assert_eq!(read(&dir, "metrics.jsonl").unwrap(), "m");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "checkpoint.json",
                "config.json",
                "metrics.jsonl",
                "model.safetensors"
            ]
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_changed_file_is_refused_and_an_unlisted_one_read_as_is() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        save(&dir, &[("model.safetensors", "weights")]).unwrap();
        std::fs::write(dir.join("model.safetensors"), "weightz").unwrap();
        let e = read(&dir, "model.safetensors").unwrap_err().to_string();
        assert!(
            e.contains("does not match the checkpoint's manifest"),
            "{e}"
        );
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        assert_eq!(read(&dir, "notes.txt").unwrap(), "x");
        assert!(read(&dir, "trainer_state.json")
            .unwrap_err()
            .to_string()
            .contains("not part of the checkpoint"));
    }

    /// Every state a kill can leave: staging half written, committed but not moved, moved in
    /// part, manifest moved but `.commit` not removed.
    #[test]
    fn interrupted_saves_read_as_old_or_new_and_recover() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        let old = [("config.json", "c1"), ("model.safetensors", "w1")];
        let new = [("config.json", "c2"), ("model.safetensors", "w2")];
        let both = |dir: &Path| {
            (
                read(dir, "config.json").unwrap(),
                read(dir, "model.safetensors").unwrap(),
            )
        };
        for stage in 0..5 {
            remove_dir_if_present(&dir).unwrap();
            save(&dir, &old).unwrap();
            // Stage the new save by hand up to `stage`.
            let staging = dir.join(STAGING_DIR);
            let mut w = CheckpointWriter::begin(&dir).unwrap();
            for (n, b) in new {
                w.add(n, b.as_bytes()).unwrap();
            }
            let json = serde_json::to_string(&w.manifest).unwrap();
            std::mem::forget(w);
            let expect_new = stage >= 1;
            if stage >= 1 {
                std::fs::write(staging.join(MANIFEST_FILE), &json).unwrap();
                std::fs::rename(&staging, dir.join(COMMIT_DIR)).unwrap();
            }
            if stage >= 2 {
                let c = dir.join(COMMIT_DIR);
                std::fs::rename(c.join("config.json"), dir.join("config.json")).unwrap();
            }
            if stage >= 3 {
                let c = dir.join(COMMIT_DIR);
                std::fs::rename(c.join("model.safetensors"), dir.join("model.safetensors"))
                    .unwrap();
            }
            if stage >= 4 {
                let c = dir.join(COMMIT_DIR);
                std::fs::rename(c.join(MANIFEST_FILE), dir.join(MANIFEST_FILE)).unwrap();
            }
            let want = if expect_new {
                ("c2", "w2")
            } else {
                ("c1", "w1")
            };
            let got = both(&dir);
            assert_eq!((got.0.as_str(), got.1.as_str()), want, "stage {stage}");
            assert!(is_complete(&dir));
            recover(&dir).unwrap();
            let got = both(&dir);
            assert_eq!((got.0.as_str(), got.1.as_str()), want, "stage {stage}");
            assert!(!dir.join(COMMIT_DIR).exists() && !staging.exists());
        }
    }

    #[test]
    fn a_failed_save_leaves_the_directory_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        save(&dir, &[("config.json", "c1")]).unwrap();
        let mut w = CheckpointWriter::begin(&dir).unwrap();
        w.add("config.json", b"c2").unwrap();
        assert!(w.add("config.json", b"c3").is_err());
        assert!(w.add("../escape", b"x").is_err());
        drop(w);
        assert_eq!(read(&dir, "config.json").unwrap(), "c1");
        assert!(!dir.join(STAGING_DIR).exists());
        // A new directory whose save fails never appears.
        let fresh = tmp.path().join("fresh");
        let mut w = CheckpointWriter::begin(&fresh).unwrap();
        w.add("config.json", b"c").unwrap();
        drop(w);
        assert!(!fresh.exists());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn content_hash_sees_every_byte_and_the_length() {
        let a = content_hash(b"0123456789abcdef");
        assert_ne!(a, content_hash(b"0123456789abcdeg"));
        assert_ne!(content_hash(b""), content_hash(b"\0"));
        assert_ne!(content_hash(b"\0"), content_hash(b"\0\0"));
    }
}
