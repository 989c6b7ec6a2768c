//! Envoy's hooks forwarded to the gateway (`crate::gateway`), with [`NativeHost`] as its host.
//!
//! Threads: Envoy creates and destroys configurations on its main thread and runs every stream
//! hook, and every scheduled event of a stream, on the stream's worker thread. Each worker
//! thread owns one [`Worker`] (like one proxy-wasm VM) and one [`Root`] per live configuration,
//! built from the configuration's bytes on the worker's first stream under it; in-flight
//! streams keep the configuration they started with. The main thread's root of a configuration
//! reads its `clusterPolicy` and publishes each policy it applies (a [`SharedPolicy`]); a
//! worker's root adopts the newest as each stream starts, and never reads it itself.

use super::abi::{self, ConfigPtr, FilterPtr};
use super::callout;
use super::host::{self, NativeHost};
use super::idle_stats;
use super::leases;
use super::wake;
use crate::config::parse_plugin_config;
use crate::digest::identity::IdentitySource;
use crate::engine::requests::Phase;
use crate::gateway::host::Action;
use crate::gateway::policy_source::SharedPolicy;
use crate::gateway::{root::TICK_MS, Request, Root, Worker};
use hashbrown::HashMap;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One filter configuration (`filter_config` of the Envoy filter): the gateway's JSON.
pub struct Config {
    id: u64,
    envoy: ConfigPtr,
    bytes: Vec<u8>,
    /// The cluster's policy, as the main thread's root applied it last.
    policy: Arc<SharedPolicy>,
}

/// One stream.
pub struct Filter {
    context: u32,
    envoy: FilterPtr,
    request: Request,
    /// `stream_complete` ran (Envoy calls it before destroying the filter).
    completed: bool,
}

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
    /// This worker's roots, by configuration id.
    static ROOTS: RefCell<HashMap<u64, Root>> = RefCell::new(HashMap::new());
    static NEXT_CONTEXT: Cell<u32> = const { Cell::new(1) };
}

/// Configurations destroyed since each worker last looked (their roots are dropped lazily).
static LIVE_CONFIGS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

pub fn program_init() {
    super::logger::install();
}

/// Why a configuration cannot run on the native host: invalid, or a `jwt` identity source (its
/// claims are nested in the jwt_authn filter's dynamic metadata, which Envoy 1.40's metadata
/// callbacks read only one level deep: `abi_impl.cc: envoy_dynamic_module_callback_http_get_metadata_string`).
fn unsupported(bytes: &[u8]) -> Result<(), String> {
    let cfg = parse_plugin_config(bytes).map_err(|e| format!("invalid configuration ({} errors); refused: {}", e.len(), e.join("; ")))?;
    if cfg.identity.sources.iter().any(|s| matches!(s, IdentitySource::Jwt { .. })) {
        return Err("configuration refused: the identity source `jwt` needs the jwt_authn filter's claims, which the native host \
                    cannot read yet; use the wasm module or a `frontProxy` identity"
            .to_string());
    }
    Ok(())
}

/// A new configuration (main thread): `None` refuses it (every error logged).
pub fn config_new(envoy: ConfigPtr, _name: &[u8], bytes: &[u8]) -> Option<Config> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    if let Err(e) = unsupported(bytes) {
        log::error!("apf: {e}");
        return None;
    }
    super::metrics::define_families(envoy);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut live) = LIVE_CONFIGS.lock() {
        live.push(id);
    }
    callout::add_config(id, envoy);
    wake::start_ticker(Duration::from_millis(u64::from(TICK_MS)));
    Some(Config { id, envoy, bytes: bytes.to_vec(), policy: Arc::default() })
}

pub fn config_destroy(c: Config) {
    if let Ok(mut live) = LIVE_CONFIGS.lock() {
        live.retain(|&i| i != c.id);
    }
    callout::remove_config(c.id);
    // The main thread's root of the configuration (on a worker, its root goes at its next event).
    ROOTS.with(|r| r.try_borrow_mut().map(|mut r| r.remove(&c.id)).ok());
}

/// The main thread's host: no stream.
fn main_host() -> NativeHost {
    NativeHost { context: 0, filter: FilterPtr::none() }
}

/// An event of the configuration's scheduler (main thread): its timer, or calls to start.
pub fn config_scheduled(c: &Config, event: u64) {
    let h = main_host();
    match event {
        callout::TICK => {
            with_root(&h, c, Thread::Main, |root, w| root.on_tick(&h, w));
            idle_stats::add_pending(&h);
            leases::renew(&h);
        }
        callout::CALLS => callout::send_queued(c.id, c.envoy),
        _ => {}
    }
    deliver_replies(&h);
}

