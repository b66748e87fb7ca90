// dst[i, k] = W[ids[i], k]: one invocation per 4 values; an id >= d_out gives zeros (or, for
// one run of a table cut into several, leaves the row alone).
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = (wid.x + wid.y * nwg.x) * 256u + lid;
    let per_row = 8u * p.n_units;
    let i = t / per_row;
    if (i >= p.rows) {
        return;
    }
    let piece = t % per_row;
    let u = piece >> 3u;
    let j4 = piece & 7u;
    // A table of rows y_off .. of a larger one (tiles_n = 1) reads ids[i] − y_off and
    // leaves the rows of other ids alone (wrapping below y_off to a large id).
    let id = ids[i] - p.y_off;
    if (p.tiles_n == 1u && id >= p.d_out) {
        return;
    }
    var v = vec4<f32>(0.0);
    if (id < p.d_out) {
        let rb = id * p.row_bytes;
        v = unit_values(rb, u, j4, unit_params(rb, u));
    }
    let k = 32u * u + 4u * j4;
    for (var c = 0u; c < 4u; c++) {
        if (k + c < p.d_in) {
            dst[i * p.d_in + k + c] = v[c];
        }
    }
}
