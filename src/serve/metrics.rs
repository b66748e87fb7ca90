//! The server's counters, gauges and histograms, rendered in the Prometheus text exposition
//! format (version 0.0.4) at `GET /metrics`:
//!
//! ```text
//! # HELP transformer_requests_total Requests answered, by outcome.
//! # TYPE transformer_requests_total counter
//! transformer_requests_total{outcome="ok"} 12
//! # TYPE transformer_ttft_seconds histogram
//! transformer_ttft_seconds_bucket{le="0.05"} 3      (cumulative: observations <= le)
//! transformer_ttft_seconds_bucket{le="+Inf"} 12
//! transformer_ttft_seconds_sum 1.9
//! transformer_ttft_seconds_count 12
//! ```
//!
//! Gauges are written by the engine after every step; counters by whoever finishes a request
//! (the HTTP handler, which alone knows whether the client is still there).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Answered in full.
    Ok,
    /// Refused before it ran: malformed, or over a token limit (400/422).
    Invalid,
    /// Refused because the queue was full (429).
    Rejected,
    /// The client went away before the answer was complete.
    Cancelled,
    /// Its deadline passed.
    Timeout,
    /// The model was not ready, or the engine failed (5xx).
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Rejected => "rejected",
            Outcome::Cancelled => "cancelled",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Bucket upper bounds in seconds, shared by every latency histogram (1 ms .. 5 min).
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A cumulative histogram over [`BUCKETS`].
#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Observations in each bucket (not cumulative), one more for `+Inf`.
    counts: [u64; BUCKETS.len() + 1],
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        let i = BUCKETS.partition_point(|&le| le < seconds);
        self.counts[i] += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {cumulative}", self.sum);
    }
}

/// The latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Latency {
    /// From arrival to admission into the running batch.
    QueueTime,
    /// From arrival to the first generated token.
    TimeToFirstToken,
    /// Between generated tokens after the first, per request: `(end − first) / (n − 1)`.
    TimePerOutputToken,
    /// From arrival to the end of generation (finished, or left the batch early: the client
    /// went away, the deadline passed).
    EndToEnd,
    /// Between two consecutive steps that gave a request tokens: every gap, as a client sees
    /// its stream stall (a long prefill batched beside it shows here, not in the mean).
    InterToken,
}

impl Latency {
    fn name(self) -> (&'static str, &'static str) {
        match self {
            Latency::QueueTime => (
                "transformer_queue_time_seconds",
                "Time from arrival to admission into the running batch.",
            ),
            Latency::TimeToFirstToken => (
                "transformer_ttft_seconds",
                "Time from arrival to the first generated token.",
            ),
            Latency::TimePerOutputToken => (
                "transformer_time_per_output_token_seconds",
                "Mean time between generated tokens after the first, per request.",
            ),
            Latency::EndToEnd => (
                "transformer_e2e_latency_seconds",
                "Time from arrival to the end of generation.",
            ),
            Latency::InterToken => (
                "transformer_inter_token_latency_seconds",
                "Time between consecutive tokens of a request, every gap.",
            ),
        }
    }
}

/// Gauges the engine sets after each step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineGauges {
    /// Sequences in the running batch.
    pub running: usize,
    /// KV blocks holding keys and values (each `block_rows` positions in every layer).
    pub kv_blocks_used: usize,
    /// KV blocks of the pool not holding any.
    pub kv_blocks_free: usize,
    /// Blocks promised to admitted sequences (prompt + max_tokens), used or not yet.
    pub kv_blocks_reserved: usize,
    /// Blocks no sequence holds, kept for the prompt prefix they hold (counted free: evicted
    /// when a block is needed).
    pub kv_blocks_cached: usize,
}

/// What prefix caching found for the prompts admitted so far (see `super::prefix_cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCounts {
    /// Prompt tokens taken from cached blocks.
    pub hit_tokens: u64,
    /// Prompt tokens that had to be computed.
    pub miss_tokens: u64,
    /// Cached blocks taken.
    pub hit_blocks: u64,
    /// Full prompt blocks looked up and not found (at most one per prompt: the chain stops).
    pub miss_blocks: u64,
}

