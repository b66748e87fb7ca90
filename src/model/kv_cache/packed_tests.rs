//! A cache holding packed keys and values (`rows`): its rows read back as `deq(pack(x))`
//! through every view, blocks shared and copied on write across many blocks, and attention over
//! it (the step kernel through the table, matrix products over the dense copy) against float64
//! loops over the dequantised values.

use super::{KvCache, KvTypes};
use crate::backend::{AttnDims, AttnMask, Backend, KvType, KvView, Purpose, CPU};
use crate::rng::Rng;

/// One row's keys and values as written, `[positions][d_kv]` each.
type Written<T> = (Vec<Vec<T>>, Vec<Vec<T>>);

/// `x` packed as `ty` and unpacked, in float64; with `rotation` `Some(n)`, rotated by `R_n`
/// before packing and back after unpacking (`kernels::hadamard`).
fn through(ty: KvType, rotation: Option<usize>, x: &[f32]) -> Vec<f64> {
    let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    CPU.kv_quantise_row(ty, rotation, x, &mut bytes);
    let mut back = vec![0f32; x.len()];
    CPU.kv_dequantise_row(ty, rotation, &bytes, &mut back);
    back.into_iter().map(f64::from).collect()
}

/// Softmax attention of one query head `q [d_head]` over `keys`, `values` (`[n][d_head]`),
/// in float64.
fn reference(q: &[f32], keys: &[Vec<f64>], values: &[Vec<f64>], scale: f64) -> Vec<f64> {
    let s: Vec<f64> = keys
        .iter()
        .map(|k| q.iter().zip(k).map(|(&a, b)| a as f64 * b).sum::<f64>() * scale)
        .collect();
    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0.0; q.len()];
    for (w, v) in e.iter().zip(values) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += w / z * x;
        }
    }
    out
}

