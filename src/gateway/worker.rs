//! One worker's state (an Envoy worker VM): its lease, its mailbox, the table of its requests,
//! its watches and its stats. The host owns one [`Worker`] per worker and hands it to every
//! callback; shared state lives in the host's store.

use super::fleet::{FleetDriver, FleetRole};
use super::host::Host;
use super::request::Digested;
use super::stats::{Flow, Labels, Own, Stats, EXTRA_NONE, M};
use crate::digest::initial_events::MarkerScanner;
use crate::digest::request_info::RequestInfo;
use crate::engine::requests::{self, Ctx, Entry, Requests};
use crate::engine::{self, Compiled, Notice};
use crate::Nanos;
use hashbrown::{HashMap, HashSet};
use std::rc::Rc;

/// A worker whose lease is older than this is presumed dead and its seats are reclaimed.
pub const LEASE_TTL: Nanos = 5 * crate::NANOS_PER_SEC;
pub const HEARTBEAT_EVERY: Nanos = crate::NANOS_PER_SEC;
pub const REAP_EVERY: Nanos = 2 * crate::NANOS_PER_SEC;
/// An unmarked initial phase ends when the stream has been quiet this long: the initial events
/// are written back to back, live events come later.
pub const UNMARKED_QUIET: Nanos = 250_000_000;

/// The gateway's own data of one of this worker's requests (the engine's [`Entry::extra`]).
#[derive(Clone)]
pub struct Extra {
    /// The caller asked for explanations (adds `x-apf-reject-reason`).
    pub explain: bool,
    pub enforce: bool,
    /// The configuration the request was admitted under (metric labels).
    pub compiled: Rc<Compiled>,
    pub pl: usize,
    pub fs: usize,
    pub seats: u32,
    pub is_watch: bool,
}

pub type Local = Entry<Extra>;

impl Extra {
    /// Adds `delta` to the request's series of `m` (a single record; [`Extra::record`] for
    /// several).
    pub fn add(&self, s: &mut Stats, m: M, label: &'static str, delta: i64) {
        s.add(self.labels(), m, label, delta);
    }

    /// Records a duration in the request's histogram `m`.
    pub fn observe(&self, s: &mut Stats, m: M, label: &'static str, d: Nanos) {
        s.observe(self.labels(), m, label, Self::seconds(d));
    }

    /// Runs `f` over the request's series: the records of one of its transitions under one
    /// lock and one lookup ([`Stats::with_flow`]).
    pub fn record<T>(&self, s: &mut Stats, f: impl FnOnce(&mut Flow<'_>) -> T) -> T {
        s.with_flow(self.labels(), f)
    }

    /// A duration in the histograms' unit (seconds).
    pub fn seconds(d: Nanos) -> f64 {
        d as f64 / 1e9
    }

    /// The labels of the request's series.
    pub fn labels(&self) -> Labels<'_> {
        Labels { compiled: &self.compiled, pl: self.pl, fs: self.fs }
    }

    /// Bookkeeping when a request enters its queue (`n` = 1), or leaves it (`n` = -1).
    pub fn queued(&self, f: &mut Flow<'_>, n: i64) {
        f.add(M::InqueueRequests, EXTRA_NONE, n);
        f.add(M::InqueueSeats, EXTRA_NONE, n * i64::from(self.seats));
    }

    /// Bookkeeping when a request starts executing (`n` = 1), or finishes (`n` = -1).
    fn executing(&self, f: &mut Flow<'_>, n: i64) {
        f.add(M::ExecutingRequests, EXTRA_NONE, n);
        f.add(M::ExecutingSeats, EXTRA_NONE, n * i64::from(self.seats));
    }

