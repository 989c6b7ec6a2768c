//! Reference module for the saturated benchmark (not part of the product).
//!
//! It has the same request shape as apf-wasm at saturation (requests beyond the seat limit are
//! paused and later resumed) but none of the global state: each worker keeps its own seat count
//! and FIFO, so there are no shared values, no CAS and no cross-worker wake-ups. Its plugin
//! configuration is the per-worker seat limit as a decimal string (the benchmark gives each
//! worker limit ÷ workers so that the total is the same as apf-wasm's level). It also does the
//! floor module's host calls (request headers, two shared-data CAS bumps, two response headers),
//! so that apf-wasm ÷ localqueue at the same worker count is the cost of APF's logic and global
//! state in that shape, and localqueue's own 2-worker ÷ 1-worker ratio is what splitting a
//! paused-and-resumed pipeline over two Envoy workers costs by itself.
//!
//! The configuration may add `,BYTES` and `,private`: the shared-data value it bumps is then
//! BYTES long (as apf-wasm's level value: ≈ 1.1 KB in the saturated shape) and, with
//! `private`, each worker bumps a key of its own. Shared ÷ private with 2 workers is what Envoy
//! charges for two workers reading and writing one value of that size with CAS, with no
//! decoding and no wake-ups: the host's part of apf-wasm's sharing cost.
use proxy_wasm::hostcalls;
use proxy_wasm::traits::*;
use proxy_wasm::types::*;
use std::cell::RefCell;
use std::collections::VecDeque;

struct Local {
    limit: u32,
    /// Size of the bumped value, and its key (shared, or this worker's own).
    value_bytes: usize,
    key: String,
    in_use: u32,
    waiting: VecDeque<u32>,
    /// Waiting requests that were given a seat (their own context still says Waiting).
    promoted: Vec<u32>,
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local { limit: 1, value_bytes: 8, key: String::new(), in_use: 0, waiting: VecDeque::new(), promoted: Vec::new() }) };
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;
impl Context for Root {}
impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let cfg = self.get_plugin_configuration().and_then(|b| String::from_utf8(b).ok()).unwrap_or_default();
        let mut parts = cfg.trim().trim_matches('"').split(',').map(str::trim);
        let limit = parts.next().and_then(|v| v.parse::<u32>().ok()).unwrap_or(1).max(1);
        let value_bytes = parts.next().and_then(|v| v.parse::<usize>().ok()).unwrap_or(8).max(8);
        let key = match parts.next() {
            // Each VM (worker) its own key: the time it was configured at tells them apart.
            Some("private") => format!("localqueue/seats/{}", hostcalls::get_current_time().map(|t| format!("{t:?}")).unwrap_or_default()),
            _ => "localqueue/seats".to_string(),
        };
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            (l.limit, l.value_bytes, l.key) = (limit, value_bytes, key);
        });
        true
    }
    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Req { id, state: State::New }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(PartialEq)]
enum State {
    New,
    Waiting,
    Executing,
    Done,
}

struct Req {
    id: u32,
    state: State,
}

fn bump(ctx: &dyn Context, delta: i64) {
    // Borrowed, not cloned: the host calls do not re-enter the module.
    LOCAL.with_borrow(|l| {
        for _ in 0..8 {
            let (cur, cas) = ctx.get_shared_data(&l.key);
            let mut value = cur.unwrap_or_default();
            value.resize(l.value_bytes, 0);
            let n = i64::from_le_bytes(value[..8].try_into().unwrap_or([0; 8])) + delta;
            value[..8].copy_from_slice(&n.to_le_bytes());
            if ctx.set_shared_data(&l.key, Some(&value), cas).is_ok() {
                return;
            }
        }
    });
}

impl Req {
    fn release(&mut self) {
        let mut was = std::mem::replace(&mut self.state, State::Done);
        if was == State::Waiting {
            let id = self.id;
            let promoted = LOCAL.with(|l| {
                let mut l = l.borrow_mut();
                let p = l.promoted.iter().position(|&c| c == id);
                p.map(|i| l.promoted.swap_remove(i)).is_some()
            });
            if promoted {
                was = State::Executing;
            }
        }
        match was {
            State::Executing => {
                let next = LOCAL.with(|l| {
                    let mut l = l.borrow_mut();
                    match l.waiting.pop_front() {
                        Some(n) => {
                            l.promoted.push(n);
                            Some(n)
                        }
                        None => {
                            l.in_use = l.in_use.saturating_sub(1);
                            None
                        }
                    }
                });
                // The seat passes to the next waiting request of this worker.
                if let Some(n) = next {
                    if hostcalls::set_effective_context(n).is_ok() {
                        let _ = hostcalls::resume_http_request();
                    }
                }
            }
            State::Waiting => LOCAL.with(|l| l.borrow_mut().waiting.retain(|&c| c != self.id)),
            _ => {}
        }
    }
}

impl Context for Req {}
impl HttpContext for Req {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let _m = self.get_http_request_header_bytes(":method");
        let _p = self.get_http_request_header_bytes(":path");
        let _u = self.get_http_request_header_bytes("x-remote-user");
        let _g = self.get_http_request_header_bytes("x-remote-group");
        bump(self, 1);
        let run = LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            if l.in_use < l.limit {
                l.in_use += 1;
                true
            } else {
                l.waiting.push_back(self.id);
                false
            }
        });
        if run {
            self.state = State::Executing;
            Action::Continue
        } else {
            self.state = State::Waiting;
            Action::Pause
        }
    }
    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.add_http_response_header("x-kubernetes-pf-flowschema-uid", "00000000-0000-0000-0000-000000000001");
        self.add_http_response_header("x-kubernetes-pf-prioritylevel-uid", "00000000-0000-0000-0000-000000000002");
        Action::Continue
    }
    fn on_log(&mut self) {
        bump(self, -1);
        self.release();
    }
}

impl Drop for Req {
    fn drop(&mut self) {
        self.release();
    }
}
