use super::*;
use crate::rng::Rng;

/// Grouped heads (4 value heads over 2 key heads), widths apart, a 4-tap convolution.
const SHAPE: DeltaShape = DeltaShape {
    key_heads: 2,
    value_heads: 4,
    d_key: 5,
    d_value: 3,
    conv_kernel: 4,
};

/// One sequence's inputs of the rule: `q`, `k` L2-normalised (`q` scaled), `v`, `g ≤ 0`,
/// `β ∈ (0, 1)`.
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
}

fn unit(x: &mut [f64], scale: f64) {
    let n = x.iter().map(|a| a * a).sum::<f64>().sqrt();
    x.iter_mut().for_each(|a| *a *= scale / n);
}

fn inputs(len: usize, rng: &mut Rng) -> Inputs {
    let sh = SHAPE;
    let mut draw = |n: usize| {
        (0..n)
            .map(|_| rng.uniform_range(-1.0, 1.0))
            .collect::<Vec<f64>>()
    };
    let (mut q, mut k) = (
        draw(len * sh.key_heads * sh.d_key),
        draw(len * sh.key_heads * sh.d_key),
    );
    for (qh, kh) in q.chunks_mut(sh.d_key).zip(k.chunks_mut(sh.d_key)) {
        unit(qh, 1.0 / (sh.d_key as f64).sqrt());
        unit(kh, 1.0);
    }
    let v = draw(len * sh.value_heads * sh.d_value);
    let g = draw(len * sh.value_heads)
        .iter()
        .map(|x| -0.6 * x.abs())
        .collect();
    let beta = draw(len * sh.value_heads)
        .iter()
        .map(|x| 0.5 + 0.45 * x)
        .collect();
    Inputs { q, k, v, g, beta }
}

/// The rule written out in float64 with one matrix per head, straight from its equations:
/// the outputs `[len, value_heads · d_v]` and the final states.
fn reference(x: &Inputs, len: usize) -> (Vec<f64>, Vec<Vec<Vec<f64>>>) {
    let sh = SHAPE;
    let (dk, dv, nv, nk) = (sh.d_key, sh.d_value, sh.value_heads, sh.key_heads);
    let mut s = vec![vec![vec![0.0; dv]; dk]; nv];
    let mut out = vec![0.0; len * nv * dv];
    for t in 0..len {
        for h in 0..nv {
            let kh = h / (nv / nk);
            let q = &x.q[(t * nk + kh) * dk..][..dk];
            let k = &x.k[(t * nk + kh) * dk..][..dk];
            let v = &x.v[(t * nv + h) * dv..][..dv];
            let (g, beta) = (x.g[t * nv + h], x.beta[t * nv + h]);
            let sh = &mut s[h];
            for row in sh.iter_mut() {
                row.iter_mut().for_each(|e| *e *= g.exp());
            }
            let predicted: Vec<f64> = (0..dv)
                .map(|j| (0..dk).map(|i| sh[i][j] * k[i]).sum())
                .collect();
            for i in 0..dk {
                for j in 0..dv {
                    sh[i][j] += k[i] * beta * (v[j] - predicted[j]);
                }
            }
            for j in 0..dv {
                out[(t * nv + h) * dv + j] = (0..dk).map(|i| sh[i][j] * q[i]).sum();
            }
        }
    }
    (out, s)
}

fn cast(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&a| a as f32).collect()
}

/// Runs the state's forms over `x`: position by position (`chunk` 0) or chunked, on row 1 of
/// a state of 2 rows (row 0 stays empty).
fn run<T: Float>(
    x: &Inputs,
    len: usize,
    chunk: usize,
    of: impl Fn(&[f64]) -> Vec<T>,
) -> (Vec<T>, DeltaState<T>) {
    let sh = SHAPE;
    let mut state = DeltaState::<T>::new(2, sh);
    let (q, k, v, g, beta) = (of(&x.q), of(&x.k), of(&x.v), of(&x.g), of(&x.beta));
    let (wk, wv, nv) = (
        sh.key_heads * sh.d_key,
        sh.value_heads * sh.d_value,
        sh.value_heads,
    );
    let mut out = vec![T::zero(); len * wv];
    if chunk == 0 {
        for t in 0..len {
            let qkv = (&q[t * wk..][..wk], &k[t * wk..][..wk], &v[t * wv..][..wv]);
            let gates = (&g[t * nv..][..nv], &beta[t * nv..][..nv]);
            state.step(1, qkv, gates, &mut out[t * wv..][..wv]);
        }
    } else {
        state.chunk(1, (&q, &k, &v), (&g, &beta), &mut out, chunk);
    }
    (out, state)
}

