//! Per-VM (per Envoy worker) state: lease, mailbox, and the table of this worker's requests.

use super::host;
use super::metrics::{self, EXTRA_NONE, M};
use crate::digest::initial_events::MarkerScanner;
use crate::digest::request_info::RequestInfo;
use crate::engine::requests::{Entry, Host, Requests};
use crate::engine::store::Store;
use crate::engine::{self, Notice};
use crate::Nanos;
use std::cell::RefCell;
use hashbrown::{HashMap, HashSet};
use std::rc::Rc;

/// A worker whose lease is older than this is presumed dead and its seats are reclaimed.
pub const LEASE_TTL: Nanos = 5 * crate::NANOS_PER_SEC;
pub const HEARTBEAT_EVERY: Nanos = crate::NANOS_PER_SEC;
pub const REAP_EVERY: Nanos = 2 * crate::NANOS_PER_SEC;

/// The filter's own data of one of this worker's requests (the engine's [`Entry::extra`]).
#[derive(Clone)]
pub struct Extra {
    /// The caller asked for explanations (adds `x-apf-reject-reason`).
    pub explain: bool,
    pub enforce: bool,
    /// The configuration the request was admitted under (metric labels).
    pub compiled: Rc<crate::engine::Compiled>,
    pub pl: usize,
    pub fs: usize,
    pub seats: u32,
    pub is_watch: bool,
}

pub type Local = Entry<Extra>;

impl Extra {
    /// Adds `delta` to the request's series of `m`.
    pub fn add(&self, m: M, label: &'static str, delta: i64) {
        metrics::add(&self.compiled, m, self.pl, self.fs, label, delta);
    }

    /// Records a duration in the request's histogram `m`.
    pub fn observe(&self, m: M, label: &'static str, d: Nanos) {
        metrics::observe(&self.compiled, m, self.pl, self.fs, label, d as f64 / 1e9);
    }

    /// Bookkeeping when a request enters its queue (`n` = 1), or leaves it (`n` = -1).
    pub fn queued(&self, n: i64) {
        self.add(M::InqueueRequests, EXTRA_NONE, n);
        self.add(M::InqueueSeats, EXTRA_NONE, n * i64::from(self.seats));
    }

    /// Bookkeeping when a request starts executing (`n` = 1), or finishes (`n` = -1).
    fn executing(&self, n: i64) {
        self.add(M::ExecutingRequests, EXTRA_NONE, n);
        self.add(M::ExecutingSeats, EXTRA_NONE, n * i64::from(self.seats));
    }

    /// Bookkeeping when a request starts executing, after waiting `waited` in a queue.
    pub fn dispatched(&self, waited: Nanos) {
        self.add(M::Dispatched, EXTRA_NONE, 1);
        self.executing(1);
        self.observe(M::WaitDuration, "true", waited);
    }
}

#[derive(Default)]
pub struct Worker {
    pub instance: u64,
    pub slot: Option<u32>,
    pub mailbox: Option<u32>,
    /// Shared-state keys of every level this VM has used (so removed levels still drain).
    pub known_levels: HashSet<String>,
    pub noted_generation: Option<u64>,
    pub last_heartbeat: Nanos,
    pub last_reap: Nanos,
    pub last_tick: Nanos,
    pub last_flush: Nanos,
    /// Mailbox queue ids of other workers, by slot (slots are never reused).
    pub slot_mailboxes: HashMap<u32, u32>,
    /// Outcome of requests resolved from the root (by context), read by their HTTP context.
    pub rejected: HashSet<u32>,
    /// Open watches of this worker, by context (forgotten when the stream ends).
    pub watches: HashMap<u32, crate::digest::work_estimate::WatchKey>,
    /// Watches of this worker holding their seats while their initial state streams, by context.
    pub holds: HashMap<u32, Hold>,
    /// The cluster's object counts as last read from shared data, and that value's CAS token.
    pub counts: Option<Rc<crate::engine::object_counts::SharedCounts>>,
    pub counts_cas: Option<u32>,
    pub counts_read: Nanos,
}

