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
//!
//! `,global` as the third part makes the seats global instead, as apf-wasm's are: one seat
//! count and one FIFO of (worker, request) for all workers in a shared value of BYTES bytes,
//! taken and released with CAS (those are its two writes per request, in place of the bumps),
//! and a seat released on one worker passes to the head of the FIFO, on another worker through
//! that worker's shared queue (a cross-worker wake-up). Global ÷ per-worker seats with 2 workers
//! is what a global seat pool costs on this host with no fair queuing and no decoding; apf-wasm ÷
//! its no-sharing control should be compared with it.
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
    /// Global seats: this worker's id in the FIFO (0: per-worker seats).
    worker: u32,
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local { limit: 1, value_bytes: 8, key: String::new(), in_use: 0, waiting: VecDeque::new(), promoted: Vec::new(), worker: 0 }) };
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
        // The time this VM (worker) was configured at tells the workers apart.
        let stamp = hostcalls::get_current_time().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(1, |d| d.as_nanos() as u32 | 1);
        let (key, worker) = match parts.next() {
            Some("private") => (format!("localqueue/seats/{stamp}"), 0),
            Some("global") => {
                if hostcalls::register_shared_queue(&mailbox(stamp)).is_err() {
                    return false;
                }
                ("localqueue/global".to_string(), stamp)
            }
            _ => ("localqueue/seats".to_string(), 0),
        };
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            (l.limit, l.value_bytes, l.key, l.worker) = (limit, value_bytes, key, worker);
        });
        true
    }
    /// Requests of this worker that another worker's released seat passed to.
    fn on_queue_ready(&mut self, queue: u32) {
        while let Ok(Some(msg)) = hostcalls::dequeue_shared_queue(queue) {
            if let Some(b) = msg.first_chunk::<4>() {
                start(u32::from_le_bytes(*b));
            }
        }
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

fn mailbox(worker: u32) -> String {
    format!("localqueue/mailbox/{worker}")
}

/// Global seats: the shared value's seat count and FIFO of (worker, request).
struct Global {
    in_use: u32,
    fifo: VecDeque<(u32, u32)>,
}

impl Global {
    fn decode(v: &[u8]) -> Global {
        let word = |i: usize| v.get(4 * i..4 * i + 4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes);
        let fifo = (0..word(1) as usize).map(|i| (word(2 + 2 * i), word(3 + 2 * i))).collect();
        Global { in_use: word(0), fifo }
    }
    fn encode(&self, bytes: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(bytes.max(8 + 8 * self.fifo.len()));
        v.extend(self.in_use.to_le_bytes());
        v.extend((self.fifo.len() as u32).to_le_bytes());
        for &(w, c) in &self.fifo {
            v.extend(w.to_le_bytes());
            v.extend(c.to_le_bytes());
        }
        v.resize(v.len().max(bytes), 0);
        v
    }
}

/// One CAS update of the global seats; returns what `f` returned for the update that landed.
fn update<T>(f: impl Fn(&mut Global) -> T) -> Option<T> {
    LOCAL.with_borrow(|l| {
        for _ in 0..64 {
            let (cur, cas) = hostcalls::get_shared_data(&l.key).ok()?;
            let mut g = Global::decode(cur.as_deref().unwrap_or_default());
            let out = f(&mut g);
            if hostcalls::set_shared_data(&l.key, Some(&g.encode(l.value_bytes)), cas).is_ok() {
                return Some(out);
            }
        }
        None
    })
}

/// Resumes this worker's request `ctx`, which a released seat passed to (if it is gone, the
/// seat passes on).
fn start(ctx: u32) {
    if hostcalls::set_effective_context(ctx).is_ok() && hostcalls::resume_http_request().is_ok() {
        LOCAL.with(|l| l.borrow_mut().promoted.push(ctx));
    } else {
        release_global();
    }
}

/// Releases a global seat: it passes to the head of the FIFO (woken on its own worker).
fn release_global() {
    let me = worker();
    let next = update(|g| {
        let next = g.fifo.pop_front();
        if next.is_none() {
            g.in_use = g.in_use.saturating_sub(1);
        }
        next
    });
    match next.flatten() {
        Some((w, c)) if w == me => start(c),
        Some((w, c)) => {
            let q = hostcalls::resolve_shared_queue("", &mailbox(w)).ok().flatten();
            if q.and_then(|q| hostcalls::enqueue_shared_queue(q, Some(&c.to_le_bytes())).ok()).is_none() {
                release_global();
            }
        }
        None => {}
    }
}

/// Global seats: this worker's id in the FIFO (0: per-worker seats).
fn worker() -> u32 {
    LOCAL.with_borrow(|l| l.worker)
}

/// Whether waiting request `id` was given a seat (forgetting it).
fn take_promoted(id: u32) -> bool {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let p = l.promoted.iter().position(|&c| c == id);
        p.map(|i| l.promoted.swap_remove(i)).is_some()
    })
}

/// Releases a per-worker seat: it passes to the next waiting request of this worker.
fn release_local() {
    let next = LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let next = l.waiting.pop_front();
        match next {
            Some(n) => l.promoted.push(n),
            None => l.in_use = l.in_use.saturating_sub(1),
        }
        next
    });
    if let Some(n) = next {
        if hostcalls::set_effective_context(n).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}

impl Req {
    /// Per-worker seats: takes one or joins this worker's FIFO; whether the request runs now.
    fn arrive_local(&self) -> bool {
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            if l.in_use < l.limit {
                l.in_use += 1;
                true
            } else {
                l.waiting.push_back(self.id);
                false
            }
        })
    }

    /// Global seats: takes one or joins the FIFO; whether the request runs now.
    fn arrive_global(&self, me: u32) -> bool {
        let limit = LOCAL.with_borrow(|l| l.limit);
        let id = self.id;
        update(|g| {
            if g.in_use < limit {
                g.in_use += 1;
                true
            } else {
                g.fifo.push_back((me, id));
                false
            }
        })
        .unwrap_or(true)
    }

    fn release(&mut self) {
        let id = self.id;
        let mut was = std::mem::replace(&mut self.state, State::Done);
        if was == State::Waiting && take_promoted(id) {
            was = State::Executing;
        }
        match (was, worker()) {
            (State::Executing, 0) => release_local(),
            (State::Executing, _) => release_global(),
            (State::Waiting, 0) => LOCAL.with(|l| l.borrow_mut().waiting.retain(|&c| c != id)),
            // Not promoted: still in the FIFO, or a seat is on its way (then `start` finds the
            // request gone and passes the seat on).
            (State::Waiting, me) => {
                update(|g| g.fifo.retain(|&e| e != (me, id)));
            }
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
        let me = worker();
        let run = if me != 0 {
            self.arrive_global(me)
        } else {
            bump(self, 1);
            self.arrive_local()
        };
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
        if worker() == 0 {
            bump(self, -1);
        }
        self.release();
    }
}

impl Drop for Req {
    fn drop(&mut self) {
        self.release();
    }
}
