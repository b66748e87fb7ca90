// Q5_0, 22-byte blocks of 32: d: f16, qh: u32 (little-endian), qs: [u8; 16]; value j =
// (q_j + 16 h_j - 16) d, q_j the nibble as in Q4_0, h_j bit j of qh.
struct UnitParams { base: u32, d: f32, qh: u32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let b = rb + 22u * u;
    return UnitParams(b, half_at(b), u32_at(b + 2u));
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let n = nibbles(u32_at(q.base + 6u + 4u * (j4 & 3u)), 4u * (j4 >> 2u));
    let h = ((vec4<u32>(q.qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + 4u * j4)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return (vec4<f32>(n | h) - 16.0) * q.d;
}
