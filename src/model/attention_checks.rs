//! What the float64 tests of the attention layer's variants share (windows, query/key norms,
//! the attention kinds): random inputs, a `x Wᵀ + b` loop, the backward of `Σ r ⊙ y` against
//! central differences, and incremental decoding against the full forward in every step
//! layout. Each variant's test file keeps only what is its own (its layer, its loops).

use super::attention::MultiHeadAttention;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::step_layout::{Feed, Outputs, StepLayout};
use super::Module;
use crate::backend::AttnMask;
use crate::rng::Rng;

/// `n` values uniform in [−1, 1) from `seed`.
pub fn uniform(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
}

/// `max |a − b|` over two slices of one length.
pub fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// `x Wᵀ` in loops (`x [rows, d_in]`, `W [d_out, d_in]`).
pub fn matmul_t(x: &[f64], w: &[f64], d_in: usize, d_out: usize) -> Vec<f64> {
    let rows = x.len() / d_in;
    let mut y = vec![0.0; rows * d_out];
    for r in 0..rows {
        for o in 0..d_out {
            y[r * d_out + o] = (0..d_in).map(|i| x[r * d_in + i] * w[o * d_in + i]).sum();
        }
    }
    y
}

/// `∂f/∂x_i` by central differences of step `h`.
pub fn numeric(f: &impl Fn(&[f64]) -> f64, x: &[f64], i: usize, h: f64) -> f64 {
    let (mut up, mut down) = (x.to_vec(), x.to_vec());
    up[i] += h;
    down[i] -= h;
    (f(&up) - f(&down)) / (2.0 * h)
}

/// Causal self-attention over rows of `lens` keys.
pub fn causal(lens: &[usize]) -> AttnMask<'_> {
    AttnMask {
        key_lens: lens,
        causal: true,
        q_offset: 0,
    }
}

/// `x Wᵀ + b` in loops.
pub fn linear_loops(x: &[f64], l: &Linear<f64>) -> Vec<f64> {
    let (w, rows) = (&l.weight.value.data, x.len() / l.d_in);
    let mut y = vec![0.0; rows * l.d_out];
    for r in 0..rows {
        for o in 0..l.d_out {
            let dot: f64 = (0..l.d_in)
                .map(|i| x[r * l.d_in + i] * w[o * l.d_in + i])
                .sum();
            y[r * l.d_out + o] = dot + l.bias.as_ref().map_or(0.0, |b| b.value.data[o]);
        }
    }
    y
}

/// The rows `[batch, width]` of `x [batch*len, width]` at position `p` of each row.
pub fn at_position(x: &[f64], batch: usize, len: usize, p: usize) -> Vec<f64> {
    let width = x.len() / (batch * len);
    (0..batch)
        .flat_map(|b| x[(b * len + p) * width..(b * len + p + 1) * width].to_vec())
        .collect()
}

/// Self-attention's backward of `L = Σ r ⊙ m(x)` over `batch` rows under `mask` against
/// central differences (step 1e-5, tolerance 1e-7): about `x_picks` entries of the input
/// gradient, and of each parameter every `param_step(name, len)`-th entry.
pub fn check_backward(
    m: &mut MultiHeadAttention<f64>,
    (x, r): (&[f64], &[f64]),
    batch: usize,
    mask: AttnMask,
    x_picks: usize,
    param_step: impl Fn(&str, usize) -> usize,
    what: &str,
) {
    let loss = |m: &MultiHeadAttention<f64>, x: &[f64]| -> f64 {
        let (y, _) = m.forward(x, x, batch, mask, None);
        y.iter().zip(r).map(|(a, b)| a * b).sum()
    };
    let (_, cache) = m.forward(x, x, batch, mask, None);
    m.zero_grads();
    let (dq, dkv) = m.backward(x, x, cache, r);
    let dx: Vec<f64> = dq.iter().zip(&dkv).map(|(a, b)| a + b).collect();
    let h = 1e-5;
    for i in (0..x.len()).step_by(x.len() / x_picks + 1) {
        let (mut up, mut down) = (x.to_vec(), x.to_vec());
        up[i] += h;
        down[i] -= h;
        let fd = (loss(m, &up) - loss(m, &down)) / (2.0 * h);
        assert!(
            (fd - dx[i]).abs() < 1e-7,
            "{what} dx[{i}]: {fd} vs {}",
            dx[i]
        );
    }
    let grads: Vec<(String, Vec<f64>)> = m
        .params_mut()
        .into_iter()
        .map(|(n, p)| (n, p.grad.data.clone()))
        .collect();
    for (pi, (name, grad)) in grads.iter().enumerate() {
        for j in (0..grad.len()).step_by(param_step(name, grad.len())) {
            let nudge = |by: f64| {
                let mut m = m.clone();
                m.params_mut()[pi].1.value.data[j] += by;
                loss(&m, x)
            };
            let fd = (nudge(h) - nudge(-h)) / (2.0 * h);
            assert!(
                (fd - grad[j]).abs() < 1e-7,
                "{what} {name}[{j}]: {fd} vs {}",
                grad[j]
            );
        }
    }
}

