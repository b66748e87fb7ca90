//! No build step. The script exists for its `[build-dependencies]` entry in Cargo.toml (syn's
//! `visit-mut` feature, shared with the `mpi` feature's bindgen so that both builds reuse one
//! set of proc macros).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
