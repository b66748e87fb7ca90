// Paged decode attention, second pass: merges the partitions of each (sequence, head),
//   M = max_p m_p,  L = Σ_p l_p exp(m_p − M),  o = Σ_p acc_p exp(m_p − M) / L,
// skipping partitions with l_p = 0 (past the context). One workgroup per (sequence, head),
// one invocation per dim.
struct Params { rows: u32, parts: u32, d: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part_ml: array<f32>;
@group(0) @binding(2) var<storage, read> part_acc: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let sh = wid.x + wid.y * nwg.x;
    if (sh >= p.rows || lid >= p.d) {
        return;
    }
    let first = sh * p.parts;
    var m = -3.0e38;
    for (var i = 0u; i < p.parts; i++) {
        if (part_ml[2u * (first + i) + 1u] > 0.0) {
            m = max(m, part_ml[2u * (first + i)]);
        }
    }
    var l = 0.0;
    var acc = 0.0;
    for (var i = 0u; i < p.parts; i++) {
        let li = part_ml[2u * (first + i) + 1u];
        if (li > 0.0) {
            let w = exp(part_ml[2u * (first + i)] - m);
            l += li * w;
            acc += part_acc[(first + i) * p.d + lid] * w;
        }
    }
    var res = 0.0;
    if (l > 0.0) {
        res = acc / l;
    }
    o[sh * p.d + lid] = res;
}
