//! RoPE conventions and bases (`kernels::rope::Rope`): each pairing against an f64 loop of its
//! own formula — for the half split literally Hugging Face's `q·cos + rotate_half(q)·sin` with
//! its `cos`/`sin` tables — relative-position invariance, the backward (the inverse rotation)
//! against central finite differences, and the two pairings related by a column permutation.
//! The default (interleaved, base 10000) is also checked in tests/positions.rs.

use crate::common;

use common::*;
use transformer::kernels::rope::{rope_backward, rope_forward, Rope, RopeStyle};
use transformer::rng::Rng;

const BATCH: usize = 2;

fn ropes() -> [Rope; 4] {
    [
        Rope::default(),
        Rope {
            base: 500000.0,
            style: RopeStyle::Interleaved,
            attention_factor: 1.0,
        },
        Rope::half_split(10000.0),
        Rope::half_split(100000.0),
    ]
}

/// Sizes of a rotation: rows `[batch * seq_len, heads * d_head]`, row `r` at `pos0 + r % seq_len`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    heads: usize,
    d_head: usize,
    seq_len: usize,
    pos0: usize,
}

impl Shape {
    fn len(&self) -> usize {
        BATCH * self.seq_len * self.heads * self.d_head
    }
    fn forward<T: transformer::Float>(&self, x: &mut [T], rope: Rope) {
        rope_forward(x, rope, self.seq_len, self.heads, self.d_head, self.pos0);
    }
    fn backward<T: transformer::Float>(&self, x: &mut [T], rope: Rope) {
        rope_backward(x, rope, self.seq_len, self.heads, self.d_head, self.pos0);
    }
}

const SHAPES: [Shape; 4] = [
    Shape {
        heads: 2,
        d_head: 8,
        seq_len: 5,
        pos0: 0,
    },
    Shape {
        heads: 3,
        d_head: 6,
        seq_len: 3,
        pos0: 7,
    },
    Shape {
        heads: 1,
        d_head: 64,
        seq_len: 4,
        pos0: 3000,
    },
    Shape {
        heads: 2,
        d_head: 2,
        seq_len: 2,
        pos0: 1,
    },
];

/// RoFormer's pairs `(2i, 2i+1)` rotated by `pos / base^(2i/d_head)`.
fn naive_interleaved(x: &[f64], base: f64, s: Shape) -> Vec<f64> {
    let mut y = x.to_vec();
    let d = s.heads * s.d_head;
    for (r, (out, row)) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
        let pos = (s.pos0 + r % s.seq_len) as f64;
        for (o, h) in out
            .chunks_exact_mut(s.d_head)
            .zip(row.chunks_exact(s.d_head))
        {
            for i in 0..s.d_head / 2 {
                let angle = pos / base.powf((2 * i) as f64 / s.d_head as f64);
                let (a, b) = (h[2 * i], h[2 * i + 1]);
                o[2 * i] = a * angle.cos() - b * angle.sin();
                o[2 * i + 1] = a * angle.sin() + b * angle.cos();
            }
        }
    }
    y
}

/// Hugging Face's tables for one position: `inv_freq = 1 / base^(arange(0, d, 2) / d)`,
/// `emb = cat(pos · inv_freq, pos · inv_freq)`, returned as `(emb.cos(), emb.sin())`.
fn hf_cos_sin(base: f64, d_head: usize, pos: usize) -> (Vec<f64>, Vec<f64>) {
    let inv_freq: Vec<f64> = (0..d_head)
        .step_by(2)
        .map(|j| 1.0 / base.powf(j as f64 / d_head as f64))
        .collect();
    let freqs: Vec<f64> = inv_freq.iter().map(|f| pos as f64 * f).collect();
    let emb: Vec<f64> = freqs.iter().chain(&freqs).copied().collect();
    (
        emb.iter().map(|a| a.cos()).collect(),
        emb.iter().map(|a| a.sin()).collect(),
    )
}

/// `cat(−x[d/2..], x[..d/2])`.
fn rotate_half(x: &[f64]) -> Vec<f64> {
    let (x1, x2) = x.split_at(x.len() / 2);
    x2.iter().map(|v| -v).chain(x1.iter().copied()).collect()
}

