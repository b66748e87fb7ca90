//! `transformer bench --bandwidth`: the machine's memory read bandwidth, as STREAM measures it
//! but reading only (a decode step reads its weights and writes almost nothing).
//!
//! A buffer far larger than the last-level cache (`--bandwidth-mib`, 1 GiB by default) is
//! mapped, advised for transparent huge pages (unless `--small-pages`) and filled; then each
//! pass sums it as 64-bit words, split into one contiguous part per thread:
//!
//! ```text
//! bandwidth = bytes / t_pass            (GB/s, 10^9 bytes a second)
//! sum       = Σ_i word_i  (mod 2^64)    (checked against the sum the fill wrote)
//! ```
//!
//! `--warmup-steps` untimed passes, then the median of `--steps` timed ones. A decode step that
//! reads every weight byte once runs at `weight bytes × tokens/s`; dividing that by this figure
//! gives the share of the bandwidth it uses (`benches/compare/llama_bench.sh` prints both).

use super::bench::{median, BenchArgs};
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::time::Instant;

/// Bytes summed per inner step: eight words, eight independent sums (no add waits on another).
const LANES: usize = 8;

/// The wrapping sum of `bytes` read as native-endian 64-bit words (a tail shorter than a
/// word is read as a zero-padded word). Eight sums run side by side so the loads are the limit,
/// not one chain of additions.
pub fn read_sum(bytes: &[u8]) -> u64 {
    let mut sums = [0u64; LANES];
    let mut groups = bytes.chunks_exact(8 * LANES);
    for group in &mut groups {
        for (sum, word) in sums.iter_mut().zip(group.chunks_exact(8)) {
            *sum = sum.wrapping_add(u64::from_ne_bytes(word.try_into().unwrap()));
        }
    }
    let rest = groups.remainder();
    for word in rest.chunks(8) {
        let mut padded = [0u8; 8];
        padded[..word.len()].copy_from_slice(word);
        sums[0] = sums[0].wrapping_add(u64::from_ne_bytes(padded));
    }
    sums.iter().fold(0u64, |a, &s| a.wrapping_add(s))
}

/// Fills `bytes` with word `i` = `i · 0x9E37_79B9_7F4A_7C15` (touching every page, so the timed
/// passes read memory that is mapped) and returns their wrapping sum, which `read_sum` must
/// give back. The buffer's length is a multiple of 8.
fn fill(bytes: &mut [u8]) -> u64 {
    const STEP: u64 = 0x9E37_79B9_7F4A_7C15;
    bytes
        .par_chunks_mut(1 << 20)
        .enumerate()
        .map(|(chunk, block)| {
            let first = (chunk << 20) as u64 / 8;
            let mut sum = 0u64;
            for (i, word) in block.chunks_exact_mut(8).enumerate() {
                let value = (first + i as u64).wrapping_mul(STEP);
                word.copy_from_slice(&value.to_ne_bytes());
                sum = sum.wrapping_add(value);
            }
            sum
        })
        .reduce(|| 0, u64::wrapping_add)
}

/// One pass: every thread sums its own contiguous part. Returns the seconds and the sum.
fn pass(bytes: &[u8], threads: usize) -> (f64, u64) {
    let part = bytes.len().div_ceil(threads).next_multiple_of(64);
    let start = Instant::now();
    let sum = bytes
        .par_chunks(part)
        .map(read_sum)
        .reduce(|| 0, u64::wrapping_add);
    (start.elapsed().as_secs_f64(), sum)
}

/// Bytes of this process's memory on transparent huge pages (`AnonHugePages` of
/// `/proc/self/smaps_rollup`), if the system reports it.
fn huge_page_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn bench_bandwidth(args: &BenchArgs, threads: usize) -> Result<()> {
    let mib = args.bandwidth_mib;
    anyhow::ensure!(
        (1..=1 << 20).contains(&mib) && args.steps > 0,
        "--bandwidth-mib must be in 1..=1048576 and --steps positive"
    );
    let len = mib << 20;
    let mut map = memmap2::MmapOptions::new()
        .len(len)
        .map_anon()
        .with_context(|| format!("cannot map a {mib} MiB buffer"))?;
    let advised = !args.small_pages && map.advise(memmap2::Advice::HugePage).is_ok();
    let expected = fill(&mut map);
    let huge = huge_page_bytes();
    let mut rates = Vec::with_capacity(args.steps);
    for step in 0..args.warmup_steps + args.steps {
        let (secs, sum) = pass(&map, threads);
        anyhow::ensure!(
            sum == expected,
            "pass {step}: the sum read back ({sum:#x}) is not the one written ({expected:#x})"
        );
        if step >= args.warmup_steps {
            rates.push(len as f64 / secs / 1e9);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    let med = median(rates.clone());
    if args.json {
        let line = serde_json::json!({
            "bandwidth_gbs": med,
            "passes_gbs": rates,
            "threads": threads,
            "buffer_mib": mib,
            "huge_pages_advised": advised,
            "huge_page_mib": huge.map(|b| b >> 20),
            "load": load,
        });
        println!("{line}");
    } else {
        let pages = match (advised, huge) {
            (true, Some(b)) => format!("huge pages advised, {} MiB on them", b >> 20),
            (true, None) => "huge pages advised".to_string(),
            (false, _) => "small pages".to_string(),
        };
        println!(
            "read bandwidth: {med:.1} GB/s (median of {} passes over {mib} MiB, {threads} \
             thread(s), {pages}; passes {:.1}-{:.1} GB/s)",
            rates.len(),
            rates.iter().cloned().fold(f64::INFINITY, f64::min),
            rates.iter().cloned().fold(0.0, f64::max),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapping sum of the words of `bytes`, one at a time (the tail zero-padded).
    fn plain_sum(bytes: &[u8]) -> u64 {
        bytes.chunks(8).fold(0u64, |sum, w| {
            let mut padded = [0u8; 8];
            padded[..w.len()].copy_from_slice(w);
            sum.wrapping_add(u64::from_ne_bytes(padded))
        })
    }

    #[test]
    fn the_read_sum_is_the_sum_of_the_words() {
        // Lengths around the 64-byte group and the 8-byte word, and words that overflow.
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 151 % 251) as u8 ^ 0xF0).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 200, 999, 1000] {
            assert_eq!(
                read_sum(&bytes[..len]),
                plain_sum(&bytes[..len]),
                "len {len}"
            );
        }
        assert_eq!(read_sum(&[1, 0, 0, 0, 0, 0, 0, 0].repeat(16)), 16);
        assert_eq!(read_sum(&u64::MAX.to_ne_bytes().repeat(2)), u64::MAX - 1);
    }

    #[test]
    fn a_fill_reads_back_its_sum_over_threads() {
        // 3 MiB + 64 bytes: parts that are not whole blocks of the fill.
        let mut bytes = vec![0u8; (3 << 20) + 64];
        let expected = fill(&mut bytes);
        let words = bytes.len() as u64 / 8;
        let closed = (0..words).fold(0u64, |s, i| {
            s.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        });
        assert_eq!(expected, closed);
        assert_eq!(plain_sum(&bytes), expected);
        for threads in [1, 2, 3, 7] {
            let (secs, sum) = pass(&bytes, threads);
            assert_eq!(sum, expected, "{threads} threads");
            assert!(secs > 0.0);
        }
    }
}
