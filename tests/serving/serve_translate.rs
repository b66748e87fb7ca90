//! The continuous-batching translation engine without HTTP, stepped by hand (so "while" and
//! "before" are counted in steps, not measured in time), with a small random translation model:
//! - staggered requests (several sentences each, an empty line, sentences of very different
//!   lengths, a small encoding budget and batch so sentences wait for room) get exactly the
//!   greedy translations of `Translator::translate`, each request alone and each line alone;
//! - a short sentence arriving while a long one decodes joins the running decode and is
//!   answered first;
//! - a client that goes away (or a deadline that passes) frees its rows and blocks at the next
//!   step, queued or running, and the others are unaffected;
//! - over HTTP, concurrent clients get the same translations, and `transformer loadtest
//!   --translate` counts every request answered.
//!
//! The random model does not emit EOS within these lengths: every sentence runs to its own
//! limit (source length + 50), so rows still leave the batch at different steps.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use transformer::decode::beam::BeamOptions;
use transformer::decode::greedy::{greedy_decode, GreedyOptions};
use transformer::model::{ModelConfig, Seq2Seq};
use transformer::pipeline::translate::Translator;
use transformer::rng::Rng;
use transformer::serve::metrics::Metrics;
use transformer::serve::translate_engine::{TranslateConfig, TranslateRequest, TranslationEngine};
use transformer::text::vocab::{Vocab, VocabLevel};

type Answer = Result<Vec<Vec<(f64, String)>>, String>;

fn translator() -> Translator {
    let vocab = Vocab::build(
        ["the cat sat on the mat", "die katze sass auf der matte"],
        VocabLevel::Char,
        1,
    );
    let mut config = ModelConfig::preset("tiny", vocab.len()).unwrap();
    (config.d_model, config.n_heads, config.d_ff, config.max_len) = (32, 4, 64, 96);
    let mut t = Translator::of(Seq2Seq::<f32>::new(config, &mut Rng::new(11)), vocab);
    t.prepare_inference();
    t
}

const CONFIG: TranslateConfig = TranslateConfig {
    block_rows: 4,
    max_batch: 5,
    encode_budget: 24,
    max_len_extra: 50,
};

/// A request of `lines` as the HTTP layer submits it (counted in the queue); its answer's
/// receiver.
fn submit(
    engine: &mut TranslationEngine<'_>,
    metrics: &Metrics,
    lines: &[&str],
    deadline: Duration,
) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    metrics.queued.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    engine.submit(TranslateRequest {
        lines: lines.iter().map(|s| s.to_string()).collect(),
        languages: Default::default(),
        arrived: now,
        deadline: now + deadline,
        reply: tx,
    });
    rx
}

const LONG: Duration = Duration::from_secs(600);

/// The texts of an answer.
fn texts(answer: &[Vec<(f64, String)>]) -> Vec<String> {
    answer
        .iter()
        .map(|l| l.first().map(|h| h.1.clone()).unwrap_or_default())
        .collect()
}