/// `q · cos + rotate_half(q) · sin` per head.
fn naive_half_split(x: &[f64], base: f64, s: Shape) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    let d = s.heads * s.d_head;
    for (r, row) in x.chunks_exact(d).enumerate() {
        let (cos, sin) = hf_cos_sin(base, s.d_head, s.pos0 + r % s.seq_len);
        for q in row.chunks_exact(s.d_head) {
            let rot = rotate_half(q);
            y.extend((0..s.d_head).map(|c| q[c] * cos[c] + rot[c] * sin[c]));
        }
    }
    y
}

fn naive(x: &[f64], rope: Rope, s: Shape) -> Vec<f64> {
    match rope.style {
        RopeStyle::Interleaved => naive_interleaved(x, rope.base, s),
        RopeStyle::HalfSplit => naive_half_split(x, rope.base, s),
    }
}

#[test]
fn the_default_is_interleaved_with_base_10000() {
    assert_eq!(
        Rope::default(),
        Rope {
            base: 10000.0,
            style: RopeStyle::Interleaved,
            attention_factor: 1.0,
        }
    );
}

#[test]
fn each_style_and_base_matches_its_formula() {
    let mut rng = Rng::new(1);
    let (mut worst64, mut worst32) = (0.0f64, 0.0f64);
    for rope in ropes() {
        for s in SHAPES {
            let x: Vec<f64> = randn(&mut rng, s.len(), 1.0);
            let want = naive(&x, rope, s);
            let mut y = x.clone();
            s.forward(&mut y, rope);
            let err = max_abs_diff(&y, &want);
            worst64 = worst64.max(err);
            assert!(err < 1e-11, "{rope:?} {s:?}: f64 {err:e}");
            let mut y32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            s.forward(&mut y32, rope);
            worst32 = worst32.max(assert_close("rope f32", &y32, &want, 1e-5, 1e-5));
            // rotations keep norms
            let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
            assert!((norm(&y) - norm(&x)).abs() < 1e-10);
        }
    }
    eprintln!("rope styles: max |diff| f64 {worst64:e}; f32 worst diff/allowance {worst32:.3}");
}

#[test]
fn the_base_and_the_pairing_matter() {
    let s = SHAPES[0];
    let x: Vec<f64> = randn(&mut Rng::new(2), s.len(), 1.0);
    let outs: Vec<Vec<f64>> = ropes()
        .iter()
        .map(|&rope| {
            let mut y = x.clone();
            s.forward(&mut y, rope);
            y
        })
        .collect();
    for i in 0..outs.len() {
        for j in 0..i {
            assert!(max_abs_diff(&outs[i], &outs[j]) > 1e-3, "ropes {i} and {j}");
        }
    }
}

/// Scores `q_i · k_j` per head of rotated rows.
fn head_scores(q: &[f64], k: &[f64], heads: usize, d_head: usize) -> Vec<f64> {
    let d = heads * d_head;
    let mut out = Vec::new();
    for h in 0..heads {
        for qi in q.chunks_exact(d) {
            for kj in k.chunks_exact(d) {
                let span = h * d_head..(h + 1) * d_head;
                out.push(dot(&qi[span.clone()], &kj[span]));
            }
        }
    }
    out
}

#[test]
fn scores_depend_only_on_relative_position() {
    let mut rng = Rng::new(3);
    let (heads, d_head, len) = (2, 8, 5);
    let q: Vec<f64> = randn(&mut rng, len * heads * d_head, 1.0);
    let k: Vec<f64> = randn(&mut rng, len * heads * d_head, 1.0);
    for rope in ropes() {
        let scores = |q_pos: usize, k_pos: usize| {
            let (mut qr, mut kr) = (q.clone(), k.clone());
            rope_forward(&mut qr, rope, len, heads, d_head, q_pos);
            rope_forward(&mut kr, rope, len, heads, d_head, k_pos);
            head_scores(&qr, &kr, heads, d_head)
        };
        let at0 = scores(0, 0);
        for shift in [1, 9, 500] {
            let err = max_abs_diff(&at0, &scores(shift, shift));
            assert!(err < 1e-10, "{rope:?} shift {shift}: {err:e}");
        }
        assert!(max_abs_diff(&scores(3, 1), &scores(12, 10)) < 1e-10);
        assert!(
            max_abs_diff(&scores(3, 1), &at0) > 1e-2,
            "{rope:?}: rotation had no effect"
        );
    }
}

