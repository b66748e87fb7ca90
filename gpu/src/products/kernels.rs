//! The compiled-in kernels: for each format, its WGSL decoder between the common prelude and
//! each kernel body (`src/shaders/products/`).

use crate::dispatch::Kernel;

use super::WeightFormat;

/// The three kernels of one weight format.
pub(super) struct FormatKernels {
    pub matvec: Kernel,
    pub matmul: Kernel,
    pub gather: Kernel,
}

/// One kernel: the prelude, the activation functions (for the gated products), the format's
/// files, the body.
macro_rules! kernel {
    ($format:literal, [$($part:literal),+], $body:literal) => {
        Kernel {
            name: concat!("products_", $body, "_", $format),
            source: concat!(
                include_str!("../shaders/products/prelude.wgsl"),
                include_str!("../shaders/act_fns.wgsl"),
                $(include_str!(concat!("../shaders/products/", $part, ".wgsl")),)+
                include_str!(concat!("../shaders/products/", $body, ".wgsl"))
            ),
        }
    };
}

/// The three kernels of a format made of these WGSL files.
macro_rules! format_kernels {
    ($format:literal, [$($part:literal),+]) => {
        FormatKernels {
            matvec: kernel!($format, [$($part),+], "matvec"),
            matmul: kernel!($format, [$($part),+], "matmul"),
            gather: kernel!($format, [$($part),+], "gather"),
        }
    };
}

static F32: FormatKernels = format_kernels!("f32", ["f32"]);
static F16: FormatKernels = format_kernels!("f16", ["f16"]);
static BF16: FormatKernels = format_kernels!("bf16", ["bf16"]);
static Q4_0: FormatKernels = format_kernels!("q4_0", ["q4_0"]);
static Q4_1: FormatKernels = format_kernels!("q4_1", ["q4_1"]);
static Q5_0: FormatKernels = format_kernels!("q5_0", ["q5_0"]);
static Q5_1: FormatKernels = format_kernels!("q5_1", ["q5_1"]);
static Q8_0: FormatKernels = format_kernels!("q8_0", ["q8_0"]);
static Q4K: FormatKernels = format_kernels!("q4_k", ["kscale", "q4_k"]);
static Q5K: FormatKernels = format_kernels!("q5_k", ["kscale", "q5_k"]);
static Q6K: FormatKernels = format_kernels!("q6_k", ["q6_k"]);

/// The kernels of `format`.
pub(super) fn of(format: WeightFormat) -> &'static FormatKernels {
    match format {
        WeightFormat::F32 => &F32,
        WeightFormat::F16 => &F16,
        WeightFormat::Bf16 => &BF16,
        WeightFormat::Q4_0 => &Q4_0,
        WeightFormat::Q4_1 => &Q4_1,
        WeightFormat::Q5_0 => &Q5_0,
        WeightFormat::Q5_1 => &Q5_1,
        WeightFormat::Q8_0 => &Q8_0,
        WeightFormat::Q4K => &Q4K,
        WeightFormat::Q5K => &Q5K,
        WeightFormat::Q6K => &Q6K,
    }
}
