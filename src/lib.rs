//! apf-wasm: Kubernetes API Priority and Fairness for Envoy / Istio gateways.
//!
//! The crate is a host-independent core (everything but `filter`) plus thin proxy-wasm glue
//! (`filter`, compiled only for `wasm32`). The `apf` CLI and the simulator run the same core.
//!
//! Module map (one domain concept per module):
//! - [`policy`]: FlowSchema / PriorityLevelConfiguration objects (all API versions), defaulting,
//!   validation, Kubernetes' built-in configuration, and the plugin configuration document.
//! - [`digest`]: what we learn from one HTTP request: RequestInfo, caller identity, long-running
//!   check, work estimate (seats).
//! - [`classify`]: FlowSchema matching, flow distinguisher and flow hash.
//! - [`fairqueuing`]: seat-seconds, the shuffle-sharding dealer and the QueueSet.
//! - [`limits`]: nominal/lendable/borrowing seats, seat-demand integrator, periodic borrowing,
//!   Retry-After tracker.
//! - [`engine`]: the APF engine over an injected clock and shared key-value store (CAS), with
//!   worker leases; the filter and the simulator both drive it.
//! - [`simulate`]: the deterministic discrete-event simulator behind `apf simulate`.
//! - [`cli`]: the `apf` command's subcommands.
//! - [`codec`]: the compact binary encoding of shared state.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod classify;
pub mod cli;
pub mod codec;
pub mod digest;
pub mod duration;
pub mod engine;
pub mod fairqueuing;
pub mod limits;
pub mod observe;
pub mod policy;
pub mod simulate;

#[cfg(all(target_arch = "wasm32", feature = "proxy-wasm-filter"))]
mod filter;

/// Monotonic time in nanoseconds (the engine's clock unit; origin is arbitrary but shared by all
/// workers of one process).
pub type Nanos = i64;

pub const NANOS_PER_SEC: Nanos = 1_000_000_000;
