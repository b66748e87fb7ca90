//! The seam stays a seam: no file of `src/model` reaches the kernels except through
//! [`super::Backend`] and the types re-exported beside it.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/model is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_model_file_imports_the_kernels() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model");
    let mut files = Vec::new();
    rust_files(&model, &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    // `crate::kernels`, `super::kernels`, `super::super::kernels`, ... and a bare `kernels::`
    // path after `use` (an import through a glob or a re-export of the crate root).
    let forbidden = ["crate::kernels", "super::kernels", "use kernels", "transformer::kernels"];
    let mut offenders = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            if forbidden.iter().any(|f| line.contains(f)) {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "src/model must compute through crate::backend, not the kernels:\n{}",
        offenders.join("\n")
    );
}
