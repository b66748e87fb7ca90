//! Loading the served model on the compute thread and running its engine there: the kind of
//! model a path holds, a language model's pool of key/value blocks and context, and where the
//! model runs (`--device`: the CPU, or a GPU whose memory holds the weights and the blocks).

use super::scheduler::{EngineConfig, GenRequest, PagedLm, PrefillBudget, Scheduler};
use super::{context_fit, jobs, system_fingerprint, translate_api, translate_engine};
use super::{App, LmFront, ServeConfig, Served};
use crate::decode::constraint::ConstraintVocab;
use crate::error::Error;
use crate::model::LanguageModel;
use crate::pipeline::device::DeviceChoice;
use crate::pipeline::embed::SentenceEncoder;
use crate::pipeline::generate::{ModelPrecision, TextGenerator};
use crate::pipeline::translate::Translator;
use std::sync::Arc;

mod more_translators;
mod on_device;

/// What kind of model `path` holds (see the module docs).
fn model_kind(path: &std::path::Path) -> &'static str {
    use crate::model::families::{is_encoder, is_translation, model_type_of};
    let model_type = model_type_of(path);
    if path.join(crate::store::VOCAB_FILE).is_file()
        || model_type.as_deref().is_some_and(is_translation)
        || crate::model::families::ctranslate2::is_ctranslate2_dir(path)
        || crate::pipeline::argos::is_package(path)
    {
        "translation"
    } else if model_type.as_deref().is_some_and(is_encoder) {
        "encoder"
    } else {
        "language-model"
    }
}

/// Loads the model and runs its engine until the request channel closes (on the compute
/// thread; the model's work on the rayon pool).
pub(super) fn compute(app: Arc<App>) {
    let path = &app.config.model;
    let precision = app.config.precision;
    let float_only = || match precision {
        ModelPrecision::Ggml => Err(Error::Input(
            "--precision ggml is for .gguf models only".into(),
        )),
        p => Ok(p.float_precision()),
    };
    let kind = model_kind(path);
    if kind != "language-model" && app.config.device != DeviceChoice::Cpu {
        let _ = app.load_error.set(format!(
            "--device gpu serves language models; this is a {kind} model: serve it with \
             --device cpu (`translate` and `embed` run it on a GPU)"
        ));
        return;
    }
    if kind != "translation" && !app.config.more_models.is_empty() {
        let _ = app.load_error.set(format!(
            "{}: several --model serve translation models only; this is a {kind} model",
            path.display()
        ));
        return;
    }
    if kind != "language-model" && !app.config.kv_types.is_exact() {
        let _ = app.load_error.set(format!(
            "--cache-type-k/--cache-type-v {}: only a language model's key/value cache is \
             stored packed; this is a {kind} model",
            app.config.kv_types
        ));
        return;
    }
    let model = match kind {
        "translation" => float_only()
            .and_then(|p| Ok((p, Translator::load(path)?)))
            .and_then(|(p, mut t)| {
                t.prepare_precision(p)?;
                if let Some(note) = &t.generation_note {
                    eprintln!("note: {note}");
                }
                // MADLAD-400: --target-lang chooses the `<2xx>` piece before every source.
                let madlad = t.vocab.t5().is_some_and(|v| v.language_codes().next().is_some());
                if madlad && app.config.target_lang != "tgt" {
                    t.set_languages(None, Some(&app.config.target_lang))?;
                }
                Ok(jobs::JobModel::Translator(Box::new(t)))
            }),
        "encoder" => float_only()
            .and_then(|p| Ok((p, SentenceEncoder::load(path, None)?)))
            .and_then(|(p, mut e)| {
                e.model.prepare_precision(p).map_err(Error::Input)?;
                Ok(jobs::JobModel::Encoder(Box::new(e)))
            }),
        _ => return compute_lm(app),
    };
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            let _ = app.load_error.set(e.to_string());
            return;
        }
    };
    let kind = match model {
        jobs::JobModel::Translator(_) => "translation",
        jobs::JobModel::Encoder(_) => "encoder",
    };
    let languages = match &model {
        jobs::JobModel::Translator(t) => {
            match translate_api::LanguageTable::of(t, &app.config.source_lang, &app.config.target_lang) {
                Ok(table) => table.map(Arc::new),
                Err(e) => {
                    let _ = app.load_error.set(e.to_string());
                    return;
                }
            }
        }
        jobs::JobModel::Encoder(_) => None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let config = translate_config(&app.config);
    let routes = if app.config.more_models.is_empty() {
        None
    } else {
        let precision = precision.float_precision();
        match more_translators::start(&app, &languages, &tx, precision, config) {
            Ok(routes) => Some(Arc::new(routes)),
            Err(e) => {
                let _ = app.load_error.set(e);
                return;
            }
        }
    };
    let _ = app.served.set(Served::Jobs {
        kind,
        jobs: tx,
        languages,
        routes,
    });
    // The queue's sender lives in `app`: once the server and its handlers are gone, the
    // channel closes and the loop ends.
    let metrics = app.metrics.clone();
    drop(app);
    jobs::run(&model, rx, &metrics, config);
}

