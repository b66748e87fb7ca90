//! A Llama-style decoder layer's decode step, fused (8 dispatches, one submission) against
//! the unfused sequence of kernels.

use crate::activations::{glu, Activation, GluInput};
use crate::device::Gpu;
use crate::kv_cache::{kv_write, BlockTable, PagedCache};
use crate::norms::{add_norm, Norm};
use crate::paged_attention::{paged_attention, paged_attention_passes, DecodeScratch, Scores};
use crate::products::reference::random_weight;
use crate::products::{
    glu_product, stacked_product, weight_product, GpuWeight, StackedWeight, WeightFormat,
};
use crate::rope::{rope, rope_kv_write, RopeFreqs, RopeLayout};
use crate::testing::{gpu, rand_vec};

struct Shape {
    d_model: usize,
    n_heads: usize,
    n_kv: usize,
    d: usize,
    d_ff: usize,
    /// Formats of Q, K, V, O, gate/up, down.
    formats: [WeightFormat; 6],
}

/// The layer's outputs: the residual `h` after the attention's add, the feed-forward output,
/// the k and v caches.
type Outputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn layer(s: &Shape, fused: bool, gpu: &Gpu) -> (Outputs, u64, u64) {
    let (dm, nh, nkv, d, dff) = (s.d_model, s.n_heads, s.n_kv, s.d, s.d_ff);
    let [fq, fk, fv, fo, fgu, fdown] = s.formats;
    let (bs, max_blocks) = (8usize, 3usize);
    let past = [5u32, 20];
    let seqs = past.len();
    let table: Vec<u32> = vec![3, 0, 5, 1, 4, 2];
    let row = nkv * d;
    let cache_len = 6 * bs * row;
    let w =
        |f: WeightFormat, d_in: usize, d_out: usize, seed: u64| random_weight(f, d_in, d_out, seed);
    let (wq, wk, wv) = (
        w(fq, dm, nh * d, 1),
        w(fk, dm, nkv * d, 2),
        w(fv, dm, nkv * d, 3),
    );
    let wo = w(fo, nh * d, dm, 4);
    let (wg, wu) = (w(fgu, dm, dff, 5), w(fgu, dm, dff, 6));
    let wd = w(fdown, dff, dm, 7);
    let up = |x: &[f32]| gpu.upload(x).unwrap();
    let (kc, vc) = (up(&rand_vec(cache_len, 10)), up(&rand_vec(cache_len, 11)));
    let h = up(&rand_vec(seqs * dm, 12));
    let x = up(&rand_vec(seqs * dm, 13));
    let (n1, n2) = (
        up(&rand_vec(dm, 14)
            .iter()
            .map(|v| 1.0 + v / 4.0)
            .collect::<Vec<_>>()),
        up(&rand_vec(dm, 15)
            .iter()
            .map(|v| 1.0 + v / 4.0)
            .collect::<Vec<_>>()),
    );
    let (dt, pos, seq, ctx) = (
        gpu.upload(&table).unwrap(),
        gpu.upload(&past).unwrap(),
        gpu.upload(&[0u32, 1]).unwrap(),
        gpu.upload(&[past[0] + 1, past[1] + 1]).unwrap(),
    );
    let freqs = RopeFreqs::standard(gpu, 10_000.0, d).unwrap();
    // One partition covers every context (max_blocks · bs = 24 keys).
    let scratch = DecodeScratch::new(gpu, seqs, nh, d, max_blocks * bs, max_blocks * bs).unwrap();
    let cache = PagedCache {
        k: &kc,
        v: &vc,
        block_size: bs,
        n_kv_heads: nkv,
        d_head: d,
    };
    let bt = BlockTable {
        ids: &dt,
        max_blocks,
    };
    let rms = |weight| Norm::Rms {
        weight,
        eps: 1e-5,
        offset: 0.0,
    };
    let scale = 1.0 / (d as f32).sqrt();
    let z = |n: usize| gpu.zeros::<f32>(n).unwrap();
    let (xn, q, attn, attn_out, xn2, ff, out) = (
        z(seqs * dm),
        z(seqs * nh * d),
        z(seqs * nh * d),
        z(seqs * dm),
        z(seqs * dm),
        z(seqs * dff),
        z(seqs * dm),
    );
    let layout = RopeLayout::HalfSplit;
    let wo = GpuWeight::upload(gpu, fo, nh * d, dm, &wo).unwrap();
    let wd = GpuWeight::upload(gpu, fdown, dff, dm, &wd).unwrap();
    let before;
    if fused {
        let qkv_w = StackedWeight::upload(
            gpu,
            dm,
            &[(fq, nh * d, &wq), (fk, nkv * d, &wk), (fv, nkv * d, &wv)],
        )
        .unwrap();
        let gate_up = GpuWeight::concat_rows(gpu, fgu, dm, &[&wg, &wu]).unwrap();
        let qkv = z(seqs * (nh + 2 * nkv) * d);
        before = gpu.counters().get();
        add_norm(gpu, &rms(&n1), &h, &x, &xn).unwrap();
        stacked_product(gpu, &qkv, &xn, seqs, &qkv_w).unwrap();
        rope_kv_write(gpu, &qkv, &q, &seq, &pos, &freqs, nh, layout, cache, bt).unwrap();
        paged_attention(gpu, &q, cache, bt, &ctx, &attn, nh, scale, &scratch).unwrap();
        weight_product(gpu, &attn_out, &attn, seqs, &wo).unwrap();
        add_norm(gpu, &rms(&n2), &h, &attn_out, &xn2).unwrap();
        glu_product(gpu, Activation::Silu, &ff, &xn2, seqs, &gate_up).unwrap();
        weight_product(gpu, &out, &ff, seqs, &wd).unwrap();
    } else {
        let ws: Vec<GpuWeight> = [(fq, nh * d, &wq), (fk, nkv * d, &wk), (fv, nkv * d, &wv)]
            .into_iter()
            .map(|(f, n, b)| GpuWeight::upload(gpu, f, dm, n, b).unwrap())
            .collect();
        let (g, u) = (
            GpuWeight::upload(gpu, fgu, dm, dff, &wg).unwrap(),
            GpuWeight::upload(gpu, fgu, dm, dff, &wu).unwrap(),
        );
        let (kn, vn, gate, upv) = (z(seqs * row), z(seqs * row), z(seqs * dff), z(seqs * dff));
        before = gpu.counters().get();
        add_norm(gpu, &rms(&n1), &h, &x, &xn).unwrap();
        weight_product(gpu, &q, &xn, seqs, &ws[0]).unwrap();
        weight_product(gpu, &kn, &xn, seqs, &ws[1]).unwrap();
        weight_product(gpu, &vn, &xn, seqs, &ws[2]).unwrap();
        rope(gpu, &q, &pos, &freqs, nh, d, layout).unwrap();
        rope(gpu, &kn, &pos, &freqs, nkv, d, layout).unwrap();
        kv_write(gpu, cache, bt, &kn, &vn, &seq, &pos).unwrap();
        paged_attention_passes(
            gpu,
            &q,
            cache,
            bt,
            &ctx,
            &attn,
            nh,
            Scores {
                scale,
                window: None,
                softcap: None,
            },
            &scratch,
            false,
        )
        .unwrap();
        weight_product(gpu, &attn_out, &attn, seqs, &wo).unwrap();
        add_norm(gpu, &rms(&n2), &h, &attn_out, &xn2).unwrap();
        weight_product(gpu, &gate, &xn2, seqs, &g).unwrap();
        weight_product(gpu, &upv, &xn2, seqs, &u).unwrap();
        let gi = GluInput::Split {
            gate: &gate,
            up: &upv,
        };
        glu(gpu, Activation::Silu, gi, &ff, dff).unwrap();
        weight_product(gpu, &out, &ff, seqs, &wd).unwrap();
    }
    let got_out = gpu.read(&out).unwrap();
    let after = gpu.counters().get();
    let outputs = (
        gpu.read(&h).unwrap(),
        got_out,
        gpu.read(&kc).unwrap(),
        gpu.read(&vc).unwrap(),
    );
    (
        outputs,
        after.dispatches - before.dispatches,
        after.submissions - before.submissions,
    )
}

