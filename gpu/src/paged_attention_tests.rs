//! Paged decode attention against float64 attention: contexts around and across blocks,
//! shuffled block pools, partitions, head tiles, windows and soft caps, one submission.

use super::*;
use crate::flash_attention::{attention_ref, attention_ref_capped, AttnMask, AttnShape};
use crate::testing::{assert_close, gpu, rand_vec};

/// Block ids 0..n in a seeded shuffled order.
fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n as u32).collect();
    let r = rand_vec(n, seed);
    for i in (1..n).rev() {
        let j = (((r[i] + 1.0) / 2.0) * (i + 1) as f32) as usize;
        ids.swap(i, j.min(i));
    }
    ids
}

struct Case {
    ctx: Vec<usize>,
    n_heads: usize,
    n_kv: usize,
    d: usize,
    bs: usize,
    partition: usize,
    /// Fill the cache with [`kv_write`], recorded with the attention in one submission,
    /// rather than uploading it built on the host.
    via_kv_write: bool,
    /// A sliding window and a soft cap of the scores.
    window: Option<usize>,
    softcap: Option<f32>,
}

/// Builds the paged cache from contiguous per-sequence keys and values, runs the kernels
/// and compares each sequence with float64 attention over its keys.
fn run(c: Case, seed: u64) {
    let gpu = gpu().unwrap();
    let seqs = c.ctx.len();
    let max_blocks = c.ctx.iter().map(|n| n.div_ceil(c.bs)).max().unwrap();
    let used: usize = c.ctx.iter().map(|n| n.div_ceil(c.bs)).sum();
    let num_blocks = used + 3;
    let pool = shuffled(num_blocks, seed);
    let row = c.n_kv * c.d;
    let mut k_cache = vec![0.0f32; num_blocks * c.bs * row];
    let mut v_cache = k_cache.clone();
    let mut table = vec![0u32; seqs * max_blocks];
    let mut next = 0;
    let mut per_seq = Vec::new();
    for (s, &n) in c.ctx.iter().enumerate() {
        for b in 0..n.div_ceil(c.bs) {
            table[s * max_blocks + b] = pool[next];
            next += 1;
        }
        let k = rand_vec(n * row, seed + 10 + s as u64);
        let v = rand_vec(n * row, seed + 50 + s as u64);
        for j in 0..n {
            let slot = table[s * max_blocks + j / c.bs] as usize * c.bs + j % c.bs;
            k_cache[slot * row..][..row].copy_from_slice(&k[j * row..][..row]);
            v_cache[slot * row..][..row].copy_from_slice(&v[j * row..][..row]);
        }
        per_seq.push((k, v));
    }
    let q: Vec<f32> = rand_vec(seqs * c.n_heads * c.d, seed + 99)
        .iter()
        .map(|x| x * 2.0)
        .collect();
    let ctx: Vec<u32> = c.ctx.iter().map(|&n| n as u32).collect();
    let (dk, dv) = if c.via_kv_write {
        let n = k_cache.len();
        (gpu.zeros(n).unwrap(), gpu.zeros(n).unwrap())
    } else {
        (gpu.upload(&k_cache).unwrap(), gpu.upload(&v_cache).unwrap())
    };
    let (dt, dctx, dq) = (
        gpu.upload(&table).unwrap(),
        gpu.upload(&ctx).unwrap(),
        gpu.upload(&q).unwrap(),
    );
    let o = gpu.zeros::<f32>(q.len()).unwrap();
    let cache = PagedCache {
        k: &dk,
        v: &dv,
        block_size: c.bs,
        n_kv_heads: c.n_kv,
        d_head: c.d,
    };
    let bt = BlockTable {
        ids: &dt,
        max_blocks,
    };
    if c.via_kv_write {
        let (mut seq_of, mut pos_of) = (Vec::new(), Vec::new());
        for (s, &n) in c.ctx.iter().enumerate() {
            seq_of.extend(std::iter::repeat_n(s as u32, n));
            pos_of.extend(0..n as u32);
        }
        let k_all: Vec<f32> = per_seq.iter().flat_map(|(k, _)| k.clone()).collect();
        let v_all: Vec<f32> = per_seq.iter().flat_map(|(_, v)| v.clone()).collect();
        let (dkn, dvn) = (gpu.upload(&k_all).unwrap(), gpu.upload(&v_all).unwrap());
        let (ds, dp) = (gpu.upload(&seq_of).unwrap(), gpu.upload(&pos_of).unwrap());
        kv_write(gpu, cache, bt, &dkn, &dvn, &ds, &dp).unwrap();
    }
    let scale = 1.0 / (c.d as f32).sqrt();
    let scratch =
        DecodeScratch::new(gpu, seqs, c.n_heads, c.d, max_blocks * c.bs, c.partition).unwrap();
    let scores = Scores {
        scale,
        window: c.window,
        softcap: c.softcap,
    };
    paged_attention_scored(gpu, &dq, cache, bt, &dctx, &o, c.n_heads, scores, &scratch).unwrap();
    let got = gpu.read(&o).unwrap();
    let qrow = c.n_heads * c.d;
    for (s, (k, v)) in per_seq.iter().enumerate() {
        let shape = AttnShape {
            q_len: 1,
            kv_len: c.ctx[s],
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv,
            d_head: c.d,
        };
        // The query at position ctx − 1 sees the keys of the window ending there.
        let mask = AttnMask {
            scale,
            causal: true,
            past: c.ctx[s].saturating_sub(1),
            window: c.window,
        };
        let softcap = c.softcap.map(f64::from);
        let want = attention_ref_capped(&q[s * qrow..][..qrow], k, v, shape, mask, softcap);
        let what = format!("sequence {s} of {:?}", c.ctx);
        assert_close(&got[s * qrow..][..qrow], &want, 1e-4, 1e-5, &what);
    }
}

