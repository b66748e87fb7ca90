// One workgroup per row of x [rows, d]:
//   RMSNorm   (layer = 0): y = x / sqrt(mean(x²) + eps) · (w + w_offset)
//   LayerNorm (layer = 1): y = (x − mean) / sqrt(var + eps) · (w + w_offset) [+ b]
// (b is bound but unused when bias = 0.)
struct Params { rows: u32, d: u32, eps: f32, layer: u32, w_offset: f32, bias: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.d;
    let n = f32(p.d);
    var mean = 0.0;
    if (p.layer != 0u) {
        var s = 0.0;
        for (var i = lid; i < p.d; i += WG) {
            s += x[base + i];
        }
        mean = wg_sum(s, lid) / n;
    }
    var q = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        let c = x[base + i] - mean;
        q += c * c;
    }
    let inv = 1.0 / sqrt(wg_sum(q, lid) / n + p.eps);
    for (var i = lid; i < p.d; i += WG) {
        var v = (x[base + i] - mean) * inv * (w[i] + p.w_offset);
        if (p.bias != 0u) {
            v += b[i];
        }
        y[base + i] = v;
    }
}
