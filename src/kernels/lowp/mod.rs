//! Low-precision matrix products. Mixed-precision training multiplies a linear layer's
//! products in bf16 with [`bf16_train`] (through the f32 gemm over bf16-rounded operands, or
//! the packed `vdpbf16ps` kernel of [`bf16_gemm`]). The rest of this module is for inference: `y = x Wᵀ` with `W [d_out, d_in]` packed once
//! at load into a narrower number format, `x [rows, d_in]` float32 and quantised on the fly,
//! `y [rows, d_out]` float32.
//!
//! | format | weight element | activations | product per output |
//! |---|---|---|---|
//! | [`Bf16Matrix`] | bf16 (round to nearest even) | bf16 per element | `Σ_k w_k x_k` in f32 (each bf16 product exact in f32) |
//! | [`Int8Matrix`] | `s_o · q_ok`, `q ∈ [-127, 127]`, `s_o = max_k |w_ok| / 127` per output row | `t_r · p_rk` per row (same rule) | `s_o t_r Σ_k q_ok p_rk` (exact integer sum) |
//! | [`BlockMatrix`] | ggml `Q4_0` / `Q4_1` / `Q8_0` blocks of 32, as the GGUF file stores them | ggml `Q8_0` blocks of 32 (`d_b = max|x| / 127`) | `Σ_b d^w_b d^x_b Σ_{j∈b} q_j p_j` + the blocks' offset terms |
//! | [`KQuantMatrix`] | ggml K-quants (`Q2_K` … `Q6_K`, super-blocks of 256 with 16 sub-block scales) and `Q5_0` / `Q5_1` / `IQ4_NL` blocks of 32, as stored (`Q5_0` / `Q5_1` regrouped by eight blocks at load, the same bytes) | ggml `Q8_K` blocks of 256 (with sums per 16) for the K-quants, `Q8_0` / `Q8_1` for the others | `Σ_b d^w_b d^x_b Σ_g sc_g Σ_{j∈g} q_j p_j` − the minimum terms `dmin_b d^x_b Σ_g m_g Σ_{j∈g} p_j` |
//!
//! int8 is CTranslate2's scheme (weights per output row, activations per row at run time);
//! the block formats are llama.cpp's 4- and 8-bit products (`ggml_vec_dot_q4_1_q8_1` and
//! kin). Every integer dot product is exact in i32, so the only differences from the float64
//! product of the dequantised weights and activations are float32 rounding of the per-block
//! terms; the difference from the float product `x Wᵀ` is the activations' rounding (at most
//! half a quantisation step per element) and the weights' own.
//!
//! Kernels: a portable one (plain Rust, any machine) and, chosen at run time with
//! `is_x86_feature_detected!`, AVX-512 kernels: VNNI `vpdpbusd` (64 u8 × i8 products summed
//! into 16 i32 lanes per instruction) for int8 and the blocks, AVX-512 BF16 `vdpbf16ps` (32
//! bf16 products into 16 f32 lanes) for bf16; and AVX2 kernels (`vpmaddubsw` / `vpmaddwd` for
//! int8). For bf16 and the blocks the work is split over
//! output rows with rayon, each task computing a block of `y` for up to [`ROW_TILE`] activation
//! rows at a time from one loaded weight row ([`PackedFormat`]); int8 is a register-tiled GEMM
//! over weight panels of 16 outputs (see [`Int8Matrix`]), split over groups of 64 outputs.
//! The ggml blocks and K-quants also have AVX2 (+ FMA, F16C) kernels (`vpmaddubsw` /
//! `vpmaddwd`, 32 u8 × i8 products into 8 i32 lanes in two instructions) for CPUs without
//! AVX-512; they keep the portable kernels' order of f32 steps, so they give the same bits.
//! From [`block_gemm::MIN_ROWS`] activation rows on (prefill, batched decoding), the ggml
//! blocks and the K-quants are multiplied by register-tiled GEMMs too ([`block_gemm`]: AVX-512
//! and AVX2; `kquant_gemm_avx512.rs`: AVX-512, the row kernel's bits; `Q5_0`, `Q5_1`,
//! `IQ4_NL`: `kquant_matrix/blocks32_gemm.rs`, AVX-512 and AVX2, the row kernel's bits), over
//! panels unpacked from the stored blocks per call.

