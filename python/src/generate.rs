//! `transformer.Generator`: a decoder-only language model (a `train-lm` directory, a Hugging
//! Face Llama / GPT-2 / ... directory, or a GGUF file): sampling continuations through the KV
//! cache, whole or streamed ([`TokenStream`]), chat through the model's template, all-position
//! logits, and its tokenizer.

use crate::{check_exists, py_err, Pool};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use transformer::pipeline::chat::ChatContext;
use transformer::pipeline::jinja::Clock;
use transformer::{
    generate_ids, ModelPrecision, Rng, SamplingOptions, StreamDecoder, TextGenerator,
};

/// What one generation is asked for: the prompt's ids, the sampling, where to stop.
struct Request {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingOptions,
    seed: u64,
    stop: Vec<String>,
}

/// Why a generation ended early, as the emit callback reports it.
enum Halt {
    /// A stop string appeared (the text up to it is kept).
    Stop,
    /// The reader of a stream went away.
    Dropped,
    /// The tokenizer refused an id.
    Failed(transformer::Error),
}

/// The model and its pool, shared with the threads of streams.
struct Shared {
    generator: TextGenerator,
    pool: Pool,
}

impl Shared {
    /// Runs `request`, calling `piece` with each new piece of text (whole characters, the
    /// end-of-sequence tokens left out, nothing at or after a stop string); returns the whole
    /// continuation's text.
    fn run(
        &self,
        request: &Request,
        mut piece: impl FnMut(&str) -> bool + Send,
    ) -> Result<String, transformer::Error> {
        let tokenizer = &self.generator.tokenizer;
        let until = tokenizer.end_tokens();
        let mut decoder = StreamDecoder::new(tokenizer);
        let mut text = String::new();
        // Bytes of `text` already handed to `piece`.
        let mut sent = 0;
        let mut rng = Rng::new(request.seed);
        // The longest stop string, less one byte: what may still grow into one, held back.
        let hold = request
            .stop
            .iter()
            .map(|s| s.len())
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        let result = self.pool.run(|| {
            generate_ids(
                &self.generator.model,
                &request.prompt,
                request.max_tokens,
                request.sampling,
                &mut rng,
                &until,
                |id| {
                    if until.contains(&id) {
                        return Ok(());
                    }
                    text.push_str(&decoder.push(id).map_err(Halt::Failed)?);
                    if let Some(at) = first_stop(&text, &request.stop) {
                        text.truncate(at);
                        return Err(Halt::Stop);
                    }
                    let mut ready = text.len().saturating_sub(hold).max(sent);
                    while !text.is_char_boundary(ready) {
                        ready -= 1;
                    }
                    if ready > sent {
                        if !piece(&text[sent..ready]) {
                            return Err(Halt::Dropped);
                        }
                        sent = ready;
                    }
                    Ok(())
                },
            )
        });
        match result {
            Ok(_) => {
                text.push_str(&decoder.finish()?);
                if let Some(at) = first_stop(&text, &request.stop) {
                    text.truncate(at);
                }
            }
            Err(Halt::Stop) | Err(Halt::Dropped) => {}
            Err(Halt::Failed(e)) => return Err(e),
        }
        if text.len() > sent {
            piece(&text[sent..]);
        }
        Ok(text)
    }
}

/// Where the first of `stops` begins in `text`, if any does.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// A language model with its tokenizer and, for a chat model, its chat template.
#[pyclass(module = "transformer", frozen)]
pub struct Generator {
    shared: Arc<Shared>,
}

/// The sampling settings, checked as the command line checks them.
fn sampling(temperature: f64, top_p: f64, top_k: usize) -> PyResult<SamplingOptions> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "temperature={temperature} must be >= 0"
        )));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "top_p={top_p} must be in (0, 1]"
        )));
    }
    Ok(SamplingOptions {
        temperature,
        top_k,
        top_p,
    })
}

impl Generator {
    /// The request of a plain prompt (fed as a document: BOS or `<|endoftext|>` first, as the
    /// model's tokenizer has it).
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        prompt: &str,
        max_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: usize,
        seed: u64,
        stop: Option<Vec<String>>,
    ) -> PyResult<Request> {
        let g = &self.shared.generator;
        let ids = g.tokenizer.document(prompt).map_err(py_err)?;
        g.model.embedding.check_ids(&ids).map_err(py_err)?;
        Ok(Request {
            prompt: ids,
            max_tokens,
            sampling: sampling(temperature, top_p, top_k)?,
            seed,
            stop: stop.unwrap_or_default(),
        })
    }

    /// Runs `request` with the GIL released.
    fn complete(&self, py: Python<'_>, request: Request) -> PyResult<String> {
        let shared = &self.shared;
        py.detach(|| shared.run(&request, |_| true)).map_err(py_err)
    }
}

