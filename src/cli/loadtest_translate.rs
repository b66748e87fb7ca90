//! `transformer loadtest --translate FILE`: the load test of a translation server (ours, or any
//! LibreTranslate-compatible one) on loopback. At each concurrency of `--clients`, that many
//! closed-loop clients send `--requests` requests each, `POST /translate` with one source
//! sentence (`{"q": sentence, "source": "auto"}`: greedy, our continuous-batching path); the
//! sentences are the first column of FILE (`source<TAB>target` lines, or plain lines), client
//! `i`'s request `r` taking sentence `(i · requests + r) mod lines`. Prints per concurrency:
//! requests, errors, sentences per second and words of the translations per second (all
//! clients together, over the wall time; words are whitespace-separated, the server returning
//! text, not tokens), and the p50/p99 of end-to-end latency.
//!
//! With `--offline MODEL`: the yardstick, the same sentences of each concurrency translated in
//! one call of the batched greedy translation (`transformer translate`: sentences sorted by
//! length, decoded in batches of 32), timed the same way.

use super::loadtest::{on_client_threads, quantile, successes, LoadtestArgs};
use crate::decode::greedy::GreedyOptions;
use crate::pipeline::translate::Translator;
use crate::serve::client::request;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The source sentences of `path`: the text before the first tab of each non-empty line.
fn sentences(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--translate {}: cannot read it", path.display()))?;
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        bail!("--translate {}: no sentences in it", path.display());
    }
    Ok(lines)
}

/// The sentences a concurrency of `clients` sends, in client-major order.
fn batch_of(lines: &[String], clients: usize, requests: usize) -> Vec<String> {
    (0..clients * requests)
        .map(|k| lines[k % lines.len()].clone())
        .collect()
}

/// Whitespace-separated words of a translation.
fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// One request: its latency and the words of its translation.
fn one(args: &LoadtestArgs, sentence: &str) -> Result<(f64, usize)> {
    let body = json!({"q": sentence, "source": "auto"}).to_string();
    let start = Instant::now();
    let timeout = Duration::from_secs_f64(args.timeout);
    let (status, _, text) = request(args.addr, "POST", "/translate", Some(&body), timeout)?;
    let latency = start.elapsed().as_secs_f64();
    if status != 200 {
        bail!("status {status}: {text}");
    }
    let v: Value = serde_json::from_str(&text).with_context(|| format!("the answer {text}"))?;
    let Some(translation) = v["translatedText"].as_str() else {
        bail!("no translatedText in {text}");
    };
    Ok((latency, words(translation)))
}

/// The offline yardstick (see the module docs).
fn offline(args: &LoadtestArgs, model: &Path, lines: &[String]) -> Result<()> {
    super::set_threads(args.threads)?;
    let mut translator = Translator::load(model)?;
    translator.prepare_precision(args.precision.float_precision()?)?;
    println!("| clients | sentences | sentences/s (offline) | words/s (offline) |");
    println!("|---:|---:|---:|---:|");
    for &clients in &args.clients {
        let batch = batch_of(lines, clients, args.requests);
        let start = Instant::now();
        let out = translator.translate(&batch, &GreedyOptions::default())?;
        let wall = start.elapsed().as_secs_f64();
        let n_words: usize = out.iter().map(|t| words(t)).sum();
        println!(
            "| {clients} | {} | {:.2} | {:.1} |",
            batch.len(),
            batch.len() as f64 / wall,
            n_words as f64 / wall
        );
    }
    Ok(())
}

/// Runs the translation load test (`args.translate` is set).
pub fn run(args: &LoadtestArgs, file: &Path) -> Result<()> {
    let lines = sentences(file)?;
    if let Some(model) = &args.offline {
        return offline(args, model, &lines);
    }
    println!("| clients | requests | errors | sentences/s | words/s | p50 latency (s) | p99 latency (s) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &clients in &args.clients {
        let batch = batch_of(&lines, clients, args.requests);
        let start = Instant::now();
        let mine: Vec<&[String]> = batch.chunks(args.requests).collect();
        let results: Vec<Result<(f64, usize)>> = on_client_threads(mine.len(), |i| {
            mine[i].iter().map(|q| one(args, q)).collect()
        });
        let wall = start.elapsed().as_secs_f64();
        let (answers, errors) = successes(results, clients);
        let mut latencies: Vec<f64> = answers.iter().map(|a| a.0).collect();
        let n_words: usize = answers.iter().map(|a| a.1).sum();
        println!(
            "| {clients} | {} | {errors} | {:.2} | {:.1} | {:.3} | {:.3} |",
            batch.len(),
            latencies.len() as f64 / wall,
            n_words as f64 / wall,
            quantile(&mut latencies, 0.5),
            quantile(&mut latencies, 0.99),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_are_the_first_column_and_clients_cycle_through_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.tsv");
        std::fs::write(
            &path,
            "Guten Tag.\tGood day.\n\nDanke\n  Bitte sehr \tYou're welcome\n",
        )
        .unwrap();
        let lines = sentences(&path).unwrap();
        assert_eq!(lines, ["Guten Tag.", "Danke", "Bitte sehr"]);
        let batch = batch_of(&lines, 2, 2);
        assert_eq!(batch, ["Guten Tag.", "Danke", "Bitte sehr", "Guten Tag."]);
        assert_eq!(words(" zwei  Wörter\n"), 2);
        std::fs::write(&path, "\n\t\n").unwrap();
        let e = sentences(&path).unwrap_err().to_string();
        assert!(e.contains("no sentences"), "{e}");
    }
}