fn same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs() + 1e-6,
            "{what}: at {i} fused {g}, unfused {w}"
        );
    }
}

#[test]
fn a_decoder_layer_decode_step_in_8_dispatches_and_one_submission() {
    use WeightFormat::*;
    if gpu().is_none() {
        return;
    }
    // Its own device: the counters of the shared one move with the other tests.
    let gpu = &Gpu::open(None).unwrap();
    let cases = [
        // Q4_K, d_model 256, GQA 4:2 of 64.
        (
            Shape {
                d_model: 256,
                n_heads: 4,
                n_kv: 2,
                d: 64,
                d_ff: 512,
                formats: [Q4K, Q4K, Q4K, Q4K, Q4K, Q6K],
            },
            8,
        ),
        // Odd shapes: 3 heads on one kv head of 32, d_ff 160.
        (
            Shape {
                d_model: 96,
                n_heads: 3,
                n_kv: 1,
                d: 32,
                d_ff: 160,
                formats: [Q8_0, Q8_0, Q8_0, Q4_0, Q5_1, F16],
            },
            8,
        ),
        // Q4_K_M's mix: V in Q6_K, so Q‖K and V are two dispatches.
        (
            Shape {
                d_model: 256,
                n_heads: 4,
                n_kv: 2,
                d: 64,
                d_ff: 256,
                formats: [Q4K, Q4K, Q6K, Q4K, Q4K, Q6K],
            },
            9,
        ),
    ];
    for (shape, want_dispatches) in cases {
        let what = format!("{:?}", shape.formats);
        let (fused, dispatches, submissions) = layer(&shape, true, gpu);
        let (unfused, unfused_dispatches, _) = layer(&shape, false, gpu);
        assert_eq!((dispatches, submissions), (want_dispatches, 1), "{what}");
        assert_eq!(unfused_dispatches, 15, "{what}");
        same(&fused.0, &unfused.0, &format!("residual, {what}"));
        same(&fused.1, &unfused.1, &format!("output, {what}"));
        same(&fused.2, &unfused.2, &format!("k cache, {what}"));
        same(&fused.3, &unfused.3, &format!("v cache, {what}"));
    }
}