mod act_quant;
mod bf16;
pub mod bf16_gemm;
pub mod bf16_train;
pub mod block_gemm;
#[cfg(target_arch = "x86_64")]
mod block_gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod block_gemm_avx512;
mod blocks;
pub mod ggml;
mod int8;
#[cfg(target_arch = "x86_64")]
mod int8_avx2;
mod kquant_matrix;
pub mod kquants;
pub mod raw_bytes;

// Used outside the library only (feature `internals`).

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use bf16::{bf16_to_f32, f32_to_bf16, round_to_bf16, rounded_to_bf16, Bf16Matrix};
pub use blocks::{BlockKind, BlockMatrix};
pub use int8::Int8Matrix;
// Used outside the library only (feature `internals`).
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use int8_avx2::set_plain_avx2;
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use kquant_matrix::{copies_blocks, is_kquant_product, KQuantActs, KQuantMatrix};
pub use raw_bytes::RawBytes;

use rayon::prelude::*;

/// Activation rows multiplied with each loaded weight row.
pub const ROW_TILE: usize = 4;
/// Output rows (weight rows) per parallel task.
const OUT_ROWS_PER_TASK: usize = 16;

/// Which implementation of a product runs, from the plainest to the widest; a format runs
/// [`Kernel::Portable`] always and a SIMD kernel only where it has one and the CPU has the
/// instructions ([`PackedFormat::runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kernel {
    /// Plain Rust, every machine (the reference the SIMD kernels are tested against).
    Portable,
    /// AVX2 with FMA and F16C (256-bit vectors; `vpmaddubsw` / `vpmaddwd` for the integer
    /// formats); only where the CPU has them ([`cpu_has`]).
    Avx2,
    /// AVX-512 (VNNI for the integer formats, BF16 for bf16); only where the CPU has it.
    Avx512,
}

impl Kernel {
    /// Every kernel, plainest first.
    pub const ALL: [Kernel; 3] = [Kernel::Portable, Kernel::Avx2, Kernel::Avx512];

    /// The name `TRANSFORMER_KERNEL` and `--kernel` use.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
        }
    }

    /// `portable`, `avx2` or `avx512`.
    pub fn parse(name: &str) -> Result<Kernel, String> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| format!("unknown kernel {name:?} (portable, avx2 or avx512)"))
    }
}

/// Whether this CPU has the instructions of `kernel`'s integer products: AVX2 + FMA + F16C
/// for [`Kernel::Avx2`], AVX-512F/BW/VL + VNNI for [`Kernel::Avx512`] (bf16's AVX-512 kernel
/// also needs [`has_avx512_bf16`]).
pub fn cpu_has(kernel: Kernel) -> bool {
    match kernel {
        Kernel::Portable => true,
        Kernel::Avx2 => has_avx2(),
        Kernel::Avx512 => has_vnni(),
    }
}

/// Whether this CPU runs the AVX2 kernels (AVX2, FMA and F16C).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The environment variable that turns the AVX2 int8 kernel's AVX-VNNI form off (`0`) or
/// leaves it on where the CPU has it (`1`, the default).
pub const AVX_VNNI_ENV: &str = "TRANSFORMER_AVX_VNNI";

/// Reads [`AVX_VNNI_ENV`]: `Some(false)` for `0`, `Some(true)` for `1`, `None` when unset; any
/// other value is an error naming it.
pub fn avx_vnni_from_env() -> Result<Option<bool>, String> {
    match std::env::var(AVX_VNNI_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v == "0" => Ok(Some(false)),
        Ok(v) if v == "1" => Ok(Some(true)),
        Ok(v) => Err(format!("{AVX_VNNI_ENV}={v}: expected 0 or 1")),
        Err(e) => Err(format!("{AVX_VNNI_ENV}: {e}")),
    }
}

/// The environment variable that caps the kernels: `portable`, `avx2` or `avx512`.
pub const KERNEL_ENV: &str = "TRANSFORMER_KERNEL";

static KERNEL_CAP: std::sync::OnceLock<std::sync::RwLock<Kernel>> = std::sync::OnceLock::new();

fn kernel_cap_lock() -> &'static std::sync::RwLock<Kernel> {
    KERNEL_CAP.get_or_init(|| {
        // A value that does not parse, or names a kernel this CPU lacks, caps nothing here:
        // the binary refuses it at start through `kernel_from_env`.
        let cap = kernel_from_env().ok().flatten().unwrap_or(Kernel::Avx512);
        std::sync::RwLock::new(cap)
    })
}