/// A WATCH in its initial phase: it keeps its seats until the phase ends (the bookmark passed,
/// the unmarked stream went quiet or reached its expected size) or `deadline`.
pub struct Hold {
    pub deadline: Nanos,
    /// Response headers or the last body chunk.
    pub last_data: Nanos,
    pub bytes: u64,
    /// Unmarked watches: the initial state's estimated size (count × average object size).
    pub expected_bytes: Option<u64>,
    /// Looks for the initial-events-end bookmark (`sendInitialEvents` watches; `None`: unmarked).
    pub marker: Option<MarkerScanner>,
    /// Registered as an open watch when the phase ends.
    pub info: RequestInfo,
}

/// An unmarked initial phase ends when the stream has been quiet this long: the initial events
/// are written back to back, live events come later.
pub const UNMARKED_QUIET: Nanos = 250_000_000;

thread_local! {
    pub static WORKER: RefCell<Worker> = RefCell::new(Worker::new());
    /// This worker's requests (apart from [`WORKER`]: the engine calls the host while it
    /// holds them).
    static REQUESTS: RefCell<Requests<Extra>> = RefCell::new(Requests::new());
}

/// This worker's requests (the engine's table).
pub fn requests<T>(f: impl FnOnce(&mut Requests<Extra>) -> T) -> T {
    REQUESTS.with(|r| f(&mut r.borrow_mut()))
}

/// The filter as the engine's host for this worker's requests.
struct FilterHost;

impl Host<Extra> for FilterHost {
    fn slot(&self) -> Option<u32> {
        with(|w| w.slot)
    }
    fn resume(&mut self, context: u32, e: &Local) -> bool {
        // Dry run: the request never stopped; it only takes its seats now.
        !e.extra.enforce || (host::set_effective_context(context) && host::resume_request())
    }
    fn reject(&mut self, context: u32, e: &Local, reason: crate::fairqueuing::RejectReason, retry_after: i64) {
        with(|w| w.rejected.insert(context));
        if e.extra.enforce && host::set_effective_context(context) {
            send_429(&e.extra, retry_after, reason.as_str());
        }
    }
    /// Posts a notice to its owner's mailbox; false when it cannot be delivered (the owner is
    /// gone: its lease will be reaped).
    fn post(&mut self, n: &Notice) -> bool {
        let msg = n.encode();
        // The owner's mailbox queue id is looked up once (registry, then the host's queue
        // table); an enqueue that fails drops the cached id and looks it up again.
        let enqueue = |q: &u32| host::enqueue(*q, &msg);
        let cached = with(|w| w.slot_mailboxes.get(&n.owner).copied());
        let delivered = cached.as_ref().is_some_and(enqueue) || {
            with(|w| w.slot_mailboxes.remove(&n.owner));
            let instance = engine::instance_of(host::store(), n.owner).ok().flatten();
            let q = instance.and_then(|i| host::resolve_queue(&host::mailbox_name(i))).filter(enqueue);
            q.inspect(|&q| with(|w| { w.slot_mailboxes.insert(n.owner, q); })).is_some()
        };
        if !delivered {
            log::warn!("apf: cannot deliver notice to worker {}; releasing request {}", n.owner, n.id);
        } else if let Some(s) = host::store().worker() {
            s.count(|c| &mut c.wakeups);
        }
        delivered
    }
    /// A waiting request rejected (time-out or client gone).
    fn left_queue(&mut self, e: &Local, now: Nanos) {
        e.extra.queued(-1);
        e.extra.add(M::Rejected, crate::fairqueuing::RejectReason::TimeOut.as_str(), 1);
        e.extra.observe(M::WaitDuration, "false", now.saturating_sub(e.arrived));
    }
    fn dispatched(&mut self, e: &Local) {
        e.extra.queued(-1);
        e.extra.dispatched(e.waited);
    }
    fn finished(&mut self, e: &Local, now: Nanos) {
        e.extra.executing(-1);
        let t = if e.extra.is_watch { "watch" } else { "regular" };
        e.extra.observe(M::ExecutionDuration, t, now.saturating_sub(e.started));
    }
    fn failed(&mut self, what: &str, e: &engine::EngineError) {
        log::warn!("apf: {what} failed: {e}");
    }
}

