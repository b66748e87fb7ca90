// Q4_K / Q5_K: sub-block `s < 8`'s 6-bit scale and minimum from the 12 bytes at `sc`
// (ggml's get_scale_min_k4): for s < 4 the low 6 bits of bytes s and s + 4; for s >= 4 the
// nibbles of byte s + 4 with the top 2 bits of bytes s - 4 and s above them.
fn scale_min_k4(sc: u32, s: u32) -> vec2<f32> {
    if (s < 4u) {
        return vec2<f32>(f32(byte_at(sc + s) & 63u), f32(byte_at(sc + s + 4u) & 63u));
    }
    let b = byte_at(sc + s + 4u);
    let lo = byte_at(sc + s - 4u) >> 6u;
    let hi = byte_at(sc + s) >> 6u;
    return vec2<f32>(f32((b & 15u) | (lo << 4u)), f32((b >> 4u) | (hi << 4u)));
}
