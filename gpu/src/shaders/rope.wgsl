// Rotary position embedding, in place on x [rows, heads, d_head], one invocation per rotated
// pair (row, head, i) for i < half = rotary_dims / 2:
//   (x_a, x_b) ← f · (x_a cos φ − x_b sin φ, x_a sin φ + x_b cos φ),  φ = pos[row] · θ_i
// with pairs (a, b) = (i, i + half) (half-split, NeoX / HF Llama) or (2i, 2i + 1) (interleaved,
// GPT-J). θ_i comes as the 64-bit binary fraction of θ_i / 2π (turns: hi word, lo word), so
// the angle is reduced exactly in integer arithmetic, φ mod 2π = 2π · frac(pos · θ_i / 2π),
// before the f32 sine and cosine of an argument in [−π, π).
struct Params { total: u32, heads: u32, d_head: u32, half: u32, interleaved: u32, factor: f32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> turns: array<u32>;

// The high 32 bits of the 64-bit product a · b.
fn mul_hi(a: u32, b: u32) -> u32 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
}

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
    let pos = positions[row];
    let hi = turns[2u * i];
    let lo = turns[2u * i + 1u];
    // frac(pos · t) as a 64-bit fraction: (pos · hi) · 2^-32 + (pos · lo) · 2^-64, mod 1.
    let t_hi = pos * hi + mul_hi(pos, lo);
    let t_lo = pos * lo;
    // As a signed fraction in [−1/2, 1/2): the f32 angle is then at most π.
    let t = f32(bitcast<i32>(t_hi)) * 2.3283064365386963e-10 + f32(t_lo) * 5.421010862427522e-20;
    let phi = t * 6.283185307179586;
    let c = cos(phi) * p.factor;
    let s = sin(phi) * p.factor;
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
