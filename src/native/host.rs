//! The gateway's [`Host`] over Envoy's dynamic-module ABI.
//!
//! One [`NativeHost`] is made per hook call for the filter the hook is about. Shared data is an
//! in-process store shared by every worker thread, each with its own
//! [`WorkerState`](crate::engine::store::WorkerState) ([`ProcessStore`]): the priority levels'
//! states kept decoded, each under its own lock, and the other shared values as bytes with the
//! proxy-wasm semantics (compare-and-swap per key). Queues are the mailboxes of
//! [`super::wake`]. A resumed stream's continuation and a local reply are deferred until the hook
//! returns ([`Deferred`], as the `Host` contract asks), so the gateway never re-enters itself.

use super::abi::{self, FilterPtr, SchedulerPtr};
use super::wake;
use crate::engine::level_table::ProcessStore;
use crate::engine::store::{Store, WorkerStore};
use crate::gateway::host::{pairs, serialize_pairs, Body, CallError, HeaderMap, Host, PairsVisitor, StatKind};
use crate::Nanos;
use hashbrown::HashMap;
use std::cell::{Cell, RefCell};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a hook asked of a stream other than by its return value, done when it returns.
pub enum Deferred {
    Resume(u32),
    Reply { context: u32, status: u32, headers: Vec<(String, Vec<u8>)>, body: Vec<u8> },
}

thread_local! {
    /// This worker's live streams, by context.
    static STREAMS: RefCell<HashMap<u32, Stream>> = RefCell::new(HashMap::new());
    /// The stream the gateway addressed with `set_effective_context`.
    static EFFECTIVE: Cell<Option<u32>> = const { Cell::new(None) };
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
    /// This worker's mailbox, once registered.
    static MAILBOX: Cell<Option<&'static wake::Mailbox>> = const { Cell::new(None) };
    static STORE: &'static WorkerStore<'static> = Box::leak(Box::new(WorkerStore::new(worker_view())));
}

/// This worker's view of the shared data (the benchmark's no-sharing control keys its levels
/// apart: [`super::isolated`]).
fn worker_view() -> &'static dyn Store {
    #[cfg(feature = "native-isolated-levels")]
    return super::isolated::per_worker(shared());
    #[cfg(not(feature = "native-isolated-levels"))]
    shared()
}

/// The process's shared data.
fn shared() -> &'static ProcessStore {
    static S: OnceLock<ProcessStore> = OnceLock::new();
    S.get_or_init(ProcessStore::new)
}

/// The process's monotonic origin.
fn origin() -> Instant {
    static O: OnceLock<Instant> = OnceLock::new();
    *O.get_or_init(Instant::now)
}

/// A live stream of this worker: Envoy's filter, and its scheduler while it can be woken (one
/// table for both: a stream's waker comes and goes without a second lookup).
#[derive(Clone, Copy)]
struct Stream {
    filter: FilterPtr,
    waker: Option<SchedulerPtr>,
}

/// Tracks a new stream of this worker.
pub fn add_stream(context: u32, f: FilterPtr) {
    STREAMS.with(|m| m.borrow_mut().insert(context, Stream { filter: f, waker: None }));
}

/// Forgets a stream of this worker (destroyed).
pub fn remove_stream(context: u32) {
    STREAMS.with(|m| m.borrow_mut().remove(&context));
}

fn stream(context: u32) -> Option<FilterPtr> {
    STREAMS.with(|m| m.borrow().get(&context).map(|s| s.filter))
}

/// Whether the stream `context` can be woken.
pub fn has_waker(context: u32) -> bool {
    STREAMS.with(|m| m.borrow().get(&context).is_some_and(|s| s.waker.is_some()))
}

/// Gives the live stream `context` a scheduler in this worker's mailbox (false: no mailbox yet,
/// no such stream, or Envoy gave no scheduler).
pub fn give_waker(context: u32) -> bool {
    let Some(mailbox) = mailbox() else { return false };
    STREAMS.with(|m| {
        // Envoy's scheduler_new calls nothing of the module back: the borrow spans it.
        let mut m = m.borrow_mut();
        let Some(st) = m.get_mut(&context) else { return false };
        let Some(s) = st.filter.new_scheduler() else { return false };
        mailbox.add_waker(context, s);
        st.waker = Some(s);
        true
    })
}

/// Takes the scheduler of `context` out of the mailbox and deletes it: whether it had one.
pub fn take_waker(context: u32) -> bool {
    let Some(s) = STREAMS.with(|m| m.borrow_mut().get_mut(&context).and_then(|st| st.waker.take())) else { return false };
    if let Some(m) = mailbox() {
        m.remove_waker(context);
    }
    s.delete();
    true
}

