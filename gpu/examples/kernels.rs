//! Times the GPU kernels at the shapes of real models, and counts what one decode step costs.
//!
//! ```text
//! cargo run -p transformer-gpu --release --example kernels -- \
//!     [--adapter N] [--shapes smol|1b|8b[,..]] [--only SUBSTRING] [--repeats R] \
//!     [--target-ms T] [--ctx C] [--no-step] [--json]
//! ```
//!
//! `--only` keeps the kernels whose name contains the text: `mul_mat ffn_up Q4_K n=1`,
//! `rms_norm n=512`, `rope n=1`, `swiglu n=1`, `argmax`, `flash_attn prefill`,
//! `paged_attn decode ctx=8192`, `step` (the decode step). `--json` prints one JSON object
//! (adapter, timing, kernels, decode_steps) for `benches/compare/gpu_compare.py`.
//!
//! Shapes (`--shapes`, comma-separated; by default `smol` on a software adapter such as
//! lavapipe, `1b,8b` on a GPU):
//!
//! | name | model | d | ffn | vocab | heads / kv heads × d_head | layers |
//! |---|---|---|---|---|---|---|
//! | `smol` | SmolLM2-135M | 576 | 1536 | 49152 | 9 / 3 × 64 | 30 |
//! | `1b` | Llama-3.2-1B | 2048 | 8192 | 128256 | 32 / 8 × 64 | 16 |
//! | `8b` | Llama-3.1-8B | 4096 | 14336 | 128256 | 32 / 8 × 128 | 32 |
//!
//! **What is timed.** Each kernel as the crate records it (one call = the dispatches its host
//! function records, such as paged attention's split-K pass and its reduce), on random data
//! (block formats with valid f16 scales):
//!
//! - the weight products `y = x · Wᵀ` in Q4_K, Q6_K, Q8_0, Q4_0 and F16 at 1 activation row
//!   (decode: the matrix-vector kernel) and 512 (prefill: the tiled kernel), for the matrices
//!   `attn_q` `[d, d]`, `ffn_up` `[ffn, d]`, `ffn_down` `[d, ffn]` and, at decode only, the
//!   head `output` `[vocab, d]`;
//! - RMSNorm over `d` and SwiGLU over `ffn` at 1 and 512 rows, RoPE (half-split) of the
//!   queries at 1 and 512 rows, argmax over the vocabulary;
//! - FlashAttention prefill of 512 causal queries against their 512 keys, and unmasked (every
//!   query sees the 512 keys: the work of llama.cpp's `test-backend-ops` case, whose random
//!   mask hides nothing);
//! - paged decode attention of one token against 1k, 8k and 32k cached keys (f32 cache in
//!   blocks of 16); a cache larger than the adapter's largest binding is skipped, saying so.
//!
//! **How.** Where the adapter has timestamp queries, the device's clock is read before and
//! after `n` recorded calls in one submission (`transformer_gpu::timing`); otherwise the wall
//! time of one submission of `n` calls (submit, run, wait; the recording is not timed). In both
//! cases after a warm-up call (the pipeline's compilation), `n` chosen so that a batch takes
//! about `--target-ms`, and the median of `--repeats` batches divided by `n`: µs per call.
//! Successive calls read the same buffers, so a matrix that fits the GPU's last-level cache is
//! read from it (as in llama.cpp's `test-backend-ops perf`).
//!
//! **Rates.** `GB/s` is the bytes a bandwidth-bound kernel must read divided by its time: the
//! weight bytes of a decode product; the K and V bytes of paged attention; the activations
//! read and written by the norms, RoPE, SwiGLU and argmax. `GFLOP/s` is `2 · rows · d_in ·
//! d_out` per prefill product, and `4 · heads · d_head · (visible keys)` for FlashAttention
//! (the causal half only).
//!
//! **The decode step** (`--no-step` skips it): one greedy decode step of a Llama-shaped model
//! recorded from the existing kernels — embedding row, then per layer RMSNorm (fused with the
//! residual add after the first), q/k/v products, RoPE of q and k, `kv_write`, paged attention,
//! o product, the residual add fused with the second norm, gate and up products, SwiGLU, down
//! product — then the last residual add with the final norm, the head product and argmax, with
//! Q4_K weights (Q5_0 for rows that are not blocks of 256, llama.cpp's fallback; each layer its
//! own) and a KV cache of `--ctx` positions. The token id stays on
//! the device (argmax writes the id the next step's embedding lookup reads); the host writes
//! the position and the context length and reads the id. It prints the dispatches per layer,
//! submissions per step (one), bytes up and down per step, the step's wall time, and the device
//! memory the harness allocated against the weights' bytes. A harness over the kernels, not a
//! model: the weights are random.

use std::time::{Duration, Instant};

use transformer_gpu::activations::{glu, Activation, GluInput};
use transformer_gpu::flash_attention::{flash_attention, AttnMask, AttnShape};
use transformer_gpu::norms::{add_norm, norm, Norm};
use transformer_gpu::paged_attention::{
    kv_write, paged_attention, BlockTable, DecodeScratch, PagedCache, DEFAULT_PARTITION,
};
use transformer_gpu::products::{gather_rows, weight_product, GpuWeight, WeightFormat};
use transformer_gpu::rope::{rope, RopeFreqs, RopeLayout};
use transformer_gpu::softmax::{argmax, ARGMAX_CHUNK};
use transformer_gpu::timing::Timestamps;
use transformer_gpu::{Gpu, GpuBuffer, GpuError};