#[test]
fn contexts_around_a_block_and_many_shuffled_blocks() {
    if gpu().is_none() {
        return;
    }
    // 1, block_size − 1, block_size + 1 and 1000 keys in one call, GQA 4:2.
    let c = Case {
        ctx: vec![1, 15, 17, 1000],
        n_heads: 4,
        n_kv: 2,
        d: 64,
        bs: 16,
        partition: DEFAULT_PARTITION,
        via_kv_write: false,
        window: None,
        softcap: None,
    };
    run(c, 1);
}

#[test]
fn small_partitions_gqa_and_wide_heads() {
    if gpu().is_none() {
        return;
    }
    let c = Case {
        // A sequence with an empty cache gets a zero output.
        ctx: vec![33, 31, 0, 500, 64],
        n_heads: 8,
        n_kv: 1,
        d: 128,
        bs: 32,
        partition: 64,
        via_kv_write: true,
        window: None,
        softcap: None,
    };
    run(c, 2);
    let c = Case {
        ctx: vec![5, 300],
        n_heads: 2,
        n_kv: 2,
        d: 256,
        bs: 8,
        partition: 100,
        via_kv_write: false,
        window: None,
        softcap: None,
    };
    run(c, 3);
    let c = Case {
        ctx: vec![7],
        n_heads: 3,
        n_kv: 1,
        d: 80,
        bs: 4,
        partition: 1024,
        via_kv_write: true,
        window: None,
        softcap: None,
    };
    run(c, 4);
}

#[test]
fn sliding_windows_and_soft_caps_of_the_scores() {
    if gpu().is_none() {
        return;
    }
    // Windows shorter and longer than a context, ending inside and across blocks and
    // partitions (whole partitions before the window are skipped), with a soft cap.
    for (window, softcap, partition) in [(5, None, 64), (100, Some(2.5), 64), (1, Some(0.5), 1024)]
    {
        let c = Case {
            ctx: vec![1, 4, 17, 70, 300],
            n_heads: 4,
            n_kv: 2,
            d: 32,
            bs: 8,
            partition,
            via_kv_write: false,
            window: Some(window),
            softcap,
        };
        run(c, 7);
    }
}

#[test]
fn query_head_groups_in_tiles() {
    if gpu().is_none() {
        return;
    }
    // 12 heads on one kv head: tiles of 8 and 4 heads.
    let c = Case {
        ctx: vec![40, 300],
        n_heads: 12,
        n_kv: 1,
        d: 64,
        bs: 16,
        partition: 128,
        via_kv_write: false,
        window: None,
        softcap: None,
    };
    run(c, 5);
    // Groups of 3: a tile that is not a power of two.
    let c = Case {
        ctx: vec![3, 260, 1],
        n_heads: 6,
        n_kv: 2,
        d: 32,
        bs: 8,
        partition: DEFAULT_PARTITION,
        via_kv_write: false,
        window: None,
        softcap: None,
    };
    run(c, 6);
}

