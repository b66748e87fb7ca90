//! llama-server's metric names (`llamacpp:...`), appended to `/metrics` after our own
//! `transformer_*` family for a language model, so that dashboards made for llama.cpp read
//! this server too. Each is computed from [`Metrics::totals`]:
//!
//! | llama.cpp | from |
//! |---|---|
//! | `prompt_tokens_total` | prompt tokens computed (prefix-cache hits not counted) |
//! | `prompt_tokens_cached_total` | prompt tokens taken from the prefix cache |
//! | `prompt_seconds_total` | requests' time to their first token, summed (queue included) |
//! | `tokens_predicted_total` | tokens generated |
//! | `tokens_predicted_seconds_total` | requests' time from first token to end, summed |
//! | `n_decode_total` | engine steps |
//! | `n_tokens_max` | the most tokens one step fed |
//! | `spec_decode_*` | 0: no speculative decoding |
//! | `prompt_tokens_seconds`, `predicted_tokens_seconds` | the two rates of the totals above |
//! | `requests_processing`, `requests_deferred` | the running batch, the queue |
//! | `n_busy_slots_per_decode` | running sequences per step, averaged |

use super::api_error::ApiError;
use super::metrics::Metrics;
use super::App;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::fmt::Write;
use std::sync::Arc;

/// `GET /metrics`: Prometheus text, ours then llama.cpp's names; 501 with `--no-metrics`.
pub async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    if !app.config.llama.metrics {
        return ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            None,
            "this server does not answer /metrics (started with --no-metrics)",
        )
        .into_response();
    }
    let mut text = app.metrics.render();
    if let Ok(lm) = app.lm() {
        text.push_str(&render(&app.metrics, lm.engine.max_batch));
    }
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                app.started_unix.to_string(),
            ),
        ],
        text,
    )
        .into_response()
}

/// The `llamacpp:` family as Prometheus text (`slots`: the running batch's size at most).
pub fn render(metrics: &Metrics, slots: usize) -> String {
    let t = metrics.totals();
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let per_step = match t.steps {
        0 => 0.0,
        n => t.busy_sum as f64 / n as f64,
    };
    let counters: [(&str, &str, f64); 10] = [
        ("prompt_tokens_total", "Number of prompt tokens processed.", t.prompt_tokens as f64),
        ("prompt_tokens_cached_total", "Number of prompt tokens taken from the prefix cache.", t.cached_tokens as f64),
        ("prompt_seconds_total", "Prompt process time.", t.prompt_seconds),
        ("tokens_predicted_total", "Number of generation tokens processed.", t.generated_tokens as f64),
        ("tokens_predicted_seconds_total", "Predict process time.", t.generation_seconds),
        ("n_decode_total", "Total number of engine steps (forward passes).", t.steps as f64),
        ("n_tokens_max", "Largest number of tokens one step fed.", t.step_tokens_max as f64),
        ("spec_decode_num_draft_tokens_total", "Draft tokens (no speculative decoding here: 0).", 0.0),
        ("spec_decode_num_accepted_tokens_total", "Accepted draft tokens (none here).", 0.0),
        ("spec_decode_num_drafts_total", "Drafts (none here).", 0.0),
    ];
    let gauges: [(&str, &str, f64); 5] = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", rate(t.prompt_tokens, t.prompt_seconds)),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s.", rate(t.generated_tokens, t.generation_seconds)),
        ("requests_processing", "Number of requests processing.", t.running as f64),
        ("requests_deferred", "Number of requests waiting for admission.", t.queued as f64),
        ("n_busy_slots_per_decode", "Average number of busy slots per engine step.", per_step.min(slots as f64)),
    ];
    let mut out = String::new();
    for (kind, family) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
        for (name, help, value) in family {
            let _ = writeln!(
                out,
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::metrics::{EngineGauges, Latency};

    /// `name`'s `# TYPE` and value in `text`.
    fn find(text: &str, name: &str) -> (String, f64) {
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE llamacpp:{name} ")))
            .unwrap_or_else(|| panic!("no TYPE of {name} in\n{text}"));
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("llamacpp:{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        assert!(text.contains(&format!("# HELP llamacpp:{name} ")));
        (kind.to_string(), value.parse().unwrap())
    }

    #[test]
    fn the_llama_cpp_names_count_what_the_engine_did() {
        let m = Metrics::default();
        let busy = |running| EngineGauges {
            running,
            ..Default::default()
        };
        m.step(busy(1), 10, 1);
        m.step(busy(2), 3, 2);
        m.step(busy(0), 0, 3);
        m.observe(Latency::TimeToFirstToken, 0.5);
        m.observe(Latency::EndToEnd, 2.5);
        let text = render(&m, 4);
        assert_eq!(find(&text, "prompt_tokens_total"), ("counter".into(), 13.0));
        assert_eq!(find(&text, "tokens_predicted_total"), ("counter".into(), 6.0));
        assert_eq!(find(&text, "n_decode_total"), ("counter".into(), 3.0));
        assert_eq!(find(&text, "n_tokens_max").1, 11.0);
        assert_eq!(find(&text, "prompt_seconds_total").1, 0.5);
        assert_eq!(find(&text, "tokens_predicted_seconds_total").1, 2.0);
        assert_eq!(find(&text, "predicted_tokens_seconds"), ("gauge".into(), 3.0));
        assert_eq!(find(&text, "prompt_tokens_seconds").1, 26.0);
        assert_eq!(find(&text, "n_busy_slots_per_decode").1, 1.0);
        assert_eq!(find(&text, "requests_processing").1, 0.0);
        assert_eq!(find(&text, "spec_decode_num_drafts_total").1, 0.0);
    }
}
