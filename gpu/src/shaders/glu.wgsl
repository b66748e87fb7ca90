// Gated linear units, y [rows, d_ff] = act(gate) · up, one invocation per output element.
// Split (fused = 0): gate and up are separate [rows, d_ff] buffers. Fused (fused = 1): both
// bindings are one [rows, 2·d_ff] buffer, gate in the first half of each row, up in the second.
struct Params { n: u32, d_ff: u32, kind: u32, fused: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    var g = 0.0;
    var u = 0.0;
    if (p.fused != 0u) {
        let r = i / p.d_ff;
        let j = i % p.d_ff;
        g = gate[2u * r * p.d_ff + j];
        u = up[(2u * r + 1u) * p.d_ff + j];
    } else {
        g = gate[i];
        u = up[i];
    }
    y[i] = activate(p.kind, g) * u;
}
