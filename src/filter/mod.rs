//! proxy-wasm glue: Envoy's callbacks forwarded to the gateway (`crate::gateway`), with
//! [`host::WasmHost`] as its host.
//!
//! Every worker VM owns one [`Worker`] (this VM's lease, mailbox, requests and stats), shared
//! by all root contexts of the VM, because Envoy reuses VMs across configuration updates and
//! in-flight requests keep the configuration they started with. Envoy defers a resumed stream's
//! continuation and a local reply until the callback returns, so no callback re-enters another
//! while the worker is borrowed.

mod alloc;
mod host;

pub use host::HostStore;

use crate::engine::store::Store;
use crate::gateway::host::{Action as GatewayAction, Body, Host};
use crate::gateway::{Request, Root, Worker};
use host::WasmHost;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;

#[cfg(not(target_feature = "atomics"))]
#[global_allocator]
static ALLOC: alloc::SizeClassAlloc = alloc::SizeClassAlloc::new();

thread_local! {
    /// This VM's worker, for the VM's life.
    static WORKER: RefCell<Worker> = RefCell::new(Worker::new(WasmHost.monotonic_nanos() as u64));
}

/// Runs `f` on this VM's worker; `None` if it is borrowed (a re-entrant callback, which Envoy
/// does not make: logged, never a panic).
fn with_worker<T>(f: impl FnOnce(&mut Worker) -> T) -> Option<T> {
    WORKER.with(|w| match w.try_borrow_mut() {
        Ok(mut w) => Some(f(&mut w)),
        Err(_) => {
            log::error!("apf: re-entrant callback; ignored");
            None
        }
    })
}

fn action(a: GatewayAction) -> Action {
    match a {
        GatewayAction::Continue => Action::Continue,
        GatewayAction::Pause => Action::Pause,
    }
}

struct FilterRoot(Root);

struct FilterHttp(Request);

impl Context for FilterRoot {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        with_worker(|w| self.0.on_http_call_response(&WasmHost, w, token, body_size));
    }
}

impl RootContext for FilterRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = WasmHost.body_bytes(Body::Configuration, 0, usize::MAX).unwrap_or_default();
        self.0.on_configure(&WasmHost, &bytes)
    }

    fn on_tick(&mut self) {
        with_worker(|w| self.0.on_tick(&WasmHost, w));
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        with_worker(|w| self.0.on_queue_ready(&WasmHost, w));
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(FilterHttp(self.0.new_request(context_id))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Context for FilterHttp {}

impl HttpContext for FilterHttp {
    fn on_http_request_headers(&mut self, _n: usize, _end: bool) -> Action {
        action(with_worker(|w| self.0.on_request_headers(&WasmHost, w)).unwrap_or(GatewayAction::Continue))
    }

    fn on_http_response_headers(&mut self, _n: usize, end: bool) -> Action {
        action(with_worker(|w| self.0.on_response_headers(&WasmHost, w, end)).unwrap_or(GatewayAction::Continue))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(with_worker(|w| self.0.on_response_body(&WasmHost, w, body_size, end_of_stream)).unwrap_or(GatewayAction::Continue))
    }

    fn on_http_response_trailers(&mut self, _n: usize) -> Action {
        action(with_worker(|w| self.0.on_response_trailers(&WasmHost, w)).unwrap_or(GatewayAction::Continue))
    }

    fn on_log(&mut self) {
        with_worker(|w| self.0.on_stream_end(&WasmHost, w));
    }
}

impl Drop for FilterHttp {
    fn drop(&mut self) {
        with_worker(|w| self.0.on_stream_end(&WasmHost, w));
    }
}

/// Starts the filter in this VM: the body of the module's entry point. `store`: this VM's view
/// of the shared store when it is not Envoy's shared data as is ([`HostStore`]), for a module of
/// its own that wraps it (bench/isolated).
pub fn start(store: Option<&'static dyn Store>) {
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    if store.is_some_and(|s| !host::set_store(s)) {
        log::error!("apf: the shared store is already in use; not replaced");
    }
    std::panic::set_hook(Box::new(|info| {
        log::error!("apf: panic: {info}");
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(FilterRoot(Root::default())) });
}

#[cfg(feature = "proxy-wasm-filter")]
proxy_wasm::main! {{ start(None); }}
