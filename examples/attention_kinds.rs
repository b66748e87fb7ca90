//! Time and peak memory of one self-attention layer of each kind (`layer_attention`: exact,
//! window, sparse, global tokens, linear) at one sequence length, in one of two modes:
//!
//! - `train`: a causal forward and backward over one sequence of N random rows;
//! - `decode`: N positions fed one at a time through the layer's decoding cache (a sliding
//!   window's paged cache releases what the window left; linear attention keeps its running
//!   sums only).
//!
//! ```sh
//! cargo run --release --example attention_kinds -- KIND N train|decode [D_MODEL HEADS]
//! ```
//!
//! KIND as `train-lm --attention` reads it (`exact`, `window:64`, `sparse:64:64`,
//! `global:64:4`, `linear`). Prints one line: `kind n mode seconds tokens/s peak-RSS-MiB`, the
//! peak read from `/proc/self/status` (`VmHWM`), so run one process per measurement.

use std::time::Instant;
use transformer::kernels::attention::AttnMask;
use transformer::model::attention::MultiHeadAttention;
use transformer::model::attention_kind::AttentionKind;
use transformer::model::kv_cache::KvCache;
use transformer::model::step_layout::StepLayout;
use transformer::rng::Rng;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: attention_kinds KIND N train|decode [D_MODEL HEADS]";
    let (Some(kind), Some(n), Some(mode)) = (args.first(), args.get(1), args.get(2)) else {
        return Err(usage.into());
    };
    let kind: AttentionKind = kind.parse()?;
    let n: usize = n.parse().map_err(|_| format!("N {n:?} is not a number"))?;
    let d_model: usize = args.get(3).map_or(Ok(256), |s| s.parse())?;
    let heads: usize = args.get(4).map_or(Ok(4), |s| s.parse())?;
    let mut rng = Rng::new(1);
    let mut layer = MultiHeadAttention::<f32>::new(d_model, heads, &mut rng).with_kind(kind, true);
    let x: Vec<f32> = (0..n * d_model)
        .map(|_| rng.uniform_range(-1.0, 1.0) as f32)
        .collect();
    let start = Instant::now();
    match mode.as_str() {
        "train" => {
            let lens = [n];
            let mask = AttnMask {
                key_lens: &lens,
                causal: true,
                q_offset: 0,
            };
            let (y, cache) = layer.forward(&x, &x, 1, mask, None);
            let (dx, _) = layer.backward(&x, &x, cache, &y);
            std::hint::black_box(dx);
        }
        "decode" => {
            let block_rows = layer.window.map_or(n, |w| w.clamp(1, 64));
            let mut cache = KvCache::new(1, n, layer.d_kv(), block_rows);
            for p in 0..n {
                let (y, _) = layer.step(
                    &x[p * d_model..(p + 1) * d_model],
                    &mut cache,
                    &StepLayout::dense(),
                );
                std::hint::black_box(y);
            }
        }
        _ => return Err(usage.into()),
    }
    let seconds = start.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let peak_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    println!(
        "{} {n} {mode} {seconds:.3} {:.0} {:.1}",
        kind.label(),
        n as f64 / seconds,
        peak_kib / 1024.0
    );
    Ok(())
}
