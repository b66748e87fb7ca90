// Q6_K, 210-byte super-blocks of 256: ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16.
// Unit s < 8 (32 values, l < 32) lies in half n = s / 4, quarter t = s % 4: its 6-bit q_l is
// the low (t < 2) or high nibble of ql[64 n + 32 (t % 2) + l] with bits 2t, 2t + 1 of
// qh[32 n + l] above; value l = d scales[2 s + l / 16] (q_l - 32).
struct UnitParams { ql: u32, qh: u32, t: u32, a0: f32, a1: f32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let base = rb + 210u * (u >> 3u);
    let s = u & 7u;
    let n = s >> 2u;
    let t = s & 3u;
    let d = half_at(base + 208u);
    return UnitParams(base + 64u * n + 32u * (t & 1u), base + 128u + 32u * n, t,
                      d * f32(i8_at(base + 192u + 2u * s)),
                      d * f32(i8_at(base + 193u + 2u * s)));
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let lo = nibbles(u32_at(q.ql + 4u * j4), 4u * (q.t >> 1u));
    let hi = ((vec4<u32>(u32_at(q.qh + 4u * j4)) >> (vec4<u32>(0u, 8u, 16u, 24u) + 2u * q.t)) & vec4<u32>(3u)) << vec4<u32>(4u);
    let a = select(q.a0, q.a1, j4 >= 4u);
    return a * (vec4<f32>(lo | hi) - 32.0);
}