/// Both forms in float64 against the written-out rule (outputs and final states), chunks of
/// every size (one position, uneven, the whole sequence, longer than it).
#[test]
fn both_forms_equal_the_rule_in_float64() {
    let len = 11;
    let x = inputs(len, &mut Rng::new(7));
    let (want, want_s) = reference(&x, len);
    for chunk in [0, 1, 3, 4, 11, 64] {
        let (out, state) = run::<f64>(&x, len, chunk, |a| a.to_vec());
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "chunk {chunk}: {a} vs {b}");
        }
        for (h, s) in want_s.iter().enumerate() {
            let flat: Vec<f64> = s.iter().flatten().copied().collect();
            for (a, b) in state.head_state(1, h).iter().zip(&flat) {
                assert!((a - b).abs() < 1e-12, "chunk {chunk} state {h}: {a} vs {b}");
            }
            assert!(
                state.head_state(0, h).iter().all(|&a| a == 0.0),
                "row 0 untouched"
            );
        }
    }
    // Not a rule that passes by doing nothing: the outputs are of the values' size.
    assert!(want.iter().map(|a| a.abs()).fold(0.0, f64::max) > 0.1);
}

/// In float32 the chunked form agrees with the recurrent one to 1e-5, and continuing from a
/// chunked prefix by steps gives the steps' outputs.
#[test]
fn chunked_and_recurrent_agree_in_float32() {
    let len = 40;
    let x = inputs(len, &mut Rng::new(3));
    let (steps, s_steps) = run::<f32>(&x, len, 0, cast);
    let (chunked, s_chunked) = run::<f32>(&x, len, 16, cast);
    let d = steps
        .iter()
        .zip(&chunked)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(d < 1e-5, "outputs differ by {d:e}");
    for h in 0..SHAPE.value_heads {
        let (a, b) = (s_steps.head_state(1, h), s_chunked.head_state(1, h));
        let d = a
            .iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-5, "state {h} differs by {d:e}");
    }
}

/// The convolution against its definition in float64: `silu(Σ_j w_j x_{t−K+1+j})`, zeros
/// before the first position; rows are independent; gathering and copying rows carries
/// windows and states.
#[test]
fn convolution_window_and_rows() {
    let sh = SHAPE;
    let (c_dim, kk) = (sh.conv_dim(), sh.conv_kernel);
    let mut rng = Rng::new(5);
    let w: Vec<f64> = (0..c_dim * kk)
        .map(|_| rng.uniform_range(-1.0, 1.0))
        .collect();
    let xs: Vec<Vec<f64>> = (0..6)
        .map(|_| (0..c_dim).map(|_| rng.uniform_range(-2.0, 2.0)).collect())
        .collect();
    let mut state = DeltaState::<f64>::new(2, sh);
    let mut y = vec![0.0; c_dim];
    for (t, x) in xs.iter().enumerate() {
        state.convolve(0, &w, x, &mut y);
        for c in 0..c_dim {
            let z: f64 = (0..kk)
                .filter(|&j| t + j + 1 >= kk)
                .map(|j| w[c * kk + j] * xs[t + j + 1 - kk][c])
                .sum();
            let want = z / (1.0 + (-z).exp());
            assert!(
                (y[c] - want).abs() < 1e-12,
                "t {t} c {c}: {} vs {want}",
                y[c]
            );
        }
    }
    // Row 1 never fed: its first output sees zeros before it.
    let mut fresh = vec![0.0; c_dim];
    state.convolve(1, &w, &xs[0], &mut fresh);
    let mut alone = DeltaState::<f64>::new(1, sh);
    let mut want = vec![0.0; c_dim];
    alone.convolve(0, &w, &xs[0], &mut want);
    assert_eq!(fresh, want);
    // Rows gathered (swapped, one repeated) and copied keep their windows.
    let mut next = (vec![0.0; c_dim], vec![0.0; c_dim]);
    let mut copy = state.clone();
    copy.gather_rows(&[1, 0, 0]);
    assert_eq!(copy.rows(), 3);
    state.convolve(0, &w, &xs[1], &mut next.0);
    copy.convolve(2, &w, &xs[1], &mut next.1);
    assert_eq!(next.0, next.1);
    let mut added = state.empty_like(1);
    assert_eq!(added.add_row(), 1);
    added.copy_row(1, &state, 0);
    assert_eq!(
        added.len_values(),
        2 * (3 * c_dim + sh.value_heads * sh.d_key * sh.d_value)
    );
}
