//! The server: its engine (batched output equals single-request output, blocks returned), the
//! HTTP interface, the kinds of model it serves, and translation.
//!
//! One test binary (cargo builds `tests/serving/main.rs` as the target `serving`); each module
//! was its own binary before. Run one module with `cargo test --test serving MODULE::`.

mod json_check;
mod json_close;
mod serve_constrain;
mod serve_device;
mod serve_engine;
mod serve_hostile;
mod serve_http;
mod serve_kinds;
mod serve_libre;
mod serve_llama;
mod serve_llama_compat;
mod serve_options;
mod serve_prefill;
mod serve_prefix_cache;
mod serve_routes;
mod serve_surface;
mod serve_tools;
mod serve_translate;
