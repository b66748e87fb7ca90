//! int8 weights per output row, int8 activations per row (CTranslate2's `int8` compute type):
//!
//! ```text
//! s_o = max_k |w_ok| / 127,  q_ok = round(w_ok / s_o)        (once, at load)
//! t_r = max_k |x_rk| / 127,  p_rk = round(x_rk / t_r)        (every call)
//! y_ro = s_o t_r Σ_k q_ok p_rk
//! ```
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so the activations are stored as
//! `u_rk = p_rk + 128 ∈ [1, 255]` and the kernel subtracts `128 Σ_k q_ok` (kept per row):
//! `Σ_k q_ok p_rk = Σ_k q_ok u_rk - 128 Σ_k q_ok`. Every sum is an exact i32 (each term is at
//! most 255 · 127, and rows are limited to [`MAX_COLS`] elements), so the portable, the
//! AVX-512 and the AVX2 kernel (`int8_avx2.rs`: `vpmaddubsw` / `vpmaddwd` with ggml's sign
//! trick, which sums `Σ_k q_ok p_rk` directly) give bit-identical results.
//!
//! The product is a register-tiled GEMM, as oneDNN's int8 kernels are: the weight is stored
//! in panels of [`LANES`] outputs, each input group of four bytes of the 16 outputs side by
//! side (`[panel][k / 4][lane][4]`, zero-padded), so one 64-byte load holds 16 outputs × 4
//! inputs and `vpdpbusd` against four broadcast activation bytes adds four products into each
//! output's own i32 lane: no horizontal sums. A tile keeps [`TILE_ROWS`] activation rows ×
//! [`TILE_PANELS`] panels (64 outputs) of accumulators in registers; `y` is written row-major
//! from them directly.

use super::Kernel;
use rayon::prelude::*;

/// Outputs per panel: the 16 i32 lanes of one AVX-512 register.
pub const LANES: usize = 16;
/// Activation rows per register tile.
pub const TILE_ROWS: usize = 4;
/// Panels per register tile (and per parallel task).
pub const TILE_PANELS: usize = 4;
/// The longest row: `255 · 127 · MAX_COLS` stays below `i32::MAX`.
pub const MAX_COLS: usize = 65_536;

/// `W [rows, cols]` as int8 with one scale per row, in panels of 16 rows.
#[derive(Clone, Debug)]
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    /// Input groups of four: `⌈cols / 4⌉`.
    groups: usize,
    /// `[panels, groups, LANES, 4]`: `q_ok` of output `LANES · panel + lane`, input
    /// `4 · group + j`; zero past `rows` and `cols`.
    q: Vec<i8>,
    /// `[panels · LANES]`: `s_o` (0 past `rows`).
    scale: Vec<f32>,
    /// `[panels · LANES]`: `Σ_k q_ok`.
    row_sum: Vec<i32>,
}

/// Activations: `u = p + 128` `[n, 4 · groups]` (padded with 128, `p = 0`) and the row
/// scales `t [n]`.
pub struct Int8Acts {
    stride: usize,
    /// `u = p + 128`, or, where [`signed`](Self::signed), `p` itself (as i8 bytes).
    u: Vec<u8>,
    scale: Vec<f32>,
    /// Whether `u` holds `p`: for the plain AVX2 kernel, which multiplies signed bytes and
    /// would otherwise flip every byte's top bit once per panel.
    signed: bool,
    /// Where `signed`: whether every `p` is at least 0 (after a ReLU), so that the plain AVX2
    /// kernel can take `p` as the unsigned side of its byte products.
    non_negative: bool,
    /// Where `signed` and not `non_negative`: `|p|` in `u`'s layout, the unsigned side of the
    /// plain AVX2 kernel's products (empty otherwise).
    magnitude: Vec<u8>,
    /// Where `signed`: which groups of four inputs the plain AVX2 kernel adds two at a time.
    #[cfg(target_arch = "x86_64")]
    plan: Option<super::int8_avx2::GroupPlan>,
}