/// Source tokens encoded so far (`transformer_prompt_tokens_total`).
fn prompt_tokens(metrics: &Metrics) -> u64 {
    let text = metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("transformer_prompt_tokens_total "))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn staggered_requests_get_their_single_request_translations() {
    let t = translator();
    let metrics = Arc::new(Metrics::default());
    let mut engine = TranslationEngine::new(&t, CONFIG, metrics.clone());
    // (lines, the step before which it is submitted)
    let requests: Vec<(Vec<&str>, usize)> = vec![
        (vec!["the cat sat on the mat", "a"], 0),
        (vec!["die katze"], 0),
        (vec!["sat", "", "the mat on the cat on the mat", "der"], 1),
        (vec!["matte auf der katze"], 4),
        (vec!["on"], 9),
        (vec!["", "the"], 9),
        (vec!["katze sass"], 30),
    ];
    let mut replies: Vec<Option<oneshot::Receiver<Answer>>> = Vec::new();
    let mut step = 0;
    let mut max_running = 0;
    loop {
        for (lines, at) in &requests {
            if *at == step {
                replies.push(Some(submit(&mut engine, &metrics, lines, LONG)));
            }
        }
        let before = prompt_tokens(&metrics);
        let stepped = engine.step();
        max_running = max_running.max(engine.running());
        assert!(engine.running() <= CONFIG.max_batch);
        // The encoding budget (24 padded tokens, or one sentence alone: the longest source
        // here has 29 + EOS) holds back the burst of step 0 (3 sentences, 35 tokens).
        let encoded = prompt_tokens(&metrics) - before;
        assert!(encoded <= 30, "step {step} encoded {encoded} source tokens");
        if step == 0 {
            assert!(engine.waiting() > 0);
        }
        step += 1;
        if !stepped && replies.len() == requests.len() {
            break;
        }
        assert!(step < 5000, "the engine does not finish");
    }
    assert_eq!(max_running, CONFIG.max_batch, "sentences waited for room");
    let greedy = GreedyOptions::default();
    let alpha = BeamOptions::default().alpha;
    for ((lines, _), rx) in requests.iter().zip(replies) {
        let got = rx.unwrap().try_recv().expect("answered").expect("no error");
        let owned: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        // The request alone, and each line alone.
        assert_eq!(
            texts(&got),
            t.translate(&owned, &greedy).unwrap(),
            "{lines:?}"
        );
        for (i, line) in owned.iter().enumerate() {
            let alone = t.translate(std::slice::from_ref(line), &greedy).unwrap();
            assert_eq!(texts(&got[i..i + 1]), alone, "{line:?}");
            if line.is_empty() {
                assert!(got[i].is_empty());
                continue;
            }
            // The score: log p over the beam's length penalty, as translate_nbest gives it.
            let hyp = &greedy_decode(&t.model, &[t.vocab.encode(line)], &greedy)[0];
            let want = hyp.score / transformer::decode::length_penalty(hyp.n_emitted(), alpha);
            assert!(
                (got[i][0].0 - want).abs() < 1e-4 * want.abs().max(1.0),
                "{line:?}"
            );
        }
    }
    assert_eq!(engine.blocks_in_use(), 0, "every block is free again");
    assert!(engine.is_idle());
    assert_eq!(metrics.queued.load(Ordering::Relaxed), 0);
    let gauges = metrics.gauges();
    assert_eq!((gauges.running, gauges.kv_blocks_used), (0, 0));
    let text = metrics.render();
    let count = |name: &str| -> String {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().to_string()
    };
    let n = requests.len().to_string();
    assert_eq!(count("transformer_queue_time_seconds_count"), n);
    assert_eq!(count("transformer_ttft_seconds_count"), n);
    assert_eq!(count("transformer_e2e_latency_seconds_count"), n);
}

#[test]
fn a_short_sentence_joins_the_running_decode_and_finishes_first() {
    let t = translator();
    let greedy = GreedyOptions::default();
    // The longest and shortest outputs among a few candidates (the model is random: whether
    // it emits EOS early is its choice, fixed by the seed).
    let candidates = [
        "the cat sat on the mat and the cat sat on the mat",
        "die katze sass auf der matte und die katze sass auf der matte",
        "a",
        "t",
        "on",
        "der",
    ];
    let sources: Vec<Vec<u32>> = candidates.iter().map(|s| t.vocab.encode(s)).collect();
    let hyps = greedy_decode(&t.model, &sources, &greedy);
    let steps = |i: usize| hyps[i].n_emitted();
    let long = (0..candidates.len()).max_by_key(|&i| steps(i)).unwrap();
    let short = (0..candidates.len()).min_by_key(|&i| steps(i)).unwrap();
    let join = 3;
    assert!(
        steps(long) > join + steps(short) + 1,
        "the long sentence takes {} steps, the short one {}",
        steps(long),
        steps(short)
    );
    let metrics = Arc::new(Metrics::default());
    let mut engine = TranslationEngine::new(&t, CONFIG, metrics.clone());
    let mut long_rx = submit(&mut engine, &metrics, &[candidates[long]], LONG);
    for _ in 0..join {
        assert!(engine.step());
    }
    let mut short_rx = submit(&mut engine, &metrics, &[candidates[short]], LONG);
    // The next step admits it beside the running one.
    assert!(engine.step());
    assert_eq!(
        engine.running(),
        2,
        "the short sentence joined the running batch"
    );
    let mut taken = join + 1;
    let short_answer = loop {
        if let Ok(answer) = short_rx.try_recv() {
            break answer.unwrap();
        }
        assert!(long_rx.try_recv().is_err(), "the long one finished first");
        assert!(engine.step());
        taken += 1;
    };
    // Answered at the step its own length ends, long before the long sentence's end.
    assert_eq!(taken, join + steps(short));
    assert_eq!(engine.running(), 1);
    let alone = t
        .translate(&[candidates[short].to_string()], &greedy)
        .unwrap();
    assert_eq!(texts(&short_answer), alone);
    while engine.step() {
        taken += 1;
    }
    assert_eq!(taken, steps(long));
    let long_answer = long_rx.try_recv().unwrap().unwrap();
    let alone = t
        .translate(&[candidates[long].to_string()], &greedy)
        .unwrap();
    assert_eq!(texts(&long_answer), alone);
}

