// y[r, o] = sum_k x[r, k] W[o, k], tiled: each workgroup computes a 64 x 64 tile of y (64
// activation rows by 64 outputs), 4 x 4 per invocation, stepping through d_in one unit of 32
// at a time: the x tile and the decoded W tile wait in workgroup memory, k-major. Output
// y[r, o] is y[r * y_stride + y_off + o] (a column range of a wider buffer).
// GLU = 1 + kind (gated): W is gate‖up (d_out = 2 d_ff); a tile covers outputs j0..j0 + 32,
// its column n holding weight row j (gate) or d_ff + j (up) for j = j0 + 2 (n / 4) + n % 2,
// up when bit 1 of n is set, so each invocation's 4 columns are the gate and up of two
// outputs: y[r, j] = activate(kind, gate) * up, each sum as the plain kernel makes it.
override GLU: u32 = 0u;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
// [k][m / 4] and [k][n / 4], 32 k each: 16 KiB together.
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let m0 = (g / p.tiles_n) * TM;
    let n0 = (g % p.tiles_n) * TN;
    let d_ff = p.d_out / 2u;
    let j0 = (g % p.tiles_n) * 32u;
    if (m0 >= p.rows) {
        return; // uniform: past the last tile of a 2D grid
    }
    let tx = lid & 15u;
    let ty = lid >> 4u;
    // What this invocation loads: 8 consecutive k of one row of x and of one row of W.
    let lm = lid >> 2u;
    let part = lid & 3u;
    let row = m0 + lm;
    var o = n0 + lm;
    var valid = o < p.d_out;
    if (GLU != 0u) {
        let j = j0 + 2u * (lm >> 2u) + (lm & 1u);
        o = j + ((lm >> 1u) & 1u) * d_ff;
        valid = j < d_ff;
    }
    let rb = o * p.row_bytes;
    var acc: array<vec4<f32>, 4>;
    for (var u = 0u; u < p.n_units; u++) {
        for (var c = 0u; c < 8u; c++) {
            let k = 32u * u + 8u * part + c;
            var v = 0.0;
            if (row < p.rows && k < p.d_in) {
                v = x[row * p.d_in + k];
            }
            xs[(8u * part + c) * 16u + (lm >> 2u)][lm & 3u] = v;
        }
        var v0 = vec4<f32>(0.0);
        var v1 = vec4<f32>(0.0);
        if (valid) {
            let q = unit_params(rb, u);
            v0 = unit_values(rb, u, 2u * part, q);
            v1 = unit_values(rb, u, 2u * part + 1u, q);
        }
        for (var c = 0u; c < 4u; c++) {
            ws[(8u * part + c) * 16u + (lm >> 2u)][lm & 3u] = v0[c];
            ws[(8u * part + 4u + c) * 16u + (lm >> 2u)][lm & 3u] = v1[c];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let a = xs[kk * 16u + ty];
            let b = ws[kk * 16u + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = m0 + 4u * ty + i;
        if (r < p.rows && GLU == 0u) {
            for (var c = 0u; c < 4u; c++) {
                let oc = n0 + 4u * tx + c;
                if (oc < p.d_out) {
                    y[r * p.y_stride + p.y_off + oc] = acc[i][c];
                }
            }
        }
        if (r < p.rows && GLU != 0u) {
            for (var c = 0u; c < 2u; c++) {
                let j = j0 + 2u * tx + c;
                if (j < d_ff) {
                    y[r * p.y_stride + p.y_off + j] = activate(GLU - 1u, acc[i][c]) * acc[i][c + 2u];
                }
            }
        }
    }
}