/// Totals since the start (see [`Metrics::totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Prompt tokens computed (not taken from the prefix cache).
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: u64,
    pub generated_tokens: u64,
    /// Engine steps (forward passes of the running batch).
    pub steps: u64,
    /// The most tokens one step fed.
    pub step_tokens_max: u64,
    /// Sequences in the running batch, summed over steps.
    pub busy_sum: u64,
    /// Requests' time from arrival to their first token, summed.
    pub prompt_seconds: f64,
    /// Requests' time from their first token to their end, summed.
    pub generation_seconds: f64,
    /// Sequences in the running batch now.
    pub running: usize,
    /// Requests waiting for admission now.
    pub queued: usize,
}

/// Everything `/metrics` shows.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests waiting for admission (incremented by handlers, decremented by the engine).
    pub queued: AtomicUsize,
    inner: Mutex<Inner>,
    /// Why the engine's device failed (set once by the engine; the HTTP side then answers
    /// 503 and `/health` says so).
    device_lost: std::sync::OnceLock<String>,
}

#[derive(Debug, Default)]
struct Inner {
    outcomes: BTreeMap<Outcome, u64>,
    latencies: BTreeMap<Latency, Histogram>,
    gauges: EngineGauges,
    prompt_tokens: u64,
    generated_tokens: u64,
    steps: u64,
    /// The most tokens one step fed (prompt and generated).
    step_tokens_max: u64,
    /// Sequences in the running batch, summed over steps.
    busy_sum: u64,
    /// Seconds in the model's forward passes (the steps' `step_logits`).
    forward_seconds: f64,
    /// Constrained rows' next-token sets computed ([`crate::decode::constraint::Constraint::allowed`]).
    constraint_masks: u64,
    /// Seconds spent computing them, summed over rows (they run beside the forward pass).
    constraint_mask_seconds: f64,
    prefix: PrefixCounts,
    /// The served model's name (the `model_name` label of `transformer_model_info`).
    model_name: Option<String>,
}

