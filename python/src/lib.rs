//! The native part of the Python package `transformer` (PyO3): the library's pipelines as
//! Python classes — [`Translator`](translate::Translator), [`Generator`](generate::Generator)
//! (with its [`TokenStream`](generate::TokenStream)), [`Encoder`](embed::Encoder) — and the
//! training entry points [`train`](train::train) and [`train_lm`](train::train_lm).
//!
//! Model work runs with the GIL released (`Python::detach`), on the object's own thread pool
//! when it was given `threads`. The library's errors become Python exceptions carrying the
//! library's message: `OSError` (`FileNotFoundError` for a missing path) for files that cannot
//! be read or written, `ValueError` for everything else it refuses.

mod embed;
mod generate;
mod train;
mod translate;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use std::path::Path;
use transformer::text::TextError;
use transformer::Error;

/// The Python exception for a library error, with the library's message.
pub(crate) fn py_err(e: Error) -> PyErr {
    let message = e.to_string();
    match &e {
        Error::Write { .. } | Error::Text(TextError::Io { .. } | TextError::Write { .. }) => {
            PyOSError::new_err(message)
        }
        // A checkpoint file that is not there, or cannot be opened, is a file problem; one
        // that is there but wrong (truncated, corrupt, mismatched) is a bad value.
        Error::Checkpoint { path, .. } if !path.exists() => PyFileNotFoundError::new_err(message),
        Error::Checkpoint { path, .. } if path.is_file() && std::fs::File::open(path).is_err() => {
            PyOSError::new_err(message)
        }
        _ => PyValueError::new_err(message),
    }
}

/// `FileNotFoundError` naming `what` when `path` does not exist (checked before loading, so
/// that a mistyped path is an `OSError` whichever loader would have met it first).
pub(crate) fn check_exists(path: &Path, what: &str) -> PyResult<()> {
    if path.exists() {
        Ok(())
    } else {
        Err(PyFileNotFoundError::new_err(format!(
            "{what} {} does not exist",
            path.display()
        )))
    }
}

/// The float precision of a model's products: `f32`, `bf16` or `int8`.
pub(crate) fn float_precision(name: &str) -> PyResult<transformer::Precision> {
    use transformer::Precision as P;
    match name {
        "f32" => Ok(P::F32),
        "bf16" => Ok(P::Bf16),
        "int8" => Ok(P::Int8),
        "ggml" => Err(PyValueError::new_err(
            "precision \"ggml\" is for .gguf models only (use f32, bf16 or int8)",
        )),
        other => Err(PyValueError::new_err(format!(
            "precision {other:?} is not one of \"f32\", \"bf16\", \"int8\""
        ))),
    }
}

/// The worker threads of one object: its own rayon pool of `threads`, or (None, 0) the
/// global pool of all cores.
pub(crate) struct Pool(Option<rayon::ThreadPool>);

impl Pool {
    /// A pool of `threads` workers (`None` or 0: the global pool).
    pub(crate) fn new(threads: Option<usize>) -> PyResult<Pool> {
        match threads {
            None | Some(0) => Ok(Pool(None)),
            Some(n) => rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map(|p| Pool(Some(p)))
                .map_err(|e| PyValueError::new_err(format!("threads={n}: {e}"))),
        }
    }

    /// Runs `work` on this pool's workers (the library's parallel loops then use them).
    pub(crate) fn run<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        match &self.0 {
            Some(pool) => pool.install(work),
            None => work(),
        }
    }
}

/// The Transformer of "Attention Is All You Need" in Rust: translation, generation, chat,
/// sentence embeddings and training.
#[pymodule]
fn _transformer(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<translate::Translator>()?;
    m.add_class::<generate::Generator>()?;
    m.add_class::<generate::TokenStream>()?;
    m.add_class::<embed::Encoder>()?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_function(wrap_pyfunction!(train::train_lm, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
