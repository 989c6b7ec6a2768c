//! proxy-wasm glue: the thin layer between Envoy and the engine.
//!
//! - Every worker VM has one [`worker::Worker`] (thread-local): its lease slot, its mailbox (a
//!   shared queue with a name unique to the VM), and the table of its requests that hold or wait
//!   for seats. It is shared by all root contexts of the VM, because Envoy reuses VMs across
//!   configuration updates and in-flight requests keep the configuration they started with.
//! - A root context holds one compiled configuration (`on_configure`) and runs the timer.
//! - An HTTP context digests and classifies its request, asks the engine, and continues, pauses
//!   or answers 429. Whoever frees seats dispatches by fair queuing; a dispatched request owned by
//!   another worker is woken through that worker's mailbox, because only the owning worker can
//!   resume a paused stream.

mod alloc;
mod host;
mod http;
#[cfg(feature = "bench-isolated-levels")]
mod isolated_levels;
mod metrics;
mod root;
mod worker;

#[cfg(not(target_feature = "atomics"))]
#[global_allocator]
static ALLOC: alloc::SizeClassAlloc = alloc::SizeClassAlloc::new();

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        log::error!("apf: panic: {info}");
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