    /// Bookkeeping when a request starts executing, after waiting `waited` in a queue.
    pub fn dispatched(&self, f: &mut Flow<'_>, waited: Nanos) {
        f.add(M::Dispatched, EXTRA_NONE, 1);
        self.executing(f, 1);
        f.observe(M::WaitDuration, "true", Self::seconds(waited));
    }
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

/// One worker's state.
pub struct Worker {
    /// Random id of this worker (names its mailbox; holds its lease).
    instance: u64,
    slot: Option<u32>,
    mailbox: Option<u32>,
    /// Shared-state keys of every level this worker has used (so removed levels still drain).
    known_levels: HashSet<String>,
    noted_generation: Option<u64>,
    last_heartbeat: Nanos,
    /// When each [`Timer`] last ran.
    timers: Timers,
    /// Mailbox queue ids of other workers, by slot (slots are never reused).
    slot_mailboxes: HashMap<u32, u32>,
    /// Requests resolved from the root (by context): their 429 is already sent.
    rejected: HashSet<u32>,
    /// Open watches of this worker, by context (forgotten when the stream ends).
    watches: HashMap<u32, crate::digest::work_estimate::WatchKey>,
    /// Places of this worker's open watches under `watchLimits`, by context (given back when the
    /// stream ends).
    watch_places: HashMap<u32, engine::watch_limits::Place>,
    /// Ids of the `apf_wasm_open_watches` gauges, by level name.
    open_watch_gauges: HashMap<String, Option<u32>>,
    /// Watches of this worker holding their seats while their initial state streams, by context.
    holds: HashMap<u32, Hold>,
    /// The cluster's object counts as last read from shared data.
    counts: CountsCopy,
    /// This worker's requests that are queued or hold seats.
    requests: Requests<Extra>,
    stats: Stats,
    /// Fleet mode: the driver role, held by one worker per process.
    fleet: FleetRole,
    /// The last request's digest, its strings' buffers reused by the next one.
    spare_digest: Option<Box<Digested>>,
}

/// This worker's copy of the cluster's object counts in shared data.
#[derive(Default)]
struct CountsCopy {
    counts: Option<Rc<engine::object_counts::SharedCounts>>,
    /// The shared value's CAS token when it was read.
    cas: Option<u32>,
    /// When it was last read.
    read: Nanos,
}

/// The worker's periodic jobs that the root's timer runs less often than it ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The timer's own work (expiry, borrowing, polls).
    Tick,
    /// The metrics' flush.
    Flush,
    /// The reaping of dead workers.
    Reap,
}

/// When each [`Timer`] last ran.
#[derive(Default)]
struct Timers {
    tick: Nanos,
    flush: Nanos,
    reap: Nanos,
}

/// The engine's callbacks for this worker's requests: resume, answer, post to other workers,
/// and the stats of every transition.
struct Callbacks<'a> {
    h: &'a dyn Host,
    slot: Option<u32>,
    rejected: &'a mut HashSet<u32>,
    slot_mailboxes: &'a mut HashMap<u32, u32>,
    stats: &'a mut Stats,
}

impl requests::Host<Extra> for Callbacks<'_> {
    fn slot(&self) -> Option<u32> {
        self.slot
    }
    fn resume(&mut self, context: u32, e: &Local) -> bool {
        // Dry run: the request never stopped; it only takes its seats now.
        !e.extra.enforce || (self.h.set_effective_context(context) && self.h.resume_request())
    }
    fn reject(&mut self, context: u32, e: &Local, reason: crate::fairqueuing::RejectReason, retry_after: i64) {
        self.rejected.insert(context);
        if e.extra.enforce && self.h.set_effective_context(context) {
            send_429(self.h, &e.extra, retry_after, reason.as_str());
        }
    }
    /// Posts a notice to its owner's mailbox; false when it cannot be delivered (the owner is
    /// gone: its lease will be reaped).
    fn post(&mut self, n: &Notice) -> bool {
        let h = self.h;
        let msg = n.encode();
        // The owner's mailbox queue id is looked up once (registry, then the host's queue
        // table); an enqueue that fails drops the cached id and looks it up again.
        let enqueue = |q: &u32| h.enqueue_for(*q, n.context, &msg);
        let cached = self.slot_mailboxes.get(&n.owner).copied();
        let delivered = cached.as_ref().is_some_and(enqueue) || {
            self.slot_mailboxes.remove(&n.owner);
            let instance = engine::instance_of(h.store(), n.owner).ok().flatten();
            let q = instance.and_then(|i| h.resolve_queue(&mailbox_name(i))).filter(enqueue);
            q.inspect(|&q| {
                self.slot_mailboxes.insert(n.owner, q);
            })
            .is_some()
        };
        if !delivered {
            log::warn!("apf: cannot deliver notice to worker {}; releasing request {}", n.owner, n.id);
        } else if let Some(s) = h.store().worker() {
            s.count(|c| &mut c.wakeups);
        }
        delivered
    }
    /// A waiting request rejected (time-out or client gone).
    fn left_queue(&mut self, e: &Local, now: Nanos) {
        let x = &e.extra;
        x.record(self.stats, |f| {
            x.queued(f, -1);
            f.add(M::Rejected, crate::fairqueuing::RejectReason::TimeOut.as_str(), 1);
            f.observe(M::WaitDuration, "false", Extra::seconds(now.saturating_sub(e.arrived)));
        });
    }
    fn dispatched(&mut self, e: &Local) {
        let x = &e.extra;
        x.record(self.stats, |f| {
            x.queued(f, -1);
            x.dispatched(f, e.waited);
        });
    }
    fn finished(&mut self, e: &Local, now: Nanos) {
        let x = &e.extra;
        let t = if x.is_watch { "watch" } else { "regular" };
        x.record(self.stats, |f| {
            x.executing(f, -1);
            f.observe(M::ExecutionDuration, t, Extra::seconds(now.saturating_sub(e.started)));
        });
    }
    fn failed(&mut self, what: &str, e: &engine::EngineError) {
        log::warn!("apf: {what} failed: {e}");
    }
}