/// The widest kernel products may use: [`KERNEL_ENV`] when set, else [`Kernel::Avx512`]
/// (no cap). Each format runs the widest kernel at or below it that it has and the CPU runs.
pub fn kernel_cap() -> Kernel {
    *kernel_cap_lock().read().unwrap_or_else(|e| e.into_inner())
}

/// Caps the kernels for the rest of the process (what `--kernel` and [`KERNEL_ENV`] set).
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn set_kernel_cap(cap: Kernel) {
    *kernel_cap_lock().write().unwrap_or_else(|e| e.into_inner()) = cap;
}

/// The kernel named `name` (`portable`, `avx2` or `avx512`), or why it cannot run here: an
/// unknown name, or a kernel this CPU does not have (what [`KERNEL_ENV`] and `bench --kernel`
/// accept).
pub fn kernel_for_this_cpu(name: &str) -> Result<Kernel, String> {
    let kernel = Kernel::parse(name.trim())?;
    if !cpu_has(kernel) {
        return Err(format!(
            "this CPU does not have the {} instructions",
            kernel.name()
        ));
    }
    Ok(kernel)
}

/// The kernel [`KERNEL_ENV`] asks for (`None` when unset), or why it cannot run here.
pub fn kernel_from_env() -> Result<Option<Kernel>, String> {
    let Ok(value) = std::env::var(KERNEL_ENV) else {
        return Ok(None);
    };
    kernel_for_this_cpu(&value)
        .map(Some)
        .map_err(|e| format!("{KERNEL_ENV}={value}: {e}"))
}

/// The widest kernel at or below [`kernel_cap`] that `runs` accepts.
pub fn widest_kernel(runs: impl Fn(Kernel) -> bool) -> Kernel {
    widest_below(kernel_cap(), runs)
}

/// The widest kernel at or below `cap` that `runs` accepts ([`Kernel::Portable`] always runs).
fn widest_below(cap: Kernel, runs: impl Fn(Kernel) -> bool) -> Kernel {
    Kernel::ALL
        .into_iter()
        .rev()
        .find(|&k| k <= cap && (k == Kernel::Portable || runs(k)))
        .unwrap_or(Kernel::Portable)
}

