//! Linear attention in float64: the forward against its quadratic form written out as loops, the
//! backward against central finite differences, decoding's running state against the forward.

use super::*;
use crate::rng::Rng;

fn uniform(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform_range(-1.5, 1.5)).collect()
}

fn dims(
    batch: usize,
    (heads, kv_heads, d_head): (usize, usize, usize),
    q_len: usize,
    k_len: usize,
) -> AttnDims {
    AttnDims {
        batch,
        heads,
        kv_heads,
        d_head,
        q_len,
        k_len,
        kv_stride: k_len,
        scores: Default::default(),
    }
}

/// `out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)` over the keys `j < visible(b, i)`,
/// straight loops.
fn quadratic(q: &[f64], k: &[f64], v: &[f64], dm: AttnDims, mask: AttnMask<'_>) -> Vec<f64> {
    let (d, dmod, dkv, group) = (dm.d_head, dm.d_model(), dm.d_kv(), dm.group());
    let phi = |x: f64| if x > 0.0 { x + 1.0 } else { x.exp() };
    let mut out = vec![0.0; dm.batch * dm.q_len * dmod];
    for b in 0..dm.batch {
        for h in 0..dm.heads {
            for i in 0..dm.q_len {
                let seen = mask.visible(b, i).min(dm.k_len);
                let qa = (b * dm.q_len + i) * dmod + h * d;
                let ka = |j: usize| (b * dm.k_len + j) * dkv + (h / group) * d;
                let w: Vec<f64> = (0..seen)
                    .map(|j| (0..d).map(|c| phi(q[qa + c]) * phi(k[ka(j) + c])).sum())
                    .collect();
                let total: f64 = w.iter().sum();
                for c in 0..d {
                    let num: f64 = (0..seen).map(|j| w[j] * v[ka(j) + c]).sum();
                    out[qa + c] = if seen == 0 { 0.0 } else { num / total };
                }
            }
        }
    }
    out
}

/// Causal with padding and a query offset (a chunk after cached keys), not causal with
/// padding, grouped-query heads: the running sums equal the quadratic form, and so do the
/// weights of [`linear_attention_weights`].
#[test]
fn forward_equals_the_quadratic_form() {
    for &(batch, hd, q_len, k_len, causal, q_offset) in &[
        (2, (2, 2, 4), 5, 5, true, 0),
        (3, (4, 2, 3), 3, 7, true, 4),
        (2, (3, 1, 5), 6, 6, false, 0),
    ] {
        let dm = dims(batch, hd, q_len, k_len);
        let lens: Vec<usize> = (0..batch).map(|b| k_len - b).collect();
        let mask = AttnMask {
            key_lens: &lens,
            causal,
            q_offset,
        };
        let q = uniform(batch * q_len * dm.d_model(), 1);
        let k = uniform(batch * k_len * dm.d_kv(), 2);
        let v = uniform(batch * k_len * dm.d_kv(), 3);
        let mut ctx = vec![f64::NAN; q.len()];
        linear_attention_forward(&mut ctx, &q, &k, &v, dm, mask);
        let want = quadratic(&q, &k, &v, dm, mask);
        for (a, b) in ctx.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        // the weights, applied to v, give the same context
        let w = linear_attention_weights(&q, &k, dm, mask);
        let (d, group) = (dm.d_head, dm.group());
        for b in 0..batch {
            for h in 0..dm.heads {
                for i in 0..q_len {
                    let row = &w[((b * dm.heads + h) * q_len + i) * k_len..][..k_len];
                    for c in 0..d {
                        let got: f64 = (0..k_len)
                            .map(|j| row[j] * v[(b * k_len + j) * dm.d_kv() + (h / group) * d + c])
                            .sum();
                        let at = (b * q_len + i) * dm.d_model() + h * d + c;
                        assert!((got - want[at]).abs() < 1e-12);
                    }
                }
            }
        }
    }
}

