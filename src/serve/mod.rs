//! `transformer serve`: a model held in memory, answering many HTTP clients at once.
//!
//! Threads: the HTTP side runs on a tokio runtime (axum), which only parses, tokenizes, queues
//! and streams; the model runs on its own compute thread ([`compute_loop::run`] inside the
//! rayon pool), fed through a channel. A request's tokens come back through its own
//! channel; a client that goes away drops its receiver, which the engine notices at its next
//! step (the sequence leaves the batch and its KV blocks return to the pool).
//!
//! Model kinds (decided from the path): a directory with `vocab.json` is a translation model
//! (`/translate`, `/languages`, `/attention`; greedy translations are continuously batched by
//! the engine's [`translate_engine`] kind, the other jobs run between its steps through
//! [`jobs`]), a Hugging Face directory of `model_type` `bert` an encoder (`/v1/embeddings`),
//! anything else a language model ([`TextGenerator::load`]: ours, Hugging Face Llama/GPT-2,
//! GGUF). An endpoint of another kind answers 404 naming the kind served.
//!
//! Modules, one concept each: [`engine`] (continuous batching, written once for every kind:
//! requests, rows, KV blocks, admission, cancellation, metrics), its kinds [`scheduler`]
//! (language models over the paged KV cache) and [`translate_engine`] (greedy translation),
//! [`compute_loop`] (the compute thread's loop), [`jobs`] (whole jobs of translation models
//! and encoders), [`openai`] (the OpenAI-compatible endpoints), [`text`] (streamed
//! detokenization, stop strings), [`prefix_cache`] (prompts sharing their first KV blocks),
//! [`metrics`] (Prometheus), [`api_error`] (errors as JSON),
//! [`client`] (a minimal HTTP/1.1 client for the tests and the load test), [`page`] (the web
//! page at `/`).
//!
//! Routes: `GET /` (page), `GET /health` (503 until the model is loaded), `GET /metrics`,
//! `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/completions`, `POST /v1/chat/completions`,
//! `POST /translate`, `POST /detect`, `GET /languages`, `POST /attention`, `POST /v1/embeddings`,
//! `GET /info` (the kind served); llama.cpp's native routes and aliases ([`native`]:
//! `/completion` and `/completions` ([`native_completion`]), `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props`, `/slots`, `/models`, `/chat/completions`, `/v1/health`),
//! Anthropic's `POST /v1/messages` and `/v1/messages/count_tokens` ([`anthropic`]). Every
//! request passes the [`gate`] (Host,
//! CORS, API key, content type) and the body limit; connections are held by [`listen`] (cap,
//! header timeout).
//!
//! Shutdown (SIGTERM, Ctrl-C, or [`Server::shutdown`]): the listener stops accepting, `/health`
//! turns 503, new generation requests get 503, and running requests finish before the process
//! exits.

pub mod anthropic;
pub mod api_error;
pub mod client;
pub mod compute_loop;
mod context_fit;
pub mod context_shift;
pub mod embeddings;
pub mod engine;
pub mod gate;
pub mod jobs;
pub mod listen;
mod load;
pub mod metrics;
pub mod metrics_llama;
pub mod model_names;
pub mod native;
pub mod native_completion;
pub mod openai;
pub mod page;
pub mod prefix_cache;
pub mod scheduler;
pub mod server;
pub mod text;
pub mod translate_api;
pub mod translate_engine;
pub mod translate_routes;

pub use server::Server;