#[test]
fn a_decode_step_in_one_submission() {
    // Its own device: the counters of the shared one move with the other tests.
    use crate::norms::{add_norm, Norm};
    use crate::rope::{rope, RopeFreqs, RopeLayout};
    use crate::softmax::argmax;
    if gpu().is_none() {
        return;
    }
    let gpu = &Gpu::open(None).unwrap();
    let (n_heads, n_kv, d, bs, max_blocks) = (4usize, 2usize, 32usize, 8usize, 3usize);
    let (width, row) = (n_heads * d, n_kv * d);
    let past = [5usize, 20];
    let table: Vec<u32> = vec![3, 0, 5, 1, 4, 2];
    // Each sequence's keys and values, its new row (at position `past`) last.
    let kv: Vec<(Vec<f32>, Vec<f32>)> = past
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let seed = 200 + 2 * s as u64;
            (
                rand_vec((n + 1) * row, seed),
                rand_vec((n + 1) * row, seed + 1),
            )
        })
        .collect();
    let (mut k_cache, mut v_cache) = (vec![0.0f32; 6 * bs * row], vec![0.0f32; 6 * bs * row]);
    for (s, (k, v)) in kv.iter().enumerate() {
        for j in 0..past[s] {
            let slot = table[s * max_blocks + j / bs] as usize * bs + j % bs;
            k_cache[slot * row..][..row].copy_from_slice(&k[j * row..][..row]);
            v_cache[slot * row..][..row].copy_from_slice(&v[j * row..][..row]);
        }
    }
    let new_rows = |i: usize| -> Vec<f32> {
        kv.iter()
            .zip(past)
            .flat_map(|(kv, n)| [&kv.0, &kv.1][i][n * row..][..row].to_vec())
            .collect()
    };
    let up = |x: &[f32]| gpu.upload(x).unwrap();
    let (dk, dv, dkn, dvn) = (
        up(&k_cache),
        up(&v_cache),
        up(&new_rows(0)),
        up(&new_rows(1)),
    );
    let (h, x, w) = (
        up(&rand_vec(2 * width, 210)),
        up(&rand_vec(2 * width, 211)),
        up(&rand_vec(width, 212)),
    );
    let q = gpu.zeros::<f32>(2 * width).unwrap();
    let o = gpu.zeros::<f32>(2 * width).unwrap();
    let ids = gpu.zeros::<u32>(2).unwrap();
    let pos = gpu.upload(&[5u32, 20]).unwrap();
    let seq = gpu.upload(&[0u32, 1]).unwrap();
    let ctx = gpu.upload(&[6u32, 21]).unwrap();
    let dt = gpu.upload(&table).unwrap();
    let freqs = RopeFreqs::standard(gpu, 10_000.0, d).unwrap();
    let scratch = DecodeScratch::new(gpu, 2, n_heads, d, max_blocks * bs, 16).unwrap();
    let cache = PagedCache {
        k: &dk,
        v: &dv,
        block_size: bs,
        n_kv_heads: n_kv,
        d_head: d,
    };
    let bt = BlockTable {
        ids: &dt,
        max_blocks,
    };
    let scale = 1.0 / (d as f32).sqrt();
    gpu.counters().reset();
    let norm = Norm::Rms {
        weight: &w,
        eps: 1e-6,
        offset: 0.0,
    };
    add_norm(gpu, &norm, &h, &x, &q).unwrap();
    rope(gpu, &q, &pos, &freqs, n_heads, d, RopeLayout::HalfSplit).unwrap();
    kv_write(gpu, cache, bt, &dkn, &dvn, &seq, &pos).unwrap();
    paged_attention(gpu, &q, cache, bt, &ctx, &o, n_heads, scale, &scratch).unwrap();
    argmax(gpu, &o, &ids, width).unwrap();
    let got_ids = gpu.read(&ids).unwrap();
    let c = gpu.counters().get();
    assert_eq!((c.dispatches, c.submissions, c.bytes_down), (6, 1, 8));
    // The attention of the step's own queries over the cache with the new rows.
    let (qv, ov) = (gpu.read(&q).unwrap(), gpu.read(&o).unwrap());
    for (s, (k, v)) in kv.iter().enumerate() {
        let shape = AttnShape {
            q_len: 1,
            kv_len: past[s] + 1,
            n_heads,
            n_kv_heads: n_kv,
            d_head: d,
        };
        let mask = AttnMask {
            scale,
            causal: false,
            past: 0,
            window: None,
        };
        let want = attention_ref(&qv[s * width..][..width], k, v, shape, mask);
        let got = &ov[s * width..][..width];
        assert_close(got, &want, 1e-4, 1e-5, &format!("step, sequence {s}"));
        let best = (0..width).fold(0, |b, i| if got[i] > got[b] { i } else { b });
        assert_eq!(got_ids[s], best as u32, "sequence {s}");
    }
}

