//! The filter's admission path: the engine (`crate::engine`) over a [`MemStore`] (the semantics
//! of Envoy's shared data), driven by simulated Envoy workers the way `crate::filter` drives it.
//!
//! Each worker registers with [`engine::heartbeat`] (its slot is the owner of its requests) and
//! keeps its requests in the engine's own table ([`Requests`]) with the simulator as host. An
//! arrival is [`engine::admit`] (the filter's `on_http_request_headers`); a handler return is
//! `Requests::end` (the filter's `stream_ended`); timer work is [`engine::expire_level`] (in
//! Envoy whichever worker's tick comes first does it, so which worker does it here does not
//! matter). Each worker reaches the store through its own [`WorkerStore`] and so keeps its own
//! cache of the level state ([`crate::engine::cache`]), as an Envoy worker VM does.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::admission::{Admission, Call, CallId, Outcomes};
use super::results::CallKind;
use super::scenario::Scenario;
use super::SimError;
use crate::config::PluginConfig;
use crate::engine::requests::{Ctx, Entry, Host, Requests};
use crate::engine::store::{MemStore, Store, WorkerStore};
use crate::engine::{self, Arriving, Compiled, Decision, LevelRuntime, LevelState, Notice};
use crate::fairqueuing::queueset::QueueSet;
use crate::fairqueuing::{QueueSetConfig, RejectReason, RequestTag};
use crate::policy::model::Policy;
use crate::Nanos;

pub(super) const LEVEL_NAME: &str = "sim";

/// One simulated Envoy worker (VM): its view of the store and its requests (their calls).
struct Worker<'a> {
    store: WorkerStore<'a>,
    slot: u32,
    next_context: u32,
    requests: Requests<CallId>,
}

/// The simulator as the engine's host for one worker: a resumed request starts its call, a
/// rejected one ends it; notices for other workers (every owner is one) are delivered after this
/// worker's routing.
struct SimHost<'o> {
    slot: u32,
    outbox: Vec<Notice>,
    by_call: &'o mut HashMap<CallId, (usize, u32)>,
    out: &'o mut Outcomes,
}

impl Host<CallId> for SimHost<'_> {
    fn slot(&self) -> Option<u32> {
        Some(self.slot)
    }
    fn resume(&mut self, _context: u32, _e: &Entry<CallId>) -> bool {
        true
    }
    fn reject(&mut self, _context: u32, e: &Entry<CallId>, reason: RejectReason, _retry_after: i64) {
        // A rejected call is over: forget its context.
        self.by_call.remove(&e.extra);
        self.out.push((e.extra, CallKind::Reject(reason)));
    }
    fn post(&mut self, n: &Notice) -> bool {
        self.outbox.push(n.clone());
        true
    }
    fn dispatched(&mut self, e: &Entry<CallId>) {
        self.out.push((e.extra, CallKind::Start { waited: e.waited }));
    }
}

pub struct EngineLevel<'a> {
    compiled: Compiled,
    key: Arc<str>,
    workers: Vec<Worker<'a>>,
    /// The worker and the context of each call in flight.
    by_call: HashMap<CallId, (usize, u32)>,
}

fn err(e: impl std::fmt::Display) -> SimError {
    SimError::run(e)
}

/// A compiled configuration whose only level (index 0) is the scenario's: `cfg`, exempt or
/// not, enforced, its limits pinned to the concurrency limit (no borrowing is simulated). In
/// fleet mode, as `Compiled::new` makes it with `fleet` configured: the level admits nothing
/// until the fleet's allocation sets its seats, which range from none to the level's limit.
fn compiled(sc: &Scenario) -> Compiled {
    // The classifier is never consulted: requests arrive classified.
    let fleet = sc.fleet.as_ref().map(|f| f.config.clone());
    let in_fleet = fleet.is_some();
    let config = PluginConfig { policy: Policy::default(), limits: Vec::new(), fleet, ..PluginConfig::default() };
    let mut c = Compiled::new(config, 1);
    let limit = sc.cfg.concurrency_limit;
    let qs_config = if in_fleet { QueueSetConfig { concurrency_limit: 0, strict_limit: true, ..sc.cfg } } else { sc.cfg };
    c.levels = vec![LevelRuntime {
        name: LEVEL_NAME.to_string(),
        uid: String::new(),
        key: engine::level_key(LEVEL_NAME).into(),
        qs_config,
        exempt: sc.exempt,
        max_seats: None,
        nominal: limit,
        min_limit: if in_fleet { 0 } else { limit },
        max_limit: limit,
        enforce: true,
    }];
    c
}