use crate::decode::constraint::ConstraintVocab;
use crate::pipeline::chat::ChatTemplate;
use crate::text::decoder_tokenizer::DecoderTokenizer;
use api_error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics::{Metrics, Outcome};
use scheduler::{EngineConfig, GenRequest};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Everything `transformer serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The model to serve: a model directory or a GGUF file.
    pub model: PathBuf,
    /// Further translation models (`--model` repeated), routed by language pair beside
    /// [`model`](Self::model) (see `serve::translate_routes`).
    pub more_models: Vec<PathBuf>,
    /// The address to listen on.
    pub addr: SocketAddr,
    /// The KV pool in MiB.
    pub kv_memory_mib: usize,
    /// The storage types of a language model's keys and values (`--cache-type-k/-v`).
    pub kv_types: crate::model::kv_cache::KvTypes,
    /// Sequences decoded together at most (a translation model: sentences).
    pub max_batch: usize,
    /// Requests waiting for admission at most (then 429).
    pub max_queue: usize,
    /// Prompt tokens at most (default: the model's context less one).
    pub max_input_tokens: Option<usize>,
    /// `max_tokens` at most.
    pub max_output_tokens: usize,
    /// Seconds a request may take, queue included.
    pub timeout_s: f64,
    /// Positions per KV block.
    pub block_rows: usize,
    /// Tokens one forward feeds at most (`--prefill-budget`; a translation model: source
    /// tokens encoded per step). `None`: a language model's budget is timed
    /// ([`prefill_step_ms`](Self::prefill_step_ms)), a translation model's is
    /// `translate_engine::DEFAULT_ENCODE_BUDGET`.
    pub prefill_budget: Option<usize>,
    /// Without `prefill_budget`, the time a language model's step is sized to take, in
    /// milliseconds (`--prefill-step-ms`, `scheduler::DEFAULT_PREFILL_STEP_MS`).
    pub prefill_step_ms: u32,
    /// Whether prompts reuse the KV blocks of earlier prompts' equal starts
    /// (the module `prefix_cache`; `--no-prefix-cache`).
    pub prefix_cache: bool,
    /// Rows admitted ahead of one waiting for KV blocks before it gets priority
    /// (`--max-overtakes`; 0: strict first come, first served).
    pub max_overtakes: usize,
    /// The language codes a translation model translates from and to (`/languages`).
    pub source_lang: String,
    /// The language code a translation model translates to.
    pub target_lang: String,
    /// The numbers the model's products use (`--precision`; `ggml`: a GGUF file's blocks).
    pub precision: crate::pipeline::generate::ModelPrecision,
    /// Where a language model runs (`--device`: the CPU, or a GPU holding the weights and the
    /// key/value pool).
    pub device: crate::pipeline::device::DeviceChoice,
    /// The key every route but `/health` needs (`--api-key`); `None`: open.
    pub api_key: Option<String>,
    /// Origins a browser page may call from (`--cors-origin`; `*`: any; `localhost`: any
    /// origin on this machine, reflected); empty: none.
    pub cors_origins: Vec<String>,
    /// Whether allowed origins may send credentials (`--cors-credentials`): the answer names
    /// the origin itself (never `*`) and a preflight says `Access-Control-Allow-Credentials`.
    pub cors_credentials: bool,
    /// Host names accepted in the `Host` header beyond `localhost` and IP addresses
    /// (`--allowed-host`; `*`: any).
    pub allowed_hosts: Vec<String>,
    /// The model's name in requests and responses (`--served-model-name`); default: the model
    /// path's file name.
    pub served_model_name: Option<String>,
    /// Connections held at most (then the longest-idle one is closed).
    pub max_connections: usize,
    /// Seconds a connection has to send a request head.
    pub header_timeout_s: f64,
    /// Request body bytes at most (then 413).
    pub max_body_bytes: usize,
    /// llama.cpp's server settings (context, defaults of requests, `/slots`).
    pub llama: native::LlamaOptions,
}

impl ServeConfig {
    /// The defaults for `model` on `addr`.
    pub fn new(model: PathBuf, addr: SocketAddr) -> Self {
        ServeConfig {
            model,
            more_models: Vec::new(),
            addr,
            kv_memory_mib: 512,
            kv_types: Default::default(),
            max_batch: 64,
            max_queue: 256,
            max_input_tokens: None,
            max_output_tokens: 2048,
            timeout_s: 600.0,
            block_rows: 16,
            prefill_budget: None,
            prefill_step_ms: scheduler::DEFAULT_PREFILL_STEP_MS,
            prefix_cache: true,
            max_overtakes: 16,
            source_lang: "src".into(),
            target_lang: "tgt".into(),
            precision: Default::default(),
            device: Default::default(),
            api_key: None,
            cors_origins: Vec::new(),
            cors_credentials: false,
            allowed_hosts: Vec::new(),
            served_model_name: None,
            max_connections: 1024,
            header_timeout_s: 10.0,
            max_body_bytes: 2 << 20,
            llama: Default::default(),
        }
    }
}

/// What the HTTP side knows of a loaded language model.
pub struct LmFront {
    pub tokenizer: DecoderTokenizer,
    pub chat: Option<ChatTemplate>,
    /// Tokens that end a sequence (end of text, end of turn); not shown as text.
    pub end_tokens: Vec<u32>,
    pub vocab_size: usize,
    /// The model's context.
    pub max_len: usize,
    pub engine: EngineConfig,
    pub timeout_s: f64,
    /// The engine's queue.
    pub requests: std::sync::mpsc::Sender<GenRequest>,
    /// The model's vocabulary for constrained decoding, or why there is none.
    pub constraints: Result<Arc<ConstraintVocab>, String>,
    /// OpenAI's `system_fingerprint` ([`system_fingerprint`]).
    pub fingerprint: String,
}

/// A stable name of this binary serving these model files: `fp_` and 16 hex digits of a hash
/// of the crate's version and, for the model path (a file, or a directory's files), each
/// file's name, length and modification time. The same binary on the same files gives the
/// same string across restarts; a new build version or a changed model file changes it.
pub fn system_fingerprint(model: &std::path::Path) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(model) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => vec![model.to_path_buf()],
    };
    files.sort();
    for file in files {
        file.file_name().hash(&mut h);
        if let Ok(meta) = std::fs::metadata(&file) {
            meta.len().hash(&mut h);
            meta.modified().ok().hash(&mut h);
        }
    }
    format!("fp_{:016x}", h.finish())
}

/// What is served, once loaded.
pub enum Served {
    Lm(Arc<LmFront>),
    /// A translation model or an encoder: its job queue.
    Jobs {
        kind: &'static str,
        jobs: std::sync::mpsc::Sender<jobs::Job>,
        /// A multilingual translation model's languages.
        languages: Option<Arc<translate_api::LanguageTable>>,
        /// Several translation models (`--model` repeated): their routes by language pair.
        routes: Option<Arc<translate_routes::Routes>>,
    },
}

impl Served {
    /// `language-model`, `translation` or `encoder`.
    pub fn kind(&self) -> &'static str {
        match self {
            Served::Lm(_) => "language-model",
            Served::Jobs { kind, .. } => kind,
        }
    }
}

/// The state every handler shares.
pub struct App {
    pub config: ServeConfig,
    pub metrics: Arc<Metrics>,
    /// Set once the model is loaded.
    served: OnceLock<Served>,
    /// Set if loading failed.
    load_error: OnceLock<String>,
    /// Set on shutdown.
    draining: AtomicBool,
    /// Response ids and default seeds.
    next_id: AtomicU64,
    /// The `model` of responses: `--served-model-name`, else the model path's file name.
    pub model_name: String,
    /// The names the model answers to: `model_name` and the model path's file name (see
    /// [`model_names`]).
    pub names: model_names::ModelNames,
    /// When the server started, in seconds since the Unix epoch (llama.cpp's
    /// `Process-Start-Time-Unix` header of `/metrics`).
    pub started_unix: u64,
}

impl App {
    /// What is served, or 503 while it loads (or after it failed to).
    fn served(&self) -> std::result::Result<&Served, ApiError> {
        if let Some(served) = self.served.get() {
            return Ok(served);
        }
        Err(ApiError::unavailable(match self.load_error.get() {
            Some(e) => format!("the model failed to load: {e}"),
            None => "the model is loading".to_string(),
        }))
    }

    /// The language model, 503 while loading, 404 when another kind is served.
    fn lm(&self) -> std::result::Result<Arc<LmFront>, ApiError> {
        match self.served()? {
            Served::Lm(_) if self.metrics.device_lost().is_some() => {
                Err(ApiError::unavailable(self.device_lost_message()))
            }
            Served::Lm(lm) => Ok(lm.clone()),
            other => Err(ApiError::not_found(format!(
                "this server serves a {} model, not a language model",
                other.kind()
            ))),
        }
    }

    /// Why the model's device failed (see [`Metrics::device_lost`]).
    fn device_lost_message(&self) -> String {
        let why = self.metrics.device_lost().unwrap_or("unknown");
        format!("the model's device failed ({why}); restart the server")
    }

    /// The served model the body's `model` names ([`model_names`]: with one model served,
    /// any name is answered by it).
    pub fn check_model(&self, body: &serde_json::Value) -> std::result::Result<(), ApiError> {
        let asked = body.get("model").and_then(serde_json::Value::as_str);
        self.names.route(asked).map(|_| ())
    }

    /// For a LibreTranslate request that brought no key in its headers ([`gate::KeyFromBody`]):
    /// 401 unless the body's `api_key` is the key.
    pub fn check_body_key(&self, body: &serde_json::Value) -> std::result::Result<(), ApiError> {
        let Some(secret) = &self.config.api_key else {
            return Ok(());
        };
        let given = body.get("api_key").and_then(serde_json::Value::as_str);
        match given {
            Some(k) if gate::same_secret(k.as_bytes(), secret.as_bytes()) => Ok(()),
            _ => Err(ApiError::unauthorized()),
        }
    }

    /// Runs a job on the compute thread and waits for its answer (429 when the queue is
    /// full, 404 when a language model is served, 504 past the deadline).
    async fn job<T>(
        &self,
        make: impl FnOnce(jobs::Answer<T>) -> jobs::Job,
    ) -> std::result::Result<T, ApiError> {
        let Served::Jobs { jobs, .. } = self.served()? else {
            return Err(ApiError::not_found(
                "this server serves a language model (POST /v1/completions)",
            ));
        };
        self.job_on(jobs, make).await
    }

    /// [`job`](Self::job) on the engine whose queue is `jobs` (one of several translation
    /// models').
    async fn job_on<T>(
        &self,
        jobs: &std::sync::mpsc::Sender<jobs::Job>,
        make: impl FnOnce(jobs::Answer<T>) -> jobs::Job,
    ) -> std::result::Result<T, ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let max = self.config.max_queue;
        let queued = self
            .metrics
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max).then_some(q + 1)
            });
        if queued.is_err() {
            return Err(ApiError::queue_full(max));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if jobs.send(make(tx)).is_err() {
            self.metrics.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::internal("the engine has stopped"));
        }
        let deadline = std::time::Duration::from_secs_f64(self.config.timeout_s);
        let start = std::time::Instant::now();
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(message))) => Err(ApiError::invalid(None, message)),
            // The engine gives up on a request at its deadline, maybe just before this timer.
            Ok(Err(_)) if start.elapsed() >= deadline => {
                Err(ApiError::timeout(self.config.timeout_s))
            }
            Ok(Err(_)) => Err(ApiError::internal("the engine dropped the request")),
            Err(_) => Err(ApiError::timeout(self.config.timeout_s)),
        }
    }
}

/// Counts a request's outcome once, when dropped: `Cancelled` unless the handler said
/// otherwise (dropped early = the client went away).
pub struct OutcomeGuard {
    metrics: Arc<Metrics>,
    outcome: Option<Outcome>,
}

impl OutcomeGuard {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        OutcomeGuard {
            metrics,
            outcome: None,
        }
    }

    pub fn set(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    /// A handler's JSON answer or its error response, the outcome counted.
    pub fn respond(
        &mut self,
        result: std::result::Result<serde_json::Value, ApiError>,
    ) -> Response {
        match result {
            Ok(v) => {
                self.set(Outcome::Ok);
                axum::Json(v).into_response()
            }
            Err(e) => {
                self.set(e.outcome());
                e.into_response()
            }
        }
    }
}

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        self.metrics
            .count(self.outcome.unwrap_or(Outcome::Cancelled));
    }
}

/// `GET /health`: 200 once the model is loaded and while not shutting down, else 503.
async fn health(State(app): State<Arc<App>>) -> Response {
    if app.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    }
    if app.metrics.device_lost().is_some() {
        let message = app.device_lost_message();
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{message}\n")).into_response();
    }
    match app.served() {
        Ok(_) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", e.message)).into_response(),
    }
}

/// `GET /info`: the kind of model served (the page picks its view from it).
async fn info(State(app): State<Arc<App>>) -> Response {
    match app.served() {
        Ok(served) => axum::Json(serde_json::json!({
            "model": app.model_name,
            "kind": served.kind(),
            "source_lang": app.config.source_lang,
            "target_lang": app.config.target_lang,
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route (see GET / for the page, /v1/models, /health, /metrics)")
}

/// Every route (see the module docs), behind the [`gate`] and the body-size limit.
fn router(app: Arc<App>) -> Router {
    let page = match app.config.llama.webui {
        true => Router::new().route("/", get(page::index)),
        false => Router::new(),
    };
    page.route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics_llama::metrics_text))
        .route("/v1/models", get(native::models))
        .route("/models", get(native::models))
        .route("/v1/models/{id}", get(native::model))
        .route("/v1/completions", post(openai::completions))
        .route("/completions", post(native_completion::completion))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/chat/completions/input_tokens", post(native::chat_input_tokens))
        .route("/v1/chat/completions/input_tokens", post(native::chat_input_tokens))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/completion", post(native_completion::completion))
        .route("/slots", get(native::slots))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/props", get(native::props))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/translate", post(translate_api::translate))
        .route("/detect", post(translate_api::detect))
        .route(
            "/languages",
            get(translate_api::languages).post(translate_api::languages),
        )
        .route("/attention", post(translate_api::attention))
        .route("/info", get(info))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(
            app.config.max_body_bytes,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            gate::gate,
        ))
        .with_state(app)
}
