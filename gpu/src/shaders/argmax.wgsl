// ids[row] = the index of the largest entry of row `row` of x [rows, n], the lowest index on
// ties (as the CPU's greedy pick). One workgroup per row: each invocation scans a strided
// slice keeping its first maximum, then a tree merge that prefers the larger value, and the
// lower index on equal values.
struct Params { rows: u32, n: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var bv = 0.0;
    var bi = NONE;
    for (var i = lid; i < p.n; i += 256u) {
        let v = x[base + i];
        if (bi == NONE || v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            let sv = best_v[lid];
            let si = best_i[lid];
            if (oi != NONE && (si == NONE || ov > sv || (ov == sv && oi < si))) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ids[row] = best_i[0];
    }
}
