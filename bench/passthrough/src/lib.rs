//! Pass-through proxy-wasm module: an HTTP context whose callbacks all continue. Benchmark
//! baseline for "a Wasm filter is present" (every proxy_on_* callback still crosses into the VM).
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

proxy_wasm::main! {{
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(PassThrough) });
}}

struct PassThrough;

impl Context for PassThrough {}

impl HttpContext for PassThrough {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        Action::Continue
    }
}