/// A model's shapes.
#[derive(Clone, Copy, Debug)]
struct Model {
    key: &'static str,
    name: &'static str,
    d: usize,
    ffn: usize,
    vocab: usize,
    heads: usize,
    kv_heads: usize,
    d_head: usize,
    layers: usize,
    /// The head shares the embedding's matrix.
    tied: bool,
    rope_theta: f64,
}

const MODELS: [Model; 3] = [
    Model {
        key: "smol",
        name: "SmolLM2-135M",
        d: 576,
        ffn: 1536,
        vocab: 49152,
        heads: 9,
        kv_heads: 3,
        d_head: 64,
        layers: 30,
        tied: true,
        rope_theta: 100_000.0,
    },
    Model {
        key: "1b",
        name: "Llama-3.2-1B",
        d: 2048,
        ffn: 8192,
        vocab: 128_256,
        heads: 32,
        kv_heads: 8,
        d_head: 64,
        layers: 16,
        tied: true,
        rope_theta: 500_000.0,
    },
    Model {
        key: "8b",
        name: "Llama-3.1-8B",
        d: 4096,
        ffn: 14336,
        vocab: 128_256,
        heads: 32,
        kv_heads: 8,
        d_head: 128,
        layers: 32,
        tied: false,
        rope_theta: 500_000.0,
    },
];

/// The formats of the weight products timed.
const FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q4K,
    WeightFormat::Q6K,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::F16,
];

/// The paged KV cache's block size, in positions.
const BLOCK: usize = 16;

struct Args {
    adapter: Option<usize>,
    shapes: Option<Vec<Model>>,
    only: Option<String>,
    repeats: usize,
    target: Duration,
    ctx: usize,
    step: bool,
    json: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: kernels [--adapter N] [--shapes smol|1b|8b[,..]] [--only SUBSTRING] \
         [--repeats R] [--target-ms T] [--ctx C] [--no-step] [--json]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        adapter: None,
        shapes: None,
        only: None,
        repeats: 5,
        target: Duration::from_millis(20),
        ctx: 1024,
        step: true,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--adapter" => a.adapter = Some(value().parse().unwrap_or_else(|_| usage())),
            "--shapes" => {
                let list = value()
                    .split(',')
                    .map(|k| {
                        MODELS
                            .iter()
                            .find(|m| m.key == k)
                            .copied()
                            .unwrap_or_else(|| usage())
                    })
                    .collect();
                a.shapes = Some(list);
            }
            "--only" => a.only = Some(value()),
            "--repeats" => a.repeats = value().parse().unwrap_or_else(|_| usage()),
            "--target-ms" => {
                a.target = Duration::from_secs_f64(
                    value().parse::<f64>().unwrap_or_else(|_| usage()) / 1e3,
                )
            }
            "--ctx" => a.ctx = value().parse().unwrap_or_else(|_| usage()),
            "--no-step" => a.step = false,
            "--json" => a.json = true,
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    a.repeats = a.repeats.max(1);
    a.ctx = a.ctx.max(1);
    a
}

/// A seeded xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` values in [-1, 1).
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            .collect()
    }

    /// A finite half (or the top of a bfloat) of magnitude in about [2⁻⁸, 1).
    fn half(&mut self, bf16: bool) -> u16 {
        let r = self.next();
        let sign = ((r >> 20) as u16 & 1) << 15;
        if bf16 {
            sign | (0x3B80 + (r % 0x400) as u16)
        } else {
            sign | (0x1C00 + (r % 0x2000) as u16)
        }
    }
}

/// Random bytes of a `[d_out, d_in]` matrix in `format`, every f16 scale (and every f16 /
/// bf16 value) a finite number.
fn random_matrix(format: WeightFormat, d_in: usize, d_out: usize, rng: &mut Rng) -> Vec<u8> {
    let n = d_out * format.row_bytes(d_in);
    let mut bytes: Vec<u8> = (0..n.div_ceil(8))
        .flat_map(|_| rng.next().to_le_bytes())
        .take(n)
        .collect();
    let set = |b: &mut [u8], at: usize, h: u16| b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    let block = format.block_bytes();
    // The byte offsets of each block's f16 scales.
    let halves: &[usize] = match format {
        WeightFormat::F32 => {
            for (i, v) in rng.floats(n / 4).into_iter().enumerate() {
                bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            &[]
        }
        WeightFormat::F16 | WeightFormat::Bf16 => &[0],
        WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::Q8_0 => &[0],
        WeightFormat::Q4_1 | WeightFormat::Q5_1 | WeightFormat::Q4K | WeightFormat::Q5K => &[0, 2],
        WeightFormat::Q6K => &[208],
    };
    let bf16 = format == WeightFormat::Bf16;
    for b in (0..n).step_by(block) {
        for &h in halves {
            let v = rng.half(bf16);
            set(&mut bytes, b + h, v);
        }
    }
    bytes
}

/// How a kernel was timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Timestamps,
    Wall,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Timestamps => "timestamps",
            Method::Wall => "wall",
        }
    }
}