/// A live stream of this worker for which `keep` holds.
pub fn find_stream(keep: impl FnMut(&u32) -> bool) -> Option<u32> {
    STREAMS.with(|m| m.borrow().keys().copied().find(keep))
}

/// This worker's mailbox (`None` until the gateway registered it).
pub fn mailbox() -> Option<&'static wake::Mailbox> {
    MAILBOX.with(Cell::get)
}

/// Runs what the hook deferred (each may re-enter the module: the list is taken first).
pub fn run_deferred() {
    EFFECTIVE.with(|e| e.set(None));
    loop {
        let batch = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        if batch.is_empty() {
            return;
        }
        for d in batch {
            match d {
                Deferred::Resume(c) => stream(c).into_iter().for_each(FilterPtr::continue_decoding),
                Deferred::Reply { context, status, headers, body } => {
                    let hs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
                    if let Some(f) = stream(context) {
                        f.send_response(status, &hs, &body, "apf");
                    }
                }
            }
        }
    }
}

/// Runs `f` over `raw` with the names that are not UTF-8 left out (as
/// [`crate::gateway::host::pairs`] reads a map), on the stack for up to [`abi::STACK_HEADERS`].
fn utf8_pairs(raw: &[(&[u8], &[u8])], f: &mut PairsVisitor<'_>) {
    let named = raw.iter().filter_map(|&(k, v)| Some((abi::utf8(k)?, v)));
    if raw.len() > abi::STACK_HEADERS {
        return f(&named.collect::<Vec<_>>());
    }
    let mut buf = [("", &[][..]); abi::STACK_HEADERS];
    let mut n = 0;
    for (slot, p) in buf.iter_mut().zip(named) {
        *slot = p;
        n += 1;
    }
    f(buf.get(..n).unwrap_or_default());
}

/// Envoy, for a hook about the stream `context`.
pub struct NativeHost {
    pub context: u32,
    pub filter: FilterPtr,
}

fn header_type(map: HeaderMap) -> Option<u32> {
    match map {
        HeaderMap::Request => Some(abi::REQUEST_HEADER),
        HeaderMap::Response => Some(abi::RESPONSE_HEADER),
        HeaderMap::CallResponse => None,
    }
}

impl NativeHost {
    fn target(&self) -> u32 {
        EFFECTIVE.with(|e| e.get()).unwrap_or(self.context)
    }

    fn defer(&self, d: Deferred) {
        DEFERRED.with(|q| q.borrow_mut().push(d));
    }
}

impl Host for NativeHost {
    fn monotonic_nanos(&self) -> Nanos {
        // Offset so that no time reads as "never" (the gateway's timers start at 0), as a
        // monotonic clock since boot would.
        const OFFSET: Nanos = 1 << 40;
        Nanos::try_from(origin().elapsed().as_nanos()).unwrap_or(Nanos::MAX).saturating_add(OFFSET)
    }

    fn realtime_nanos(&self) -> Nanos {
        let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn store(&self) -> &dyn Store {
        STORE.with(|s| *s)
    }

    fn header_map_bytes(&self, map: HeaderMap) -> Vec<u8> {
        if map == HeaderMap::CallResponse {
            return super::callout::reply_headers();
        }
        let mut out = serialize_pairs(&[]);
        self.with_header_pairs(map, &mut |pairs| out = serialize_pairs(pairs));
        out
    }

    fn with_header_pairs(&self, map: HeaderMap, f: &mut PairsVisitor<'_>) {
        if map == HeaderMap::CallResponse {
            return f(&pairs(&super::callout::reply_headers()));
        }
        match header_type(map) {
            Some(t) if !self.filter.is_none() => self.filter.with_headers(t, |raw| utf8_pairs(raw, f)),
            _ => f(&[]),
        }
    }

    fn add_header(&self, map: HeaderMap, name: &str, value: &[u8]) -> bool {
        !self.filter.is_none() && header_type(map).is_some_and(|t| self.filter.add_header(t, name, value))
    }

    fn remove_header(&self, map: HeaderMap, name: &str) -> bool {
        !self.filter.is_none() && header_type(map).is_some_and(|t| self.filter.remove_header(t, name))
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        if self.filter.is_none() {
            return None;
        }
        match path {
            ["source", "address"] => self.filter.attribute_string(abi::ATTR_SOURCE_ADDRESS),
            ["destination", "address"] => self.filter.attribute_string(abi::ATTR_DESTINATION_ADDRESS),
            ["connection", "mtls"] => self.filter.attribute_bool(abi::ATTR_CONNECTION_MTLS).map(|b| vec![u8::from(b)]),
            ["connection", "subject_peer_certificate"] => self.filter.attribute_string(abi::ATTR_SUBJECT_PEER_CERTIFICATE),
            _ => None,
        }
    }

    fn body_bytes(&self, body: Body, start: usize, max: usize) -> Option<Vec<u8>> {
        if body == Body::CallResponse {
            return super::callout::reply_body(start, max);
        }
        if body != Body::Response || self.filter.is_none() {
            return None;
        }
        let all = self.filter.body(abi::RECEIVED_RESPONSE_BODY)?;
        let end = start.saturating_add(max).min(all.len());
        Some(all.get(start.min(end)..end).unwrap_or_default().to_vec())
    }

    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        self.defer(Deferred::Reply { context: self.target(), status, headers, body: body.to_vec() });
        true
    }

