//! The native host: the gateway (`crate::gateway`) as an Envoy dynamic module (Envoy 1.40's
//! dynamic-module ABI), loaded as `libapf_wasm.so` by the `envoy.filters.http.dynamic_modules`
//! filter with the same JSON configuration as the proxy-wasm module.
//!
//! - [`abi`]: our declarations of the ABI, the exported hooks, every `unsafe` of the host; each
//!   hook runs under `catch_unwind`, so no panic crosses into Envoy.
//! - `glue`: hooks → gateway; one worker per Envoy worker thread, a root per configuration.
//! - `host`: [`crate::gateway::Host`] over the ABI; deferred resumes and local replies.
//! - `callout`: HTTP calls, made from the main thread, replies routed back to the asking root.
//! - `wake`: per-worker mailboxes woken through stream schedulers, and the timer thread.
//! - `logger`, `metrics`: logs and stats through Envoy; `idle_stats`: every worker's pending stats,
//!   added by the main thread; `leases`: every worker's lease, renewed by the main thread.
//! - `isolated` (feature `native-isolated-levels`): the saturated benchmark's no-sharing control.

pub mod abi;
mod callout;
mod glue;
mod host;
mod idle_stats;
#[cfg(feature = "native-isolated-levels")]
mod isolated;
mod leases;
mod logger;
mod metrics;
mod wake;