#[pymethods]
impl Generator {
    /// Loads a `train-lm` directory, a Hugging Face directory or a `.gguf` file; `precision`
    /// "f32", "bf16", "int8" or (GGUF only) "ggml": its quantised blocks as stored.
    /// `ctx_size`: the longest sequence, prompt and output (default: the model's context;
    /// memory follows the tokens held either way); one whose key/value cache would not fit the
    /// memory available is refused (`ValueError` naming both), one above the model's context
    /// is lowered to it.
    #[new]
    #[pyo3(signature = (path, precision = "f32", threads = None, ctx_size = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        precision: &str,
        threads: Option<usize>,
        ctx_size: Option<usize>,
    ) -> PyResult<Self> {
        check_exists(&path, "model")?;
        let precision = match precision {
            "f32" => ModelPrecision::F32,
            "bf16" => ModelPrecision::Bf16,
            "int8" => ModelPrecision::Int8,
            "ggml" => ModelPrecision::Ggml,
            other => {
                return Err(PyValueError::new_err(format!(
                    "precision {other:?} is not one of \"f32\", \"bf16\", \"int8\", \"ggml\""
                )))
            }
        };
        let pool = Pool::new(threads)?;
        let mut generator = py
            .detach(|| pool.run(|| TextGenerator::load_prepared(&path, precision)))
            .map_err(py_err)?;
        if let Some(ctx) = ctx_size {
            let available = transformer::model::context::mem_available_bytes();
            generator
                .model
                .set_context(ctx, available)
                .map_err(py_err)?;
        }
        Ok(Generator {
            shared: Arc::new(Shared { generator, pool }),
        })
    }

    /// The continuation of `prompt` (without the prompt): up to `max_tokens` sampled tokens
    /// (`temperature=0`: greedy), ending at the model's end of sequence or before the first of
    /// `stop`.
    #[pyo3(signature = (prompt, max_tokens = 200, temperature = 1.0, top_p = 1.0, top_k = 0,
                        seed = 1, stop = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        max_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: usize,
        seed: u64,
        stop: Option<Vec<String>>,
    ) -> PyResult<String> {
        let request = self.request(prompt, max_tokens, temperature, top_p, top_k, seed, stop)?;
        self.complete(py, request)
    }

    /// The ids sampled after the prompt `ids` (fed as given, nothing added): up to
    /// `max_tokens`, ending after the model's end-of-sequence token or any of `until` (that
    /// id included). With `temperature=0` the greedy ids, as transformers' `generate` gives.
    #[pyo3(signature = (ids, max_tokens = 200, temperature = 1.0, top_p = 1.0, top_k = 0,
                        seed = 1, until = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate_tokens(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        max_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: usize,
        seed: u64,
        until: Option<Vec<u32>>,
    ) -> PyResult<Vec<u32>> {
        let g = &self.shared.generator;
        if ids.is_empty() {
            return Err(PyValueError::new_err(
                "an empty prompt: give at least one id",
            ));
        }
        g.model.embedding.check_ids(&ids).map_err(py_err)?;
        let options = sampling(temperature, top_p, top_k)?;
        let mut ends = g.tokenizer.end_tokens();
        ends.extend(until.unwrap_or_default());
        let pool = &self.shared.pool;
        let new = py.detach(|| {
            pool.run(|| {
                let mut rng = Rng::new(seed);
                generate_ids(&g.model, &ids, max_tokens, options, &mut rng, &ends, |_| {
                    Ok::<(), std::convert::Infallible>(())
                })
            })
        });
        Ok(new.unwrap_or_else(|e| match e {}))
    }

    /// As [`generate`](Self::generate), the text as an iterator of pieces while it is sampled
    /// (their concatenation is what `generate` returns).
    #[pyo3(signature = (prompt, max_tokens = 200, temperature = 1.0, top_p = 1.0, top_k = 0,
                        seed = 1, stop = None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        prompt: &str,
        max_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: usize,
        seed: u64,
        stop: Option<Vec<String>>,
    ) -> PyResult<TokenStream> {
        let request = self.request(prompt, max_tokens, temperature, top_p, top_k, seed, stop)?;
        let shared = self.shared.clone();
        let (send, receive) = sync_channel::<Result<String, String>>(16);
        std::thread::spawn(move || {
            let result = shared.run(&request, |piece| send.send(Ok(piece.to_string())).is_ok());
            if let Err(e) = result {
                let _ = send.send(Err(e.to_string()));
            }
        });
        Ok(TokenStream {
            pieces: Mutex::new(Some(receive)),
        })
    }

    /// The assistant's reply to `messages` (a list of `{"role": ..., "content": ...}` dicts,
    /// any JSON-like values) through the model's chat template, with `tools` (a list of tool
    /// definitions) when given; greedy unless `temperature > 0`.
    #[pyo3(signature = (messages, tools = None, max_tokens = 512, temperature = 0.0,
                        top_p = 1.0, top_k = 0, seed = 1, stop = None))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: Bound<'_, PyAny>,
        tools: Option<Bound<'_, PyAny>>,
        max_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: usize,
        seed: u64,
        stop: Option<Vec<String>>,
    ) -> PyResult<String> {
        let prompt = self.chat_prompt(py, messages, tools)?;
        let g = &self.shared.generator;
        let ids = g.tokenizer.encode(&prompt).map_err(py_err)?;
        g.model.embedding.check_ids(&ids).map_err(py_err)?;
        let request = Request {
            prompt: ids,
            max_tokens,
            sampling: sampling(temperature, top_p, top_k)?,
            seed,
            stop: stop.unwrap_or_default(),
        };
        self.complete(py, request)
    }

    /// The text a chat prompt is fed as: `messages` (and `tools`) through the model's chat
    /// template, rendered as transformers renders it, ending where the reply begins.
    #[pyo3(signature = (messages, tools = None))]
    fn chat_prompt(
        &self,
        py: Python<'_>,
        messages: Bound<'_, PyAny>,
        tools: Option<Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        let template = self.shared.generator.chat.as_ref().ok_or_else(|| {
            PyValueError::new_err("this model has no chat template (use generate)")
        })?;
        let context = PyDict::new(py);
        context.set_item("messages", messages)?;
        if let Some(tools) = tools {
            context.set_item("tools", tools)?;
        }
        context.set_item("add_generation_prompt", true)?;
        let json: String = py
            .import("json")?
            .call_method1("dumps", (context,))
            .map_err(|e| PyValueError::new_err(format!("messages and tools must be JSON: {e}")))?
            .extract()?;
        let context = ChatContext::from_json(&json).map_err(py_err)?;
        template.render(&context, Clock::Now).map_err(py_err)
    }

    /// The logits at every position of `ids`, a float32 array `[len(ids), vocab_size]`.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let g = &self.shared.generator;
        if ids.is_empty() {
            return Err(PyValueError::new_err("logits of no ids: give at least one"));
        }
        g.model.embedding.check_ids(&ids).map_err(py_err)?;
        if ids.len() > g.model.max_len() {
            return Err(PyValueError::new_err(format!(
                "{} ids; the model takes at most {}",
                ids.len(),
                g.model.max_len()
            )));
        }
        let pool = &self.shared.pool;
        let logits = py.detach(|| pool.run(|| g.model.forward(&ids, 1, None).0));
        let vocab = g.model.config.vocab_size;
        Array2::from_shape_vec((ids.len(), vocab), logits)
            .map(|a| a.into_pyarray(py))
            .map_err(|e| PyRuntimeError::new_err(format!("logits shape: {e}")))
    }

    /// The ids of `text`: as a prompt is fed (`add_special=True`: BOS or `<|endoftext|>`
    /// first, as the tokenizer has it), or as written (special tokens in it still
    /// recognised).
    #[pyo3(signature = (text, add_special = true))]
    fn tokenize(&self, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        let t = &self.shared.generator.tokenizer;
        match add_special {
            true => t.document(text),
            false => t.encode(text),
        }
        .map_err(py_err)
    }

    /// The text of `ids` (special tokens written out).
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(PyValueError::new_err(format!(
                "id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        self.shared.generator.tokenizer.decode(&ids).map_err(py_err)
    }

    /// The size of the model's vocabulary (rows of its logits).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.shared.generator.model.config.vocab_size
    }

    /// The longest sequence the model takes (`ctx_size`, else the model's context).
    #[getter]
    fn max_len(&self) -> usize {
        self.shared.generator.model.max_len()
    }

    /// Whether the model has a chat template (`chat` needs one).
    #[getter]
    fn has_chat_template(&self) -> bool {
        self.shared.generator.chat.is_some()
    }
}

/// The pieces of a generation as they are sampled (from [`Generator::stream`]); the
/// generation runs on its own thread and stops when this iterator is dropped.
#[pyclass(module = "transformer")]
pub struct TokenStream {
    /// `None` once the generation has ended.
    pieces: Mutex<Option<Receiver<Result<String, String>>>>,
}

#[pymethods]
impl TokenStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece of text, waiting (GIL released) until it is sampled.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self
            .pieces
            .lock()
            .map_err(|_| PyRuntimeError::new_err("stream poisoned"))?;
        // Moved to the waiting thread and back: a receiver is not shared between threads.
        let Some(receiver) = guard.take() else {
            return Ok(None);
        };
        let (receiver, next) = py.detach(move || {
            let next = receiver.recv();
            (receiver, next)
        });
        *guard = Some(receiver);
        match next {
            Ok(Ok(piece)) => Ok(Some(piece)),
            Ok(Err(message)) => {
                *guard = None;
                Err(PyValueError::new_err(message))
            }
            Err(_) => {
                *guard = None;
                Ok(None)
            }
        }
    }
}
