// Chunked softmax, first pass: one workgroup per (row, chunk of `chunk` entries) of
// x [rows, n] writes the chunk's max m_c and sum l_c = Σ exp(x_j − m_c) to
// part [rows, chunks, 2].
struct Params { rows: u32, n: u32, chunk: u32, chunks: u32, log: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let row = g / p.chunks;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    let first = (g % p.chunks) * p.chunk;
    let end = min(p.n, first + p.chunk);
    var m = -3.4028234e38;
    for (var i = first + lid; i < end; i += WG) {
        m = max(m, x[base + i]);
    }
    m = wg_max(m, lid);
    var s = 0.0;
    for (var i = first + lid; i < end; i += WG) {
        s += exp(x[base + i] - m);
    }
    s = wg_sum(s, lid);
    if (lid == 0u) {
        part[2u * g] = m;
        part[2u * g + 1u] = s;
    }
}
