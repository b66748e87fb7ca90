// Q4_0, 18-byte blocks of 32: d: f16, qs: [u8; 16]; value j = (q_j - 8) d, q_j the low
// nibble of qs[j] (j < 16) or the high nibble of qs[j - 16].
struct UnitParams { base: u32, d: f32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let b = rb + 18u * u;
    return UnitParams(b, half_at(b));
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let n = nibbles(u32_at(q.base + 2u + 4u * (j4 & 3u)), 4u * (j4 >> 2u));
    return (vec4<f32>(n) - 8.0) * q.d;
}
