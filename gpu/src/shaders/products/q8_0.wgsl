// Q8_0, 34-byte blocks of 32: d: f16, qs: [i8; 32]; value j = qs[j] d.
struct UnitParams { base: u32, d: f32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    let b = rb + 34u * u;
    return UnitParams(b, half_at(b));
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let word = bitcast<i32>(u32_at(q.base + 2u + 4u * j4));
    let s = (vec4<i32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(s) * q.d;
}
