// One workgroup per row of x [rows, n], max-subtracted:
//   softmax     (log = 0): y_j = exp(x_j − m) / Σ_k exp(x_k − m)
//   log-softmax (log = 1): y_j = x_j − m − log Σ_k exp(x_k − m),   m = max_k x_k
struct Params { rows: u32, n: u32, log: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var m = -3.4028234e38;
    for (var i = lid; i < p.n; i += WG) {
        m = max(m, x[base + i]);
    }
    m = wg_max(m, lid);
    var s = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        s += exp(x[base + i] - m);
    }
    s = wg_sum(s, lid);
    if (p.log != 0u) {
        let ls = log(s);
        for (var i = lid; i < p.n; i += WG) {
            y[base + i] = x[base + i] - m - ls;
        }
    } else {
        for (var i = lid; i < p.n; i += WG) {
            y[base + i] = exp(x[base + i] - m) / s;
        }
    }
}
