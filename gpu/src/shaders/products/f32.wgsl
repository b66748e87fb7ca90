// F32: one little-endian f32 per value. Units past d_in (a row's last partial unit) read 0.
struct UnitParams { unused: u32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    return UnitParams(0u);
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let k = 32u * u + 4u * j4;
    let i = (rb >> 2u) + k;
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (k + c < p.d_in) {
            v[c] = bitcast<f32>(w[i + c]);
        }
    }
    return v;
}
