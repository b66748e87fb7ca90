// y[r, o] = sum_k x[r, k] W[o, k] for r < rows <= 8: one workgroup per output o. Each
// invocation takes pieces of 8 values (a quarter of a unit), decodes them once and multiplies
// them with every activation row; a tree in workgroup memory sums the invocations. Output
// y[r, o] is y[r * y_stride + y_off + o] (a column range of a wider buffer).
// GLU = 1 + kind (gated): W is gate‖up (d_out = 2 d_ff) and workgroup j < d_ff computes rows
// j and d_ff + j, each exactly as the plain kernel does, then writes
// y[r, j] = activate(kind, gate) * up.
override GLU: u32 = 0u;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const MAXR: u32 = 8u;
var<workgroup> red: array<f32, 1024>; // 2 * MAXR * WG

// x[r, k..k + 4], zeros past d_in.
fn x4(r: u32, k: u32) -> vec4<f32> {
    let i = r * p.d_in + k;
    return vec4<f32>(select(0.0, x[i], k < p.d_in), select(0.0, x[i + 1u], k + 1u < p.d_in),
                     select(0.0, x[i + 2u], k + 2u < p.d_in), select(0.0, x[i + 3u], k + 3u < p.d_in));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let o = wid.x + wid.y * nwg.x;
    var outs = p.d_out;
    var halves = 1u;
    if (GLU != 0u) {
        outs = p.d_out / 2u;
        halves = 2u;
    }
    if (o >= outs) {
        return; // uniform: the whole workgroup leaves
    }
    var acc: array<f32, 16>;
    for (var hs = 0u; hs < halves; hs++) {
        let rb = (o + hs * outs) * p.row_bytes;
        for (var piece = lid; piece < 4u * p.n_units; piece += WG) {
            let u = piece >> 2u;
            let part = piece & 3u;
            let q = unit_params(rb, u);
            let v0 = unit_values(rb, u, 2u * part, q);
            let v1 = unit_values(rb, u, 2u * part + 1u, q);
            let k = 32u * u + 8u * part;
            for (var r = 0u; r < MAXR; r++) {
                if (r < p.rows) {
                    acc[hs * MAXR + r] += dot(v0, x4(r, k)) + dot(v1, x4(r, k + 4u));
                }
            }
        }
    }
    for (var r = 0u; r < halves * MAXR; r++) {
        red[r * WG + lid] = acc[r];
    }
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            for (var r = 0u; r < halves * MAXR; r++) {
                if ((r % MAXR) < p.rows) {
                    red[r * WG + lid] += red[r * WG + lid + s];
                }
            }
        }
    }
    workgroupBarrier();
    if (lid < p.rows) {
        let at = lid * p.y_stride + p.y_off + o;
        if (GLU == 0u) {
            y[at] = red[lid * WG];
        } else {
            y[at] = activate(GLU - 1u, red[lid * WG]) * red[(MAXR + lid) * WG];
        }
    }
}
