//! apf-wasm: Kubernetes API Priority and Fairness for Envoy / Istio gateways.
//!
//! The crate is a host-independent core (everything but `filter`) plus thin proxy-wasm glue
//! (`filter`, compiled only for `wasm32`). The `apf` CLI and the simulator run the same core.
//! Each module holds one domain concept (see its documentation).
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod base64;
pub mod classify;
pub mod cli;
pub mod codec;
pub mod config;
pub mod digest;
pub mod duration;
pub mod engine;
pub mod etcd;
pub mod fairqueuing;
pub mod fleet;
pub mod gateway;
pub mod limits;
pub mod observe;
pub mod policy;
pub mod simulate;

#[cfg(all(target_arch = "wasm32", feature = "proxy-wasm-glue"))]
pub mod filter;

#[cfg(all(not(target_arch = "wasm32"), feature = "dynamic-module"))]
pub mod native;

/// The tests' deterministic generator, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/rng.rs"]
mod test_rng;

/// Monotonic time in nanoseconds (the engine's clock unit; origin is arbitrary but shared by all
/// workers of one process).
pub type Nanos = i64;

pub const NANOS_PER_SEC: Nanos = 1_000_000_000;
