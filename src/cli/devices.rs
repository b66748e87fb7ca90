//! `transformer devices [--json]`: what this machine can run models on. The CPU (always), then
//! every GPU adapter in the order `gpu:N` names them (discrete first, software devices such as
//! Mesa's lavapipe last): its name, kind, graphics API, driver, the largest buffer one binding
//! may hold, and the shader features the kernels use where present (f16 arithmetic, subgroups,
//! cooperative matrices).

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::outln;

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// One JSON object: `{"devices": [...]}`, the CPU first.
    #[arg(long)]
    pub json: bool,
}

/// The CPU's model name as the kernel reports it (`/proc/cpuinfo`), or its architecture.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let adapters = transformer_gpu::adapters();
    if args.json {
        let mut list = vec![json!({
            "device": "cpu", "name": cpu_name(), "kind": "cpu", "threads": threads,
        })];
        for a in &adapters {
            list.push(json!({
                "device": format!("gpu:{}", a.index),
                "name": a.name,
                "kind": a.kind,
                "api": a.api,
                "driver": a.driver,
                "max_binding_bytes": a.max_binding_bytes,
                "shader_f16": a.shader_f16,
                "subgroups": a.subgroups,
                "cooperative_matrix": a.cooperative_matrix,
            }));
        }
        outln!("{}", json!({ "devices": list }))?;
    } else {
        outln!("cpu\t{} ({threads} threads)", cpu_name())?;
        for a in &adapters {
            let mut features = Vec::new();
            for (on, name) in [
                (a.shader_f16, "f16"),
                (a.subgroups, "subgroups"),
                (a.cooperative_matrix, "cooperative-matrix"),
            ] {
                if on {
                    features.push(name);
                }
            }
            let kind = if a.kind == "cpu" {
                "software (runs on the CPU)"
            } else {
                a.kind
            };
            outln!(
                "gpu:{}\t{}\t{kind}\t{} ({})\tbinding {} MiB\t{}",
                a.index,
                a.name,
                a.api,
                a.driver,
                a.max_binding_bytes >> 20,
                if features.is_empty() {
                    "-".to_string()
                } else {
                    features.join(" ")
                },
            )?;
        }
    }
    if adapters.is_empty() {
        eprintln!("{}", transformer_gpu::GpuError::NoAdapter);
    }
    Ok(())
}
