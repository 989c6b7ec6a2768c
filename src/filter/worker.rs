//! Per-VM (per Envoy worker) state: lease, mailbox, and the table of this worker's requests.

use super::host;
use super::metrics::{self, EXTRA_NONE, M};
use crate::engine::{self, Notice, NoticeKind};
use crate::fairqueuing::RequestId;
use crate::Nanos;
use std::cell::RefCell;
use hashbrown::HashMap;
use std::rc::Rc;

/// A worker whose lease is older than this is presumed dead and its seats are reclaimed.
pub const LEASE_TTL: Nanos = 5 * crate::NANOS_PER_SEC;
pub const HEARTBEAT_EVERY: Nanos = crate::NANOS_PER_SEC;
pub const REAP_EVERY: Nanos = 2 * crate::NANOS_PER_SEC;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Waiting,
    Executing,
}

/// One of this worker's requests that is queued or holds seats.
#[derive(Clone)]
pub struct Local {
    pub level_key: std::sync::Arc<str>,
    pub id: RequestId,
    pub phase: Phase,
    pub arrived: Nanos,
    pub wait_deadline: Nanos,
    /// The caller asked for explanations (adds `x-apf-reject-reason`).
    pub explain: bool,
    pub waited: Nanos,
    pub enforce: bool,
    /// The configuration the request was admitted under (metric labels).
    pub compiled: Rc<crate::engine::Compiled>,
    pub pl: usize,
    pub fs: usize,
    pub seats: u32,
    pub started: Nanos,
    pub is_watch: bool,
    /// Set once it executes: what the QueueSet needs back to finish it.
    pub receipt: Option<crate::fairqueuing::Receipt>,
}

impl Local {
    fn metric(&self, m: M, extra: u8, delta: i64) {
        metrics::add(&self.compiled, m, self.pl, self.fs, extra, delta);
    }
    fn left_queue(&self) {
        self.metric(M::InqueueRequests, EXTRA_NONE, -1);
        self.metric(M::InqueueSeats, EXTRA_NONE, -i64::from(self.seats));
    }
    /// Bookkeeping when a waiting request starts executing.
    pub fn note_dispatched(&self, waited: Nanos, from_queue: bool) {
        if from_queue {
            self.left_queue();
        }
        self.metric(M::Dispatched, EXTRA_NONE, 1);
        self.metric(M::ExecutingRequests, EXTRA_NONE, 1);
        self.metric(M::ExecutingSeats, EXTRA_NONE, i64::from(self.seats));
        metrics::observe(&self.compiled, M::WaitDuration, self.pl, self.fs, metrics::EXECUTE_TRUE, waited as f64 / 1e9);
    }
    /// Bookkeeping when a waiting request is rejected (time-out or client gone).
    pub fn note_rejected_waiting(&self, now: Nanos) {
        self.left_queue();
        self.metric(M::Rejected, metrics::reason_extra(crate::fairqueuing::RejectReason::TimeOut), 1);
        metrics::observe(&self.compiled, M::WaitDuration, self.pl, self.fs, metrics::EXECUTE_FALSE, now.saturating_sub(self.arrived) as f64 / 1e9);
    }
    /// Bookkeeping when an executing request finishes.
    pub fn note_finished(&self, now: Nanos) {
        self.metric(M::ExecutingRequests, EXTRA_NONE, -1);
        self.metric(M::ExecutingSeats, EXTRA_NONE, -i64::from(self.seats));
        let t = if self.is_watch { metrics::TYPE_WATCH } else { metrics::TYPE_REGULAR };
        metrics::observe(&self.compiled, M::ExecutionDuration, self.pl, self.fs, t, now.saturating_sub(self.started) as f64 / 1e9);
    }
}