/// Whether this CPU has AVX-VNNI (the 256-bit `vpdpbusd`), which the AVX2 int8 kernel uses.
pub fn has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2() && is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 VNNI kernels (int8 and ggml blocks).
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 BF16 kernel.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One packed weight format: how activations are quantised for it and how one weight row
/// meets a few activation rows.
pub trait PackedFormat: Sync {
    /// The quantised activations of one call.
    type Acts: Sync;
    /// `d_out`.
    fn rows(&self) -> usize;
    /// `d_in`.
    fn cols(&self) -> usize;
    /// Whether `kernel` runs for this format on this CPU (always for [`Kernel::Portable`]).
    fn runs(&self, kernel: Kernel) -> bool;
    /// Quantises `x [n, d_in]`.
    fn quantize_acts(&self, x: &[f32], n: usize) -> Self::Acts;
    /// `out[i] = (x_{r0+i} · w_o)` for `i < out.len() <= ROW_TILE`. The caller has checked
    /// [`runs`](Self::runs) for `kernel`.
    fn tile(&self, kernel: Kernel, acts: &Self::Acts, o: usize, r0: usize, out: &mut [f32]);
    /// `out[i] = (x_0 · w_{o0+i})` for every `i < out.len()`: the one activation row of a
    /// decoding step against consecutive weight rows, the same bits as [`tile`](Self::tile)
    /// row by row (which is what this default does). A format overrides it to take several
    /// weight rows per pass, sharing the activation loads and the per-row set-up.
    fn row_outputs(&self, kernel: Kernel, acts: &Self::Acts, o0: usize, out: &mut [f32]) {
        for (i, v) in out.iter_mut().enumerate() {
            self.tile(kernel, acts, o0 + i, 0, std::slice::from_mut(v));
        }
    }
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` with `kernel`, parallel over output rows.
pub fn product_with<F: PackedFormat>(w: &F, kernel: Kernel, y: &mut [f32], x: &[f32], rows: usize) {
    let (d_out, d_in) = (w.rows(), w.cols());
    if !check_operands((d_out, d_in), y, x, rows, kernel, w.runs(kernel)) {
        return;
    }
    let acts = w.quantize_acts(x, rows);
    // yt [d_out, rows]: each task owns whole output rows of W, so whole rows of yt.
    let fill = |(task, yt): (usize, &mut [f32])| {
        let o0 = task * OUT_ROWS_PER_TASK;
        let mut out = [0f32; ROW_TILE];
        for r0 in (0..rows).step_by(ROW_TILE) {
            let nr = ROW_TILE.min(rows - r0);
            for (i, yt_row) in yt.chunks_exact_mut(rows).enumerate() {
                w.tile(kernel, &acts, o0 + i, r0, &mut out[..nr]);
                yt_row[r0..r0 + nr].copy_from_slice(&out[..nr]);
            }
        }
    };
    let serial = products_are_serial();
    let chunk = rows * OUT_ROWS_PER_TASK;
    if rows == 1 {
        // Decoding: y is one row, [d_out]; each task fills a run of its outputs.
        if serial {
            w.row_outputs(kernel, &acts, 0, y);
        } else {
            y.par_chunks_mut(chunk).enumerate().for_each(|(task, y_run)| {
                w.row_outputs(kernel, &acts, task * OUT_ROWS_PER_TASK, y_run)
            });
        }
        return;
    }
    let mut yt = vec![0f32; rows * d_out];
    if serial {
        yt.chunks_mut(chunk).enumerate().for_each(fill);
    } else {
        yt.par_chunks_mut(chunk).enumerate().for_each(fill);
    }
    // y = ytᵀ, in blocks of output rows so that both sides stay in cache.
    for (block, yt_block) in yt.chunks(chunk).enumerate() {
        let o0 = block * OUT_ROWS_PER_TASK;
        let n = yt_block.len() / rows;
        for r in 0..rows {
            let dst = &mut y[r * d_out + o0..r * d_out + o0 + n];
            for (i, d) in dst.iter_mut().enumerate() {
                *d = yt_block[i * rows + r];
            }
        }
    }
}

/// Panics unless `x` is `[rows, d_in]`, `y` is `[rows, d_out]` for a weight of `(d_out, d_in)`
/// and `kernel` runs on this CPU for this format (`runs`); whether there is anything to compute.
fn check_operands(
    (d_out, d_in): (usize, usize),
    y: &[f32],
    x: &[f32],
    rows: usize,
    kernel: Kernel,
    kernel_runs: bool,
) -> bool {
    assert_eq!(
        x.len(),
        rows * d_in,
        "low-precision product: x is not [rows, d_in]"
    );
    assert_eq!(
        y.len(),
        rows * d_out,
        "low-precision product: y is not [rows, d_out]"
    );
    assert!(
        kernel == Kernel::Portable || kernel_runs,
        "the {} kernel was asked for where it does not run (this CPU or this format)",
        kernel.name()
    );
    rows > 0 && d_out > 0
}

/// Whether a product runs on the calling thread only (inside
/// [`serial_matmuls`](crate::kernels::matmul::serial_matmuls), or a one-thread pool).
fn products_are_serial() -> bool {
    crate::kernels::matmul::matmuls_are_serial() || rayon::current_num_threads() == 1
}

/// A weight matrix in one of the packed formats, prepared once for a run of products.
#[derive(Clone, Debug)]
pub enum PackedWeight {
    Bf16(Bf16Matrix),
    Int8(Int8Matrix),
    Blocks(BlockMatrix),
    /// K-quants, `Q5_0`, `Q5_1`, `IQ4_NL` as stored ([`KQuantMatrix`]).
    KQuants(KQuantMatrix),
}

impl PackedWeight {
    /// `d_out`.
    pub fn rows(&self) -> usize {
        match self {
            PackedWeight::Bf16(w) => w.rows(),
            PackedWeight::Int8(w) => w.rows(),
            PackedWeight::Blocks(w) => w.rows(),
            PackedWeight::KQuants(w) => w.rows(),
        }
    }

    /// `d_in`.
    pub fn cols(&self) -> usize {
        match self {
            PackedWeight::Bf16(w) => w.cols(),
            PackedWeight::Int8(w) => w.cols(),
            PackedWeight::Blocks(w) => w.cols(),
            PackedWeight::KQuants(w) => w.cols(),
        }
    }

    /// Whether `kernel` runs for this format on this CPU.
    pub fn runs(&self, kernel: Kernel) -> bool {
        match self {
            PackedWeight::Bf16(w) => w.runs(kernel),
            PackedWeight::Int8(w) => w.runs(kernel),
            PackedWeight::Blocks(w) => w.runs(kernel),
            PackedWeight::KQuants(w) => w.runs(kernel),
        }
    }

    /// The fastest kernel this CPU runs for this format, at or below [`kernel_cap`].
    pub fn best_kernel(&self) -> Kernel {
        widest_kernel(|k| self.runs(k))
    }

    /// `y [rows, d_out] = x [rows, d_in] · Wᵀ` with the fastest kernel.
    pub fn product(&self, y: &mut [f32], x: &[f32], rows: usize) {
        self.product_with(self.best_kernel(), y, x, rows);
    }

    /// `y = x Wᵀ` with the given kernel.
    pub fn product_with(&self, kernel: Kernel, y: &mut [f32], x: &[f32], rows: usize) {
        match self {
            PackedWeight::Bf16(w) => product_with(w, kernel, y, x, rows),
            PackedWeight::Int8(w) => w.product(kernel, y, x, rows),
            // Many rows: the register-tiled GEMM (another float order, see block_gemm), unless
            // every row must get the one-row bits (`crate::kernels::row_exact`).
            PackedWeight::Blocks(w)
                if rows >= block_gemm::MIN_ROWS
                    && kernel != Kernel::Portable
                    && block_gemm::runs(kernel)
                    && !crate::kernels::row_exact::products_are_row_exact() =>
            {
                block_gemm::product(w, kernel, y, x, rows)
            }
            PackedWeight::Blocks(w) => product_with(w, kernel, y, x, rows),
            // Interleaved Q4_K / Q6_K rows, eight a pass (the row kernel's bits): with AVX-512,
            // decoding steps (more rows take its GEMM); with AVX2, every product.
            #[cfg(target_arch = "x86_64")]
            PackedWeight::KQuants(w)
                if w.is_interleaved()
                    && (kernel == Kernel::Avx512 && rows < kquant_matrix::gemm_avx512::MIN_ROWS
                        || kernel == Kernel::Avx2) =>
            {
                kquant_matrix::rows8::product(w, kernel, y, x, rows)
            }
            // Many rows: the K-quants' register-tiled GEMM (the row kernel's bits).
            #[cfg(target_arch = "x86_64")]
            PackedWeight::KQuants(w)
                if rows >= kquant_matrix::gemm_avx512::MIN_ROWS
                    && kernel == Kernel::Avx512
                    && kquant_matrix::gemm_avx512::runs(w) =>
            {
                kquant_matrix::gemm_avx512::product(w, y, x, rows)
            }
            // Many rows of 32-blocks: their register-tiled GEMM (the row kernel's bits).
            #[cfg(target_arch = "x86_64")]
            PackedWeight::KQuants(w)
                if rows >= kquant_matrix::blocks32_gemm::MIN_ROWS
                    && kquant_matrix::blocks32_gemm::runs(w, kernel) =>
            {
                kquant_matrix::blocks32_gemm::product(w, kernel, y, x, rows)
            }
            PackedWeight::KQuants(w) => product_with(w, kernel, y, x, rows),
        }
    }

    /// Row `o` of the weight as the products see it (bf16 values, int8 `s_o · q_ok`: an int8
    /// embedding's lookup, as CTranslate2 dequantises it) into `out [cols]`; the GGUF formats
    /// are not read back (an error naming the format).
    pub fn row(&self, o: usize, out: &mut [f32]) -> Result<(), String> {
        assert!(o < self.rows() && out.len() == self.cols(), "row {o} of a packed weight");
        match self {
            PackedWeight::Bf16(w) => out.iter_mut().enumerate().for_each(|(k, v)| *v = w.get(o, k)),
            PackedWeight::Int8(w) => out.iter_mut().enumerate().for_each(|(k, v)| *v = w.get(o, k)),
            PackedWeight::Blocks(_) | PackedWeight::KQuants(_) => {
                return Err("rows of a GGUF block weight are not read back".into())
            }
        }
        Ok(())
    }

    /// The weight as a GGUF file stores it, `(type, [rows, blocks, block bytes])`, when it is
    /// held in GGUF blocks (`None` for this crate's bf16 and int8 packings).
    pub fn ggml_blocks(&self) -> Option<(ggml::GgmlType, std::borrow::Cow<'_, [u8]>)> {
        match self {
            PackedWeight::Bf16(_) | PackedWeight::Int8(_) => None,
            PackedWeight::Blocks(w) => Some((w.ggml_type(), std::borrow::Cow::Borrowed(&w.stored()[..]))),
            PackedWeight::KQuants(w) => Some((w.ggml_type(), w.file_bytes())),
        }
    }

    /// Bytes the packed weight occupies.
    pub fn bytes(&self) -> usize {
        match self {
            PackedWeight::Bf16(w) => w.bytes(),
            PackedWeight::Int8(w) => w.bytes(),
            PackedWeight::Blocks(w) => w.bytes(),
            PackedWeight::KQuants(w) => w.bytes(),
        }
    }
}

/// Whether a ggml tensor of `ty` can be multiplied in its stored blocks ([`pack_ggml`]).
pub fn is_block_product(ty: ggml::GgmlType) -> bool {
    BlockKind::of(ty).is_some() || is_kquant_product(ty)
}

/// A ggml tensor `[rows, cols]` (`data` as the GGUF file stores it) packed for block
/// products: [`BlockMatrix`] for `Q4_0` / `Q4_1` / `Q8_0`, [`KQuantMatrix`] for the K-quants,
/// `Q5_0`, `Q5_1` and `IQ4_NL`; `None` for a type that is not multiplied in blocks (floats).
pub fn pack_ggml(
    ty: ggml::GgmlType,
    data: RawBytes,
    rows: usize,
    cols: usize,
) -> Result<Option<PackedWeight>, String> {
    if BlockKind::of(ty).is_some() {
        return BlockMatrix::in_place(ty, data, rows, cols).map(|m| Some(PackedWeight::Blocks(m)));
    }
    if is_kquant_product(ty) {
        return KQuantMatrix::from_ggml(ty, data, rows, cols)
            .map(|m| Some(PackedWeight::KQuants(m)));
    }
    Ok(None)
}

/// `x` rounded to the nearest integer, ties to even, for `|x| <= 2^22` (as
/// `f32::round_ties_even`, which compiles to a library call on baseline x86-64): adding and
/// subtracting 1.5 · 2^23 leaves no fraction bits, and Rust does not reassociate float sums.
#[inline(always)]
fn round_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod kernel_choice_tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_are_refused() {
        for k in Kernel::ALL {
            assert_eq!(Kernel::parse(k.name()), Ok(k));
        }
        let err = Kernel::parse("neon").unwrap_err();
        assert!(err.contains("neon") && err.contains("avx2"), "{err}");
    }

    #[test]
    fn the_widest_kernel_at_or_below_the_cap_that_runs_is_chosen() {
        let all = |_: Kernel| true;
        let no_avx512 = |k: Kernel| k != Kernel::Avx512;
        let none = |_: Kernel| false;
        assert_eq!(widest_below(Kernel::Avx512, all), Kernel::Avx512);
        assert_eq!(widest_below(Kernel::Avx2, all), Kernel::Avx2);
        assert_eq!(widest_below(Kernel::Portable, all), Kernel::Portable);
        assert_eq!(widest_below(Kernel::Avx512, no_avx512), Kernel::Avx2);
        assert_eq!(widest_below(Kernel::Avx512, none), Kernel::Portable);
        assert!(cpu_has(Kernel::Portable));
    }
}

#[cfg(test)]
mod kquant_tests;
#[cfg(test)]
mod tests;

/// The number format a model's float32 weights are multiplied in at inference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// float32 throughout (the training format; bit-identical to the plain product).
    #[default]
    F32,
    /// bf16 weights and activations, f32 accumulation (`Bf16Matrix`).
    Bf16,
    /// int8 weights per output row, activations per row (`Int8Matrix`).
    Int8,
}

impl Precision {
    /// `w [rows, cols]` packed for this precision (`None` for f32), or why it cannot be.
    pub fn pack(self, w: &[f32], rows: usize, cols: usize) -> Result<Option<PackedWeight>, String> {
        Ok(match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(PackedWeight::Bf16(Bf16Matrix::from_f32(w, rows, cols))),
            Precision::Int8 => Some(PackedWeight::Int8(Int8Matrix::from_f32(w, rows, cols)?)),
        })
    }
}