/// The translation engine's settings of `config`.
fn translate_config(config: &ServeConfig) -> translate_engine::TranslateConfig {
    translate_engine::TranslateConfig {
        block_rows: config.block_rows.max(1),
        max_batch: config.max_batch.max(1),
        encode_budget: config
            .prefill_budget
            .unwrap_or(translate_engine::DEFAULT_ENCODE_BUDGET)
            .max(1),
        max_len_extra: crate::decode::GreedyOptions::default().max_len_extra,
    }
}

/// [`compute`] for a language model: the continuous-batching engine, on the CPU or on the
/// device of `--device`.
fn compute_lm(app: Arc<App>) {
    let fail = |app: &App, e: String| {
        let _ = app.load_error.set(e);
    };
    let loaded = TextGenerator::load_prepared(&app.config.model, app.config.precision);
    let generator = match loaded {
        Ok(g) => g,
        Err(e) => return fail(&app, e.to_string()),
    };
    let TextGenerator {
        mut model,
        tokenizer,
        chat,
        ..
    } = generator;
    if model.config.gated_delta.is_some() {
        // The running batch's pool and admission count KV blocks, prefix caching shares them:
        // a Gated DeltaNet layer holds a fixed-size state per request instead.
        return fail(
            &app,
            "serve: this model has Gated DeltaNet (linear-attention) layers (a hybrid stack, \
             Qwen3.5); the server's continuous batching, paged KV pool and prefix cache do not \
             hold their per-request states yet (`transformer generate` runs it)"
                .into(),
        );
    }
    if let Err(e) = model.set_kv_types(app.config.kv_types) {
        return fail(&app, e.to_string());
    }
    let mut engine = engine_config(&app.config, &model);
    let device = match on_device::open(&app.config, &model, &mut engine) {
        Ok(device) => device,
        Err(e) => return fail(&app, e),
    };
    if let Err(e) = context_fit::fit_context(&mut model, app.config.llama.ctx_size, &engine) {
        return fail(&app, e);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let end_tokens = tokenizer.end_tokens();
    // The token trie of constrained decoding, once (a model without an end token has none).
    let constraints = crate::text::token_bytes::token_bytes(&tokenizer)
        .and_then(|bytes| ConstraintVocab::new(&bytes, model.config.vocab_size, &end_tokens))
        .map(Arc::new)
        .map_err(|e| e.to_string());
    let front = LmFront {
        constraints,
        end_tokens,
        tokenizer,
        chat,
        vocab_size: model.config.vocab_size,
        max_len: model.max_len(),
        engine,
        timeout_s: app.config.timeout_s,
        requests: tx,
        fingerprint: system_fingerprint(&app.config.model),
    };
    match device {
        None => run_engine(app, &model, front, rx),
        Some(device) => on_device::run(app, device, model, front, rx),
    }
}

/// Starts the engine of `model` (its pool allocated), publishes `front` and runs until the
/// server and its handlers are gone (the request channel closes, as for jobs).
fn run_engine<M>(
    app: Arc<App>,
    model: &M,
    front: LmFront,
    requests: std::sync::mpsc::Receiver<GenRequest>,
) where
    M: PagedLm + Sync,
    M::State: Send,
{
    let mut scheduler = match Scheduler::paged(model, front.engine, app.metrics.clone()) {
        Ok(s) => s,
        Err(e) => {
            let _ = app.load_error.set(e);
            return;
        }
    };
    let _ = app.served.set(Served::Lm(Arc::new(front)));
    drop(app);
    scheduler.run(requests);
}

/// The pool and batch sizes for `model`.
fn engine_config(config: &ServeConfig, model: &LanguageModel<f32>) -> EngineConfig {
    let block_rows = config.block_rows.max(1);
    let block_bytes = EngineConfig::block_bytes(model, block_rows).max(1);
    EngineConfig {
        block_rows,
        pool_blocks: config.kv_memory_mib.saturating_mul(1 << 20) / block_bytes,
        max_batch: config.max_batch.max(1),
        prefill_budget: PrefillBudget::of(config.prefill_budget, config.prefill_step_ms),
        prefix_cache: config.prefix_cache && prefix_cacheable(model),
        max_overtakes: config.max_overtakes,
    }
}

/// Whether `model`'s KV blocks can be shared between requests by prefix: every layer keeps
/// every position (exact attention, no sliding window). A windowed layer releases its old
/// blocks while its neighbours keep theirs, and a linear-attention layer keeps a running state
/// instead of blocks: neither can take a prefix's blocks from another row, so such models are
/// served without prefix caching.
pub fn prefix_cacheable(model: &LanguageModel<f32>) -> bool {
    let c = &model.config;
    (0..c.n_decoder_layers).all(|i| {
        !c.gated_delta.as_ref().is_some_and(|g| g.is_delta(i))
            && c.layer_window(i).is_none()
            && c.layer_attention_kind(i) == crate::model::attention_kind::AttentionKind::Exact
    })
}