/// Name of a worker's mailbox (a shared queue named after its random instance id).
pub fn mailbox_name(instance: u64) -> String {
    format!("apf/v3/mailbox/{instance:016x}")
}

/// The PF response headers of a classified request (UIDs; names for explain callers).
pub fn pf_headers(e: &Extra) -> impl Iterator<Item = (&'static str, &[u8])> {
    let fs_obj = e.compiled.config.policy.flow_schemas.get(e.fs);
    let lvl = e.compiled.levels.get(e.pl);
    debug_assert!(fs_obj.is_some() && lvl.is_some(), "a request classified outside its configuration");
    // An array, not a vector: the response path allocates nothing for them.
    let h = [
        ("x-kubernetes-pf-flowschema-uid", fs_obj.map(|f| f.uid.as_bytes()).unwrap_or_default()),
        ("x-kubernetes-pf-prioritylevel-uid", lvl.map(|l| l.uid.as_bytes()).unwrap_or_default()),
        ("x-apf-flowschema", fs_obj.map(|f| f.name.as_bytes()).unwrap_or_default()),
        ("x-apf-prioritylevel", lvl.map(|l| l.name.as_bytes()).unwrap_or_default()),
    ];
    h.into_iter().take(if e.explain { 4 } else { 2 })
}

/// The content headers of the gateway's own (plain text) responses.
pub const TEXT_PLAIN: [(&str, &[u8]); 2] = [("content-type", b"text/plain; charset=utf-8"), ("x-content-type-options", b"nosniff")];

/// Answers the request `e` describes with a 429.
pub fn send_429(h: &dyn Host, e: &Extra, retry_after: i64, reason: &str) {
    let ra = retry_after.clamp(1, 32).to_string();
    let seats = e.seats.to_string();
    let mut headers = vec![("retry-after", ra.as_bytes())];
    headers.extend(TEXT_PLAIN.into_iter().chain(pf_headers(e)));
    if e.explain {
        headers.push(("x-apf-reject-reason", reason.as_bytes()));
        headers.push(("x-apf-seats", seats.as_bytes()));
    }
    h.send_response(429, &headers, b"Too many requests, please try again later.\n");
}

impl Worker {
    /// A new worker with a random instance id (`fallback_seed` if no randomness is available).
    pub fn new(fallback_seed: u64) -> Worker {
        let mut b = [0u8; 8];
        let random = getrandom::getrandom(&mut b).map(|()| u64::from_le_bytes(b));
        let instance = random.unwrap_or(fallback_seed ^ 0x9e37_79b9_7f4a_7c15);
        Worker {
            instance: instance.max(1),
            slot: None,
            mailbox: None,
            known_levels: HashSet::new(),
            noted_generation: None,
            last_heartbeat: 0,
            timers: Timers::default(),
            slot_mailboxes: HashMap::new(),
            rejected: HashSet::new(),
            watches: HashMap::new(),
            watch_places: HashMap::new(),
            open_watch_gauges: HashMap::new(),
            holds: HashMap::new(),
            counts: CountsCopy::default(),
            requests: Requests::new(),
            stats: Stats::default(),
            fleet: FleetRole::default(),
            spare_digest: None,
        }
    }

