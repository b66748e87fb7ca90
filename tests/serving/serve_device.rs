//! The language model's engine on a device (`serve --device gpu`): the same continuous batching
//! over a model whose weights and key/value blocks live in the device's memory.
//! - The engine over the device step ([`DeviceLm`]) on the host device (everywhere) and on the
//!   GPU the tests find (lavapipe in CI): batched greedy requests joining at different steps
//!   give transformers' greedy ids of the tiny Llama, also in a pool so small that requests
//!   wait for blocks, and every block returns to the pool.
//! - A device that fails mid-step: its running requests end with `Unavailable` (a 503), the
//!   engine records why, and a request admitted later fails at once; over HTTP, `/health`
//!   and generation requests then answer 503 naming the failure.
//! - Over HTTP: `serve --device gpu` answers concurrent completions with the CPU server's
//!   text; what a GPU does not do (another block size) is refused by name at load.

use super::serve_engine::{llama_tiny, run_engine, Reference};
use super::serve_surface::{model_dir, post, start};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transformer::backend::{GpuDevice, Host};
use transformer::decode::sample::SamplingOptions;
use transformer::model::device_lm::DeviceLm;
use transformer::model::LanguageModel;
use transformer::pipeline::device::DeviceChoice;
use transformer::serve::metrics::Metrics;
use transformer::serve::scheduler::{
    EngineConfig, Event, GenRequest, PagedLm, PrefillBudget, Scheduler,
};
use transformer::serve::ServeConfig;

fn greedy() -> SamplingOptions {
    SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Blocks of the device's 16 positions.
fn config(pool_blocks: usize) -> EngineConfig {
    EngineConfig {
        block_rows: 16,
        pool_blocks,
        max_batch: 8,
        prefill_budget: PrefillBudget::Fixed(7),
        prefix_cache: true,
        max_overtakes: 4,
    }
}

/// Each reference prompt twice (16 tokens and 30), joining at steps 0, 2, 4, ...: the batched
/// greedy tokens start with transformers' greedy ids; a pool of 6 blocks (two rows at a time)
/// gives the same tokens.
fn check_engine<M: PagedLm>(lm: &M, what: &str) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/hf-decoders/llama-tiny");
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let mut requests = Vec::new();
    for (i, p) in reference.prompts.iter().enumerate() {
        requests.push((p.input_ids.clone(), 16, 2 * i));
        requests.push((p.input_ids.clone(), 30, 2 * i + 1));
    }
    let batched = run_engine(lm, config(1000), &requests, greedy());
    for (i, (out, _)) in batched.iter().enumerate() {
        let hf = &reference.prompts[i / 2].greedy_ids;
        assert_eq!(
            &out[..hf.len()],
            &hf[..],
            "{what}: request {i} vs transformers"
        );
    }
    let squeezed = run_engine(lm, config(6), &requests, greedy());
    assert_eq!(squeezed, batched, "{what}: in a pool of 6 blocks");
}

#[test]
fn the_engine_over_a_device_gives_transformers_greedy_ids() {
    let Some(g) = llama_tiny() else { return };
    check_engine(&DeviceLm::new(Host, &g.model).unwrap(), "host device");
    if transformer_gpu::testing::gpu().is_some() {
        let gpu = GpuDevice::open(None).unwrap();
        check_engine(&DeviceLm::new(gpu, &g.model).unwrap(), "gpu");
    }
}

/// The CPU model whose steps fail from step `fails_at` on, as a lost device's do.
struct Failing<'m> {
    model: &'m LanguageModel<f32>,
    steps: AtomicUsize,
    fails_at: usize,
}

impl PagedLm for Failing<'_> {
    type State = <LanguageModel<f32> as PagedLm>::State;
    fn vocab_size(&self) -> usize {
        PagedLm::vocab_size(self.model)
    }
    fn max_len(&self) -> usize {
        PagedLm::max_len(self.model)
    }
    fn start(&self, config: &EngineConfig) -> Result<Self::State, String> {
        PagedLm::start(self.model, config)
    }
    fn step_logits(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        fed_at: (&[usize], &[usize]),
        picked: &[usize],
    ) -> Result<Vec<f32>, String> {
        if self.steps.fetch_add(1, Ordering::Relaxed) >= self.fails_at {
            return Err("device lost (test)".into());
        }
        PagedLm::step_logits(self.model, state, tokens, fed_at, picked)
    }
}