/// One measured (or skipped) kernel.
#[derive(Clone, Debug, Default)]
struct Row {
    model: &'static str,
    kernel: String,
    format: String,
    /// The product's `d_out`, `d_in`, `rows` (0 for other kernels).
    m: usize,
    k: usize,
    n: usize,
    /// The shape, in words.
    shape: String,
    us: f64,
    calls: usize,
    method: &'static str,
    gbps: Option<f64>,
    gflops: Option<f64>,
    skipped: Option<String>,
}

/// Records one call of a kernel.
type Call<'c> = Box<dyn FnMut() -> Result<(), GpuError> + 'c>;

struct Bench<'g> {
    gpu: &'g Gpu,
    stamps: Option<Timestamps>,
    repeats: usize,
    target: Duration,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Bench<'_> {
    /// µs per call of `call` (which records one call), the calls per batch, and how.
    fn time(
        &self,
        call: &mut dyn FnMut() -> Result<(), GpuError>,
    ) -> Result<(f64, usize, Method), GpuError> {
        let gpu = self.gpu;
        call()?;
        gpu.finish()?;
        let t = Instant::now();
        call()?;
        gpu.finish()?;
        let one = t.elapsed().as_secs_f64().max(1e-7);
        let n = ((self.target.as_secs_f64() / one) as usize).clamp(1, 256);
        let mut samples = Vec::with_capacity(self.repeats);
        let mut method = if self.stamps.is_some() {
            Method::Timestamps
        } else {
            Method::Wall
        };
        for _ in 0..self.repeats {
            if let (Method::Timestamps, Some(ts)) = (method, &self.stamps) {
                ts.mark(gpu, 0);
                for _ in 0..n {
                    call()?;
                }
                ts.mark(gpu, 1);
                let t = ts.read(gpu, 2)?;
                let dt = t[1] - t[0];
                if dt > 0.0 {
                    samples.push(dt / 1e3 / n as f64);
                    continue;
                }
                // A clock that does not advance: time the wall from here on.
                method = Method::Wall;
                samples.clear();
            }
            for _ in 0..n {
                call()?;
            }
            let t = Instant::now();
            gpu.finish()?;
            samples.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        Ok((median(samples), n, method))
    }

    /// Times `call` into `row`, or notes why it was skipped (a buffer larger than the adapter
    /// binds); `bytes` and `flops` per call give the rates.
    fn run<'c>(
        &self,
        mut row: Row,
        bytes: Option<f64>,
        flops: Option<f64>,
        setup: impl FnOnce() -> Result<Call<'c>, GpuError>,
    ) -> Result<Row, GpuError> {
        let timed = setup().and_then(|mut call| self.time(&mut call));
        match timed {
            Ok((us, calls, method)) => {
                row.us = us;
                row.calls = calls;
                row.method = method.name();
                row.gbps = bytes.map(|b| b / us / 1e3);
                row.gflops = flops.map(|f| f / us / 1e3);
            }
            Err(GpuError::TooLarge { what, bytes, limit }) => {
                row.skipped = Some(format!(
                    "skipped: {what} needs {bytes} bytes in one binding, this adapter binds at \
                     most {limit}"
                ));
            }
            Err(e) => return Err(e),
        }
        Ok(row)
    }
}

fn product_rows(b: &Bench<'_>, m: &Model, rng: &mut Rng, only: &dyn Fn(&str) -> bool) -> Vec<Row> {
    let gpu = b.gpu;
    let mut rows = Vec::new();
    let mats = [
        ("attn_q", m.d, m.d),
        ("ffn_up", m.ffn, m.d),
        ("ffn_down", m.d, m.ffn),
        ("output", m.vocab, m.d),
    ];
    for format in FORMATS {
        for (name, d_out, d_in) in mats {
            for n in [1usize, 512] {
                if name == "output" && n > 1 {
                    continue;
                }
                let kernel = format!("mul_mat {name}");
                if !only(&format!("{kernel} {format} n={n}")) {
                    continue;
                }
                let row = Row {
                    model: m.key,
                    kernel: kernel.clone(),
                    format: format.name().into(),
                    m: d_out,
                    k: d_in,
                    n,
                    shape: format!("[{n}, {d_in}] · [{d_out}, {d_in}]ᵀ"),
                    ..Row::default()
                };
                if !d_in.is_multiple_of(format.block_values()) {
                    rows.push(Row {
                        skipped: Some(format!(
                            "skipped: rows of {d_in} are not blocks of {} (llama.cpp stores such \
                             a matrix in another format)",
                            format.block_values()
                        )),
                        ..row
                    });
                    continue;
                }
                let weight_bytes = (d_out * format.row_bytes(d_in)) as f64;
                let flops = 2.0 * (n * d_in * d_out) as f64;
                let bytes = random_matrix(format, d_in, d_out, rng);
                let x = rng.floats(n * d_in);
                let result = b.run(row, Some(weight_bytes), (n > 1).then_some(flops), || {
                    let w = GpuWeight::upload(gpu, format, d_in, d_out, &bytes)?;
                    let x = gpu.upload(&x)?;
                    let y = gpu.zeros::<f32>(n * d_out)?;
                    Ok(Box::new(move || weight_product(gpu, &y, &x, n, &w)))
                });
                match result {
                    Ok(r) => rows.push(r),
                    Err(e) => eprintln!("{kernel} {format}: {e}"),
                }
            }
        }
    }
    rows
}