/// `max_k |row_k|` (in lanes, so that it vectorises; a maximum is exact in any order).
#[inline(always)]
fn max_abs(row: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = row.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let m = lanes.iter().fold(0f32, |m, &v| m.max(v));
    rest.iter().fold(m, |m, v| m.max(v.abs()))
}

/// The symmetric int8 scale of one row (0 for an all-zero row) and `1 / scale` (0 then).
#[inline(always)]
fn row_scale(row: &[f32]) -> (f32, f32) {
    let scale = max_abs(row) / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    (scale, inv)
}

/// `round(v · inv)` clamped to ±127.
#[inline(always)]
pub(super) fn quantize(v: f32, inv: f32) -> f32 {
    super::round_small((v * inv).clamp(-127.0, 127.0))
}

/// `u_k = round(x_k / t) + 128` for one activation row; returns `t`.
#[inline(always)]
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8]) -> f32 {
    let (s, inv) = row_scale(src);
    for (d, &v) in dst.iter_mut().zip(src) {
        // An integer in [1, 255]: exact.
        *d = (quantize(v, inv) + 128.0) as u8;
    }
    s
}

/// [`quantize_row`] with AVX-512 instructions: the same operations on 16 lanes (the maximum
/// ignores NaN as `f32::max` does; finite inputs give the same bits).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_row_avx512(src: &[f32], dst: &mut [u8]) -> f32 {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let tail = n % 16;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as u16;
    // SAFETY (here and below): full loads and stores at i < n - tail cover 16 elements
    // inside both slices; the tail's are masked to its `tail` elements.
    let mut amax = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let v = _mm512_abs_ps(_mm512_loadu_ps(src.as_ptr().add(i)));
        amax = _mm512_max_ps(v, amax);
        i += 16;
    }
    if tail > 0 {
        let v = _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask, src.as_ptr().add(i)));
        amax = _mm512_max_ps(v, amax);
    }
    let scale = _mm512_reduce_max_ps(amax) / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let (inv, lo, hi) = (
        _mm512_set1_ps(inv),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    let (magic, offset) = (_mm512_set1_ps(12_582_912.0), _mm512_set1_ps(128.0));
    // round_small(clamp(v · inv, ±127)) + 128, as an integer in [1, 255], to a byte.
    let quantize = |v: __m512| {
        let c = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, inv), lo), hi);
        let r = _mm512_sub_ps(_mm512_add_ps(c, magic), magic);
        _mm512_cvttps_epi32(_mm512_add_ps(r, offset))
    };
    let mut i = 0;
    while i + 16 <= n {
        let q = quantize(_mm512_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(
            dst.as_mut_ptr().add(i) as *mut __m128i,
            _mm512_cvtepi32_epi8(q),
        );
        i += 16;
    }
    if tail > 0 {
        let q = quantize(_mm512_maskz_loadu_ps(tail_mask, src.as_ptr().add(i)));
        _mm512_mask_cvtepi32_storeu_epi8(dst.as_mut_ptr().add(i) as *mut i8, tail_mask, q);
    }
    scale
}

