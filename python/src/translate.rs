//! `transformer.Translator`: a translation model directory (`transformer train`, `demo --out`,
//! `average`): greedy and beam translation with n-best lists, and `log p(target | source)` of
//! given pairs.

use crate::{check_exists, float_precision, py_err, Pool};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::path::PathBuf;
use transformer::decode::beam::MAX_BEAM;
use transformer::text::corpus::Pair;
use transformer::{BeamOptions, BeamStop};

/// An encoder-decoder translation model and its vocabulary.
#[pyclass(module = "transformer", frozen)]
pub struct Translator {
    inner: transformer::Translator,
    pool: Pool,
}

#[pymethods]
impl Translator {
    /// Loads a model directory; `precision` "f32", "bf16" or "int8"; `threads` workers of its
    /// own (None: all cores).
    #[new]
    #[pyo3(signature = (path, precision = "f32", threads = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        precision: &str,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        check_exists(&path, "model directory")?;
        let precision = float_precision(precision)?;
        let pool = Pool::new(threads)?;
        let inner = py.detach(|| {
            pool.run(|| {
                let mut t = transformer::Translator::load(&path)?;
                t.prepare_precision(precision)?;
                Ok::<_, transformer::Error>(t)
            })
        });
        Ok(Translator {
            inner: inner.map_err(py_err)?,
            pool,
        })
    }

    /// Translates `sentences` (empty ones stay empty): greedy with `beam=1`, beam search with
    /// length penalty `alpha` above. With `nbest=1` a list of strings; with `nbest > 1` a list
    /// (per sentence) of `(score, text)` pairs, best first. A multilingual model (NLLB,
    /// M2M100) translates from `source_lang` to `target_lang` (its codes, e.g. "eng_Latn";
    /// None: its tokenizer_config.json's).
    #[pyo3(signature = (sentences, beam = 1, nbest = 1, alpha = 0.6, max_extra = 50,
                        batch_size = 32, beam_stop = "exact", source_lang = None,
                        target_lang = None))]
    #[allow(clippy::too_many_arguments)]
    fn translate<'py>(
        &self,
        py: Python<'py>,
        sentences: Vec<String>,
        beam: usize,
        nbest: usize,
        alpha: f64,
        max_extra: usize,
        batch_size: usize,
        beam_stop: &str,
        source_lang: Option<&str>,
        target_lang: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !(1..=MAX_BEAM as usize).contains(&beam) {
            return Err(PyValueError::new_err(format!(
                "beam={beam} must be in 1..={MAX_BEAM}"
            )));
        }
        if nbest == 0 || nbest > beam {
            return Err(PyValueError::new_err(format!(
                "nbest={nbest} must be in 1..=beam (beam={beam})"
            )));
        }
        if !alpha.is_finite() {
            return Err(PyValueError::new_err(format!(
                "alpha={alpha} must be a finite number"
            )));
        }
        let stop = match beam_stop {
            "exact" => BeamStop::Exact,
            "first-k" => BeamStop::FirstK,
            "hugging-face" => BeamStop::HuggingFace,
            other => {
                return Err(PyValueError::new_err(format!(
                    "beam_stop={other:?} is not \"exact\", \"first-k\" or \"hugging-face\""
                )))
            }
        };
        let options = BeamOptions {
            beam_size: beam,
            alpha,
            max_len_extra: max_extra,
            batch_size: batch_size.max(1),
            nbest,
            stop,
            // The translator forces a multilingual model's target language itself, and applies
            // the defaults of the runtime the model came from.
            forced_first: None,
            min_len: 0,
            forced_end: false,
            beam_rules: Default::default(),
        };
        let languages = (self.inner)
            .languages_of(source_lang, target_lang)
            .map_err(py_err)?;
        let lists = py
            .detach(|| {
                self.pool
                    .run(|| (self.inner).translate_nbest_in(languages, &sentences, &options))
            })
            .map_err(py_err)?;
        if nbest == 1 {
            let best: Vec<String> = lists
                .into_iter()
                .map(|l| l.into_iter().next().map(|(_, t)| t).unwrap_or_default())
                .collect();
            best.into_bound_py_any(py)
        } else {
            lists.into_bound_py_any(py)
        }
    }

    /// `log p(target | source)` of each pair (natural log, summed over the target's tokens and
    /// the closing end of sentence).
    #[pyo3(signature = (sources, targets, batch_size = 32))]
    fn score(
        &self,
        py: Python<'_>,
        sources: Vec<String>,
        targets: Vec<String>,
        batch_size: usize,
    ) -> PyResult<Vec<f64>> {
        if sources.len() != targets.len() {
            return Err(PyValueError::new_err(format!(
                "{} sources but {} targets",
                sources.len(),
                targets.len()
            )));
        }
        let pairs: Vec<Pair> = sources
            .into_iter()
            .zip(targets)
            .enumerate()
            .map(|(i, (source, target))| Pair {
                source: source.trim().to_string(),
                target: target.trim().to_string(),
                line: i + 1,
            })
            .collect();
        py.detach(|| {
            self.pool
                .run(|| self.inner.score(&pairs, batch_size.max(1), "pair"))
        })
        .map_err(py_err)
    }
}