    /// A digest to rewrite for the next request: the last request's, if given back.
    pub fn take_digest(&mut self) -> Box<Digested> {
        self.spare_digest.take().unwrap_or_default()
    }

    /// Gives a finished request's digest back, for its buffers.
    pub fn keep_digest(&mut self, digest: Box<Digested>) {
        self.spare_digest = Some(digest);
    }

    /// This worker's random id.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// This worker's stats (flushed on the timer).
    pub fn stats(&mut self) -> &mut Stats {
        &mut self.stats
    }

    /// This worker's request `context`, while it is queued or holds seats.
    pub fn request(&self, context: u32) -> Option<&Local> {
        self.requests.get(context)
    }

    /// Tracks an admitted request (queued, or holding seats) until it ends.
    pub fn track(&mut self, context: u32, e: Local) {
        self.requests.insert(context, e);
    }

    /// Whether the request `context` was rejected after it queued (its 429 is sent).
    pub fn was_rejected(&self, context: u32) -> bool {
        self.rejected.contains(&context)
    }

    /// The WATCH `context` took `place` under the open-watch limits: it is given back when its
    /// stream ends.
    pub fn keep_watch_place(&mut self, context: u32, place: engine::watch_limits::Place) {
        self.watch_places.insert(context, place);
    }

    /// Whether the stream `context` holds a place under the open-watch limits.
    /// Whether no request of this worker is queued or holds seats.
    pub fn tracks_no_request(&self) -> bool {
        self.requests.is_empty()
    }

    /// Whether the WATCH `context` holds its seats through its initial phase (timed: a deadline,
    /// or quiet long enough).
    pub fn holds(&self, context: u32) -> bool {
        !self.holds.is_empty() && self.holds.contains_key(&context)
    }

    /// Whether the WATCH `context` holds a place under the open-watch limits.
    pub fn has_watch_place(&self, context: u32) -> bool {
        self.watch_places.contains_key(&context)
    }

    /// Gives back the place of the WATCH `context` under the open-watch limits, if it took one.
    pub fn release_watch_place(&mut self, h: &dyn Host, context: u32) {
        if let (Some(place), Some(slot)) = (self.watch_places.remove(&context), self.slot) {
            if let Err(e) = engine::watch_limits::release(h.store(), slot, &place) {
                log::warn!("apf: giving back an open watch's place failed: {e}");
            }
        }
    }

    /// Exports the open watches per level of `c` (when `watchLimits` is configured).
    pub fn export_open_watches(&mut self, h: &dyn Host, c: &Compiled) {
        super::watch_limits::export_gauges(h, c, &mut self.open_watch_gauges);
    }

    /// A WATCH `context` holds its seats while its initial state streams.
    pub fn hold(&mut self, context: u32, hold: Hold) {
        self.holds.insert(context, hold);
    }

    /// The hold of the WATCH `context` (`None`: released meanwhile).
    pub fn held(&mut self, context: u32) -> Option<&mut Hold> {
        self.holds.get_mut(&context)
    }

    /// The cluster's object counts as this worker last read them.
    pub fn counts(&self) -> Option<&engine::object_counts::SharedCounts> {
        self.counts.counts.as_deref()
    }

    /// Re-reads the shared object counts when `every` has passed since the last read.
    pub fn refresh_counts_every(&mut self, h: &dyn Host, now: Nanos, every: Nanos) {
        if now.saturating_sub(self.counts.read) >= every {
            self.refresh_counts(h, now);
        }
    }