impl Worker {
    fn new() -> Worker {
        let mut b = [0u8; 8];
        let random = getrandom::getrandom(&mut b).map(|()| u64::from_le_bytes(b));
        let instance = random.unwrap_or_else(|_| (host::monotonic_nanos() as u64) ^ 0x9e37_79b9_7f4a_7c15);
        Worker { instance: instance.max(1), ..Default::default() }
    }
}

pub fn with<T>(f: impl FnOnce(&mut Worker) -> T) -> T {
    WORKER.with(|w| f(&mut w.borrow_mut()))
}

/// Makes sure this VM is registered (lease + mailbox); returns its slot.
pub fn ensure_registered(now: Nanos) -> Option<u32> {
    let (instance, slot, mailbox, last) = with(|w| (w.instance, w.slot, w.mailbox, w.last_heartbeat));
    if mailbox.is_none() {
        match host::register_queue(&host::mailbox_name(instance)) {
            Ok(q) => with(|w| w.mailbox = Some(q)),
            Err(s) => log::warn!("apf: cannot register mailbox: status {s}"),
        }
    }
    if slot.is_some() && now.saturating_sub(last) < HEARTBEAT_EVERY {
        return slot;
    }
    match engine::heartbeat(host::store(), instance, now) {
        Ok(s) => with(|w| (w.last_heartbeat, w.slot) = (now, Some(s))),
        Err(e) => log::warn!("apf: heartbeat failed: {e}"),
    }
    with(|w| w.slot)
}

/// Remembers the level keys of a configuration (once per configuration and VM), so that levels
/// removed by a later configuration still get their timers until they drain.
pub fn note_levels(c: &crate::engine::Compiled) {
    with(|w| {
        if w.noted_generation.replace(c.generation) != Some(c.generation) {
            w.known_levels.extend(c.level_keys());
        }
    })
}

/// Delivers notices: our own are handled here, others go to their owner's mailbox.
pub fn route(notices: Vec<Notice>, now: Nanos) {
    requests(|r| r.route(host::store(), &mut FilterHost, notices, now));
}

/// Backstop for the wait limit: a queued request of ours whose deadline passed (and that no
/// worker's expiry has answered yet) is timed out here.
pub fn enforce_local_deadlines(now: Nanos) {
    const GRACE: Nanos = 100_000_000;
    requests(|r| r.time_out_overdue(host::store(), &mut FilterHost, now, GRACE));
}

/// The PF response headers of a classified request (UIDs; names for explain callers).
pub fn pf_headers(e: &Extra) -> Vec<(&'static str, &[u8])> {
    let fs_obj = e.compiled.config.policy.flow_schemas.get(e.fs);
    let lvl = e.compiled.levels.get(e.pl);
    let mut h = vec![
        ("x-kubernetes-pf-flowschema-uid", fs_obj.map(|f| f.uid.as_bytes()).unwrap_or_default()),
        ("x-kubernetes-pf-prioritylevel-uid", lvl.map(|l| l.uid.as_bytes()).unwrap_or_default()),
    ];
    if e.explain {
        h.push(("x-apf-flowschema", fs_obj.map(|f| f.name.as_bytes()).unwrap_or_default()));
        h.push(("x-apf-prioritylevel", lvl.map(|l| l.name.as_bytes()).unwrap_or_default()));
    }
    h
}