#[allow(clippy::too_many_lines)]
fn other_rows(
    b: &Bench<'_>,
    m: &Model,
    rng: &mut Rng,
    only: &dyn Fn(&str) -> bool,
) -> Result<Vec<Row>, GpuError> {
    let gpu = b.gpu;
    let mut rows = Vec::new();
    let row = |kernel: &str, shape: String| Row {
        model: m.key,
        kernel: kernel.into(),
        format: "F32".into(),
        shape,
        ..Row::default()
    };
    for n in [1usize, 512] {
        if only(&format!("rms_norm n={n}")) {
            let x = rng.floats(n * m.d);
            let w = rng.floats(m.d);
            let bytes = ((2 * n * m.d + m.d) * 4) as f64;
            let mut r = b.run(
                row("rms_norm", format!("[{n}, {}]", m.d)),
                Some(bytes),
                None,
                || {
                    let x = gpu.upload(&x)?;
                    let w = gpu.upload(&w)?;
                    let y = gpu.zeros::<f32>(x.len())?;
                    Ok(Box::new(move || {
                        let nm = Norm::Rms {
                            weight: &w,
                            eps: 1e-5,
                            offset: 0.0,
                        };
                        norm(gpu, &nm, &x, &y)
                    }))
                },
            )?;
            (r.m, r.n) = (m.d, n);
            rows.push(r);
        }
        if only(&format!("rope n={n}")) {
            let x = rng.floats(n * m.heads * m.d_head);
            let bytes = (2 * x.len() * 4) as f64;
            let mut r = b.run(
                row(
                    "rope",
                    format!("[{n}, {}, {}] half-split", m.heads, m.d_head),
                ),
                Some(bytes),
                None,
                || {
                    let x = gpu.upload(&x)?;
                    let pos = gpu.upload(&(0..n as u32).map(|p| p + 7).collect::<Vec<_>>())?;
                    let freqs = RopeFreqs::standard(gpu, m.rope_theta, m.d_head)?;
                    Ok(Box::new(move || {
                        rope(
                            gpu,
                            &x,
                            &pos,
                            &freqs,
                            m.heads,
                            m.d_head,
                            RopeLayout::HalfSplit,
                        )
                    }))
                },
            )?;
            (r.m, r.n) = (m.heads * m.d_head, n);
            rows.push(r);
        }
        if only(&format!("swiglu n={n}")) {
            let g = rng.floats(n * m.ffn);
            let u = rng.floats(n * m.ffn);
            let bytes = (3 * n * m.ffn * 4) as f64;
            let mut r = b.run(
                row("swiglu", format!("[{n}, {}]", m.ffn)),
                Some(bytes),
                None,
                || {
                    let g = gpu.upload(&g)?;
                    let u = gpu.upload(&u)?;
                    let y = gpu.zeros::<f32>(g.len())?;
                    Ok(Box::new(move || {
                        glu(
                            gpu,
                            Activation::Silu,
                            GluInput::Split { gate: &g, up: &u },
                            &y,
                            m.ffn,
                        )
                    }))
                },
            )?;
            (r.m, r.n) = (m.ffn, n);
            rows.push(r);
        }
    }
    if only("argmax") {
        let x = rng.floats(m.vocab);
        let mut r = b.run(
            row(
                "argmax",
                format!(
                    "[1, {}] ({} chunks)",
                    m.vocab,
                    m.vocab.div_ceil(ARGMAX_CHUNK)
                ),
            ),
            Some((m.vocab * 4) as f64),
            None,
            || {
                let x = gpu.upload(&x)?;
                let ids = gpu.zeros::<u32>(1)?;
                Ok(Box::new(move || argmax(gpu, &x, &ids, m.vocab)))
            },
        )?;
        (r.m, r.n) = (m.vocab, 1);
        rows.push(r);
    }
    let q_len = 512;
    for causal in [true, false] {
        let kernel = if causal {
            "flash_attn prefill"
        } else {
            "flash_attn prefill full"
        };
        if !only(kernel) {
            continue;
        }
        let q = rng.floats(q_len * m.heads * m.d_head);
        let k = rng.floats(q_len * m.kv_heads * m.d_head);
        let v = rng.floats(k.len());
        let visible = if causal {
            (q_len * (q_len + 1) / 2) as f64
        } else {
            (q_len * q_len) as f64
        };
        let flops = 4.0 * (m.heads * m.d_head) as f64 * visible;
        let mut r = b.run(
            row(
                kernel,
                format!(
                    "{q_len} {} queries × {q_len} keys, {} / {} heads × {}",
                    if causal { "causal" } else { "unmasked" },
                    m.heads,
                    m.kv_heads,
                    m.d_head
                ),
            ),
            None,
            Some(flops),
            || {
                let q = gpu.upload(&q)?;
                let k = gpu.upload(&k)?;
                let v = gpu.upload(&v)?;
                let o = gpu.zeros::<f32>(q.len())?;
                let shape = AttnShape {
                    q_len,
                    kv_len: q_len,
                    n_heads: m.heads,
                    n_kv_heads: m.kv_heads,
                    d_head: m.d_head,
                };
                let mask = AttnMask {
                    scale: 1.0 / (m.d_head as f32).sqrt(),
                    causal,
                    past: 0,
                    window: None,
                };
                Ok(Box::new(move || {
                    flash_attention(gpu, &q, &k, &v, &o, shape, mask)
                }))
            },
        )?;
        (r.m, r.k, r.n) = (q_len, q_len, m.d_head);
        rows.push(r);
    }
    for ctx in [1024usize, 8192, 32768] {
        if !only(&format!("paged_attn decode ctx={ctx}")) {
            continue;
        }
        let row_len = m.kv_heads * m.d_head;
        let kv_bytes = (2 * ctx * row_len * 4) as f64;
        let mut r = row(
            "paged_attn decode",
            format!(
                "1 query × {ctx} keys, {} / {} heads × {}, blocks of {BLOCK}",
                m.heads, m.kv_heads, m.d_head
            ),
        );
        (r.m, r.k, r.n) = (ctx, m.d_head, 1);
        // Larger than one binding: skipped before making the data.
        let need = (ctx * row_len * 4) as u64;
        if need > gpu.max_binding_bytes() {
            r.skipped = Some(format!(
                "skipped: a K cache of {need} bytes in one binding, this adapter binds at most {}",
                gpu.max_binding_bytes()
            ));
            rows.push(r);
            continue;
        }
        let kc = rng.floats(ctx * row_len);
        let vc = rng.floats(ctx * row_len);
        let q = rng.floats(m.heads * m.d_head);
        let blocks = ctx / BLOCK;
        // The blocks in a scrambled order, as a shared pool hands them out.
        let ids: Vec<u32> = (0..blocks as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % blocks as u32)
            .collect();
        let ids = if is_permutation(&ids) {
            ids
        } else {
            (0..blocks as u32).collect()
        };
        let r = b.run(r, Some(kv_bytes), None, || {
            let kc = gpu.upload(&kc)?;
            let vc = gpu.upload(&vc)?;
            let q = gpu.upload(&q)?;
            let o = gpu.zeros::<f32>(q.len())?;
            let ids = gpu.upload(&ids)?;
            let lens = gpu.upload(&[ctx as u32])?;
            let scratch = DecodeScratch::new(gpu, 1, m.heads, m.d_head, ctx, DEFAULT_PARTITION)?;
            Ok(Box::new(move || {
                let cache = PagedCache {
                    k: &kc,
                    v: &vc,
                    block_size: BLOCK,
                    n_kv_heads: m.kv_heads,
                    d_head: m.d_head,
                };
                let table = BlockTable {
                    ids: &ids,
                    max_blocks: blocks,
                };
                paged_attention(
                    gpu,
                    &q,
                    cache,
                    table,
                    &lens,
                    &o,
                    m.heads,
                    1.0 / (m.d_head as f32).sqrt(),
                    &scratch,
                )
            }))
        })?;
        rows.push(r);
    }
    Ok(rows)
}