#[test]
fn a_client_that_goes_away_frees_its_rows() {
    let t = translator();
    let greedy = GreedyOptions::default();
    let metrics = Arc::new(Metrics::default());
    let config = TranslateConfig {
        max_batch: 3,
        ..CONFIG
    };
    let mut engine = TranslationEngine::new(&t, config, metrics.clone());
    let gone_lines = ["the cat sat on the mat", "die katze sass auf der matte"];
    let gone = submit(&mut engine, &metrics, &gone_lines, LONG);
    let mut stays = submit(&mut engine, &metrics, &["the mat"], LONG);
    // Waits for a row (the batch holds 3), then its client goes away.
    let queued = submit(&mut engine, &metrics, &["katze"], LONG);
    // Already past its deadline when the engine looks at it.
    let late = submit(&mut engine, &metrics, &["der"], Duration::ZERO);
    for _ in 0..3 {
        assert!(engine.step());
    }
    assert_eq!((engine.running(), engine.waiting()), (3, 1));
    assert_eq!(metrics.queued.load(Ordering::Relaxed), 1);
    let with_all = engine.blocks_in_use();
    drop(gone);
    drop(queued);
    assert!(engine.step());
    // The two rows of the request that went away left before the step; nothing waits.
    assert_eq!((engine.running(), engine.waiting()), (1, 0));
    assert!(engine.blocks_in_use() < with_all);
    assert_eq!(metrics.queued.load(Ordering::Relaxed), 0);
    assert_eq!(metrics.gauges().running, 1);
    while engine.step() {}
    assert_eq!(engine.blocks_in_use(), 0);
    let got = stays.try_recv().unwrap().unwrap();
    assert_eq!(
        texts(&got),
        t.translate(&["the mat".to_string()], &greedy).unwrap()
    );
    // The request past its deadline was dropped without an answer.
    let mut late = late;
    assert!(matches!(
        late.try_recv(),
        Err(oneshot::error::TryRecvError::Closed)
    ));
}

/// Over HTTP: concurrent clients get the single-request translations, and
/// `transformer loadtest --translate` reports every request answered, online and offline.
#[test]
fn http_clients_and_the_translation_load_test() {
    use transformer::serve::client::request;
    use transformer::serve::{ServeConfig, Server};
    let tmp = tempfile::tempdir().unwrap();
    let mut t = translator();
    let mut writer = transformer::store::CheckpointWriter::begin(tmp.path()).unwrap();
    transformer::model::checkpoint::write_model(&mut writer, &mut t.model).unwrap();
    t.vocab.write(&mut writer).unwrap();
    writer.commit().unwrap();
    let server = Server::start(ServeConfig::new(
        tmp.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .unwrap();
    server.wait_ready().unwrap();
    let addr = server.addr;
    let lines: [&'static str; 5] = ["the cat", "sat on the mat", "die katze sass", "a", "matte"];
    let threads: Vec<_> = lines
        .into_iter()
        .map(|line| {
            std::thread::spawn(move || {
                let body = serde_json::json!({"q": line}).to_string();
                let (status, _, text) = request(
                    addr,
                    "POST",
                    "/translate",
                    Some(&body),
                    Duration::from_secs(120),
                )
                .unwrap();
                assert_eq!(status, 200, "{text}");
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                v["translatedText"].as_str().unwrap().to_string()
            })
        })
        .collect();
    for (line, thread) in lines.iter().zip(threads) {
        let alone = t
            .translate(&[line.to_string()], &GreedyOptions::default())
            .unwrap();
        assert_eq!(thread.join().unwrap(), alone[0], "{line:?}");
    }
    let tsv = tmp.path().join("pairs.tsv");
    std::fs::write(&tsv, lines.map(|l| format!("{l}\tx\n")).concat()).unwrap();
    let loadtest = |extra: &[&str]| -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_transformer"))
            .args(["loadtest", "--translate", tsv.to_str().unwrap()])
            .args(["--clients", "1,3", "--requests", "2"])
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let online = loadtest(&["--addr", &addr.to_string()]);
    // | clients | requests | errors | ...
    let rows: Vec<Vec<String>> = online
        .lines()
        .skip(2)
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{online}");
    for (row, (clients, requests)) in rows.iter().zip([("1", "2"), ("3", "6")]) {
        assert_eq!(
            (&row[1][..], &row[2][..], &row[3][..]),
            (clients, requests, "0")
        );
        assert!(row[4].parse::<f64>().unwrap() > 0.0, "{online}");
    }
    let ok = server
        .metrics()
        .outcomes(transformer::serve::metrics::Outcome::Ok);
    assert_eq!(ok, lines.len() as u64 + 2 + 6);
    let offline = loadtest(&["--offline", tmp.path().to_str().unwrap(), "--threads", "1"]);
    assert_eq!(offline.lines().count(), 4, "{offline}");
    assert!(offline.contains("| 3 | 6 |"), "{offline}");
    server.shutdown().unwrap();
}