/// Every element of dq, dk and dv against central differences of `L = Σ g ⊙ out`.
#[test]
fn backward_matches_finite_differences() {
    for &(batch, hd, len, causal) in &[(2, (2, 1, 3), 5, true), (2, (2, 2, 3), 4, false)] {
        let dm = dims(batch, hd, len, len);
        let lens: Vec<usize> = (0..batch).map(|b| len - b).collect();
        let mask = AttnMask {
            key_lens: &lens,
            causal,
            q_offset: 0,
        };
        let q = uniform(batch * len * dm.d_model(), 4);
        let k = uniform(batch * len * dm.d_kv(), 5);
        let v = uniform(batch * len * dm.d_kv(), 6);
        let g = uniform(q.len(), 7);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| {
            let mut ctx = vec![0.0; q.len()];
            linear_attention_forward(&mut ctx, q, k, v, dm, mask);
            ctx.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>()
        };
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
        linear_attention_backward(&mut dq, &mut dk, &mut dv, &g, &q, &k, &v, dm, mask);
        let eps = 1e-6;
        for which in 0..3 {
            let (x, grad) = match which {
                0 => (&q, &dq),
                1 => (&k, &dk),
                _ => (&v, &dv),
            };
            for n in 0..x.len() {
                let (mut up, mut down) = (x.clone(), x.clone());
                up[n] += eps;
                down[n] -= eps;
                let f = |y: &[f64]| match which {
                    0 => loss(y, &k, &v),
                    1 => loss(&q, y, &v),
                    _ => loss(&q, &k, y),
                };
                let numeric = (f(&up) - f(&down)) / (2.0 * eps);
                assert!(
                    (numeric - grad[n]).abs() < 1e-7,
                    "tensor {which} element {n}: {numeric} vs {}",
                    grad[n]
                );
            }
        }
    }
}

/// Feeding a sequence one token at a time through the running state gives the causal forward
/// of the whole sequence; reordering rows reorders the state.
#[test]
fn decoding_state_equals_the_forward() {
    let (batch, hd, len) = (3, (4, 2, 3), 7);
    let dm = dims(batch, hd, len, len);
    let lens = vec![len; batch];
    let mask = AttnMask {
        key_lens: &lens,
        causal: true,
        q_offset: 0,
    };
    let q = uniform(batch * len * dm.d_model(), 8);
    let k = uniform(batch * len * dm.d_kv(), 9);
    let v = uniform(batch * len * dm.d_kv(), 10);
    let mut full = vec![0.0; q.len()];
    linear_attention_forward(&mut full, &q, &k, &v, dm, mask);
    let mut state = LinearState::new(batch, dm.kv_heads, dm.d_head);
    let (d, dkv) = (dm.d_model(), dm.d_kv());
    let size = state.len_values();
    for t in 0..len {
        for b in 0..batch {
            let (qa, ka) = ((b * len + t) * d, (b * len + t) * dkv);
            let mut out = vec![0.0; d];
            state.step(
                b,
                &q[qa..qa + d],
                &k[ka..ka + dkv],
                &v[ka..ka + dkv],
                &mut out,
            );
            for (a, w) in out.iter().zip(&full[qa..qa + d]) {
                assert!((a - w).abs() < 1e-12, "position {t} row {b}: {a} vs {w}");
            }
        }
        assert_eq!(state.len_values(), size, "the state does not grow");
    }
    let mut swapped = state.clone();
    swapped.gather_rows(&[2, 0]);
    assert_eq!(swapped.rows(), 2);
    let (qa, ka) = ((2 * len) * d, (2 * len) * dkv);
    let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
    swapped.step(
        0,
        &q[qa..qa + d],
        &k[ka..ka + dkv],
        &v[ka..ka + dkv],
        &mut a,
    );
    state.step(
        2,
        &q[qa..qa + d],
        &k[ka..ka + dkv],
        &v[ka..ka + dkv],
        &mut b,
    );
    assert_eq!(a, b);
}
