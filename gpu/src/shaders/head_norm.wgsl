// RMSNorm of each head of the queries and keys inside a Q‖K‖V row, in place (query/key norms,
// Qwen3 and Gemma 3): for row r of qkv [rows, width] and head hh < n_q + n_k (the n_q query
// heads first, then the n_k key heads; the value heads after them are left alone),
//   x = qkv[r, hh·d .. (hh+1)·d],  x ← x / sqrt(mean(x²) + eps) · g,
// g the query gain for a query head, the key gain for a key head. One invocation per head.
struct Params { total: u32, heads: u32, n_q: u32, width: u32, d: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gq: array<f32>;
@group(0) @binding(2) var<storage, read> gk: array<f32>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (i >= p.total) {
        return;
    }
    let row = i / p.heads;
    let hh = i % p.heads;
    let base = row * p.width + hh * p.d;
    var q = 0.0;
    for (var c = 0u; c < p.d; c++) {
        let v = qkv[base + c];
        q += v * v;
    }
    let inv = 1.0 / sqrt(q / f32(p.d) + p.eps);
    if (hh < p.n_q) {
        for (var c = 0u; c < p.d; c++) {
            qkv[base + c] = qkv[base + c] * inv * gq[c];
        }
    } else {
        for (var c = 0u; c < p.d; c++) {
            qkv[base + c] = qkv[base + c] * inv * gk[c];
        }
    }
}
