// Paged decode attention, split-K (flash-decoding) first pass. One workgroup per
// (sequence, head, partition of part_len keys): for the keys j in [start, end) of the
// partition, end = min(start + part_len, ctx[seq]),
//   s_j = scale · q · k_j,  m = max_j s_j,  l = Σ_j exp(s_j − m),  acc = Σ_j exp(s_j − m) v_j
// written to part_ml [seqs · n_heads · parts, 2] and part_acc [seqs · n_heads · parts, d]
// (l = 0 for a partition past the context). Key j of sequence `seq` lives in slot
// table[seq, j / bs] · bs + j % bs of k_cache, v_cache [num_blocks, bs, n_kv, d].
struct Params {
    seqs: u32, n_heads: u32, n_kv: u32, d: u32,
    bs: u32, max_blocks: u32, parts: u32, part_len: u32,
    scale: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> ctx_lens: array<u32>;
@group(0) @binding(6) var<storage, read_write> part_ml: array<f32>;
@group(0) @binding(7) var<storage, read_write> part_acc: array<f32>;

const NEG: f32 = -3.0e38;
var<workgroup> qsh: array<f32, 256>;
var<workgroup> sc: array<f32, 1024>;
var<workgroup> red2: array<f32, 256>;

fn slot(seq: u32, j: u32) -> u32 {
    return table[seq * p.max_blocks + j / p.bs] * p.bs + j % p.bs;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let part = g % p.parts;
    let sh = g / p.parts;
    if (sh >= p.seqs * p.n_heads) {
        return;
    }
    let head = sh % p.n_heads;
    let seq = sh / p.n_heads;
    let kvh = head / (p.n_heads / p.n_kv);
    let d = p.d;
    let dst = sh * p.parts + part;
    let ctx = ctx_lens[seq];
    let start = part * p.part_len;
    if (start >= ctx) {
        if (lid == 0u) {
            part_ml[2u * dst] = NEG;
            part_ml[2u * dst + 1u] = 0.0;
        }
        return;
    }
    let n = min(ctx - start, p.part_len);
    if (lid < d) {
        qsh[lid] = q[sh * d + lid] * p.scale;
    }
    workgroupBarrier();

    // Scores, one key per invocation at a time.
    var mloc = NEG;
    for (var t = lid; t < n; t += WG) {
        let kb = (slot(seq, start + t) * p.n_kv + kvh) * d;
        var s = 0.0;
        for (var c = 0u; c < d; c++) {
            s += qsh[c] * k_cache[kb + c];
        }
        sc[t] = s;
        mloc = max(mloc, s);
    }
    let m = wg_max(mloc, lid);
    var lloc = 0.0;
    for (var t = lid; t < n; t += WG) {
        let e = exp(sc[t] - m);
        sc[t] = e;
        lloc += e;
    }
    let l = wg_sum(lloc, lid);

    // acc: invocation (group, dim) sums the keys t ≡ group (mod groups) for one dim, then the
    // groups are added. dp = the power of two ≥ d.
    var dp = 1u;
    while (dp < d) {
        dp *= 2u;
    }
    let groups = WG / dp;
    let dim = lid % dp;
    let grp = lid / dp;
    var a = 0.0;
    if (dim < d) {
        for (var t = grp; t < n; t += groups) {
            a += sc[t] * v_cache[(slot(seq, start + t) * p.n_kv + kvh) * d + dim];
        }
    }
    red2[lid] = a;
    workgroupBarrier();
    if (grp == 0u && dim < d) {
        var sum = 0.0;
        for (var r = 0u; r < groups; r++) {
            sum += red2[dim + r * dp];
        }
        part_acc[dst * d + dim] = sum;
    }
    if (lid == 0u) {
        part_ml[2u * dst] = m;
        part_ml[2u * dst + 1u] = l;
    }
}
