//! `transformer loadtest --addr HOST:PORT`: a bounded load generator for any OpenAI-compatible
//! server on loopback (ours, llama.cpp's): at each concurrency of `--clients`, that many
//! closed-loop clients send `--requests` streamed completions each (temperature 0) and time
//! them. Prints per concurrency: requests, errors, generated tokens per second (all clients
//! together, over the wall time), and the p50/p99 of end-to-end latency and of time to first
//! token. A token is counted per streamed text chunk, or from `usage` when the server sends it.

use crate::serve::client::Connection;
use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct LoadtestArgs {
    /// The server (loopback).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Concurrencies to measure, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Requests each client sends at each concurrency.
    #[arg(long, default_value_t = 4)]
    pub requests: usize,
    /// max_tokens of every request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// The prompt (the same for every request; client i appends " (i)" so none are identical).
    #[arg(long, default_value = "The history of the printing press begins")]
    pub prompt: String,
    /// The `model` field (llama.cpp's server accepts any).
    #[arg(long, default_value = "model")]
    pub model: String,
    /// Seconds a request may take before it counts as an error.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
}

/// One request's timings.
struct Sample {
    e2e: f64,
    ttft: f64,
    tokens: usize,
}

/// One streamed completion.
fn one(args: &LoadtestArgs, prompt: &str) -> Result<Sample> {
    let body = json!({
        "model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
        "temperature": 0, "stream": true,
    });
    let start = Instant::now();
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut c = Connection::open(
        args.addr,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
        timeout,
    )?;
    if c.status != 200 {
        let status = c.status;
        bail!("status {status}: {}", c.text().unwrap_or_default());
    }
    let (mut ttft, mut chunks, mut usage) = (None, 0, None);
    while let Some(data) = c.next_event()? {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data)?;
        if v.get("error").is_some() {
            bail!("{data}");
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            chunks += 1;
            ttft.get_or_insert_with(|| start.elapsed().as_secs_f64());
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            usage = Some(n as usize);
        }
    }
    let e2e = start.elapsed().as_secs_f64();
    Ok(Sample {
        e2e,
        ttft: ttft.unwrap_or(e2e),
        tokens: usage.unwrap_or(chunks),
    })
}

/// The `q`-quantile (nearest rank) of `xs`.
fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

pub fn run(args: LoadtestArgs) -> Result<()> {
    if !args.addr.ip().is_loopback() {
        bail!("--addr {}: the load test only talks to loopback", args.addr);
    }
    if args.clients.iter().any(|&c| c == 0 || c > 1024) || args.requests == 0 {
        bail!("--clients must be in 1..=1024 and --requests at least 1");
    }
    println!("| clients | requests | errors | tokens/s | p50 latency (s) | p99 latency (s) | p50 TTFT (s) | p99 TTFT (s) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &clients in &args.clients {
        let start = Instant::now();
        let results: Vec<Result<Sample>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|i| {
                    let args = &args;
                    s.spawn(move || {
                        (0..args.requests)
                            .map(|r| {
                                one(
                                    args,
                                    &format!("{} ({})", args.prompt, i * args.requests + r),
                                )
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let wall = start.elapsed().as_secs_f64();
        let mut errors = 0;
        let (mut e2e, mut ttft, mut tokens) = (Vec::new(), Vec::new(), 0);
        for r in results {
            match r {
                Ok(s) => {
                    e2e.push(s.e2e);
                    ttft.push(s.ttft);
                    tokens += s.tokens;
                }
                Err(e) => {
                    if errors == 0 {
                        eprintln!("first error at {clients} clients: {e}");
                    }
                    errors += 1;
                }
            }
        }
        println!(
            "| {clients} | {} | {errors} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} |",
            clients * args.requests,
            tokens as f64 / wall,
            quantile(&mut e2e, 0.5),
            quantile(&mut e2e, 0.99),
            quantile(&mut ttft, 0.5),
            quantile(&mut ttft, 0.99),
        );
    }
    Ok(())
}
