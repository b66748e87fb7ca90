// Q5_K, 176-byte super-blocks of 256: d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32],
// qs: [u8; 128]. Unit s < 8 (32 values, l < 32) is d sc_s (q_l + 16 h_l) - dmin m_s, as
// Q4_K with h_l = bit s of qh[l].
struct UnitParams { base: u32, s: u32, a: f32, b: f32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let base = rb + 176u * (u >> 3u);
    let s = u & 7u;
    let sm = scale_min_k4(base + 4u, s);
    return UnitParams(base, s, half_at(base) * sm.x, half_at(base + 2u) * sm.y);
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let n = nibbles(u32_at(q.base + 48u + 32u * (q.s >> 1u) + 4u * j4), 4u * (q.s & 1u));
    let qh = u32_at(q.base + 16u + 4u * j4);
    let h = ((vec4<u32>(qh) >> (vec4<u32>(0u, 8u, 16u, 24u) + q.s)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return q.a * vec4<f32>(n | h) - q.b;
}
