//! proxy-wasm glue (stub)