    /// Re-reads the shared object counts into this worker's copy when they changed.
    pub fn refresh_counts(&mut self, h: &dyn Host, now: Nanos) {
        let copy = &mut self.counts;
        copy.read = now;
        let (bytes, cas) = match h.store().get(engine::object_counts::OBJECT_COUNTS_KEY) {
            Ok(v) => v,
            Err(e) => return log::warn!("apf: reading the object counts failed: {e}"),
        };
        if copy.cas == cas && copy.counts.is_some() {
            return;
        }
        let counts = bytes.map(|b| engine::object_counts::SharedCounts::decode(&b)).transpose();
        let counts = counts.inspect_err(|e| log::warn!("apf: unreadable object counts in shared data: {e}"));
        (copy.counts, copy.cas) = (counts.ok().flatten().map(Rc::new), cas);
    }

    /// The level keys of `c` and of every level a previous configuration had here (removed
    /// levels still get their timers until they drain).
    pub fn level_keys(&self, c: &Compiled) -> Vec<String> {
        let mut keys = c.level_keys();
        let removed: Vec<String> = self.known_levels.iter().filter(|k| !keys.contains(k)).cloned().collect();
        keys.extend(removed);
        keys
    }

    /// The fleet's driver, on the worker that holds the role.
    pub fn fleet_driver(&self) -> Option<&FleetDriver> {
        self.fleet.driver()
    }

    /// The timer's part of fleet mode ([`FleetRole::on_tick`]).
    pub fn fleet_tick(&mut self, h: &dyn Host, c: &Compiled, now: Nanos) {
        let notices = self.fleet.on_tick(h, &mut self.stats, self.instance, c, now);
        self.route(h, notices, now);
    }

    /// An HTTP call's reply: true if it was the fleet's ([`FleetRole::on_call_response`]).
    pub fn fleet_call_response(&mut self, h: &dyn Host, c: Option<&Compiled>, token: u32, body_size: usize) -> bool {
        let now = h.monotonic_nanos();
        let Some(notices) = self.fleet.on_call_response(h, c, token, body_size, now) else { return false };
        self.route(h, notices, now);
        true
    }