fn is_permutation(ids: &[u32]) -> bool {
    let mut seen = vec![false; ids.len()];
    ids.iter()
        .all(|&i| !std::mem::replace(&mut seen[i as usize], true))
}

/// One layer's weights and KV cache in the decode step.
struct Layer {
    attn_norm: GpuBuffer<f32>,
    ffn_norm: GpuBuffer<f32>,
    q: GpuWeight,
    k: GpuWeight,
    v: GpuWeight,
    o: GpuWeight,
    gate: GpuWeight,
    up: GpuWeight,
    down: GpuWeight,
    k_cache: GpuBuffer<f32>,
    v_cache: GpuBuffer<f32>,
}

/// The decode step's format for rows of `d_in`: Q4_K, or Q5_0 where the rows are not blocks
/// of 256 (llama.cpp's fallback for Q4_K, as in SmolLM2's Q4_K_M files).
fn step_format(d_in: usize) -> WeightFormat {
    if d_in.is_multiple_of(256) {
        WeightFormat::Q4K
    } else {
        WeightFormat::Q5_0
    }
}

/// What the decode step cost.
#[derive(Debug, Default)]
struct StepReport {
    model: &'static str,
    layers: usize,
    ctx: usize,
    dispatches_first_layer: u64,
    dispatches_per_layer: u64,
    dispatches_per_step: u64,
    submissions_per_step: u64,
    bytes_up_per_step: u64,
    bytes_down_per_step: u64,
    step_ms: f64,
    weight_bytes: u64,
    kv_bytes: u64,
    other_bytes: u64,
}

