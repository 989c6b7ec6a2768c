//! apf-wasm fuzz targets (see `targets`) and the dependency-free mutation fuzzer (`harness`) that
//! runs them inside `cargo test` where libFuzzer is not available.
pub mod harness;
pub mod targets;