/// The reply of a configuration's callout (main thread): to the thread that asked.
pub fn config_callout_done(c: &Config, id: u64, headers: Vec<(Vec<u8>, Vec<u8>)>, body: Vec<u8>) {
    callout::done(c.id, id, &headers, body);
    deliver_replies(&main_host());
}

/// Hands the replies waiting for this thread to the roots that asked (a root gone meanwhile
/// drops its reply).
fn deliver_replies(h: &NativeHost) {
    for reply in callout::take_replies() {
        let (config, token, size) = (reply.config, reply.token, reply.body.len());
        WORKER.with(|w| {
            ROOTS.with(|r| {
                let (Ok(mut w), Ok(mut roots)) = (w.try_borrow_mut(), r.try_borrow_mut()) else { return };
                let (Some(w), Some(root)) = (w.as_mut(), roots.get_mut(&config)) else { return };
                callout::with_reply(reply, || callout::as_config(config, || root.on_http_call_response(h, w, token, size)));
            })
        });
    }
    host::run_deferred();
}

/// Which thread runs a root: the main thread's reads the cluster's policy for every worker's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Thread {
    Main,
    Worker,
}

/// Runs `f` on this thread's worker and the root of `config` (`None` on a re-entrant call,
/// logged).
fn with_root<T>(h: &NativeHost, config: &Config, thread: Thread, f: impl FnOnce(&mut Root, &mut Worker) -> T) -> Option<T> {
    WORKER.with(|w| {
        ROOTS.with(|r| {
            let (Ok(mut w), Ok(mut roots)) = (w.try_borrow_mut(), r.try_borrow_mut()) else {
                log::error!("apf: re-entrant callback; ignored");
                return None;
            };
            let w = w.get_or_insert_with(|| new_worker(h));
            let root = roots.entry(config.id).or_insert_with(|| {
                let mut root = Root::sharing(config.policy.clone(), thread == Thread::Main);
                callout::as_config(config.id, || root.on_configure(h, &config.bytes));
                root
            });
            Some(callout::as_config(config.id, || f(root, w)))
        })
    })
}

/// This thread's worker, its pending stats added and its lease renewed by the main thread from
/// now on ([`idle_stats`], [`leases`]).
fn new_worker(h: &NativeHost) -> Worker {
    let mut w = Worker::new(crate::gateway::Host::monotonic_nanos(h) as u64);
    idle_stats::register(w.stats().pending());
    leases::register(w.instance());
    w
}

/// Runs `f` on this thread's worker (`None` on a re-entrant call, logged).
fn with_worker<T>(f: impl FnOnce(&mut Worker) -> T) -> Option<T> {
    WORKER.with(|w| match w.try_borrow_mut() {
        Ok(mut w) => w.as_mut().map(f),
        Err(_) => {
            log::error!("apf: re-entrant callback; ignored");
            None
        }
    })
}

pub fn filter_new(c: &Config, envoy: FilterPtr) -> Filter {
    let context = NEXT_CONTEXT.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1).max(1));
        v
    });
    host::add_stream(context, envoy);
    let h = NativeHost { context, filter: envoy };
    let request = with_root(&h, c, Thread::Worker, |root, w| {
        root.on_stream_start(&h, w);
        root.new_request(context)
    })
    .unwrap_or_default();
    Filter { context, envoy, request, completed: false }
}

fn host_of(f: &Filter) -> NativeHost {
    NativeHost { context: f.context, filter: f.envoy }
}

fn status(a: Action) -> u32 {
    match a {
        Action::Continue => abi::CONTINUE,
        Action::Pause => abi::STOP_ALL_ITERATION_AND_WATERMARK,
    }
}

/// Gives a stream a scheduler in its worker's mailbox when it must be wakeable: it waits in a
/// queue (another worker, or the timer, resumes or rejects it), or it is a WATCH in its initial
/// phase holding seats until a deadline while no other stream of the worker can carry the timer.
/// A stream that only holds seats (or a place under the open-watch limits) needs none: nothing
/// of it is timed, and its worker's lease is renewed by the main thread ([`leases`]).
fn ensure_waker(f: &Filter) {
    if host::has_waker(f.context) {
        return;
    }
    let Some((phase, hold)) = with_worker(|w| (w.request(f.context).map(|l| l.phase), w.holds(f.context))) else { return };
    let idle = || host::mailbox().is_some_and(|m| m.idle());
    let needed = match phase {
        Some(Phase::Waiting) => true,
        Some(Phase::Executing) => hold && idle(),
        None => false,
    };
    if needed {
        host::give_waker(f.context);
    }
}

