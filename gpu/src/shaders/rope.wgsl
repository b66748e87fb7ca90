// Rotary position embedding, in place on x [rows, heads, d_head], one invocation per rotated
// pair (row, head, i) for i < half = rotary_dims / 2:
//   (x_a, x_b) ← f · (x_a cos φ − x_b sin φ, x_a sin φ + x_b cos φ),  φ = pos[row] · θ_i
// with pairs (a, b) = (i, i + half) (half-split, NeoX / HF Llama) or (2i, 2i + 1) (interleaved,
// GPT-J). θ_i comes as the 64-bit binary fraction of θ_i / 2π (turns: hi word, lo word), so
// the angle is reduced exactly in integer arithmetic (rope_fns.wgsl).
struct Params { total: u32, heads: u32, d_head: u32, half: u32, interleaved: u32, factor: f32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> turns: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= p.total) {
        return;
    }
    let i = idx % p.half;
    let rh = idx / p.half;
    let row = rh / p.heads;
    let base = rh * p.d_head;
    var a = base + i;
    var b = base + i + p.half;
    if (p.interleaved != 0u) {
        a = base + 2u * i;
        b = a + 1u;
    }
    let cs = rope_cs(positions[row], i, p.factor);
    let c = cs.x;
    let s = cs.y;
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
