// Chunked softmax, second pass: one workgroup per (row, chunk) merges the row's chunk
// statistics, M = max_c m_c, L = Σ_c l_c exp(m_c − M), and writes its chunk:
//   softmax y_j = exp(x_j − M) / L,  log-softmax y_j = x_j − M − log L.
struct Params { rows: u32, n: u32, chunk: u32, chunks: u32, log: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let row = g / p.chunks;
    if (row >= p.rows) {
        return;
    }
    let stats = row * p.chunks;
    var mm = -3.4028234e38;
    for (var c = 0u; c < p.chunks; c++) {
        mm = max(mm, part[2u * (stats + c)]);
    }
    var l = 0.0;
    for (var c = 0u; c < p.chunks; c++) {
        l += part[2u * (stats + c) + 1u] * exp(part[2u * (stats + c)] - mm);
    }
    let base = row * p.n;
    let first = (g % p.chunks) * p.chunk;
    let end = min(p.n, first + p.chunk);
    if (p.log != 0u) {
        let ll = log(l);
        for (var i = first + lid; i < end; i += 256u) {
            y[base + i] = x[base + i] - mm - ll;
        }
    } else {
        for (var i = first + lid; i < end; i += 256u) {
            y[base + i] = exp(x[base + i] - mm) / l;
        }
    }
}