/// The content headers of the filter's own (plain text) responses.
pub const TEXT_PLAIN: [(&str, &[u8]); 2] = [("content-type", b"text/plain; charset=utf-8"), ("x-content-type-options", b"nosniff")];

/// Answers the request `e` describes with a 429.
pub fn send_429(e: &Extra, retry_after: i64, reason: &str) {
    let ra = retry_after.clamp(1, 32).to_string();
    let seats = e.seats.to_string();
    let mut headers = vec![("retry-after", ra.as_bytes())];
    headers.extend(TEXT_PLAIN.into_iter().chain(pf_headers(e)));
    if e.explain {
        headers.push(("x-apf-reject-reason", reason.as_bytes()));
        headers.push(("x-apf-seats", seats.as_bytes()));
    }
    host::send_response(429, &headers, b"Too many requests, please try again later.\n");
}

/// Takes up to `limit` messages from this VM's mailbox. The host posts one `on_queue_ready` per
/// message, so that callback takes one (saving a dequeue that would find the queue empty); the
/// timer drains whatever is left (a notification is lost only when the VM was gone).
pub fn drain_mailbox(now: Nanos, limit: usize) {
    let Some(q) = with(|w| w.mailbox) else { return };
    for _ in 0..limit {
        match host::dequeue(q) {
            Ok(Some(msg)) => match Notice::decode(&msg) {
                Ok(n) => route(vec![n], now),
                Err(e) => log::warn!("apf: bad mailbox message: {e}"),
            },
            Ok(None) => return,
            Err(s) => return log::warn!("apf: dequeue failed: status {s}"),
        }
    }
}

/// The stream of `context` ended (client gone, response done, or reset): release what it
/// holds, reading the clock only when seats are held or awaited (a host call saved on the
/// common path where `on_log` already released everything before the context is dropped).
pub fn stream_ended_with(context: u32, now: impl FnOnce() -> Nanos) {
    let (watch, slot) = with(|w| {
        w.rejected.remove(&context);
        w.holds.remove(&context);
        (w.watches.remove(&context), w.slot)
    });
    if let Some(Err(e)) = watch.zip(slot).map(|(key, slot)| engine::watches::forget(host::store(), slot, &key)) {
        log::warn!("apf: forgetting a watch failed: {e}");
    }
    requests(|r| r.get(context).is_some().then(|| r.end(host::store(), &mut FilterHost, context, now())));
}

/// A WATCH's initial phase ended (or it has none): release its seats and count it as an open
/// watch for the mutating-request estimator (`info`, or the one its hold kept).
pub fn end_watch_init(context: u32, now: Nanos, info: Option<&RequestInfo>) {
    let (hold, slot) = with(|w| (w.holds.remove(&context), w.slot));
    requests(|r| r.end(host::store(), &mut FilterHost, context, now));
    let info = info.or(hold.as_ref().map(|h| &h.info));
    if let (Some(info), Some(slot)) = (info, slot) {
        match engine::watches::register(host::store(), slot, info) {
            Ok(key) => with(|w| w.watches.extend(key.map(|k| (context, k)))),
            Err(e) => log::warn!("apf: watch registration failed: {e}"),
        }
    }
}

/// Ends the initial phase of held watches past their deadline or, unmarked, quiet long enough.
pub fn check_watch_holds(now: Nanos) {
    let quiet = |h: &Hold| h.marker.is_none() && now.saturating_sub(h.last_data) >= UNMARKED_QUIET;
    let due: Vec<(u32, bool)> = with(|w| {
        let due = w.holds.iter().filter(|(_, h)| now >= h.deadline || quiet(h));
        due.map(|(c, h)| (*c, now >= h.deadline)).collect()
    });
    for (ctx, timed_out) in due {
        if timed_out {
            log::info!("apf: a watch's initial phase exceeded watchInitialEventsMaxHold; releasing its seats");
            metrics::count_own(metrics::Own::WatchHoldTimeouts);
        }
        end_watch_init(ctx, now, None);
    }
}
