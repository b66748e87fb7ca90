// Greedy argmax over x [rows, n], the lowest index on ties (as the CPU's greedy pick), in
// chunks of `chunk` entries: one workgroup per (row, chunk) writes the chunk's largest value
// and its index to part_v, part_i [rows, chunks] (and the index to ids[row] when the row is one
// chunk; argmax_merge.wgsl merges the chunks otherwise). Each invocation scans a strided slice
// keeping its first maximum, then a tree merge prefers the larger value, and the lower index
// on equal values.
struct Params { rows: u32, n: u32, chunk: u32, chunks: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> part_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> part_i: array<u32>;

const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let row = g / p.chunks;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    let end = min(p.n, (g % p.chunks + 1u) * p.chunk);
    var bv = 0.0;
    var bi = NONE;
    for (var i = (g % p.chunks) * p.chunk + lid; i < end; i += 256u) {
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
        if (p.chunks == 1u) {
            ids[row] = best_i[0];
        } else {
            part_v[g] = best_v[0];
            part_i[g] = best_i[0];
        }
    }
}
