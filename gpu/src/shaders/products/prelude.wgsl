// The weight products' common part: parameters, the weight buffer (raw bytes as u32 words,
// little-endian) and the readers of bytes, halves and 32-bit words at any byte offset.
// A format file follows (`UnitParams`, `unit_params`, `unit_values`: the 32 values of unit
// `u` of a row, four at a time), then one kernel body (matvec, matmul or gather).
struct Params {
    rows: u32,      // activation rows (matvec, matmul) or ids (gather)
    d_in: u32,      // values per weight row
    d_out: u32,     // weight rows
    row_bytes: u32, // bytes per weight row
    n_units: u32,   // ceil(d_in / 32): units of 32 values per row
    tiles_n: u32,   // matmul: output tiles along d_out
    y_stride: u32,  // matvec, matmul: output y[r, o] is y[r * y_stride + y_off + o]
    y_off: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;

// Byte `b` of the weights.
fn byte_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The little-endian u32 of bytes b..b+4, at any offset.
fn u32_at(b: u32) -> u32 {
    let s = (b & 3u) * 8u;
    let lo = w[b >> 2u];
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (w[(b >> 2u) + 1u] << (32u - s));
}

// The f16 at an even byte offset `b`, as f32.
fn half_at(b: u32) -> f32 {
    return unpack2x16float(w[b >> 2u] >> ((b & 2u) * 8u)).x;
}

// Byte `b` as a signed 8-bit integer.
fn i8_at(b: u32) -> i32 {
    return bitcast<i32>(byte_at(b) << 24u) >> 24u;
}

// The four nibbles at bit `shift` (0 or 4) of the bytes of `q`.
fn nibbles(q: u32, shift: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
}
