//! Each GPU operation (the `gpu/` crate) against the CPU kernel the model calls for it today, on
//! the same inputs: RMSNorm, LayerNorm, RoPE (both layouts), SwiGLU, GELU (tanh and erf),
//! log-softmax, greedy argmax and causal grouped-query attention (FlashAttention on the GPU,
//! the plain kernel on the CPU), on shapes that are not multiples of a workgroup. The GPU's own
//! tests check each kernel against float64 loops; these check that both backends compute the
//! same function (within float32 rounding).

#![cfg(feature = "gpu")]

use crate::common::randn;
use transformer::kernels::activations::{gelu_erf_forward, gelu_tanh_forward, swiglu_forward};
use transformer::kernels::attention::{AttnDims, AttnMask};
use transformer::kernels::layer_norm::layer_norm_forward;
use transformer::kernels::plain_attention::attention_forward;
use transformer::kernels::rms_norm::rms_norm_forward;
use transformer::kernels::rope::{rope_forward, Rope, RopeStyle};
use transformer::kernels::softmax::log_softmax_inplace;
use transformer::rng::Rng;
use transformer_gpu::activations::{activate, glu, Activation, GluInput};
use transformer_gpu::flash_attention::{self as fa, flash_attention, AttnShape};
use transformer_gpu::norms::{norm, Norm};
use transformer_gpu::rope::{rope, RopeFreqs, RopeLayout};
use transformer_gpu::softmax::{argmax, log_softmax};
use transformer_gpu::{Gpu, GpuBuffer};

fn gpu() -> Option<&'static Gpu> {
    crate::gpu_products::gpu()
}

fn up(gpu: &Gpu, x: &[f32]) -> GpuBuffer<f32> {
    gpu.upload(x).unwrap()
}

/// `|a − b| ≤ tol · (|b| + floor)` everywhere.
fn close(a: &[f32], b: &[f32], tol: f32, floor: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (y.abs() + floor),
            "{what} [{i}]: gpu {x} cpu {y}"
        );
    }
}

#[test]
fn norms_agree() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(1);
    for (rows, d) in [(1, 1), (3, 7), (5, 576), (2, 2049)] {
        let x: Vec<f32> = randn(&mut rng, rows * d, 2.0);
        let g: Vec<f32> = randn(&mut rng, d, 1.0);
        let b: Vec<f32> = randn(&mut rng, d, 1.0);
        let mut want = vec![0f32; x.len()];
        rms_norm_forward(&mut want, &x, &g, d, 1e-6);
        let (dx, dy, dg, db) = (up(gpu, &x), up(gpu, &x), up(gpu, &g), up(gpu, &b));
        norm(
            gpu,
            &Norm::Rms {
                weight: &dg,
                eps: 1e-6,
                offset: 0.0,
            },
            &dx,
            &dy,
        )
        .unwrap();
        close(
            &gpu.read(&dy).unwrap(),
            &want,
            1e-5,
            1e-3,
            &format!("rms {rows}x{d}"),
        );
        layer_norm_forward(&mut want, &x, &g, &b, d, 1e-5);
        norm(
            gpu,
            &Norm::Layer {
                gain: &dg,
                bias: Some(&db),
                eps: 1e-5,
            },
            &dx,
            &dy,
        )
        .unwrap();
        close(
            &gpu.read(&dy).unwrap(),
            &want,
            1e-4,
            1e-2,
            &format!("layer {rows}x{d}"),
        );
    }
}