#[test]
fn one_partition_in_one_pass_is_the_two_passes() {
    let Some(gpu) = gpu() else { return };
    // (contexts, n_heads, n_kv, d, block size): an empty context, GQA tiles of 3 and of
    // 8 + 4, odd d.
    let cases = [
        (vec![1usize, 0, 37, 64], 6, 2, 40, 8),
        (vec![300, 5], 12, 1, 64, 16),
        (vec![9], 3, 3, 7, 3),
    ];
    for (ctx, n_heads, n_kv, d, bs) in cases {
        let seqs = ctx.len();
        let max_blocks = ctx.iter().max().unwrap().div_ceil(bs).max(1);
        let num_blocks = seqs * max_blocks;
        let row = n_kv * d;
        let table: Vec<u32> = shuffled(num_blocks, 9);
        let k = rand_vec(num_blocks * bs * row, 31);
        let v = rand_vec(num_blocks * bs * row, 32);
        let q = rand_vec(seqs * n_heads * d, 33);
        let lens: Vec<u32> = ctx.iter().map(|&n| n as u32).collect();
        let (dk, dv, dq) = (
            gpu.upload(&k).unwrap(),
            gpu.upload(&v).unwrap(),
            gpu.upload(&q).unwrap(),
        );
        let (dt, dl) = (gpu.upload(&table).unwrap(), gpu.upload(&lens).unwrap());
        let cache = PagedCache {
            k: &dk,
            v: &dv,
            block_size: bs,
            n_kv_heads: n_kv,
            d_head: d,
        };
        let bt = BlockTable {
            ids: &dt,
            max_blocks,
        };
        let partition = max_blocks * bs;
        let scratch = DecodeScratch::new(gpu, seqs, n_heads, d, partition, partition).unwrap();
        let scale = 0.3;
        let out = |single: bool| {
            let o = gpu.upload(&vec![f32::NAN; q.len()]).unwrap();
            let scores = Scores {
                scale,
                window: None,
                softcap: None,
            };
            paged_attention_passes(
                gpu, &dq, cache, bt, &dl, &o, n_heads, scores, &scratch, single,
            )
            .unwrap();
            gpu.read(&o).unwrap()
        };
        let (one, two) = (out(true), out(false));
        assert!(
            one.iter().all(|x| x.is_finite()),
            "{ctx:?}: every output written"
        );
        assert_eq!(one, two, "{ctx:?} {n_heads}/{n_kv} × {d}");
    }
}

#[test]
fn paged_shape_errors() {
    let Some(gpu) = gpu() else { return };
    let c = gpu.zeros::<f32>(2 * 4 * 2 * 8).unwrap();
    let cache = PagedCache {
        k: &c,
        v: &c,
        block_size: 4,
        n_kv_heads: 2,
        d_head: 8,
    };
    let ids = gpu.zeros::<u32>(6).unwrap();
    let bt = BlockTable {
        ids: &ids,
        max_blocks: 2,
    };
    let ctx = gpu.zeros::<u32>(2).unwrap();
    let q = gpu.zeros::<f32>(3 * 4 * 8).unwrap();
    let scratch = DecodeScratch::new(gpu, 3, 4, 8, 8, 256).unwrap();
    let e = paged_attention(gpu, &q, cache, bt, &ctx, &q, 4, 1.0, &scratch).unwrap_err();
    assert!(e.to_string().contains("2 context lengths for 3"), "{e}");
    let e = paged_attention(gpu, &q, cache, bt, &ctx, &q, 3, 1.0, &scratch).unwrap_err();
    assert!(e.to_string().contains("not groups of 2 kv heads"), "{e}");
    assert!(DecodeScratch::new(gpu, 1, 1, 8, 8, 2000).is_err());
}
