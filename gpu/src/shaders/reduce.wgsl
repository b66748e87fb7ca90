// Workgroup reductions over 256 invocations (prepended to the kernels that use them). Call
// from uniform control flow: every invocation of the workgroup, the same number of times.
const WG: u32 = 256u;
var<workgroup> red: array<f32, 256>;

// The sum of `v` over the workgroup, pairwise (a tree of adds), returned to every invocation.
fn wg_sum(v: f32, lid: u32) -> f32 {
    workgroupBarrier();
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    return red[0];
}

// The maximum of `v` over the workgroup, returned to every invocation.
fn wg_max(v: f32, lid: u32) -> f32 {
    workgroupBarrier();
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    return red[0];
}
