//! Nothing lost, nothing crashes: bad inputs and divergence (`robust`), runs killed at random
//! moments and resumed (`crash`; `tests/crash/crash.sh` runs it at length), and structured
//! mutations of valid files fed to every reader (`fuzz_readers`; `tests/fuzz/fuzz.sh`).
//!
//! One test binary (cargo builds `tests/robustness/main.rs` as the target `robustness`); each
//! module was its own binary before. Run one module with `cargo test --test robustness MODULE::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../fuzz_common/mod.rs"]
mod fuzz_common;

mod crash;
mod devices;
mod fuzz_grammars;
mod fuzz_readers;
#[cfg(feature = "hub")]
mod hub;
mod robust;
