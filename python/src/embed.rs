//! `transformer.Encoder`: sentence embeddings of a pretrained BERT-style encoder
//! (all-MiniLM-L6-v2): the mean of the last hidden states over the tokens, L2-normalised.

use crate::{check_exists, float_precision, py_err, Pool};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;
use transformer::SentenceEncoder;

/// A sentence encoder loaded from a Hugging Face BERT directory.
#[pyclass(module = "transformer", frozen)]
pub struct Encoder {
    inner: SentenceEncoder,
    pool: Pool,
}

#[pymethods]
impl Encoder {
    /// Loads `path` (config.json, model.safetensors, tokenizer.json); `max_len` word pieces
    /// per sentence (default: the directory's sentence_bert_config.json, else 256).
    #[new]
    #[pyo3(signature = (path, precision = "f32", threads = None, max_len = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        precision: &str,
        threads: Option<usize>,
        max_len: Option<usize>,
    ) -> PyResult<Self> {
        check_exists(&path, "model directory")?;
        let precision = float_precision(precision)?;
        let pool = Pool::new(threads)?;
        let inner = py.detach(|| {
            pool.run(|| {
                let mut e = SentenceEncoder::load(&path, max_len).map_err(py_err)?;
                e.model
                    .prepare_precision(precision)
                    .map_err(|e| PyValueError::new_err(format!("precision: {e}")))?;
                Ok::<_, PyErr>(e)
            })
        })?;
        Ok(Encoder { inner, pool })
    }

    /// The embeddings of `sentences`, a float32 array `[len(sentences), d_model]`, each row of
    /// unit length.
    #[pyo3(signature = (sentences, batch_size = 32))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        sentences: Vec<String>,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let d = self.dim();
        let rows = py
            .detach(|| {
                self.pool
                    .run(|| self.inner.embed(&sentences, batch_size.max(1)))
            })
            .map_err(py_err)?;
        let n = rows.len();
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        let array = Array2::from_shape_vec((n, d), flat)
            .map_err(|e| PyValueError::new_err(format!("embedding shape: {e}")))?;
        Ok(array.into_pyarray(py))
    }

    /// The width of an embedding (`d_model`).
    #[getter]
    fn dim(&self) -> usize {
        self.inner.model.config.hidden_size
    }
}
