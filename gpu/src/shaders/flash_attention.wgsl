// FlashAttention-2 forward (prefill): O = softmax(Q Kᵀ · scale + mask) V for
// q [q_len, n_heads, d], k, v [kv_len, n_kv, d], o [q_len, n_heads, d]; head h reads kv head
// h / (n_heads / n_kv). Query i sits at absolute position past + i; key j is visible when
// j < kv_len, (not causal or j ≤ past + i) and (window = 0 or j > past + i − window).
//
// One workgroup per (tile of bq queries, head). The scaled Q tile stays in workgroup memory;
// K and V pass through it in tiles of bk keys (only the tiles some query of the tile can see).
// Per tile: bq·bk scores into workgroup memory (each dot product shared by 256 / (bq·bk)
// invocations when there are fewer scores than invocations); then one invocation per query
// runs the online softmax (running max m and sum l, the factor exp(m_old − m_new), the
// weights in place of the scores); then invocation (qi, lane) rescales and accumulates its
// dims lane, lane + L, … of the output (L = 256 / bq lanes per query, at most 4 dims each).
// bq·d ≤ 1024, bk·d ≤ 1024, bq·bk ≤ 512: about 15 KiB of workgroup memory for any d ≤ 256.
struct Params {
    q_len: u32, kv_len: u32, n_heads: u32, n_kv: u32,
    d: u32, scale: f32, past: u32, causal: u32,
    window: u32, bq: u32, bk: u32, q_tiles: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

const NEG: f32 = -3.0e38;
var<workgroup> qs: array<f32, 1024>;
var<workgroup> ks: array<f32, 1024>;
var<workgroup> vs: array<f32, 1024>;
var<workgroup> ss: array<f32, 512>;
var<workgroup> corr_s: array<f32, 32>;
var<workgroup> l_s: array<f32, 32>;
var<workgroup> psum: array<f32, 256>;

fn visible(j: u32, pos: u32) -> bool {
    return j < p.kv_len && (p.causal == 0u || j <= pos) && (p.window == 0u || j + p.window > pos);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let head = g % p.n_heads;
    let qt = g / p.n_heads;
    if (qt >= p.q_tiles) {
        return;
    }
    let d = p.d;
    let bq = p.bq;
    let bk = p.bk;
    let kvh = head / (p.n_heads / p.n_kv);
    let q0 = qt * bq;
    let lanes = 256u / bq;
    let qi = lid / lanes;
    let lane = lid % lanes;

    for (var e = lid; e < bq * d; e += 256u) {
        let r = q0 + e / d;
        var val = 0.0;
        if (r < p.q_len) {
            val = q[(r * p.n_heads + head) * d + e % d] * p.scale;
        }
        qs[e] = val;
    }

    // The keys some query of this tile may see.
    let pos_lo = p.past + q0;
    let pos_hi = p.past + min(q0 + bq, p.q_len) - 1u;
    var k_end = p.kv_len;
    if (p.causal != 0u) {
        k_end = min(k_end, pos_hi + 1u);
    }
    var k_start = 0u;
    if (p.window != 0u && pos_lo + 1u > p.window) {
        k_start = pos_lo + 1u - p.window;
    }

    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);

    for (var kt = k_start; kt < k_end; kt += bk) {
        workgroupBarrier();
        for (var e = lid; e < bk * d; e += 256u) {
            let j = kt + e / d;
            var kv = 0.0;
            var vv = 0.0;
            if (j < p.kv_len) {
                let at = (j * p.n_kv + kvh) * d + e % d;
                kv = k[at];
                vv = v[at];
            }
            ks[e] = kv;
            vs[e] = vv;
        }
        workgroupBarrier();
        let ns = bq * bk;
        if (ns >= 256u) {
            for (var e = lid; e < ns; e += 256u) {
                let r = e / bk;
                let c = e % bk;
                var s = NEG;
                if (q0 + r < p.q_len && visible(kt + c, pos_lo + r)) {
                    s = 0.0;
                    for (var t = 0u; t < d; t++) {
                        s += qs[r * d + t] * ks[c * d + t];
                    }
                }
                ss[e] = s;
            }
        } else {
            // Fewer scores than invocations: tps invocations share each dot product.
            let tps = 256u / ns;
            let e = lid / tps;
            let part = lid % tps;
            var s = 0.0;
            if (e < ns) {
                let r = e / bk;
                let c = e % bk;
                for (var t = part; t < d; t += tps) {
                    s += qs[r * d + t] * ks[c * d + t];
                }
            }
            psum[lid] = s;
            workgroupBarrier();
            if (part == 0u && e < ns) {
                let r = e / bk;
                let c = e % bk;
                var total = NEG;
                if (q0 + r < p.q_len && visible(kt + c, pos_lo + r)) {
                    total = 0.0;
                    for (var i = 0u; i < tps; i++) {
                        total += psum[lid + i];
                    }
                }
                ss[e] = total;
            }
        }
        workgroupBarrier();
        // One invocation per query: the tile's max, the rescale factor, the weights
        // p_j = exp(s_j − m_new) in place of the scores, and the running sum.
        if (lane == 0u) {
            var mt = NEG;
            for (var c = 0u; c < bk; c++) {
                mt = max(mt, ss[qi * bk + c]);
            }
            let m_new = max(m, mt);
            let corr = exp(m - m_new);
            var sum = 0.0;
            for (var c = 0u; c < bk; c++) {
                let s = ss[qi * bk + c];
                var pr = 0.0;
                if (s > NEG) {
                    pr = exp(s - m_new);
                }
                ss[qi * bk + c] = pr;
                sum += pr;
            }
            l = l * corr + sum;
            m = m_new;
            corr_s[qi] = corr;
        }
        workgroupBarrier();
        // Every invocation: its dims of the query's accumulator.
        let corr = corr_s[qi];
        for (var u = 0u; u < 4u; u++) {
            let dim = lane + u * lanes;
            if (dim < d) {
                var a = acc[u] * corr;
                for (var c = 0u; c < bk; c++) {
                    a += ss[qi * bk + c] * vs[c * d + dim];
                }
                acc[u] = a;
            }
        }
    }

    // The running sums live with each query's lane 0.
    workgroupBarrier();
    if (lane == 0u) {
        l_s[qi] = l;
    }
    workgroupBarrier();
    l = l_s[qi];
    let r = q0 + qi;
    if (r < p.q_len) {
        var inv = 0.0;
        if (l > 0.0) {
            inv = 1.0 / l;
        }
        for (var u = 0u; u < 4u; u++) {
            let dim = lane + u * lanes;
            if (dim < d) {
                o[(r * p.n_heads + head) * d + dim] = acc[u] * inv;
            }
        }
    }
}