    fn set_effective_context(&self, context: u32) -> bool {
        let live = stream(context).is_some();
        if live {
            EFFECTIVE.with(|e| e.set(Some(context)));
        }
        live
    }

    fn resume_request(&self) -> bool {
        self.defer(Deferred::Resume(self.target()));
        true
    }

    fn register_queue(&self, name: &str) -> Result<u32, u32> {
        let (id, b) = wake::register(name).ok_or(10u32)?;
        MAILBOX.with(|m| m.set(Some(b)));
        Ok(id)
    }

    fn resolve_queue(&self, name: &str) -> Option<u32> {
        wake::resolve(name)
    }

    fn enqueue(&self, queue: u32, msg: &[u8]) -> bool {
        wake::post(queue, 0, msg)
    }

    fn enqueue_for(&self, queue: u32, context: u32, msg: &[u8]) -> bool {
        wake::post(queue, context, msg)
    }

    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32> {
        wake::take(queue)
    }

    fn define_metric(&self, kind: StatKind, name: &str) -> Option<u32> {
        super::metrics::define(kind, name)
    }

    fn increment_metric(&self, id: u32, by: i64) {
        super::metrics::increment(self.filter, id, by);
    }

    fn record_metric(&self, id: u32, value: u64) {
        super::metrics::record(self.filter, id, value);
    }

    fn http_call(&self, cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> Result<u32, CallError> {
        super::callout::start(cluster, headers, body, timeout)
    }

    fn set_tick_period_ms(&self, _ms: u32) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::abi::fake;

    #[test]
    fn resumes_are_deferred_to_the_end_of_the_hook_and_follow_the_effective_stream() {
        add_stream(41, fake::filter(0x4100));
        add_stream(42, fake::filter(0x4200));
        let h = NativeHost { context: 41, filter: fake::filter(0x4100) };
        assert!(h.set_effective_context(42));
        assert!(h.resume_request());
        assert!(!h.set_effective_context(43), "a stream that is gone is not addressed");
        let continued = |p: usize| fake::CONTINUED.lock().unwrap().iter().filter(|&&c| c == p).count();
        assert_eq!(continued(0x4200), 0, "nothing happens before the hook returns");
        run_deferred();
        assert_eq!((continued(0x4200), continued(0x4100)), (1, 0));
        // The effective stream is reset after the hook: the next resume is the hook's own.
        h.resume_request();
        remove_stream(41);
        run_deferred();
        assert_eq!(continued(0x4100), 0, "a stream destroyed meanwhile is not touched");
    }

    #[test]
    fn header_pairs_are_read_as_the_gateway_reads_its_encoding() {
        let pairs: [(&[u8], &[u8]); 3] = [(b":path", b"/api/v1/pods"), (b"bad\xff", b"x"), (b"user-agent", b"")];
        let mut seen = Vec::new();
        utf8_pairs(&pairs, &mut |p| seen = p.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect());
        assert_eq!(seen, [(":path".to_string(), b"/api/v1/pods".to_vec()), ("user-agent".to_string(), Vec::new())]);
        let many: Vec<(Vec<u8>, Vec<u8>)> = (0..40).map(|i| (format!("h{i}").into_bytes(), vec![b'v'])).collect();
        let many: Vec<(&[u8], &[u8])> = many.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
        let mut n = 0;
        utf8_pairs(&many, &mut |p| n = p.len());
        assert_eq!(n, 40, "a map larger than the stack buffer is read whole");
    }

    #[test]
    fn the_clock_is_monotonic_and_never_reads_as_never() {
        let h = NativeHost { context: 1, filter: fake::filter(0x1) };
        let a = h.monotonic_nanos();
        assert!(a > 1_000_000_000_000);
        assert!(h.monotonic_nanos() >= a);
        assert!(h.realtime_nanos() > 1_700_000_000_000_000_000);
    }
}
