// The second pass of a chunked argmax (argmax.wgsl): ids[row] = the index of the best of the
// row's chunk maxima part_v, part_i [rows, chunks] — the larger value, the lower index on
// equal values. One workgroup per row.
struct Params { rows: u32, chunks: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part_v: array<f32>;
@group(0) @binding(2) var<storage, read> part_i: array<u32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;

const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

// Whether (ov, oi) beats (sv, si).
fn better(ov: f32, oi: u32, sv: f32, si: u32) -> bool {
    return oi != NONE && (si == NONE || ov > sv || (ov == sv && oi < si));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    var bv = 0.0;
    var bi = NONE;
    for (var c = lid; c < p.chunks; c += 256u) {
        let v = part_v[row * p.chunks + c];
        let i = part_i[row * p.chunks + c];
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s && better(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ids[row] = best_i[0];
    }
}