#[allow(clippy::too_many_lines)]
fn decode_step(gpu: &Gpu, m: &Model, ctx: usize, rng: &mut Rng) -> Result<StepReport, GpuError> {
    let (d, qd, kvd) = (m.d, m.heads * m.d_head, m.kv_heads * m.d_head);
    let mut weight_bytes = 0u64;
    let mut weight = |d_out: usize, d_in: usize, rng: &mut Rng| -> Result<GpuWeight, GpuError> {
        let fmt = step_format(d_in);
        let w = GpuWeight::upload(gpu, fmt, d_in, d_out, &random_matrix(fmt, d_in, d_out, rng))?;
        weight_bytes += w.data().bytes();
        Ok(w)
    };
    let ones = vec![1.0f32; d];
    let blocks = ctx.div_ceil(BLOCK);
    let mut kv_bytes = 0u64;
    let mut norm_bytes = 0u64;
    let mut layers = Vec::with_capacity(m.layers);
    for _ in 0..m.layers {
        let l = Layer {
            attn_norm: gpu.upload(&ones)?,
            ffn_norm: gpu.upload(&ones)?,
            q: weight(qd, d, rng)?,
            k: weight(kvd, d, rng)?,
            v: weight(kvd, d, rng)?,
            o: weight(d, qd, rng)?,
            gate: weight(m.ffn, d, rng)?,
            up: weight(m.ffn, d, rng)?,
            down: weight(d, m.ffn, rng)?,
            k_cache: gpu.zeros(blocks * BLOCK * kvd)?,
            v_cache: gpu.zeros(blocks * BLOCK * kvd)?,
        };
        kv_bytes += l.k_cache.bytes() + l.v_cache.bytes();
        norm_bytes += l.attn_norm.bytes() + l.ffn_norm.bytes();
        layers.push(l);
    }
    let embed = weight(m.vocab, d, rng)?;
    let head = if m.tied {
        None
    } else {
        Some(weight(m.vocab, d, rng)?)
    };
    let head = head.as_ref().unwrap_or(&embed);
    let final_norm = gpu.upload(&ones)?;
    norm_bytes += final_norm.bytes();
    weight_bytes += norm_bytes;

    let mut other = Vec::<u64>::new();
    let mut f32s = |n: usize| -> Result<GpuBuffer<f32>, GpuError> {
        let b = gpu.zeros::<f32>(n)?;
        other.push(b.bytes());
        Ok(b)
    };
    let (h, x, q, k, v) = (f32s(d)?, f32s(d)?, f32s(qd)?, f32s(kvd)?, f32s(kvd)?);
    let (attn, proj) = (f32s(qd)?, f32s(d)?);
    let (gate, up, act) = (f32s(m.ffn)?, f32s(m.ffn)?, f32s(m.ffn)?);
    let logits = f32s(m.vocab)?;
    let ids = gpu.upload(&[1u32])?;
    let pos = gpu.zeros::<u32>(1)?;
    let lens = gpu.zeros::<u32>(1)?;
    let seq = gpu.zeros::<u32>(1)?;
    let table = gpu.upload(&(0..blocks as u32).collect::<Vec<_>>())?;
    let scratch = DecodeScratch::new(gpu, 1, m.heads, m.d_head, blocks * BLOCK, DEFAULT_PARTITION)?;
    let parts = (blocks * BLOCK).div_ceil(DEFAULT_PARTITION) as u64;
    let scratch_bytes = 4 * (2 * m.heads as u64 * parts + m.heads as u64 * parts * m.d_head as u64);
    let freqs = RopeFreqs::standard(gpu, m.rope_theta, m.d_head)?;
    let other_bytes = other.iter().sum::<u64>()
        + ids.bytes()
        + pos.bytes()
        + lens.bytes()
        + seq.bytes()
        + table.bytes()
        + scratch_bytes
        + 16 * (m.d_head as u64 / 2);
    let scale = 1.0 / (m.d_head as f32).sqrt();

    // One step at position `p`: records everything, submits once (the id's read-back).
    let mut first_layer = 0u64;
    let mut step = |p: usize| -> Result<u32, GpuError> {
        gpu.write(&pos, 0, &[p as u32])?;
        gpu.write(&lens, 0, &[p as u32 + 1])?;
        gather_rows(gpu, &h, &ids, &embed)?;
        let before = gpu.counters().get().dispatches;
        for (i, l) in layers.iter().enumerate() {
            let cache = PagedCache {
                k: &l.k_cache,
                v: &l.v_cache,
                block_size: BLOCK,
                n_kv_heads: m.kv_heads,
                d_head: m.d_head,
            };
            let bt = BlockTable {
                ids: &table,
                max_blocks: blocks,
            };
            if i == 0 {
                norm(gpu, &rms(&l.attn_norm), &h, &x)?;
            } else {
                // h += the previous layer's down product; x = norm(h).
                add_norm(gpu, &rms(&l.attn_norm), &h, &proj, &x)?;
            }
            weight_product(gpu, &q, &x, 1, &l.q)?;
            weight_product(gpu, &k, &x, 1, &l.k)?;
            weight_product(gpu, &v, &x, 1, &l.v)?;
            rope(
                gpu,
                &q,
                &pos,
                &freqs,
                m.heads,
                m.d_head,
                RopeLayout::HalfSplit,
            )?;
            rope(
                gpu,
                &k,
                &pos,
                &freqs,
                m.kv_heads,
                m.d_head,
                RopeLayout::HalfSplit,
            )?;
            kv_write(gpu, cache, bt, &k, &v, &seq, &pos)?;
            paged_attention(gpu, &q, cache, bt, &lens, &attn, m.heads, scale, &scratch)?;
            weight_product(gpu, &proj, &attn, 1, &l.o)?;
            add_norm(gpu, &rms(&l.ffn_norm), &h, &proj, &x)?;
            weight_product(gpu, &gate, &x, 1, &l.gate)?;
            weight_product(gpu, &up, &x, 1, &l.up)?;
            glu(
                gpu,
                Activation::Silu,
                GluInput::Split {
                    gate: &gate,
                    up: &up,
                },
                &act,
                m.ffn,
            )?;
            weight_product(gpu, &proj, &act, 1, &l.down)?;
            if i == 0 {
                first_layer = gpu.counters().get().dispatches - before;
            }
        }
        add_norm(gpu, &rms(&final_norm), &h, &proj, &x)?;
        weight_product(gpu, &logits, &x, 1, head)?;
        argmax(gpu, &logits, &ids, m.vocab)?;
        Ok(gpu.read(&ids)?[0])
    };
    // Warm-up (compiles the pipelines), then steps at the end of the context.
    step(ctx.saturating_sub(4))?;
    let c0 = gpu.counters().get();
    let mut times = Vec::new();
    let n_steps = 3;
    for s in 0..n_steps {
        let t = Instant::now();
        step(ctx.saturating_sub(3) + s)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let c1 = gpu.counters().get();
    let per = |a: u64, b: u64| (b - a) / n_steps as u64;
    let dispatches_per_step = per(c0.dispatches, c1.dispatches);
    // Embedding (1) before the layers; final add_norm (1), head (1), argmax (1 or 2) after.
    let tail = 3 + u64::from(m.vocab > ARGMAX_CHUNK);
    let rest = dispatches_per_step - 1 - tail - first_layer;
    Ok(StepReport {
        model: m.key,
        layers: m.layers,
        ctx,
        dispatches_first_layer: first_layer,
        dispatches_per_layer: rest / (m.layers as u64 - 1).max(1),
        dispatches_per_step,
        submissions_per_step: per(c0.submissions, c1.submissions),
        bytes_up_per_step: per(c0.bytes_up, c1.bytes_up),
        bytes_down_per_step: per(c0.bytes_down, c1.bytes_down),
        step_ms: median(times),
        weight_bytes,
        kv_bytes,
        other_bytes,
    })
}

/// RMSNorm with weight `w`.
fn rms(w: &GpuBuffer<f32>) -> Norm<'_> {
    Norm::Rms {
        weight: w,
        eps: 1e-5,
        offset: 0.0,
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "null".into(),
    }
}