/// `value` as a Prometheus label value (backslash, quote and newline escaped).
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Records that the model's device failed with `message` (the first failure is kept).
    pub fn set_device_lost(&self, message: &str) {
        let _ = self.device_lost.set(message.to_string());
    }

    /// Why the model's device failed, once it has.
    pub fn device_lost(&self) -> Option<&str> {
        self.device_lost.get().map(String::as_str)
    }

    /// Names the served model (`transformer_model_info{model_name="..."} 1`).
    pub fn set_model_name(&self, name: &str) {
        self.with(|m| m.model_name = Some(name.to_string()));
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock cannot leave these numbers inconsistent in a way that
        // matters more than losing them: keep serving.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }

    /// Counts one finished request.
    pub fn count(&self, outcome: Outcome) {
        self.with(|m| *m.outcomes.entry(outcome).or_default() += 1);
    }

    /// Requests that ended with `outcome` so far.
    pub fn outcomes(&self, outcome: Outcome) -> u64 {
        self.with(|m| m.outcomes.get(&outcome).copied().unwrap_or(0))
    }

    pub fn observe(&self, latency: Latency, seconds: f64) {
        self.with(|m| m.latencies.entry(latency).or_default().observe(seconds));
    }

    /// The engine's state after a step that fed `prompt` prompt tokens and generated
    /// `generated` tokens.
    pub fn step(&self, gauges: EngineGauges, prompt: usize, generated: usize) {
        self.with(|m| {
            m.gauges = gauges;
            m.prompt_tokens += prompt as u64;
            m.generated_tokens += generated as u64;
            m.steps += 1;
            m.step_tokens_max = m.step_tokens_max.max((prompt + generated) as u64);
            m.busy_sum += gauges.running as u64;
        });
    }

    /// The totals llama.cpp's metric names show ([`super::metrics_llama`]).
    pub fn totals(&self) -> Totals {
        let queued = self.queued.load(Ordering::Relaxed);
        self.with(|m| {
            let sum = |l: Latency| m.latencies.get(&l).map_or(0.0, |h| h.sum);
            let first = sum(Latency::TimeToFirstToken);
            Totals {
                prompt_tokens: m.prompt_tokens,
                cached_tokens: m.prefix.hit_tokens,
                generated_tokens: m.generated_tokens,
                steps: m.steps,
                step_tokens_max: m.step_tokens_max,
                busy_sum: m.busy_sum,
                prompt_seconds: first,
                generation_seconds: (sum(Latency::EndToEnd) - first).max(0.0),
                running: m.gauges.running,
                queued,
            }
        })
    }

    /// Adds one forward pass of `seconds`.
    pub fn forward(&self, seconds: f64) {
        self.with(|m| m.forward_seconds += seconds);
    }

    /// Adds `masks` constrained rows' next-token sets that took `seconds` in all.
    pub fn constraint_masks(&self, masks: usize, seconds: f64) {
        self.with(|m| {
            m.constraint_masks += masks as u64;
            m.constraint_mask_seconds += seconds;
        });
    }

    /// `(forward seconds, steps, masks computed, mask seconds)` so far.
    pub fn step_times(&self) -> (f64, u64, u64, f64) {
        self.with(|m| {
            (
                m.forward_seconds,
                m.steps,
                m.constraint_masks,
                m.constraint_mask_seconds,
            )
        })
    }

    /// Adds one admitted prompt's prefix-cache lookup.
    pub fn prefix_lookup(&self, found: PrefixCounts) {
        self.with(|m| {
            let p = &mut m.prefix;
            p.hit_tokens += found.hit_tokens;
            p.miss_tokens += found.miss_tokens;
            p.hit_blocks += found.hit_blocks;
            p.miss_blocks += found.miss_blocks;
        });
    }

    /// The prefix-cache counts so far.
    pub fn prefix_counts(&self) -> PrefixCounts {
        self.with(|m| m.prefix)
    }

    pub fn set_gauges(&self, gauges: EngineGauges) {
        self.with(|m| m.gauges = gauges);
    }

    pub fn gauges(&self) -> EngineGauges {
        self.with(|m| m.gauges)
    }

    /// The Prometheus text of everything.
    pub fn render(&self) -> String {
        let queued = self.queued.load(Ordering::Relaxed);
        self.with(|m| {
            let mut out = String::new();
            if let Some(name) = &m.model_name {
                let _ = writeln!(
                    out,
                    "# HELP transformer_model_info The model served.\n\
                     # TYPE transformer_model_info gauge\n\
                     transformer_model_info{{model_name=\"{}\"}} 1",
                    label_value(name)
                );
            }
            let _ = writeln!(
                out,
                "# HELP transformer_requests_total Requests answered, by outcome.\n\
                 # TYPE transformer_requests_total counter"
            );
            for outcome in [
                Outcome::Ok,
                Outcome::Invalid,
                Outcome::Rejected,
                Outcome::Cancelled,
                Outcome::Timeout,
                Outcome::Error,
            ] {
                let n = m.outcomes.get(&outcome).copied().unwrap_or(0);
                let label = outcome.label();
                let _ = writeln!(out, "transformer_requests_total{{outcome=\"{label}\"}} {n}");
            }
            let g = m.gauges;
            for (name, help, value) in [
                (
                    "transformer_queue_length",
                    "Requests waiting for admission.",
                    queued,
                ),
                (
                    "transformer_running_batch",
                    "Sequences in the running batch.",
                    g.running,
                ),
                (
                    "transformer_kv_blocks_used",
                    "KV cache blocks holding keys and values.",
                    g.kv_blocks_used,
                ),
                (
                    "transformer_kv_blocks_free",
                    "KV cache blocks of the pool not in use.",
                    g.kv_blocks_free,
                ),
                (
                    "transformer_kv_blocks_reserved",
                    "KV cache blocks promised to admitted sequences.",
                    g.kv_blocks_reserved,
                ),
                (
                    "transformer_kv_blocks_cached",
                    "KV cache blocks no sequence holds, kept for their prompt prefix.",
                    g.kv_blocks_cached,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
                );
            }
            for (name, help, value) in [
                (
                    "transformer_prompt_tokens_total",
                    "Prompt tokens prefilled.",
                    m.prompt_tokens,
                ),
                (
                    "transformer_generated_tokens_total",
                    "Tokens generated.",
                    m.generated_tokens,
                ),
                (
                    "transformer_engine_steps_total",
                    "Forward passes of the running batch.",
                    m.steps,
                ),
                (
                    "transformer_prefix_cache_hit_tokens_total",
                    "Prompt tokens taken from cached KV blocks.",
                    m.prefix.hit_tokens,
                ),
                (
                    "transformer_prefix_cache_miss_tokens_total",
                    "Prompt tokens computed (not found in the prefix cache).",
                    m.prefix.miss_tokens,
                ),
                (
                    "transformer_prefix_cache_hit_blocks_total",
                    "Cached KV blocks taken by prompts.",
                    m.prefix.hit_blocks,
                ),
                (
                    "transformer_prefix_cache_miss_blocks_total",
                    "Full prompt blocks looked up in the prefix cache and not found.",
                    m.prefix.miss_blocks,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
                );
            }
            for (name, help, value) in [
                (
                    "transformer_forward_seconds_total",
                    "Time in the model's forward passes.",
                    m.forward_seconds,
                ),
                (
                    "transformer_constraint_mask_seconds_total",
                    "Time computing constrained rows' allowed next tokens, summed over rows.",
                    m.constraint_mask_seconds,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP transformer_constraint_masks_total Constrained rows' allowed next tokens computed.\n\
                 # TYPE transformer_constraint_masks_total counter\n\
                 transformer_constraint_masks_total {}",
                m.constraint_masks
            );
            for latency in [
                Latency::QueueTime,
                Latency::TimeToFirstToken,
                Latency::TimePerOutputToken,
                Latency::EndToEnd,
                Latency::InterToken,
            ] {
                let (name, help) = latency.name();
                let h = m.latencies.get(&latency).cloned().unwrap_or_default();
                h.render(&mut out, name, help);
            }
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_inclusive() {
        let metrics = Metrics::default();
        for s in [0.001, 0.002, 0.3, 1000.0] {
            metrics.observe(Latency::EndToEnd, s);
        }
        metrics.count(Outcome::Ok);
        metrics.count(Outcome::Ok);
        let text = metrics.render();
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("{prefix} missing in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        // le is inclusive: 0.001 falls in the first bucket.
        assert_eq!(
            line("transformer_e2e_latency_seconds_bucket{le=\"0.001\"}"),
            "1"
        );
        assert_eq!(
            line("transformer_e2e_latency_seconds_bucket{le=\"0.0025\"}"),
            "2"
        );
        assert_eq!(
            line("transformer_e2e_latency_seconds_bucket{le=\"0.5\"}"),
            "3"
        );
        assert_eq!(
            line("transformer_e2e_latency_seconds_bucket{le=\"300\"}"),
            "3"
        );
        assert_eq!(
            line("transformer_e2e_latency_seconds_bucket{le=\"+Inf\"}"),
            "4"
        );
        assert_eq!(line("transformer_e2e_latency_seconds_count"), "4");
        let sum: f64 = line("transformer_e2e_latency_seconds_sum").parse().unwrap();
        assert!((sum - 1000.303).abs() < 1e-9);
        assert_eq!(line("transformer_requests_total{outcome=\"ok\"}"), "2");
        assert_eq!(
            line("transformer_requests_total{outcome=\"cancelled\"}"),
            "0"
        );
    }

    #[test]
    fn the_model_is_named_in_a_label() {
        let metrics = Metrics::default();
        assert!(!metrics.render().contains("transformer_model_info"));
        metrics.set_model_name("smol \"q4\"\\x");
        let text = metrics.render();
        assert!(
            text.contains("transformer_model_info{model_name=\"smol \\\"q4\\\"\\\\x\"} 1"),
            "{text}"
        );
        metrics.observe(Latency::InterToken, 0.02);
        let text = metrics.render();
        assert!(text.contains("transformer_inter_token_latency_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("transformer_inter_token_latency_seconds_count 1"));
    }
}
