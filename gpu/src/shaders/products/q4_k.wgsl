// Q4_K, 144-byte super-blocks of 256: d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128].
// Unit s < 8 of the super-block (32 values) is d sc_s q - dmin m_s, with (sc_s, m_s) the
// 6-bit pair of scale_min_k4 and q the low (s even) or high (s odd) nibbles of
// qs[32 (s / 2) .. 32 (s / 2) + 32].
struct UnitParams { qs: u32, shift: u32, a: f32, b: f32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let base = rb + 144u * (u >> 3u);
    let s = u & 7u;
    let sm = scale_min_k4(base + 4u, s);
    return UnitParams(base + 16u + 32u * (s >> 1u), 4u * (s & 1u),
                      half_at(base) * sm.x, half_at(base + 2u) * sm.y);
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let n = nibbles(u32_at(q.qs + 4u * j4), q.shift);
    return q.a * vec4<f32>(n) - q.b;
}