impl Int8Matrix {
    /// Quantises `w [rows, cols]` per row, or says why not (a row longer than `MAX_COLS` (65,536),
    /// a value that is not finite).
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Result<Int8Matrix, String> {
        assert_eq!(w.len(), rows * cols, "int8 weight is not [rows, cols]");
        if cols > MAX_COLS {
            return Err(format!(
                "int8 rows of {cols} elements are longer than the {MAX_COLS} the kernel sums exactly"
            ));
        }
        if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
            return Err(format!("int8 weight holds a non-finite value {bad}"));
        }
        let groups = cols.div_ceil(4).max(1);
        let padded_rows = rows.div_ceil(LANES) * LANES;
        let mut q = vec![0i8; padded_rows * groups * 4];
        let mut scale = vec![0f32; padded_rows];
        let mut row_sum = vec![0i32; padded_rows];
        for (o, src) in w.chunks_exact(cols.max(1)).enumerate().take(rows) {
            let (s, inv) = row_scale(src);
            scale[o] = s;
            let (panel, lane) = (o / LANES, o % LANES);
            for (k, &v) in src.iter().enumerate() {
                let p = quantize(v, inv) as i8;
                q[((panel * groups + k / 4) * LANES + lane) * 4 + k % 4] = p;
                row_sum[o] += i32::from(p);
            }
        }
        Ok(Int8Matrix {
            rows,
            cols,
            groups,
            q,
            scale,
            row_sum,
        })
    }

    /// Already-quantised rows `q [rows, cols]` with their scales `scale [rows]` (`w ≈ q · s`,
    /// e.g. a CTranslate2 `int8` weight, whose `1 / weight_scale` is `s`), laid out as
    /// [`from_f32`](Self::from_f32) lays out its own: nothing is re-quantised. An error says
    /// why not (lengths, a row longer than `MAX_COLS`, a scale that is not finite, −128).
    pub fn from_quantized(q: &[i8], scale: &[f32], rows: usize, cols: usize) -> Result<Int8Matrix, String> {
        if q.len() != rows * cols || scale.len() != rows {
            return Err(format!(
                "int8 rows: {} values and {} scales for [{rows}, {cols}]",
                q.len(),
                scale.len()
            ));
        }
        if cols > MAX_COLS {
            return Err(format!("int8 rows of {cols} elements are longer than {MAX_COLS}"));
        }
        if let Some(s) = scale.iter().find(|s| !s.is_finite()) {
            return Err(format!("int8 row scale {s} is not finite"));
        }
        // The kernels' sums assume |q| ≤ 127 (symmetric quantisation never gives −128).
        if q.contains(&i8::MIN) {
            return Err("int8 weight holds −128 (symmetric quantisation stays within ±127)".into());
        }
        let groups = cols.div_ceil(4).max(1);
        let padded_rows = rows.div_ceil(LANES) * LANES;
        let mut packed = vec![0i8; padded_rows * groups * 4];
        let mut scales = vec![0f32; padded_rows];
        let mut row_sum = vec![0i32; padded_rows];
        for (o, src) in q.chunks_exact(cols.max(1)).enumerate().take(rows) {
            scales[o] = scale[o];
            let (panel, lane) = (o / LANES, o % LANES);
            for (k, &p) in src.iter().enumerate() {
                packed[((panel * groups + k / 4) * LANES + lane) * 4 + k % 4] = p;
                row_sum[o] += i32::from(p);
            }
        }
        Ok(Int8Matrix { rows, cols, groups, q: packed, scale: scales, row_sum })
    }

    /// `d_out`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// `d_in`.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Weight `(o, k)` as stored: `s_o · q_ok`.
    pub fn get(&self, o: usize, k: usize) -> f32 {
        self.scale[o] * f32::from(self.q_at(o, k))
    }

    fn q_at(&self, o: usize, k: usize) -> i8 {
        let (panel, lane) = (o / LANES, o % LANES);
        self.q[((panel * self.groups + k / 4) * LANES + lane) * 4 + k % 4]
    }

    pub fn bytes(&self) -> usize {
        self.q.len() + self.scale.len() * 8
    }

    /// Whether `kernel` runs on this CPU for int8.
    pub fn runs(&self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::Portable => true,
            Kernel::Avx2 => super::has_avx2(),
            Kernel::Avx512 => super::has_vnni(),
        }
    }

    /// Quantises `x [n, cols]` per row into `u = p + 128` (with `kernel`'s instructions: the
    /// same code and the same bits either way), or, where `signed` (the plain AVX2 kernel),
    /// into `p` itself, noting whether every `p` is at least 0.
    fn quantize_acts(&self, kernel: Kernel, x: &[f32], n: usize, signed: bool) -> Int8Acts {
        let stride = self.groups * 4;
        // The padding: p = 0.
        let mut u = vec![if signed { 0 } else { 128u8 }; n * stride];
        let mut scale = Vec::with_capacity(n);
        // The OR of every p byte (where `signed`): a top bit set is a p below 0.
        let mut top_bits = 0u8;
        for (dst, src) in u
            .chunks_exact_mut(stride)
            .zip(x.chunks_exact(self.cols.max(1)))
        {
            let s = match kernel {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: product only passes Avx512 after runs(Avx512) (AVX-512F).
                Kernel::Avx512 => unsafe { quantize_row_avx512(src, dst) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: product only passes Avx2 after runs(Avx2) (AVX2).
                Kernel::Avx2 if signed => unsafe {
                    let (s, bits) = super::int8_avx2::quantize_row_signed(src, dst);
                    top_bits |= bits;
                    s
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Kernel::Avx2 => unsafe { super::int8_avx2::quantize_row(src, dst) },
                _ => quantize_row(src, dst),
            };
            scale.push(s);
        }
        let non_negative = signed && top_bits & 0x80 == 0;
        let magnitude = match signed && !non_negative {
            true => u.iter().map(|&p| (p as i8).unsigned_abs()).collect(),
            false => Vec::new(),
        };
        #[cfg(target_arch = "x86_64")]
        let plan = signed.then(|| {
            let p_abs = if non_negative { &u } else { &magnitude };
            super::int8_avx2::GroupPlan::new(p_abs, stride, n)
        });
        Int8Acts {
            stride,
            u,
            scale,
            signed,
            non_negative,
            magnitude,
            #[cfg(target_arch = "x86_64")]
            plan,
        }
    }

    /// `y [rows, d_out] = x [rows, d_in] · Wᵀ` with `kernel`, parallel over groups of
    /// four panels (64 outputs).
    pub fn product(&self, kernel: Kernel, y: &mut [f32], x: &[f32], rows: usize) {
        let d_out = self.rows;
        let shape = (d_out, self.cols);
        if !super::check_operands(shape, y, x, rows, kernel, self.runs(kernel)) {
            return;
        }
        // The plain AVX2 kernel takes signed activations; decided once for the whole product.
        #[cfg(target_arch = "x86_64")]
        let signed = kernel == Kernel::Avx2 && !super::int8_avx2::uses_avx_vnni();
        #[cfg(not(target_arch = "x86_64"))]
        let signed = false;
        let acts = self.quantize_acts(kernel, x, rows, signed);
        let out = OutPtr(y.as_mut_ptr());
        let task = |g: usize| {
            let p0 = g * TILE_PANELS;
            let panels = TILE_PANELS.min(d_out.div_ceil(LANES) - p0);
            // SAFETY: this task writes y[r · d_out + o] for r < rows and o in its own outputs
            // [LANES · p0, LANES · (p0 + panels)) ∩ [0, d_out) only: the groups' outputs are
            // disjoint, every index lies inside y (exclusively borrowed for this call), and
            // the parallel loop below joins before `product` returns.
            unsafe { self.fill_group(kernel, &acts, rows, p0, panels, &out) };
        };
        let n_groups = d_out.div_ceil(LANES * TILE_PANELS);
        if super::products_are_serial() || n_groups == 1 {
            (0..n_groups).for_each(task);
        } else {
            (0..n_groups).into_par_iter().for_each(task);
        }
    }

    /// Writes the outputs of panels `p0 .. p0 + panels` for every activation row.
    ///
    /// # Safety
    /// `out` points at `y [rows, d_out]`, and no other thread writes these outputs meanwhile.
    unsafe fn fill_group(
        &self,
        kernel: Kernel,
        acts: &Int8Acts,
        rows: usize,
        p0: usize,
        panels: usize,
        out: &OutPtr,
    ) {
        let d_out = self.rows;
        let o0 = p0 * LANES;
        // Outputs of the group's last panel that exist.
        let last_lanes = (d_out - o0 - (panels - 1) * LANES).min(LANES);
        match kernel {
            Kernel::Portable => {
                for r in 0..rows {
                    let u = &acts.u[r * acts.stride..(r + 1) * acts.stride];
                    for o in o0..(o0 + panels * LANES).min(d_out) {
                        let (panel, lane) = (o / LANES, o % LANES);
                        let mut sum = 0i32;
                        for g in 0..self.groups {
                            let w = &self.q[((panel * self.groups + g) * LANES + lane) * 4..][..4];
                            for j in 0..4 {
                                sum += i32::from(w[j]) * i32::from(u[4 * g + j]);
                            }
                        }
                        let v = self.output(sum, o, acts.scale[r]);
                        // SAFETY (caller): r < rows and o < d_out, an output of this group.
                        unsafe { *out.0.add(r * d_out + o) = v };
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                let panel_bytes = self.groups * LANES * 4;
                for r0 in (0..rows).step_by(TILE_ROWS) {
                    let tile = avx512::Tile {
                        q: self.q[p0 * panel_bytes..].as_ptr(),
                        panel_bytes,
                        groups: self.groups,
                        u: acts.u[r0 * acts.stride..].as_ptr(),
                        u_stride: acts.stride,
                        row_sum: self.row_sum[o0..].as_ptr(),
                        scale: self.scale[o0..].as_ptr(),
                        t: acts.scale[r0..].as_ptr(),
                        y: out.0.add(r0 * d_out + o0),
                        d_out,
                        last_lanes,
                    };
                    macro_rules! by_panels {
                        ($r:literal) => {
                            match panels {
                                1 => tile.run::<$r, 1>(),
                                2 => tile.run::<$r, 2>(),
                                3 => tile.run::<$r, 3>(),
                                _ => tile.run::<$r, 4>(),
                            }
                        };
                    }
                    // SAFETY: product only passes Avx512 after runs(Avx512)
                    // (AVX-512F and VNNI present). The tile reads panels p0 .. p0 + panels
                    // (inside q, padded to whole panels), rows r0 .. r0 + R of u and t, and
                    // writes rows r0 .. r0 + R of y at this group's outputs, the last panel's
                    // past d_out masked off (the caller's guarantee covers them).
                    match (rows - r0).min(TILE_ROWS) {
                        1 => by_panels!(1),
                        2 => by_panels!(2),
                        3 => by_panels!(3),
                        _ => by_panels!(4),
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                let panel_bytes = self.groups * LANES * 4;
                for p in 0..panels {
                    let o = o0 + p * LANES;
                    for r0 in (0..rows).step_by(TILE_ROWS) {
                        let (twos, ones) = match &acts.plan {
                            Some(plan) => plan.tile(r0),
                            None => (&[][..], &[][..]),
                        };
                        let u = acts.u[r0 * acts.stride..].as_ptr();
                        // |p| beside p, or p itself where no p is below 0 (or unused).
                        let magnitude = acts.magnitude.get(r0 * acts.stride..);
                        let tile = super::int8_avx2::Tile {
                            q: self.q[(p0 + p) * panel_bytes..].as_ptr(),
                            groups: self.groups,
                            u,
                            magnitude: magnitude.map_or(u, <[u8]>::as_ptr),
                            u_stride: acts.stride,
                            twos,
                            ones,
                            scale: self.scale[o..].as_ptr(),
                            row_sum: self.row_sum[o..].as_ptr(),
                            t: acts.scale[r0..].as_ptr(),
                            y: out.0.add(r0 * d_out + o),
                            d_out,
                            lanes: if p + 1 == panels { last_lanes } else { LANES },
                        };
                        macro_rules! by_rows {
                            ($run:ident) => {
                                match (rows - r0).min(TILE_ROWS) {
                                    1 => tile.$run::<1>(),
                                    2 => tile.$run::<2>(),
                                    3 => tile.$run::<3>(),
                                    _ => tile.$run::<4>(),
                                }
                            };
                        }
                        // SAFETY: product only passes Avx2 after runs(Avx2) (AVX2 present).
                        // The tile reads panel p0 + p (inside q, padded to whole panels), its
                        // 16 scales (padded), rows r0 .. r0 + R of u and t, and writes rows
                        // r0 .. r0 + R of y at this panel's outputs that exist (the caller's
                        // guarantee covers them), and its 16 row sums (padded like the
                        // scales); run_vnni only where uses_avx_vnni() found AVX-VNNI (then
                        // `acts` holds u), run where it holds p and |p| (`magnitude`, rows
                        // r0 .. r0 + R), run_non_negative where every p is at least 0; both
                        // with the plan of their rows' |p|.
                        match (acts.signed, acts.non_negative) {
                            (true, true) => by_rows!(run_non_negative),
                            (true, false) => by_rows!(run),
                            (false, _) => by_rows!(run_vnni),
                        }
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx512 => {
                unreachable!("runs(Avx2 / Avx512) is false off x86_64")
            }
        }
    }

    /// `y_ro` from the exact sum `Σ_k q_ok u_rk`: the same float operations in both kernels.
    #[inline(always)]
    fn output(&self, sum: i32, o: usize, t: f32) -> f32 {
        (sum - 128 * self.row_sum[o]) as f32 * (self.scale[o] * t)
    }
}

/// `y`'s first element, shared by the tasks of one product (each writes its own outputs).
struct OutPtr(*mut f32);
// SAFETY: the pointer is only written through by `fill_group`, whose callers give each task
// a disjoint set of outputs of a `y` that outlives the parallel loop.
unsafe impl Sync for OutPtr {}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::LANES;
    use std::arch::x86_64::*;

    /// One register tile: `R` activation rows × `P` panels.
    pub struct Tile {
        /// The first panel's `[groups, LANES, 4]` weights; the next panels follow.
        pub q: *const i8,
        pub panel_bytes: usize,
        pub groups: usize,
        /// The first row's `u`; rows `u_stride` apart.
        pub u: *const u8,
        pub u_stride: usize,
        /// `Σ_k q_ok` and `s_o` from the tile's first output.
        pub row_sum: *const i32,
        pub scale: *const f32,
        /// The rows' scales `t_r`.
        pub t: *const f32,
        /// `y` at (first row, first output).
        pub y: *mut f32,
        pub d_out: usize,
        /// Outputs of the last panel to write (1..=16).
        pub last_lanes: usize,
    }

    impl Tile {
        /// `y_ro = (Σ_k q_ok u_rk - 128 Σ_k q_ok) · (s_o t_r)` for the tile.
        ///
        /// # Safety
        /// The CPU has AVX-512F and VNNI; the pointers cover `P` panels, `R` rows of `u` and
        /// `t`, and `R` rows of `y` at `P · LANES` outputs (`last_lanes` of the last panel),
        /// which nothing else accesses meanwhile.
        #[target_feature(enable = "avx512f,avx512vnni")]
        pub unsafe fn run<const R: usize, const P: usize>(&self) {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            for g in 0..self.groups {
                let mut w = [_mm512_setzero_si512(); P];
                for (p, wp) in w.iter_mut().enumerate() {
                    // SAFETY (caller): 64 bytes of panel p, group g; unaligned load.
                    *wp = _mm512_loadu_si512(
                        self.q.add(p * self.panel_bytes + g * 64) as *const __m512i
                    );
                }
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    // SAFETY (caller): bytes 4g .. 4g + 4 of row r (rows are 4 · groups long).
                    let four =
                        (self.u.add(r * self.u_stride + 4 * g) as *const i32).read_unaligned();
                    let a = _mm512_set1_epi32(four);
                    for (acc_rp, wp) in acc_r.iter_mut().zip(&w) {
                        *acc_rp = _mm512_dpbusd_epi32(*acc_rp, a, *wp);
                    }
                }
            }
            for p in 0..P {
                // SAFETY (caller): row_sum and scale hold whole panels (padded).
                let rs = _mm512_loadu_si512(self.row_sum.add(p * LANES) as *const __m512i);
                let comp = _mm512_slli_epi32(rs, 7); // 128 Σ_k q_ok
                let s = _mm512_loadu_ps(self.scale.add(p * LANES));
                let lanes = if p + 1 == P { self.last_lanes } else { LANES };
                let mask: __mmask16 = if lanes == LANES {
                    0xffff
                } else {
                    (1u16 << lanes) - 1
                };
                for (r, acc_r) in acc.iter().enumerate() {
                    let sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc_r[p], comp));
                    let st = _mm512_mul_ps(s, _mm512_set1_ps(*self.t.add(r)));
                    let v = _mm512_mul_ps(sum, st);
                    // SAFETY (caller): the masked lanes are the outputs that exist.
                    _mm512_mask_storeu_ps(self.y.add(r * self.d_out + p * LANES), mask, v);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "int8_tests.rs"]
mod tests;