/// After the stream `gone` lost its scheduler: hands the timer to another stream that awaits
/// seats or holds a WATCH's initial phase; false when there is none (nothing of the worker is
/// timed).
fn hand_over_timer(gone: u32) -> bool {
    if !host::mailbox().is_some_and(|m| m.idle()) {
        return true;
    }
    let timed = |w: &Worker, c: u32| w.request(c).is_some_and(|l| l.phase == Phase::Waiting) || w.holds(c);
    let tracked = with_worker(|w| host::find_stream(|&c| c != gone && timed(w, c))).flatten();
    tracked.is_some_and(host::give_waker)
}

pub fn request_headers(f: &mut Filter) -> u32 {
    let h = host_of(f);
    deliver_replies(&h);
    let a = with_request(f, |r, w| r.on_request_headers(&h, w)).unwrap_or(Action::Continue);
    ensure_waker(f);
    host::run_deferred();
    status(a)
}

/// Runs `g` on a stream's request and this thread's worker (built with the stream's root).
fn with_request<T>(f: &mut Filter, g: impl FnOnce(&mut Request, &mut Worker) -> T) -> Option<T> {
    let request = &mut f.request;
    with_worker(|w| g(request, w))
}

pub fn response_headers(f: &mut Filter, end: bool) -> u32 {
    let h = host_of(f);
    let a = with_request(f, |r, w| r.on_response_headers(&h, w, end)).unwrap_or(Action::Continue);
    if f.request.holding() {
        ensure_waker(f);
    }
    host::run_deferred();
    status(a)
}

pub fn response_body(f: &mut Filter, end: bool) -> u32 {
    let h = host_of(f);
    let size = f.envoy.body_size(abi::RECEIVED_RESPONSE_BODY);
    let a = with_request(f, |r, w| r.on_response_body(&h, w, size, end)).unwrap_or(Action::Continue);
    host::run_deferred();
    status(a)
}

pub fn response_trailers(f: &mut Filter) -> u32 {
    let h = host_of(f);
    let a = with_request(f, |r, w| r.on_response_trailers(&h, w)).unwrap_or(Action::Continue);
    host::run_deferred();
    status(a)
}

pub fn stream_complete(f: &mut Filter) {
    f.completed = true;
    let h = host_of(f);
    let unoccupied = with_request(f, |r, w| {
        r.on_stream_end(&h, w);
        w.tracks_no_request()
    });
    if host::take_waker(f.context) {
        if !hand_over_timer(f.context) {
            went_idle(&h);
        }
    } else if unoccupied == Some(true) {
        // No tick may come before the next request: the store's counts go where the main
        // thread takes them.
        with_worker(|w| w.stats().collect_store_counts(&h));
    }
    host::run_deferred();
}

/// The worker's last stream with something timed ended: no tick reaches it until another one
/// starts, so its timer runs now; its pending stats, the store's counts among them, are left
/// for the main thread to add ([`idle_stats`]).
fn went_idle(h: &NativeHost) {
    WORKER.with(|w| {
        ROOTS.with(|r| {
            let (Ok(mut w), Ok(mut roots)) = (w.try_borrow_mut(), r.try_borrow_mut()) else { return };
            let Some(w) = w.as_mut() else { return };
            roots.iter_mut().for_each(|(&id, root)| callout::as_config(id, || root.on_tick(h, w)));
            w.stats().collect_store_counts(h);
        })
    });
}

/// (Boxed as Envoy held it: the stream's state is dropped where it is, never moved.)
pub fn filter_destroy(mut f: Box<Filter>) {
    if !f.completed {
        stream_complete(&mut f);
    }
    host::remove_stream(f.context);
}

/// A scheduled event on this stream's worker: a mailbox wake-up or the timer.
pub fn scheduled(f: &mut Filter, event: u64) {
    let h = host_of(f);
    let configs: Vec<u64> = LIVE_CONFIGS.lock().map(|l| l.clone()).unwrap_or_default();
    WORKER.with(|w| {
        ROOTS.with(|r| {
            let (Ok(mut w), Ok(mut roots)) = (w.try_borrow_mut(), r.try_borrow_mut()) else { return };
            let Some(w) = w.as_mut() else { return };
            roots.retain(|id, _| configs.contains(id));
            match event {
                // The mailbox is the worker's: any root drains it.
                wake::WAKE => roots.iter_mut().take(1).for_each(|(&id, root)| callout::as_config(id, || root.on_queue_ready(&h, w))),
                wake::TICK => roots.iter_mut().for_each(|(&id, root)| callout::as_config(id, || root.on_tick(&h, w))),
                _ => {}
            }
        })
    });
    deliver_replies(&h);
}
