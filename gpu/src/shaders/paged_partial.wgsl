// Paged decode attention, split-K (flash-decoding) first pass. One workgroup per
// (sequence, kv head, tile of gt of the query heads sharing that kv head, partition of
// part_len keys): each key and value row is read once for all the tile's heads. For the keys
// j in [start, end) of the partition, end = min(start + part_len, ctx[seq]), and each head h,
//   s_hj = scale · q_h · k_j,  m_h = max_j s_hj,  l_h = Σ_j exp(s_hj − m_h),
//   acc_h = Σ_j exp(s_hj − m_h) v_j
// written to part_ml [seqs · n_heads · parts, 2] and part_acc [seqs · n_heads · parts, d]
// (l = 0 for a partition past the context). Key j of sequence `seq` lives in slot
// table[seq, j / bs] · bs + j % bs of k_cache, v_cache [num_blocks, bs, n_kv, d].
// gt·d ≤ 1024, gt·part_len ≤ 2048, gt ≤ 8; `sub` = 256 / (gt rounded up to a power of two)
// invocations reduce each head's scores.
// With a sliding window w > 0 only the keys j ≥ ctx − w are seen (the query is at position
// ctx − 1); with a soft cap c > 0 each scaled score becomes c · tanh(s / c) (Gemma 2).
// Single pass (direct = 1, only with parts = 1: one partition covers every context): the
// output itself, o[seq, h] = acc_h / l_h (0 for an empty context), with the arithmetic the
// reduce pass would do on one partition (whose weight exp(m − m) is 1), and no partials.
struct Params {
    seqs: u32, n_heads: u32, n_kv: u32, d: u32,
    bs: u32, max_blocks: u32, parts: u32, part_len: u32,
    scale: f32, gt: u32, head_tiles: u32, sub: u32,
    direct: u32, window: u32, softcap: f32, pad2: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> ctx_lens: array<u32>;
@group(0) @binding(6) var<storage, read_write> part_ml: array<f32>;
@group(0) @binding(7) var<storage, read_write> part_acc: array<f32>;
@group(0) @binding(8) var<storage, read_write> o: array<f32>;

const NEG: f32 = -3.0e38;
var<workgroup> qsh: array<f32, 1024>;
var<workgroup> sc: array<f32, 2048>;
var<workgroup> red: array<f32, 256>;
var<workgroup> lsh: array<f32, 8>;

fn slot(seq: u32, j: u32) -> u32 {
    return table[seq * p.max_blocks + j / p.bs] * p.bs + j % p.bs;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let part = g % p.parts;
    let rest = g / p.parts;
    let ht = rest % p.head_tiles;
    let kvh = (rest / p.head_tiles) % p.n_kv;
    let seq = rest / p.head_tiles / p.n_kv;
    if (seq >= p.seqs) {
        return;
    }
    let group = p.n_heads / p.n_kv;
    let h0 = kvh * group + ht * p.gt;
    let nh = min(p.gt, group - ht * p.gt);
    let d = p.d;
    let pl = p.part_len;
    let ctx = ctx_lens[seq];
    let start = part * pl;
    // The first key seen: ctx − w with a window, else 0.
    var lo = 0u;
    if (p.window > 0u && ctx > p.window) {
        lo = ctx - p.window;
    }
    if (start >= ctx || start + min(ctx - min(ctx, start), pl) <= lo) {
        if (p.direct != 0u) {
            for (var e = lid; e < nh * p.d; e += 256u) {
                o[(seq * p.n_heads + h0) * p.d + e] = 0.0;
            }
            return;
        }
        if (lid < nh) {
            let dst = (seq * p.n_heads + h0 + lid) * p.parts + part;
            part_ml[2u * dst] = NEG;
            part_ml[2u * dst + 1u] = 0.0;
        }
        return;
    }
    let n = min(ctx - start, pl);
    // The tile's heads are consecutive in the query row.
    for (var e = lid; e < nh * d; e += 256u) {
        qsh[e] = q[(seq * p.n_heads + h0) * d + e] * p.scale;
    }
    workgroupBarrier();

    // Scores: one key per invocation at a time, its row read once for every head.
    for (var t = lid; t < n; t += 256u) {
        let kb = (slot(seq, start + t) * p.n_kv + kvh) * d;
        var s = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for (var c = 0u; c < d; c++) {
            let kc = k_cache[kb + c];
            for (var h = 0u; h < nh; h++) {
                s[h] += qsh[h * d + c] * kc;
            }
        }
        for (var h = 0u; h < nh; h++) {
            var sv = s[h];
            if (p.softcap > 0.0) {
                sv = p.softcap * tanh(sv / p.softcap);
            }
            if (start + t < lo) {
                sv = NEG;
            }
            sc[h * pl + t] = sv;
        }
    }
    workgroupBarrier();

    // Per head, `sub` invocations: the max, then the weights in place and their sum.
    let sub = p.sub;
    let hh = lid / sub;
    let si = lid % sub;
    var mloc = NEG;
    if (hh < nh) {
        for (var t = si; t < n; t += sub) {
            mloc = max(mloc, sc[hh * pl + t]);
        }
    }
    red[lid] = mloc;
    workgroupBarrier();
    for (var s = sub / 2u; s > 0u; s = s >> 1u) {
        if (si < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let m = red[hh * sub];
    workgroupBarrier();
    var lloc = 0.0;
    if (hh < nh) {
        for (var t = si; t < n; t += sub) {
            let e = exp(sc[hh * pl + t] - m);
            sc[hh * pl + t] = e;
            lloc += e;
        }
    }
    red[lid] = lloc;
    workgroupBarrier();
    for (var s = sub / 2u; s > 0u; s = s >> 1u) {
        if (si < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    if (si == 0u && hh < nh) {
        let dst = (seq * p.n_heads + h0 + hh) * p.parts + part;
        part_ml[2u * dst] = m;
        part_ml[2u * dst + 1u] = red[lid];
        lsh[hh] = red[lid];
    }
    workgroupBarrier();

    // acc: invocation (grp, dim) sums the keys t ≡ grp (mod groups) for one dim of every
    // head, each value read once; then the groups are added, head by head. dp = the power of
    // two ≥ d.
    var dp = 1u;
    while (dp < d) {
        dp *= 2u;
    }
    let groups = 256u / dp;
    let dim = lid % dp;
    let grp = lid / dp;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    if (dim < d) {
        for (var t = grp; t < n; t += groups) {
            let vv = v_cache[(slot(seq, start + t) * p.n_kv + kvh) * d + dim];
            for (var h = 0u; h < nh; h++) {
                acc[h] += sc[h * pl + t] * vv;
            }
        }
    }
    for (var h = 0u; h < nh; h++) {
        red[lid] = acc[h];
        workgroupBarrier();
        if (grp == 0u && dim < d) {
            var sum = 0.0;
            for (var r = 0u; r < groups; r++) {
                sum += red[dim + r * dp];
            }
            if (p.direct != 0u) {
                let l = lsh[h];
                var res = 0.0;
                if (l > 0.0) {
                    res = sum / l;
                }
                o[(seq * p.n_heads + h0 + h) * d + dim] = res;
            } else {
                part_acc[((seq * p.n_heads + h0 + h) * p.parts + part) * d + dim] = sum;
            }
        }
        workgroupBarrier();
    }
}
