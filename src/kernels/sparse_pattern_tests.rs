//! The kernels under a sparse pattern, float64: the plain kernel against softmax loops over the
//! visible keys, its backward against central finite differences, the tiled and step kernels
//! against the plain one.

use super::*;
use crate::kernels::attention::AttnDims;
use crate::kernels::flash_attention::{flash_attention_backward, flash_attention_forward};
use crate::kernels::key_ranges::AttnMask;
use crate::kernels::plain_attention::{attention_backward, attention_forward};
use crate::kernels::step_attention::step_attention_forward;
use crate::rng::Rng;

fn uniform(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
}

fn dims(batch: usize, heads: usize, d_head: usize, len: usize) -> AttnDims {
    AttnDims {
        batch,
        heads,
        kv_heads: heads,
        d_head,
        q_len: len,
        k_len: len,
        kv_stride: len,
        scores: Default::default(),
    }
}

const PATTERNS: [Pattern; 3] = [
    Pattern::Strided {
        local: 3,
        stride: 4,
    },
    Pattern::Global {
        local: 2,
        global: 2,
    },
    Pattern::Band { window: 3 },
];

/// `softmax(q·k/√d)` over the keys `j < lens[b]` (and `j ≤ i` when causal) that `pattern` lets
/// the query at position `i` see, then `· v`, straight loops.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dm: AttnDims,
    lens: &[usize],
    causal: bool,
    pattern: Pattern,
) -> Vec<f64> {
    let (d, dmod) = (dm.d_head, dm.d_model());
    let mut out = vec![0.0; q.len()];
    for (b, &len_b) in lens.iter().enumerate().take(dm.batch) {
        for h in 0..dm.heads {
            for i in 0..dm.q_len {
                let at = |r: usize| (b * dm.q_len + r) * dmod + h * d;
                let seen: Vec<usize> = (0..len_b)
                    .filter(|&j| (!causal || j <= i) && pattern.sees(i, j))
                    .collect();
                let s: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        (0..d).map(|c| q[at(i) + c] * k[at(j) + c]).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    out[at(i) + c] = seen
                        .iter()
                        .zip(&e)
                        .map(|(&j, w)| w / z * v[at(j) + c])
                        .sum();
                }
            }
        }
    }
    out
}

/// Plain forward = the loops; plain backward = central differences of `Σ g ⊙ out`, for each
/// pattern, causal (every row full) and not (padded rows).
#[test]
fn plain_kernel_forward_and_backward() {
    let (batch, heads, d_head, len) = (2, 2, 3, 9);
    let dm = dims(batch, heads, d_head, len);
    let n = batch * len * dm.d_model();
    let (q, k, v, g) = (uniform(n, 1), uniform(n, 2), uniform(n, 3), uniform(n, 4));
    for pattern in PATTERNS {
        for causal in [true, false] {
            let lens: Vec<usize> = match causal {
                true => vec![len; batch],
                false => vec![len, len - 2],
            };
            let mask = AttnMask {
                key_lens: &lens,
                causal,
                q_offset: 0,
            };
            let ranges = Patterned {
                inner: mask,
                pattern,
                causal,
            };
            let run = |q: &[f64], k: &[f64], v: &[f64]| {
                let (mut ctx, mut p) = (vec![0.0; n], vec![0.0; batch * heads * len * len]);
                attention_forward(&mut ctx, &mut p, q, k, v, dm, ranges, None);
                (ctx, p)
            };
            let (ctx, probs) = run(&q, &k, &v);
            let want = reference(&q, &k, &v, dm, &lens, causal, pattern);
            for (a, b) in ctx.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "{pattern:?} causal {causal}: {a} vs {b}"
                );
            }
            let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            attention_backward(&mut dq, &mut dk, &mut dv, &g, &q, &k, &v, &probs, dm, None);
            let loss = |q: &[f64], k: &[f64], v: &[f64]| {
                run(q, k, v)
                    .0
                    .iter()
                    .zip(&g)
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            };
            let eps = 1e-6;
            for (which, grad) in [&dq, &dk, &dv].into_iter().enumerate() {
                for e in 0..n {
                    let mut x = [q.clone(), k.clone(), v.clone()];
                    x[which][e] += eps;
                    let up = loss(&x[0], &x[1], &x[2]);
                    x[which][e] -= 2.0 * eps;
                    let down = loss(&x[0], &x[1], &x[2]);
                    let numeric = (up - down) / (2.0 * eps);
                    assert!(
                        (numeric - grad[e]).abs() < 1e-7,
                        "{pattern:?} causal {causal} tensor {which} [{e}]: {numeric} vs {}",
                        grad[e]
                    );
                }
            }
        }
    }
}

/// Over more keys than a tile (so tiles are partly hidden), the tiled kernel's forward and
/// backward equal the plain kernel's, and the step kernel's forward too.
#[test]
fn tiled_and_step_kernels_equal_the_plain_one() {
    let (batch, heads, d_head, len) = (2, 2, 4, 150);
    let dm = dims(batch, heads, d_head, len);
    let n = batch * len * dm.d_model();
    let (q, k, v, g) = (uniform(n, 5), uniform(n, 6), uniform(n, 7), uniform(n, 8));
    let patterns = [
        Pattern::Strided {
            local: 12,
            stride: 12,
        },
        Pattern::Global {
            local: 20,
            global: 3,
        },
    ];
    for pattern in patterns {
        for causal in [true, false] {
            let lens = vec![len, len - 30];
            let mask = AttnMask {
                key_lens: &lens,
                causal,
                q_offset: 0,
            };
            let ranges = Patterned {
                inner: mask,
                pattern,
                causal,
            };
            let (mut ctx, mut probs) = (vec![0.0; n], vec![0.0; batch * heads * len * len]);
            attention_forward(&mut ctx, &mut probs, &q, &k, &v, dm, ranges, None);
            let (mut ctx_t, mut lse) = (vec![0.0; n], vec![0.0; batch * len * heads]);
            flash_attention_forward(&mut ctx_t, &mut lse, &q, &k, &v, dm, ranges);
            let rows: Vec<u32> = (0..(batch * len) as u32).collect();
            let (mut ctx_s, mut probs_s) = (vec![0.0; n], vec![0.0; probs.len()]);
            step_attention_forward(&mut ctx_s, &mut probs_s, &q, &k, &v, &rows, ranges, dm);
            let close = |a: &[f64], b: &[f64], what: &str| {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() < 1e-12,
                        "{pattern:?} causal {causal} {what}: {x} vs {y}"
                    );
                }
            };
            close(&ctx_t, &ctx, "tiled forward");
            close(&ctx_s, &ctx, "step forward");
            close(&probs_s, &probs, "step weights");
            let grads = |tiled: bool| {
                let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
                match tiled {
                    true => flash_attention_backward(
                        &mut dq, &mut dk, &mut dv, &g, &ctx_t, &lse, &q, &k, &v, dm, ranges,
                    ),
                    false => attention_backward(
                        &mut dq, &mut dk, &mut dv, &g, &q, &k, &v, &probs, dm, None,
                    ),
                }
                [dq, dk, dv]
            };
            let (plain, tiled) = (grads(false), grads(true));
            for (a, b) in plain.iter().zip(&tiled) {
                close(b, a, "tiled backward");
            }
        }
    }
}
