// F16: one IEEE half per value, two per word (the first in the low 16 bits).
struct UnitParams { unused: u32 }
fn unit_params(rb: u32, u: u32) -> UnitParams {
    return UnitParams(0u);
}
fn unit_values(rb: u32, u: u32, j4: u32, q: UnitParams) -> vec4<f32> {
    let k = 32u * u + 4u * j4;
    let h = (rb >> 1u) + k;
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (k + c < p.d_in) {
            let i = h + c;
            v[c] = unpack2x16float(w[i >> 1u] >> ((i & 1u) * 16u)).x;
        }
    }
    return v;
}