#[test]
fn rope_agrees_in_both_layouts() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(2);
    for (style, layout) in [
        (RopeStyle::HalfSplit, RopeLayout::HalfSplit),
        (RopeStyle::Interleaved, RopeLayout::Interleaved),
    ] {
        for (seq, heads, d_head, offset) in [(1, 1, 2, 0), (7, 3, 64, 5), (3, 2, 128, 40_000)] {
            let x: Vec<f32> = randn(&mut rng, seq * heads * d_head, 1.0);
            let base = 10_000.0;
            let mut want = x.clone();
            let r = Rope {
                base,
                style,
                attention_factor: 1.0,
            };
            rope_forward(&mut want, r, seq, heads, d_head, offset);
            let dx = up(gpu, &x);
            let pos: Vec<u32> = (0..seq).map(|i| (offset + i) as u32).collect();
            let freqs = RopeFreqs::standard(gpu, base, d_head).unwrap();
            rope(
                gpu,
                &dx,
                &gpu.upload(&pos).unwrap(),
                &freqs,
                heads,
                d_head,
                layout,
            )
            .unwrap();
            // Angles of p·θ at large p: both round p·θ in their own way (the GPU reduces it
            // exactly, the CPU in f32/f64); 1e-4 absolute on values of order 1.
            let got = gpu.read(&dx).unwrap();
            let what = format!("{style:?} seq {seq} heads {heads} d {d_head} at {offset}");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{what} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn activations_agree() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(3);
    for n in [1usize, 37, 1536 * 3 + 1] {
        let gate: Vec<f32> = randn(&mut rng, n, 3.0);
        let upv: Vec<f32> = randn(&mut rng, n, 3.0);
        let mut want = vec![0f32; n];
        swiglu_forward(&mut want, &gate, &upv);
        let dy = gpu.zeros::<f32>(n).unwrap();
        let (dg, du) = (up(gpu, &gate), up(gpu, &upv));
        glu(
            gpu,
            Activation::Silu,
            GluInput::Split { gate: &dg, up: &du },
            &dy,
            n,
        )
        .unwrap();
        close(
            &gpu.read(&dy).unwrap(),
            &want,
            1e-5,
            1e-4,
            &format!("swiglu {n}"),
        );
        for (act, cpu) in [
            (
                Activation::GeluTanh,
                gelu_tanh_forward::<f32> as fn(&mut [f32], &[f32]),
            ),
            (Activation::GeluErf, gelu_erf_forward::<f32>),
        ] {
            cpu(&mut want, &gate);
            let dx = up(gpu, &gate);
            activate(gpu, &dx, act).unwrap();
            close(
                &gpu.read(&dx).unwrap(),
                &want,
                1e-5,
                1e-4,
                &format!("{act:?} {n}"),
            );
        }
    }
}

#[test]
fn log_softmax_and_argmax_agree() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(4);
    for (rows, n) in [(1, 1), (3, 49_152), (2, 5000)] {
        let x: Vec<f32> = randn(&mut rng, rows * n, 4.0);
        let mut want = x.clone();
        for row in want.chunks_mut(n) {
            log_softmax_inplace(row);
        }
        let (dx, dy) = (up(gpu, &x), gpu.zeros::<f32>(rows * n).unwrap());
        log_softmax(gpu, &dx, &dy, n).unwrap();
        close(
            &gpu.read(&dy).unwrap(),
            &want,
            1e-5,
            1.0,
            &format!("log_softmax {rows}x{n}"),
        );
        let ids = gpu.zeros::<u32>(rows).unwrap();
        argmax(gpu, &dx, &ids, n).unwrap();
        let want_ids: Vec<u32> = x
            .chunks(n)
            .map(transformer::decode::sample::argmax)
            .collect();
        assert_eq!(gpu.read(&ids).unwrap(), want_ids, "argmax {rows}x{n}");
    }
}

#[test]
fn causal_grouped_query_attention_agrees() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng::new(5);
    // (q_len, past, heads, kv_heads, d_head)
    for (q_len, past, heads, kv_heads, d_head) in [
        (1, 0, 1, 1, 1),
        (5, 0, 4, 2, 64),
        (3, 30, 6, 2, 48),
        (33, 0, 9, 3, 64),
    ] {
        let k_len = past + q_len;
        let q: Vec<f32> = randn(&mut rng, q_len * heads * d_head, 1.0);
        let k: Vec<f32> = randn(&mut rng, k_len * kv_heads * d_head, 1.0);
        let v: Vec<f32> = randn(&mut rng, k_len * kv_heads * d_head, 1.0);
        let dims = AttnDims {
            batch: 1,
            heads,
            kv_heads,
            d_head,
            q_len,
            k_len,
            kv_stride: k_len,
            scores: Default::default(),
        };
        let key_lens = [k_len];
        let mask = AttnMask {
            key_lens: &key_lens,
            causal: true,
            q_offset: past,
        };
        let mut want = vec![0f32; q.len()];
        let mut probs = vec![0f32; heads * q_len * k_len];
        attention_forward(&mut want, &mut probs, &q, &k, &v, dims, mask, None);
        let o = gpu.zeros::<f32>(q.len()).unwrap();
        let shape = AttnShape {
            q_len,
            kv_len: k_len,
            n_heads: heads,
            n_kv_heads: kv_heads,
            d_head,
        };
        let gmask = fa::AttnMask {
            scale: 1.0 / (d_head as f32).sqrt(),
            causal: true,
            past,
            window: None,
        };
        flash_attention(
            gpu,
            &up(gpu, &q),
            &up(gpu, &k),
            &up(gpu, &v),
            &o,
            shape,
            gmask,
        )
        .unwrap();
        let what = format!("q {q_len} past {past} heads {heads}/{kv_heads} d {d_head}");
        close(&gpu.read(&o).unwrap(), &want, 1e-4, 1e-2, &what);
    }
}
