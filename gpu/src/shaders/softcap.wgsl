// x[i] = c · tanh(x[i] / c): the soft cap of the logits (Gemma 2).
struct Params { n: u32, c: f32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i < p.n) {
        x[i] = p.c * tanh(x[i] / p.c);
    }
}
