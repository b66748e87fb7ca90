// The rotation of RoPE's pair i at position pos: (f cos φ, f sin φ), φ = pos · θ_i. θ_i comes
// as the 64-bit binary fraction of θ_i / 2π in `turns` (hi word, lo word), so the angle is
// reduced exactly in integer arithmetic, φ mod 2π = 2π · frac(pos · θ_i / 2π), before the f32
// sine and cosine of an argument in [−π, π). The kernel declares `turns`.

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

fn rope_cs(pos: u32, i: u32, factor: f32) -> vec2<f32> {
    let hi = turns[2u * i];
    let lo = turns[2u * i + 1u];
    // frac(pos · t) as a 64-bit fraction: (pos · hi) · 2^-32 + (pos · lo) · 2^-64, mod 1.
    let t_hi = pos * hi + mul_hi(pos, lo);
    let t_lo = pos * lo;
    // As a signed fraction in [−1/2, 1/2): the f32 angle is then at most π.
    let t = f32(bitcast<i32>(t_hi)) * 2.3283064365386963e-10 + f32(t_lo) * 5.421010862427522e-20;
    let phi = t * 6.283185307179586;
    return vec2<f32>(cos(phi) * factor, sin(phi) * factor);
}