impl<'a> EngineLevel<'a> {
    /// The scenario's level as of its start in `store` (a fresh one), and its registered
    /// workers.
    pub fn new(store: &'a MemStore, sc: &Scenario) -> Result<EngineLevel<'a>, SimError> {
        let compiled = compiled(sc);
        let (key, cfg) = compiled.levels.first().map(|l| (l.key.clone(), l.qs_config)).ok_or_else(|| SimError::run("no level"))?;
        // The level exists from the scenario start (as the bare QueueSet), not from the first
        // arrival; same generation as the configuration, so admission does not reconfigure it.
        let state = LevelState::new(cfg, compiled.generation, sc.start).map_err(err)?;
        store.set(&key, &state.encode(), None).map_err(err)?;
        let mut workers = Vec::with_capacity(sc.workers as usize);
        for w in 0..sc.workers {
            let store = WorkerStore::new(store);
            let slot = engine::heartbeat(&store, u64::from(w) + 1, sc.start).map_err(err)?;
            workers.push(Worker { store, slot, next_context: 1, requests: Requests::new() });
        }
        Ok(EngineLevel { compiled, key, workers, by_call: HashMap::new() })
    }

    /// The compiled configuration the workers admit under.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    /// The level's key in the store.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether `call` is waiting or executing here.
    pub fn has_call(&self, call: &CallId) -> bool {
        self.by_call.contains_key(call)
    }

    /// Routes `notices` produced by worker 0 (the fleet's driver, the timer work).
    pub fn route_notices(&mut self, now: Nanos, notices: Vec<Notice>, out: &mut Outcomes) {
        self.route(now, 0, None, notices, out);
    }

    /// `gateway::worker::Worker::route`: each worker of `pending` (a stack) routes its notices through
    /// its request table; what it posts to other workers is routed by them in turn
    /// (synchronously: no mailbox latency). `end`: worker `by` first ends that request.
    fn route(&mut self, now: Nanos, by: usize, end: Option<u32>, notices: Vec<Notice>, out: &mut Outcomes) {
        let mut pending = vec![(by, end, notices)];
        while let Some((w, end, notices)) = pending.pop() {
            let Some(wk) = self.workers.get_mut(w) else { continue };
            let by_call = &mut self.by_call;
            let mut host = SimHost { slot: wk.slot, outbox: Vec::new(), by_call, out };
            let cx = &mut Ctx { store: &wk.store, host: &mut host, now };
            match end {
                Some(context) => drop(wk.requests.end(cx, context)),
                None => wk.requests.route(cx, notices),
            }
            let outbox = host.outbox;
            let owner = |n: &Notice| self.workers.iter().position(|w| w.slot == n.owner);
            let next = outbox.into_iter().filter_map(|n| Some((owner(&n)?, None, vec![n])));
            // What an ending request posts is routed in order, each notice with all it causes.
            if end.is_some() {
                pending.extend(next.rev());
            } else {
                pending.extend(next);
            }
        }
    }

    /// The store as worker 0 sees it: timer work, reads, and in fleet mode the fleet's driver
    /// (in Envoy every worker's tick runs the timer work, whoever comes first does it, and one
    /// worker per process drives the fleet).
    pub fn timer_store(&self) -> Result<&WorkerStore<'_>, SimError> {
        self.workers.first().map(|w| &w.store).ok_or_else(|| SimError::run("no workers"))
    }
}

impl Admission for EngineLevel<'_> {
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Outcomes) -> Result<(), SimError> {
        let w = self.workers.get_mut(call.worker as usize).ok_or_else(|| SimError::run("no such worker"))?;
        let context = w.next_context;
        w.next_context = w.next_context.wrapping_add(1).max(1);
        let tag = RequestTag { owner: w.slot, context, ..call.tag };
        let mut notices = Vec::new();
        let decision =
            engine::admit(&self.compiled, &w.store, now, Arriving { level: 0, work: call.work, tag }, &mut notices).map_err(err)?.0;
        if let Some(e) = Entry::admitted(self.key.clone(), &decision, now, tag.wait_deadline, call.id) {
            w.requests.insert(context, e);
            self.by_call.insert(call.id, (call.worker as usize, context));
        }
        match decision {
            Decision::Execute(_) => out.push((call.id, CallKind::Start { waited: 0 })),
            Decision::Queued(_) => {}
            Decision::Rejected { reason, .. } => out.push((call.id, CallKind::Reject(reason))),
        }
        self.route(now, call.worker as usize, None, notices, out);
        Ok(())
    }

    fn finish(&mut self, now: Nanos, call: CallId, out: &mut Outcomes) -> Result<(), SimError> {
        if let Some((worker, context)) = self.by_call.remove(&call) {
            self.route(now, worker, Some(context), Vec::new(), out);
        }
        Ok(())
    }

    fn expire(&mut self, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        let mut notices = Vec::new();
        engine::expire_level(self.timer_store()?, now, &self.key, &mut notices).map_err(err)?;
        self.route(now, 0, None, notices, out);
        Ok(())
    }

    fn queue_set(&self) -> Result<Option<Cow<'_, QueueSet>>, SimError> {
        Ok(engine::read_level(self.timer_store()?, &self.key).map_err(err)?.map(|st| Cow::Owned(st.qs)))
    }
}