#[derive(Default)]
pub struct Worker {
    pub instance: u64,
    pub slot: Option<u32>,
    pub mailbox: Option<u32>,
    pub requests: HashMap<u32, Local>,
    /// Shared-state keys of every level this VM has used (so removed levels still drain).
    pub known_levels: Vec<String>,
    pub noted_generation: Option<u64>,
    pub last_heartbeat: Nanos,
    pub last_reap: Nanos,
    pub last_tick: Nanos,
    pub last_flush: Nanos,
    /// Mailbox queue ids of other workers, by slot (slots are never reused).
    pub slot_mailboxes: HashMap<u32, u32>,
    /// Outcome of requests resolved from the root (by context), read by their HTTP context.
    pub rejected: HashMap<u32, (i64, &'static str)>,
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
#[derive(Debug, Clone)]
pub struct Hold {
    pub init: crate::digest::work_estimate::WatchInit,
    pub deadline: Nanos,
    /// Response headers or the last body chunk.
    pub last_data: Nanos,
    pub bytes: u64,
    /// Unmarked watches: the initial state's estimated size (count × average object size).
    pub expected_bytes: Option<u64>,
    /// Registered as an open watch when the phase ends.
    pub info: Rc<crate::digest::request_info::RequestInfo>,
}

/// An unmarked initial phase ends when the stream has been quiet this long: the initial events
/// are written back to back, live events come later.
pub const UNMARKED_QUIET: Nanos = 250_000_000;

thread_local! {
    pub static WORKER: RefCell<Worker> = RefCell::new(Worker::new());
}

impl Worker {
    fn new() -> Worker {
        let mut b = [0u8; 8];
        let instance = match getrandom::getrandom(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => (host::monotonic_nanos() as u64) ^ 0x9e37_79b9_7f4a_7c15,
        };
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
        Ok(s) => {
            with(|w| {
                w.slot = Some(s);
                w.last_heartbeat = now;
            });
            Some(s)
        }
        Err(e) => {
            log::warn!("apf: heartbeat failed: {e}");
            slot
        }
    }
}

/// Remembers the level keys of a configuration (once per configuration and VM), so that levels
/// removed by a later configuration still get their timers until they drain.
pub fn note_levels(c: &crate::engine::Compiled) {
    with(|w| {
        if w.noted_generation == Some(c.generation) {
            return;
        }
        w.noted_generation = Some(c.generation);
        for l in &c.levels {
            if !w.known_levels.iter().any(|k| **k == *l.key) {
                w.known_levels.push(l.key.to_string());
            }
        }
    })
}

/// Delivers notices: our own are handled here, others go to their owner's mailbox.
pub fn route(notices: Vec<Notice>, now: Nanos) {
    if notices.is_empty() {
        return;
    }
    let me = with(|w| w.slot);
    for n in notices {
        if Some(n.owner) == me {
            handle(n, now);
        } else {
            post(n, now);
        }
    }
}

fn post(n: Notice, now: Nanos) {
    let msg = n.encode();
    // The owner's mailbox queue id is looked up once (registry, then the host's queue table);
    // an enqueue that fails drops the cached id and looks it up again.
    let cached = with(|w| w.slot_mailboxes.get(&n.owner).copied());
    let mut delivered = cached.is_some_and(|q| host::enqueue(q, &msg).is_ok());
    if !delivered {
        with(|w| w.slot_mailboxes.remove(&n.owner));
        if let Ok(Some(instance)) = engine::instance_of(host::store(), n.owner) {
            if let Ok(Some(q)) = host::resolve_queue(&host::mailbox_name(instance)) {
                delivered = host::enqueue(q, &msg).is_ok();
                if delivered {
                    with(|w| w.slot_mailboxes.insert(n.owner, q));
                }
            }
        }
    }
    if delivered {
        host::store().state().count(|c| &mut c.wakeups);
    } else {
        // The owner is gone (its lease will be reaped): release what we dispatched to it.
        log::warn!("apf: cannot deliver notice to worker {}; releasing request {}", n.owner, n.id);
        if let NoticeKind::Run { receipt, .. } = n.kind {
            let mut more = Vec::new();
            if let Err(e) = engine::finish(host::store(), now, &n.level_key, &receipt, &mut more) {
                log::warn!("apf: release failed: {e}");
            }
            route(more, now);
        }
    }
}

/// Handles a notice for one of our own requests.
pub fn handle(n: Notice, now: Nanos) {
    let local = with(|w| match w.requests.get(&n.context) {
        Some(l) if l.id == n.id && &*l.level_key == n.level_key.as_str() => Some(l.clone()),
        _ => None,
    });
    match (n.kind, local) {
        (NoticeKind::Run { waited, receipt }, Some(l)) if l.phase == Phase::Waiting => {
            l.note_dispatched(waited, true);
            with(|w| {
                if let Some(r) = w.requests.get_mut(&n.context) {
                    r.phase = Phase::Executing;
                    r.waited = waited;
                    r.started = now;
                    r.receipt = Some(receipt);
                }
            });
            // Dry run: the request never stopped; it only takes its seats now.
            if l.enforce && !(host::set_effective_context(n.context) && host::resume_request()) {
                // Stream gone between dispatch and wake-up: give the seats back.
                stream_ended(n.context, now);
            }
        }
        (NoticeKind::Run { .. }, Some(_)) => {}
        // The stream is gone (or was answered) before its wake-up arrived: give the seats back.
        (NoticeKind::Run { receipt, .. }, None) => release(&n.level_key, n.id, Some(&receipt), now),
        (NoticeKind::Reject { reason, retry_after }, Some(l)) => {
            l.note_rejected_waiting(now);
            with(|w| {
                w.requests.remove(&n.context);
                w.rejected.insert(n.context, (retry_after, reason.as_str()));
            });
            if l.enforce && host::set_effective_context(n.context) {
                send_429(&l.compiled, l.fs, l.pl, retry_after, l.explain, reason.as_str(), l.seats);
            }
        }
        (NoticeKind::Reject { .. }, None) => {}
    }
}

fn release(level_key: &str, id: RequestId, receipt: Option<&crate::fairqueuing::Receipt>, now: Nanos) {
    let mut more = Vec::new();
    if let Err(e) = engine::end(host::store(), now, level_key, id, receipt, &mut more) {
        log::warn!("apf: release of request {id} failed: {e}");
    }
    route(more, now);
}

pub const TOO_MANY: &[u8] = b"Too many requests, please try again later.\n";

/// The PF response headers of a classified request (UIDs; names for explain callers).
pub fn pf_headers(c: &crate::engine::Compiled, fs: usize, pl: usize, explain: bool) -> Vec<(&'static str, &[u8])> {
    let fs_obj = c.config.policy.flow_schemas.get(fs);
    let lvl = c.levels.get(pl);
    let mut h: Vec<(&'static str, &[u8])> = Vec::with_capacity(4);
    h.push((super::http::FS_UID_HEADER, fs_obj.map(|f| f.uid.as_bytes()).unwrap_or_default()));
    h.push((super::http::PL_UID_HEADER, lvl.map(|l| l.uid.as_bytes()).unwrap_or_default()));
    if explain {
        h.push(("x-apf-flowschema", fs_obj.map(|f| f.name.as_bytes()).unwrap_or_default()));
        h.push(("x-apf-prioritylevel", lvl.map(|l| l.name.as_bytes()).unwrap_or_default()));
    }
    h
}

pub fn send_429(c: &crate::engine::Compiled, fs: usize, pl: usize, retry_after: i64, explain: bool, reason: &str, seats: u32) {
    let ra = retry_after.clamp(1, 32).to_string();
    let seats = seats.to_string();
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(8);
    headers.push(("retry-after", ra.as_bytes()));
    headers.push(("content-type", b"text/plain; charset=utf-8"));
    headers.push(("x-content-type-options", b"nosniff"));
    headers.extend(pf_headers(c, fs, pl, explain));
    if explain {
        headers.push(("x-apf-reject-reason", reason.as_bytes()));
        headers.push(("x-apf-seats", seats.as_bytes()));
    }
    host::send_response(429, &headers, TOO_MANY);
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
            Err(s) => {
                log::warn!("apf: dequeue failed: status {s}");
                return;
            }
        }
    }
}

/// The stream of `context` ended (client gone, response done, or reset): release what it holds.
pub fn stream_ended(context: u32, now: Nanos) {
    stream_ended_with(context, || now)
}

/// [`stream_ended`], reading the clock only when something is held (a host call saved on the
/// common path where `on_log` already released everything before the context is dropped).
pub fn stream_ended_with(context: u32, now: impl FnOnce() -> Nanos) {
    let (local, watch, slot) = with(|w| {
        if !w.rejected.is_empty() {
            w.rejected.remove(&context);
        }
        let watch = if w.watches.is_empty() { None } else { w.watches.remove(&context) };
        if !w.holds.is_empty() {
            w.holds.remove(&context);
        }
        (w.requests.remove(&context), watch, w.slot)
    });
    if local.is_none() && watch.is_none() {
        return;
    }
    let now = now();
    if let (Some(key), Some(slot)) = (watch, slot) {
        if let Err(e) = engine::watches::forget(host::store(), slot, &key) {
            log::warn!("apf: forgetting a watch failed: {e}");
        }
    }
    if let Some(l) = local {
        match l.phase {
            Phase::Executing => l.note_finished(now),
            Phase::Waiting => l.note_rejected_waiting(now),
        }
        release(&l.level_key, l.id, l.receipt.as_ref(), now);
    }
}

/// A WATCH's initial phase ended (or it has none): release its seats and count it as an open
/// watch for the mutating-request estimator (`info`, or the one its hold kept).
pub fn end_watch_init(context: u32, now: Nanos, info: Option<&crate::digest::request_info::RequestInfo>) {
    let (local, hold, slot) = with(|w| (w.requests.remove(&context), w.holds.remove(&context), w.slot));
    if let Some(l) = local {
        l.note_finished(now);
        release(&l.level_key, l.id, l.receipt.as_ref(), now);
    }
    let info = info.or(hold.as_ref().map(|h| &*h.info));
    if let (Some(info), Some(slot)) = (info, slot) {
        match engine::watches::register(host::store(), slot, info) {
            Ok(Some(key)) => with(|w| {
                w.watches.insert(context, key);
            }),
            Ok(None) => {}
            Err(e) => log::warn!("apf: watch registration failed: {e}"),
        }
    }
}

/// Ends the initial phase of held watches past their deadline or, unmarked, quiet long enough.
pub fn check_watch_holds(now: Nanos) {
    let due: Vec<u32> = with(|w| {
        if w.holds.is_empty() {
            return Vec::new();
        }
        w.holds
            .iter()
            .filter(|(_, h)| {
                now >= h.deadline || (h.init == crate::digest::work_estimate::WatchInit::Unmarked && now.saturating_sub(h.last_data) >= UNMARKED_QUIET)
            })
            .map(|(c, _)| *c)
            .collect()
    });
    for ctx in due {
        let timed_out = with(|w| w.holds.get(&ctx).is_some_and(|h| now >= h.deadline));
        if timed_out {
            log::info!("apf: a watch's initial phase exceeded watchInitialEventsMaxHold; releasing its seats");
            metrics::count_own(metrics::Own::WatchHoldTimeouts);
        }
        end_watch_init(ctx, now, None);
    }
}
