// RoPE fused with the KV-cache store, one invocation per element of qkv
// [rows, n_heads + 2 n_kv, d] (each row: its query heads, key heads, value heads, as a
// Q‖K‖V product writes them). Row r is at position pos[r] of sequence row_seq[r]:
//   q_out[r, h]           = rope(q[r, h], pos[r])                       h < n_heads
//   k_cache[slot(r), h]   = rope(k[r, h], pos[r])                       h < n_kv
//   v_cache[slot(r), h]   = v[r, h]                                     h < n_kv
// slot(r) = table[row_seq[r], pos / bs] · bs + pos % bs; rope as in rope.wgsl (pairs
// (i, i + half) or (2i, 2i + 1), dims past 2·half copied). The invocation of a pair's first
// element rotates both; that of its second does nothing.
struct Params {
    total: u32, n_heads: u32, n_kv: u32, d: u32,
    half: u32, interleaved: u32, factor: f32, bs: u32,
    max_blocks: u32, pad0: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> turns: array<u32>;
@group(0) @binding(4) var<storage, read> row_seq: array<u32>;
@group(0) @binding(5) var<storage, read> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;

// Element `i` of head `h` of row `r` into its destination: q_out, k_cache or v_cache.
fn store(r: u32, h: u32, i: u32, kv_base: u32, val: f32) {
    if (h < p.n_heads) {
        q_out[(r * p.n_heads + h) * p.d + i] = val;
    } else if (h < p.n_heads + p.n_kv) {
        k_cache[kv_base + (h - p.n_heads) * p.d + i] = val;
    } else {
        v_cache[kv_base + (h - p.n_heads - p.n_kv) * p.d + i] = val;
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (e >= p.total) {
        return;
    }
    let heads = p.n_heads + 2u * p.n_kv;
    let i = e % p.d;
    let rh = e / p.d;
    let h = rh % heads;
    let r = rh / heads;
    let pos = positions[r];
    let slot = table[row_seq[r] * p.max_blocks + pos / p.bs] * p.bs + pos % p.bs;
    let kv_base = slot * p.n_kv * p.d;
    let base = rh * p.d;
    let rot = 2u * p.half;
    if (h >= p.n_heads + p.n_kv || i >= rot) {
        store(r, h, i, kv_base, qkv[e]); // a value, or a dim past the rotary ones
        return;
    }
    // i is in a rotated pair: its first element (a) rotates it; its second (b) leaves.
    var pair = i;
    var b = i + p.half;
    if (p.interleaved != 0u) {
        if ((i & 1u) != 0u) {
            return;
        }
        pair = i / 2u;
        b = i + 1u;
    } else if (i >= p.half) {
        return;
    }
    let cs = rope_cs(pos, pair, p.factor);
    let c = cs.x;
    let s = cs.y;
    let x0 = qkv[base + i];
    let x1 = qkv[base + b];
    store(r, h, i, kv_base, x0 * c - x1 * s);
    store(r, h, b, kv_base, x0 * s + x1 * c);
}