#[test]
fn a_failing_device_ends_its_requests_as_unavailable_and_later_ones_at_once() {
    let Some(g) = llama_tiny() else { return };
    let lm = Failing {
        model: &g.model,
        steps: AtomicUsize::new(0),
        fails_at: 3,
    };
    let metrics = Arc::new(Metrics::default());
    let mut engine = Scheduler::paged(&lm, config(100), metrics.clone()).unwrap();
    let submit = |engine: &mut Scheduler<'_, Failing<'_>>, prompt: Vec<u32>| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let now = Instant::now();
        metrics.queued.fetch_add(1, Ordering::Relaxed);
        engine.submit(GenRequest {
            prompt,
            max_tokens: 50,
            sampling: greedy(),
            options: Default::default(),
            constraint: None,
            seed: 1,
            stop_ids: vec![],
            arrived: now,
            deadline: now + Duration::from_secs(600),
            events: tx,
        });
        rx
    };
    let mut first = [
        submit(&mut engine, vec![1, 2, 3]),
        submit(&mut engine, vec![4, 5]),
    ];
    while engine.step() {}
    assert!(engine.is_idle());
    assert_eq!(
        engine.blocks_in_use(),
        0,
        "the failed rows' blocks are back"
    );
    assert_eq!(metrics.device_lost(), Some("device lost (test)"));
    for rx in &mut first {
        let mut tokens = 0;
        let end = loop {
            match rx.try_recv().expect("an end for every request") {
                Event::Token(_) => tokens += 1,
                other => break other,
            }
        };
        // Three good steps: both prompts in the first (a budget of 7 tokens), a token each.
        assert_eq!(tokens, 3);
        assert_eq!(end, Event::Unavailable("device lost (test)".into()));
    }
    let mut later = submit(&mut engine, vec![6, 7]);
    while engine.step() {}
    assert_eq!(
        later.try_recv().unwrap(),
        Event::Unavailable("device lost (test)".into())
    );
    // The device was not called again.
    assert_eq!(lm.steps.load(Ordering::Relaxed), 4);
}

#[test]
fn serve_on_the_gpu_answers_as_the_cpu_does() {
    if model_dir().is_none() || transformer_gpu::testing::gpu().is_none() {
        return;
    }
    // What a GPU does not do is refused by name at load.
    let dir = model_dir().unwrap();
    let refused = transformer::serve::Server::start(ServeConfig {
        device: DeviceChoice::Gpu(None),
        block_rows: 4,
        ..ServeConfig::new(dir, "127.0.0.1:0".parse().unwrap())
    })
    .unwrap();
    let e = refused.wait_ready().unwrap_err().to_string();
    assert!(e.contains("--block-size 4"), "{e}");
    let _ = refused.shutdown();

    let cpu = start(|c| c).unwrap();
    let gpu = start(|c| ServeConfig {
        device: DeviceChoice::Gpu(None),
        kv_memory_mib: 4,
        max_batch: 3,
        ..c
    })
    .unwrap();
    let prompts = ["Once upon a time", "The capital of", "1, 2, 3,", "Hello"];
    let ask = |addr, prompt: &str| {
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
        let (status, v) = post(addr, "/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let want: Vec<String> = prompts.iter().map(|p| ask(cpu.addr, p)).collect();
    // Concurrently, more requests than the batch holds.
    let got: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| ask(gpu.addr, p)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    assert!(want.iter().any(|t| !t.is_empty()));
    let (status, _, text) = transformer::serve::client::request(
        gpu.addr,
        "GET",
        "/health",
        None,
        super::serve_surface::T,
    )
    .unwrap();
    assert_eq!((status, text.as_str()), (200, "ok\n"));
}

/// Once the engine has recorded a failed device, `/health` is 503 saying why, and a
/// generation request is a 503 (`unavailable_error`) instead of reaching the engine.
#[test]
fn after_a_failed_device_health_and_requests_answer_503() {
    let Some(server) = start(|c| c) else { return };
    let addr = server.addr;
    let body = json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0});
    assert_eq!(post(addr, "/v1/completions", &body).0, 200);
    server
        .metrics()
        .set_device_lost("vkQueueSubmit: device lost (test)");
    let (status, _, text) =
        transformer::serve::client::request(addr, "GET", "/health", None, super::serve_surface::T)
            .unwrap();
    assert_eq!(status, 503);
    assert!(text.contains("device lost (test)"), "{text}");
    let (status, v) = post(addr, "/v1/completions", &body);
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("device lost (test)"),
        "{v}"
    );
}