    /// The request table and the engine's callbacks over the rest of this worker.
    fn split<'a>(&'a mut self, h: &'a dyn Host) -> (&'a mut Requests<Extra>, Callbacks<'a>) {
        let cb = Callbacks {
            h,
            slot: self.slot,
            rejected: &mut self.rejected,
            slot_mailboxes: &mut self.slot_mailboxes,
            stats: &mut self.stats,
        };
        (&mut self.requests, cb)
    }

    /// Whether `every` has passed since `timer` last ran; if so, it runs now.
    pub fn due(&mut self, now: Nanos, every: Nanos, timer: Timer) -> bool {
        let last = match timer {
            Timer::Tick => &mut self.timers.tick,
            Timer::Flush => &mut self.timers.flush,
            Timer::Reap => &mut self.timers.reap,
        };
        let due = now.saturating_sub(*last) >= every;
        *last = if due { now } else { *last };
        due
    }

    /// Makes sure this worker is registered (lease + mailbox); returns its slot.
    pub fn ensure_registered(&mut self, h: &dyn Host, now: Nanos) -> Option<u32> {
        if self.mailbox.is_none() {
            match h.register_queue(&mailbox_name(self.instance)) {
                Ok(q) => self.mailbox = Some(q),
                Err(s) => log::warn!("apf: cannot register mailbox: status {s}"),
            }
        }
        if self.slot.is_some() && now.saturating_sub(self.last_heartbeat) < HEARTBEAT_EVERY {
            return self.slot;
        }
        match engine::heartbeat(h.store(), self.instance, now) {
            Ok(s) => (self.last_heartbeat, self.slot) = (now, Some(s)),
            Err(e) => log::warn!("apf: heartbeat failed: {e}"),
        }
        self.slot
    }

    /// Remembers the level keys of a configuration (once per configuration), so that levels
    /// removed by a later configuration still get their timers until they drain.
    pub fn note_levels(&mut self, c: &Compiled) {
        if self.noted_generation.replace(c.generation) != Some(c.generation) {
            self.known_levels.extend(c.level_keys());
        }
    }

    /// Delivers notices: our own are handled here, others go to their owner's mailbox.
    pub fn route(&mut self, h: &dyn Host, notices: Vec<Notice>, now: Nanos) {
        let (r, mut cb) = self.split(h);
        r.route(&mut Ctx { store: h.store(), host: &mut cb, now }, notices);
    }

    /// Backstop for the wait limit: a queued request of ours whose deadline passed (and that no
    /// worker's expiry has answered yet) is timed out here.
    pub fn enforce_local_deadlines(&mut self, h: &dyn Host, now: Nanos) {
        const GRACE: Nanos = 100_000_000;
        let (r, mut cb) = self.split(h);
        r.time_out_overdue(&mut Ctx { store: h.store(), host: &mut cb, now }, GRACE);
    }

    /// Takes up to `limit` messages from this worker's mailbox. The host posts one
    /// `on_queue_ready` per message, so that callback takes one (saving a dequeue that would
    /// find the queue empty); the timer drains whatever is left (a notification is lost only
    /// when the VM was gone).
    pub fn drain_mailbox(&mut self, h: &dyn Host, now: Nanos, limit: usize) {
        let Some(q) = self.mailbox else { return };
        for _ in 0..limit {
            match h.dequeue(q) {
                Ok(Some(msg)) => match Notice::decode(&msg) {
                    Ok(n) => self.route(h, vec![n], now),
                    Err(e) => log::warn!("apf: bad mailbox message: {e}"),
                },
                Ok(None) => return,
                Err(s) => return log::warn!("apf: dequeue failed: status {s}"),
            }
        }
    }

    /// The stream of `context` ended (client gone, response done, or reset): release what it
    /// holds, reading the clock only when seats are held or awaited (a host call saved on the
    /// common path where everything was already released).
    pub fn stream_ended(&mut self, h: &dyn Host, context: u32) {
        // Most streams are in none of these tables: an empty one is not hashed into.
        if !self.rejected.is_empty() {
            self.rejected.remove(&context);
        }
        if !self.holds.is_empty() {
            self.holds.remove(&context);
        }
        if !self.watch_places.is_empty() {
            self.release_watch_place(h, context);
        }
        let watch = if self.watches.is_empty() { None } else { self.watches.remove(&context) };
        if let (Some(key), Some(slot)) = (watch, self.slot) {
            if let Err(e) = engine::watches::forget(h.store(), slot, &key) {
                log::warn!("apf: forgetting a watch failed: {e}");
            }
        }
        if self.requests.get(context).is_some() {
            let now = h.monotonic_nanos();
            let (r, mut cb) = self.split(h);
            r.end(&mut Ctx { store: h.store(), host: &mut cb, now }, context);
        }
    }

    /// A WATCH's initial phase ended (or it has none): release its seats and count it as an open
    /// watch for the mutating-request estimator (`info`, or the one its hold kept).
    pub fn end_watch_init(&mut self, h: &dyn Host, context: u32, now: Nanos, info: Option<&RequestInfo>) {
        let hold = self.holds.remove(&context);
        let (r, mut cb) = self.split(h);
        r.end(&mut Ctx { store: h.store(), host: &mut cb, now }, context);
        let info = info.or(hold.as_ref().map(|h| &h.info));
        if let (Some(info), Some(slot)) = (info, self.slot) {
            match engine::watches::register(h.store(), slot, info) {
                Ok(key) => self.watches.extend(key.map(|k| (context, k))),
                Err(e) => log::warn!("apf: watch registration failed: {e}"),
            }
        }
    }

    /// Ends the initial phase of held watches past their deadline or, unmarked, quiet long enough.
    pub fn check_watch_holds(&mut self, h: &dyn Host, now: Nanos) {
        let quiet = |w: &Hold| w.marker.is_none() && now.saturating_sub(w.last_data) >= UNMARKED_QUIET;
        let due = self.holds.iter().filter(|(_, w)| now >= w.deadline || quiet(w));
        let due: Vec<(u32, bool)> = due.map(|(c, w)| (*c, now >= w.deadline)).collect();
        for (ctx, timed_out) in due {
            if timed_out {
                log::info!("apf: a watch's initial phase exceeded watchInitialEventsMaxHold; releasing its seats");
                self.stats.count_own(Own::WatchHoldTimeouts);
            }
            self.end_watch_init(h, ctx, now, None);
        }
    }
}