#[test]
fn backward_is_the_gradient_and_the_inverse() {
    let mut rng = Rng::new(4);
    for rope in ropes() {
        let mut gc = GradCheck::new(format!("rope {rope:?}"));
        for s in SHAPES {
            let x: Vec<f64> = randn(&mut rng, s.len(), 1.0);
            let r: Vec<f64> = randn(&mut rng, x.len(), 1.0);
            let mut dx = r.clone();
            s.backward(&mut dx, rope);
            gc.wrt_input("x", &x, &dx, |x| {
                let mut y = x.to_vec();
                s.forward(&mut y, rope);
                dot(&y, &r)
            });
            // and backward undoes forward
            let mut y = x.clone();
            s.forward(&mut y, rope);
            s.backward(&mut y, rope);
            assert!(max_abs_diff(&y, &x) < 1e-13, "{rope:?} {s:?}");
        }
        gc.report();
    }
}

/// Half-split column `i < d_head/2` ↔ interleaved column `2i`, half-split `i + d_head/2` ↔
/// interleaved `2i + 1`: `to_interleaved[c]` is the interleaved column of half-split column `c`.
fn to_interleaved(d_head: usize) -> Vec<usize> {
    let half = d_head / 2;
    (0..d_head)
        .map(|c| if c < half { 2 * c } else { 2 * (c - half) + 1 })
        .collect()
}

/// Moves each head's columns: `out[perm[c]] = x[c]` (inverse: `out[c] = x[perm[c]]`).
fn permute<T: Copy>(x: &[T], d_head: usize, perm: &[usize], inverse: bool) -> Vec<T> {
    let mut out = x.to_vec();
    for (o, h) in out.chunks_exact_mut(d_head).zip(x.chunks_exact(d_head)) {
        for (c, &p) in perm.iter().enumerate() {
            if inverse {
                o[c] = h[p];
            } else {
                o[p] = h[c];
            }
        }
    }
    out
}

#[test]
fn the_two_pairings_differ_by_a_column_permutation() {
    // half_split(x) = P⁻¹ interleaved(P x), to the bit (the same products and tables), in both
    // precisions, forward and backward.
    let mut rng = Rng::new(5);
    for s in SHAPES {
        let perm = to_interleaved(s.d_head);
        let x: Vec<f64> = randn(&mut rng, s.len(), 1.0);
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        for base in [10000.0, 100000.0] {
            let (half, inter) = (
                Rope::half_split(base),
                Rope {
                    base,
                    style: RopeStyle::Interleaved,
                    attention_factor: 1.0,
                },
            );
            let mut want = x.clone();
            s.forward(&mut want, half);
            let mut got = permute(&x, s.d_head, &perm, false);
            s.forward(&mut got, inter);
            assert_eq!(permute(&got, s.d_head, &perm, true), want, "{s:?} {base}");
            let mut want32 = x32.clone();
            s.backward(&mut want32, half);
            let mut got32 = permute(&x32, s.d_head, &perm, false);
            s.backward(&mut got32, inter);
            assert_eq!(
                permute(&got32, s.d_head, &perm, true),
                want32,
                "{s:?} {base}"
            );
        }
    }
}

#[test]
fn keys_with_fewer_heads_rotate_like_the_first_heads_of_the_queries() {
    // Grouped-query attention rotates keys of `kv_heads` heads: each head is rotated on its own,
    // so a [rows, 2 heads] buffer matches the first two heads of a [rows, 4 heads] one.
    let (d_head, seq_len, pos0) = (8, 3, 11);
    let rope = Rope::half_split(100000.0);
    let mut q: Vec<f64> = randn(&mut Rng::new(6), BATCH * seq_len * 4 * d_head, 1.0);
    let mut k: Vec<f64> = q
        .chunks_exact(4 * d_head)
        .flat_map(|row| row[..2 * d_head].to_vec())
        .collect();
    rope_forward(&mut q, rope, seq_len, 4, d_head, pos0);
    rope_forward(&mut k, rope, seq_len, 2, d_head, pos0);
    for (qr, kr) in q.chunks_exact(4 * d_head).zip(k.chunks_exact(2 * d_head)) {
        assert_eq!(&qr[..2 * d_head], kr);
    }
}
