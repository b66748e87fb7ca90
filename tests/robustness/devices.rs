//! `transformer devices`: the CPU always, each GPU adapter as `gpu:N`; no adapter is a clear
//! message, not a failure.

use std::process::Command;

fn devices(envs: &[(&str, &str)]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(["devices", "--json"])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = serde_json::from_slice(&out.stdout).unwrap();
    (json, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Whether this machine has a Vulkan driver installed (Mesa's lavapipe in CI).
fn vulkan_driver_installed() -> bool {
    std::fs::read_dir("/usr/share/vulkan/icd.d").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn lists_the_cpu_then_each_adapter_in_gpu_n_order() {
    let (json, stderr) = devices(&[]);
    let list = json["devices"].as_array().unwrap();
    assert_eq!(list[0]["device"], "cpu");
    assert!(list[0]["threads"].as_u64().unwrap() >= 1);
    for (i, d) in list[1..].iter().enumerate() {
        assert_eq!(d["device"], format!("gpu:{i}"));
        assert!(!d["name"].as_str().unwrap().is_empty());
        assert!(d["max_binding_bytes"].as_u64().unwrap() > 0);
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    if list.len() == 1 {
        assert!(stderr.contains("no Vulkan device found"), "{stderr}");
        assert!(
            !ci,
            "CI is set and no GPU adapter was found (.ci/run installs lavapipe)"
        );
        if vulkan_driver_installed() {
            panic!("a Vulkan driver is installed but no adapter was listed: {stderr}");
        }
        eprintln!("skipped the adapter checks: no Vulkan device on this machine");
    }
}

#[test]
fn no_driver_is_a_message_naming_what_to_install() {
    // The Vulkan loader reads its drivers from this list only: none exists.
    let none = [
        ("VK_ICD_FILENAMES", "/nonexistent/icd.json"),
        ("VK_DRIVER_FILES", "/nonexistent/icd.json"),
    ];
    let (json, stderr) = devices(&none);
    assert_eq!(json["devices"].as_array().unwrap().len(), 1, "{json}");
    assert!(
        stderr.contains("no Vulkan device found: install mesa-vulkan-drivers"),
        "{stderr}"
    );
}

/// `generate --device` (and `TRANSFORMER_DEVICE`): a device name that does not exist, a
/// CPU-only option on a GPU, and a GPU asked for with no driver are each one clear error, not
/// a crash and not a silent fall back to the CPU.
#[test]
fn bad_device_choices_are_errors_naming_them() {
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .args([
                "generate",
                "--model",
                "/nonexistent/model.gguf",
                "--prompt",
                "x",
            ])
            .args(args)
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} {envs:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(["bench", "--device", "gpu", "--steps", "1"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("--device is for --generate"),
        "{e}"
    );
    // `serve --device gpu`: what a GPU's engine does not do, named before anything loads.
    for (args, says) in [
        (
            &["--block-size", "8"][..],
            "--block-size 8: a GPU's key/value blocks hold 16",
        ),
        (
            &["--cache-type-k", "q8_0"][..],
            "--cache-type-k/-v are CPU-only",
        ),
        (&["--precision", "bf16"][..], "not --precision bf16 or int8"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .args([
                "serve",
                "--model",
                "/nonexistent/m.gguf",
                "--device",
                "gpu",
                "--port",
                "0",
            ])
            .args(args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && !e.contains("panicked"),
            "{args:?}: {e}"
        );
        assert!(e.contains(says), "{args:?}: {e}");
    }
    let e = run(&["--device", "cuda"], &[]);
    assert!(
        e.contains(r#"unknown device "cuda": cpu, gpu or gpu:N"#),
        "{e}"
    );
    let e = run(&[], &[("TRANSFORMER_DEVICE", "gpu:x")]);
    assert!(e.contains("TRANSFORMER_DEVICE: unknown device"), "{e}");
    let e = run(&["--device", "gpu", "--precision", "int8"], &[]);
    assert!(e.contains("not --precision bf16 or int8"), "{e}");
    let e = run(&["--device", "gpu", "--cache-type-k", "q8_0"], &[]);
    assert!(e.contains("--cache-type-k/-v are CPU-only"), "{e}");
    // The model is looked at before the device is opened: a missing file is named first.
    let e = run(&["--device", "gpu"], &[]);
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
    // A real model and no Vulkan driver at all: the message says what to install.
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/reference/kquants/llama256.Q4_0.gguf"
    );
    if std::path::Path::new(model).is_file() {
        let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .args([
                "generate", "--model", model, "--prompt", "x", "--device", "gpu",
            ])
            .envs([
                ("VK_ICD_FILENAMES", "/nonexistent/icd.json"),
                ("VK_DRIVER_FILES", "/nonexistent/icd.json"),
            ])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !e.contains("panicked"), "{e}");
        assert!(
            e.contains("no Vulkan device found: install mesa-vulkan-drivers for a software one, or a GPU driver"),
            "{e}"
        );
    }
}