/// Decoding the causal layer `m` equals `want`, its full forward of `x [batch*len, width]`,
/// to 1e-12 at every position: one token a row at a time (a cache of one block a row, and
/// blocks of 2, after which `inspect(cache)` runs), a prompt of `split` positions then one
/// token a row (every output, and only the last), and ragged rows (row 0's first `split`
/// positions with row 1's first two, then the rest of both in one call).
pub fn check_decoding(
    m: &MultiHeadAttention<f64>,
    (x, want): (&[f64], &[f64]),
    (batch, len, split): (usize, usize, usize),
    what: &str,
    inspect: impl Fn(&KvCache<f64>),
) {
    assert_eq!(batch, 2, "the ragged layout is written for two rows");
    let width = x.len() / (batch * len);
    let close = |got: &[f64], want: &[f64], step: &str| {
        let err = max_diff(got, want);
        assert!(err < 1e-12, "{what} {step}: {err:e}");
    };
    let one_token = |x: &[f64], p: usize| at_position(x, batch, len, p);
    for block_rows in [len, 2] {
        let mut cache = KvCache::new(batch, len, m.d_kv(), block_rows);
        for p in 0..len {
            let (y, _) = m.step(&one_token(x, p), &mut cache, &StepLayout::dense());
            close(
                &y,
                &one_token(want, p),
                &format!("step {p}, blocks {block_rows}"),
            );
        }
        inspect(&cache);
    }
    let rows_of = |x: &[f64], ps: std::ops::Range<usize>| -> Vec<f64> {
        (0..batch)
            .flat_map(|b| x[(b * len + ps.start) * width..(b * len + ps.end) * width].to_vec())
            .collect()
    };
    for last_only in [false, true] {
        let mut cache = KvCache::new(batch, len, m.d_kv(), len);
        let layout = match last_only {
            true => StepLayout::last(),
            false => StepLayout::dense(),
        };
        let (y, _) = m.step(&rows_of(x, 0..split), &mut cache, &layout);
        let expect = match last_only {
            true => one_token(want, split - 1),
            false => rows_of(want, 0..split),
        };
        close(&y, &expect, &format!("prompt, last only {last_only}"));
        for p in split..len {
            let (y, _) = m.step(&one_token(x, p), &mut cache, &StepLayout::dense());
            close(&y, &one_token(want, p), &format!("step {p} after prompt"));
        }
    }
    let mut cache = KvCache::new(batch, len, m.d_kv(), 2);
    let mut fed = [0, 0];
    for chunk in [[split, 2], [len - split, len - 2]] {
        let (mut rows, mut positions, mut xs, mut expect) = (vec![], vec![], vec![], vec![]);
        for b in 0..batch {
            for p in fed[b]..fed[b] + chunk[b] {
                rows.push(b);
                positions.push(p);
                xs.extend_from_slice(&x[(b * len + p) * width..][..width]);
                expect.extend_from_slice(&want[(b * len + p) * width..][..width]);
            }
            fed[b] += chunk[b];
        }
        let layout = StepLayout {
            feed: Feed::Ragged {
                rows: &rows,
                positions: &positions,
            },
            outputs: Outputs::All,
        };
        let (y, _) = m.step(&xs, &mut cache, &layout);
        close(&y, &expect, "ragged");
    }
}

/// A language model's incremental decoding against its full forward over `tokens` (`rows`
/// rows of `len` each, `[rows * len]`): the rows fed a token at a time in one dense step each,
/// then the whole prompt at once keeping the last positions, each within 1e-10 of the full
/// forward's log-probabilities.
pub fn check_lm_decoding(m: &super::LanguageModel<f64>, tokens: &[u32], rows: usize) {
    let len = tokens.len() / rows;
    let v = m.config.vocab_size;
    let targets: Vec<u32> = tokens[1..].iter().chain(&tokens[..1]).copied().collect();
    let (_, full) = m.evaluate_with_logprobs(tokens, &targets, rows);
    let at = |b: usize, p: usize| full[(b * len + p) * v..(b * len + p + 1) * v].to_vec();
    let mut state = m.start(rows, len);
    for p in 0..len {
        let fed: Vec<u32> = (0..rows).map(|b| tokens[b * len + p]).collect();
        let got = m.step(&mut state, &fed, &StepLayout::dense());
        let want: Vec<f64> = (0..rows).flat_map(|b| at(b, p)).collect();
        assert!(max_diff(&got, &want) < 1e-10, "position {p}");
    }
    let mut state = m.start(rows, len);
    let last = m.step(&mut state, tokens, &StepLayout::last());
    let want: Vec<f64> = (0..rows).flat_map(|b| at(b, len - 1)).collect();
    assert!(max_diff(&last, &want) < 1e-10, "a prompt at once, last positions");
}

/// Every parameter's gradient in `with_grads` (a copy of `m` after a backward of `loss`)
/// against central differences of `loss` over `m`, at three entries of each parameter (the
/// first, a third and two thirds in): the entries checked. `what` names the case in a failure.
pub fn sampled_gradients_match(
    m: &super::LanguageModel<f64>,
    with_grads: &mut super::LanguageModel<f64>,
    loss: impl Fn(&super::LanguageModel<f64>) -> f64,
    what: &str,
) -> usize {
    let grads: Vec<(String, Vec<f64>)> = with_grads
        .params_mut()
        .into_iter()
        .map(|(n, p)| (n, p.grad.data.clone()))
        .collect();
    let mut checked = 0;
    for (name, grad) in &grads {
        let n_values = grad.len();
        for i in (0..n_values).step_by(n_values.div_ceil(3)) {
            let at = |delta: f64| {
                let mut moved = m.clone();
                for (n, p) in moved.params_mut() {
                    if n == *name {
                        p.value.data[i] += delta;
                    }
                }
                loss(&moved)
            };
            let h = 1e-5;
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let tol = 1e-6 * (1.0 + numeric.abs());
            assert!(
                (grad[i] - numeric).abs() < tol,
                "{what}, {name}[{i}]: {} vs {numeric}",
                grad[i]
            );
            checked += 1;
        }
    }
    checked
}