/// Two rows of ragged lengths over 40+ blocks of 8 positions, one row re-gathered twice
/// (shared blocks, then copy on write as both grow), for every packed type as keys and values
/// (mixed: q8_0 keys with q4_0 values, etc.): every position reads back as `deq(pack(x))`,
/// and decode-step attention (one query, grouped heads) and a prompt's (20 queries, matrix
/// products over the dense copy) match float64 loops over the dequantised values.
#[test]
fn attention_over_a_packed_cache_matches_float64_over_its_values() {
    let (heads, kv_heads, d_head, block_rows) = (4, 2, 64, 8);
    let d_kv = kv_heads * d_head;
    let pairs = [
        (KvType::F16, KvType::F16),
        (KvType::Bf16, KvType::Q8_0),
        (KvType::Q8_0, KvType::Q8_0),
        (KvType::Q8_0, KvType::Q4_0),
        (KvType::Q4_0, KvType::Q4_0),
    ];
    for (kt, vt) in pairs {
        let types = KvTypes { k: kt, v: vt };
        let mut rng = Rng::new(11);
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| rng.uniform_range(-1.5, 1.5) as f32)
                .collect()
        };
        let mut cache = KvCache::<f32>::with_types(0, 400, (d_kv, d_head), block_rows, types);
        // The block types store rows rotated by R_64 (heads of 64).
        let (k_rot, v_rot) = types.rotations(d_head);
        assert_eq!(k_rot.is_some(), matches!(kt, KvType::Q8_0 | KvType::Q4_0));
        // want[b]: row b's keys and values as written, f32 `[positions][d_kv]`
        let mut want: Vec<Written<f32>> = Vec::new();
        for _ in 0..2 {
            cache.add_row();
            want.push((Vec::new(), Vec::new()));
        }
        let mut grow = |cache: &mut KvCache<f32>, want: &mut Vec<_>, rows: &[usize]| {
            let (k, v) = (draw(rows.len() * d_kv), draw(rows.len() * d_kv));
            cache.append_ragged(rows, &k, &v);
            for (i, &r) in rows.iter().enumerate() {
                let w: &mut (Vec<Vec<f32>>, Vec<Vec<f32>>) = &mut want[r];
                w.0.push(k[i * d_kv..(i + 1) * d_kv].to_vec());
                w.1.push(v[i * d_kv..(i + 1) * d_kv].to_vec());
            }
        };
        grow(&mut cache, &mut want, &[0; 150]);
        grow(&mut cache, &mut want, &[1; 77]);
        // Row 0 repeated: its blocks shared, then each copy writes its own last block.
        cache.gather_rows(&[0, 1, 0]);
        want.push(want[0].clone());
        grow(&mut cache, &mut want, &[0, 2, 2, 1, 0, 2]);
        grow(&mut cache, &mut want, &[2; 170]);
        assert!(cache.blocks_in_use() > 40);
        // Positions read back packed-and-unpacked, in every row.
        let deq: Vec<Written<f64>> = want
            .iter()
            .map(|(k, v)| {
                let k = k.iter().map(|x| through(kt, k_rot, x)).collect();
                let v = v.iter().map(|x| through(vt, v_rot, x)).collect();
                (k, v)
            })
            .collect();
        for (b, (k, v)) in deq.iter().enumerate() {
            assert_eq!(cache.row_len(b), k.len());
            for t in [0, 7, 8, k.len() / 2, k.len() - 1] {
                let got: Vec<f64> = cache.row(b, t, false).iter().map(|&x| x as f64).collect();
                assert_eq!(got, k[t], "{types} key {b} {t}");
                let got: Vec<f64> = cache.row(b, t, true).iter().map(|&x| x as f64).collect();
                assert_eq!(got, v[t], "{types} value {b} {t}");
            }
        }
        let batch = cache.batch;
        let k_len = (0..batch).map(|b| cache.row_len(b)).max().unwrap();
        let lens: Vec<usize> = (0..batch).map(|b| cache.row_len(b)).collect();
        let check = |ctx: &[f32], q: &[f32], q_len: usize, seen: &dyn Fn(usize, usize) -> usize| {
            let scale = 1.0 / (d_head as f64).sqrt();
            for (b, (deq_k, deq_v)) in deq.iter().enumerate().take(batch) {
                for i in 0..q_len {
                    for h in 0..heads {
                        let kvh = h / (heads / kv_heads);
                        let n = seen(b, i);
                        let cols = |x: &Vec<f64>| x[kvh * d_head..(kvh + 1) * d_head].to_vec();
                        let keys: Vec<Vec<f64>> = deq_k[..n].iter().map(cols).collect();
                        let values: Vec<Vec<f64>> = deq_v[..n].iter().map(cols).collect();
                        let at = ((b * q_len + i) * heads + h) * d_head;
                        let want = reference(&q[at..at + d_head], &keys, &values, scale);
                        for (c, (&g, w)) in ctx[at..at + d_head].iter().zip(&want).enumerate() {
                            let ok = (g as f64 - w).abs() < 2e-5;
                            assert!(ok, "{types} row {b} query {i} head {h} col {c}: {g} vs {w}");
                        }
                    }
                }
            }
        };
        // Decode step: one query per row through the table (the serving path's view).
        let dims = |q_len: usize, stride: usize| AttnDims {
            batch,
            heads,
            kv_heads,
            d_head,
            q_len,
            k_len,
            kv_stride: stride,
            scores: Default::default(),
        };
        let q = draw(batch * heads * d_head);
        let mut key_rows = Vec::new();
        for (b, &n) in lens.iter().enumerate() {
            cache.stored_rows_of(b, n, &mut key_rows);
            key_rows.resize((b + 1) * k_len, 0);
        }
        let (k, v) = cache.storage();
        let paged = KvView::Paged {
            k,
            v,
            rows: &key_rows,
        };
        let out = CPU.attention(&q, paged, &lens[..], dims(1, k_len), Purpose::Decode);
        check(&out.ctx, &q, 1, &|b, _| lens[b]);
        // The same through the cache itself (its own table).
        let out = CPU.attention(
            &q,
            KvView::Store(&mut cache.clone()),
            &lens[..],
            dims(1, cache.capacity),
            Purpose::Decode,
        );
        check(&out.ctx, &q, 1, &|b, _| lens[b]);
        // A prompt's 20 causal queries at the end of the shortest row: matrix products over the
        // dense copy (the cache reordered, still packed).
        let (q_len, offset) = (20, lens.iter().min().unwrap() - 20);
        let q = draw(batch * q_len * heads * d_head);
        let offsets = vec![offset + q_len; batch];
        let mask = AttnMask {
            key_lens: &offsets,
            causal: true,
            q_offset: offset,
        };
        let mut dense = cache.clone();
        let dims20 = AttnDims {
            k_len: offset + q_len,
            ..dims(q_len, cache.capacity)
        };
        let out = CPU.attention(&q, KvView::Store(&mut dense), mask, dims20, Purpose::Decode);
        check(&out.ctx, &q, q_len, &|_, i| offset + i + 1);
        assert_eq!(dense.types(), types, "the dense copy keeps the packed form");
        assert!(dense.stored_bytes() < batch * 400 * d_kv * 8 / 2 + 1);
    }
}