/// A rate with three significant digits at least.
fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn main() {
    let args = parse_args();
    let gpu = match Gpu::open(args.adapter) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("kernels: {e}");
            std::process::exit(1);
        }
    };
    let a = gpu.adapter().clone();
    let software = a.kind == "cpu";
    let models = args.shapes.clone().unwrap_or_else(|| {
        if software {
            vec![MODELS[0]]
        } else {
            vec![MODELS[1], MODELS[2]]
        }
    });
    let stamps = match gpu.timestamps(2) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kernels: {e}");
            std::process::exit(1);
        }
    };
    let how = match stamps.as_ref().map(|s| s.kind()) {
        Some(k) => format!("device timestamps ({k:?})"),
        None => "wall time of one submission".into(),
    };
    let bench = Bench {
        gpu: &gpu,
        stamps,
        repeats: args.repeats,
        target: args.target,
    };
    let only = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    if !args.json {
        println!(
            "adapter: {} ({}, {}, driver {}; largest binding {} MB; f16 {}, subgroups {})",
            a.name,
            a.kind,
            a.api,
            a.driver,
            a.max_binding_bytes >> 20,
            a.shader_f16,
            a.subgroups
        );
        println!(
            "timing: {how}; median of {} batches, each about {} ms",
            args.repeats,
            args.target.as_millis()
        );
        if software {
            println!("note: a software device (CPU): these numbers test the harness, not speed");
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut rows = Vec::new();
    let mut steps = Vec::new();
    for m in &models {
        if !args.json {
            println!(
                "\n{} (d {}, ffn {}, vocab {}, {} / {} heads × {}, {} layers)",
                m.name, m.d, m.ffn, m.vocab, m.heads, m.kv_heads, m.d_head, m.layers
            );
            println!(
                "{:<28} {:<6} {:<44} {:>11} {:>5} {:>9} {:>10}",
                "kernel", "format", "shape", "µs/call", "n", "GB/s", "GFLOP/s"
            );
        }
        let mut mine = product_rows(&bench, m, &mut rng, &only);
        match other_rows(&bench, m, &mut rng, &only) {
            Ok(r) => mine.extend(r),
            Err(e) => eprintln!("{}: {e}", m.name),
        }
        if !args.json {
            for r in &mine {
                let per_rows = ["mul_mat", "rms_norm", "rope", "swiglu"];
                let label = if per_rows.iter().any(|p| r.kernel.starts_with(p)) {
                    format!("{} n={}", r.kernel, r.n)
                } else {
                    r.kernel.clone()
                };
                match &r.skipped {
                    Some(why) => println!("{label:<28} {:<6} {:<44} {why}", r.format, r.shape),
                    None => println!(
                        "{label:<28} {:<6} {:<44} {:>11.1} {:>5} {:>9} {:>10}",
                        r.format,
                        r.shape,
                        r.us,
                        r.calls,
                        r.gbps.map_or("".into(), rate),
                        r.gflops.map_or("".into(), rate),
                    ),
                }
            }
        }
        rows.extend(mine);
        if args.step && only("step") {
            match decode_step(&gpu, m, args.ctx, &mut rng) {
                Ok(s) => {
                    if !args.json {
                        print_step(&s);
                    }
                    steps.push(s);
                }
                Err(e) => {
                    println!("decode step of {}: {e}", m.name);
                }
            }
        }
    }
    if args.json {
        print_json(&a, &how, &rows, &steps);
    }
}

fn print_step(s: &StepReport) {
    let device = s.weight_bytes + s.kv_bytes + s.other_bytes;
    println!(
        "decode step ({} layers, Q4_K weights (Q5_0 for rows that are not blocks of 256), \
         position {} of a {}-position KV cache):",
        s.layers,
        s.ctx - 1,
        s.ctx
    );
    println!(
        "  dispatches: {} per layer ({} in the first, whose norm has no residual add before \
         it), {} per step",
        s.dispatches_per_layer, s.dispatches_first_layer, s.dispatches_per_step
    );
    println!("  submissions per step: {}", s.submissions_per_step);
    println!(
        "  bytes per step: {} up (position and context length; the token id stays on the \
         device), {} down (the id)",
        s.bytes_up_per_step, s.bytes_down_per_step
    );
    println!("  step: {:.3} ms wall (median of 3)", s.step_ms);
    println!(
        "  device memory: {:.1} MB = weights {:.1} MB + KV cache {:.1} MB + activations and \
         scratch {:.1} MB ({:.3}× the weights)",
        mb(device),
        mb(s.weight_bytes),
        mb(s.kv_bytes),
        mb(s.other_bytes),
        device as f64 / s.weight_bytes as f64
    );
}

fn print_json(a: &transformer_gpu::AdapterSummary, how: &str, rows: &[Row], steps: &[StepReport]) {
    let mut out = String::from("{\n");
    out.push_str(&format!(
        "  \"adapter\": {{\"name\": {}, \"kind\": {}, \"api\": {}, \"driver\": {}, \
         \"max_binding_bytes\": {}}},\n",
        json_str(&a.name),
        json_str(a.kind),
        json_str(&a.api),
        json_str(&a.driver),
        a.max_binding_bytes
    ));
    out.push_str(&format!(
        "  \"timing\": {},\n  \"kernels\": [\n",
        json_str(how)
    ));
    let body: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "    {{\"model\": {}, \"kernel\": {}, \"format\": {}, \"m\": {}, \"k\": {}, \
                 \"n\": {}, \"shape\": {}, \"us\": {}, \"calls\": {}, \"method\": {}, \
                 \"gbps\": {}, \"gflops\": {}, \"skipped\": {}}}",
                json_str(r.model),
                json_str(&r.kernel),
                json_str(&r.format),
                r.m,
                r.k,
                r.n,
                json_str(&r.shape),
                json_num(r.skipped.is_none().then_some(r.us)),
                r.calls,
                json_str(r.method),
                json_num(r.gbps),
                json_num(r.gflops),
                r.skipped.as_deref().map_or("null".into(), json_str)
            )
        })
        .collect();
    out.push_str(&body.join(",\n"));
    out.push_str("\n  ],\n  \"decode_steps\": [\n");
    let body: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "    {{\"model\": {}, \"layers\": {}, \"ctx\": {}, \"dispatches_per_layer\": {}, \
                 \"dispatches_first_layer\": {}, \"dispatches_per_step\": {}, \
                 \"submissions_per_step\": {}, \"bytes_up_per_step\": {}, \
                 \"bytes_down_per_step\": {}, \"step_ms\": {}, \"weight_bytes\": {}, \
                 \"kv_bytes\": {}, \"other_bytes\": {}}}",
                json_str(s.model),
                s.layers,
                s.ctx,
                s.dispatches_per_layer,
                s.dispatches_first_layer,
                s.dispatches_per_step,
                s.submissions_per_step,
                s.bytes_up_per_step,
                s.bytes_down_per_step,
                json_num(Some(s.step_ms)),
                s.weight_bytes,
                s.kv_bytes,
                s.other_bytes
            )
        })
        .collect();
    out.push_str(&body.join(",\n"));
    out.push_str("\n  ]\n}");
    println!("{out}");
}
