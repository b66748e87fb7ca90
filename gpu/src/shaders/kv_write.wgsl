// Stores new keys and values into the paged cache, one invocation per element of
// k_new, v_new [n_new, n_kv, d]: row r (of sequence row_seq[r], at position row_pos[r]) goes
// to slot table[seq, pos / bs] · bs + pos % bs of k_cache, v_cache [num_blocks, bs, n_kv, d].
struct Params { n: u32, row_len: u32, bs: u32, max_blocks: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k_new: array<f32>;
@group(0) @binding(2) var<storage, read> v_new: array<f32>;
@group(0) @binding(3) var<storage, read> row_seq: array<u32>;
@group(0) @binding(4) var<storage, read> row_pos: array<u32>;
@group(0) @binding(5) var<storage, read> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let e = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (e >= p.n) {
        return;
    }
    let r = e / p.row_len;
    let pos = row_pos[r];
    let slot = table[row_seq[r] * p.max_blocks + pos / p.bs] * p.bs + pos % p.bs;
    let at = slot * p.row_len + e % p.row_len;
    k_cache[at] = k_new[e];
    v_cache[at] = v_new[e];
}
