//! Fleet mode (`"replicas": N`): N gateway processes share the scenario's level through one
//! etcd, each running the production fleet code as the gateway runs it.
//!
//! Each replica is one Envoy process: its own store (shared data), its own simulated workers
//! and its own clients ([`EngineLevel`], configured as `Compiled::new` configures a level with
//! `fleet`: no seats until the fleet sets them). Worker 0 drives the process's fleet
//! membership as `gateway::fleet` does: every timer tick (`gateway::root::TICK_MS`) it runs
//! [`FleetFeed::tick`] — the level's seat demand sampled into the period's integrator, every
//! `period` the demand statistics and seats in use handed to the [`Fleet`] state machine, its
//! etcd calls sent — and applies the fleet's limits ([`FleetFeed::apply`], i.e.
//! `engine::set_limits`); every etcd answer goes to [`FleetFeed::on_response`] and the limits are
//! applied again. The replicas' ticks are spread over the tick interval. All replicas share one
//! [`MemEtcd`]; a call reaches it half `etcdDelay` after it was sent and its answer arrives
//! `etcdDelay` after it was sent.
//!
//! The level is the policy's only one and neither lends nor borrows, so its fleet CurrentCL is
//! its `concurrencyLimit`: the fleet's allocation splits that among the replicas
//! (`fleet::allocation`). After every event the replicas' seats in use (`QueueSet::seats_in_use`,
//! from each process's level state) are summed; the largest sum is reported beside the limit.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::admission::{Admission, Call, CallId, Outcomes};
use super::engine_level::{EngineLevel, LEVEL_NAME};
use super::results::{FleetResult, ReplicaResult};
use super::scenario::{FleetSim, Scenario};
use super::SimError;
use crate::engine::{self, store::MemStore, LevelState};
use crate::fairqueuing::queueset::QueueSet;
use crate::fleet::{EtcdCall, Fleet, FleetFeed, FleetLevel, FleetPolicy};
use crate::limits::static_limits::LevelLimits;
use crate::simulate::memetcd::MemEtcd;
use crate::Nanos;

/// The gateway's timer tick (`gateway::root::TICK_MS`).
const TICK: Nanos = crate::gateway::root::TICK_MS as Nanos * 1_000_000;
/// With calls still waiting and nothing left but the fleet's own work, the run goes on at most
/// this many periods past the window (a replica may never get seats, e.g. with fewer seats
/// than replicas).
const DRAIN_PERIODS: i64 = 10;

/// The fleet's own work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    /// A replica's timer tick.
    Tick(usize),
    /// A call reaches etcd.
    Request(u64),
    /// A call's answer reaches its replica.
    Answer(u64),
    /// Every replica's seats and seats in use are sampled.
    Sample,
}

/// A call on the wire, by token.
enum Wire {
    Request { replica: usize, call: EtcdCall },
    Answer { replica: usize, id: u64, status: u16, body: Vec<u8> },
}

struct Replica<'a> {
    id: String,
    level: EngineLevel<'a>,
    /// Made at the replica's first tick (the gateway's driver: at its first tick).
    feed: Option<FleetFeed>,
    in_use: u32,
    max_in_use: u32,
    /// The level's concurrency limit, and when it changed (from 0 at the start).
    limit: u32,
    changes: Vec<(Nanos, u32)>,
    seats: Vec<u32>,
    executing: Vec<u32>,
}

/// The replicas of a fleet as one admission path: each call goes to its thread's replica.
pub struct FleetLevels<'a> {
    sim: FleetSim,
    policy: FleetPolicy,
    replicas: Vec<Replica<'a>>,
    /// Each client's replica.
    clients: Vec<u32>,
    etcd: MemEtcd,
    agenda: BinaryHeap<Reverse<(Nanos, u64, Job)>>,
    seq: u64,
    wire: BTreeMap<u64, Wire>,
    next_token: u64,
    start: Nanos,
    eval_end: Nanos,
    drain_end: Nanos,
    max_total: u32,
    max_total_at: Nanos,
    sample_times: Vec<Nanos>,
}

fn err(e: impl std::fmt::Display) -> SimError {
    SimError::run(e)
}

/// The fleet's view of the scenario's level: the policy's only level, neither lending nor
/// borrowing, so the fleet limit (`serverConcurrencyLimit`) and its CurrentCL are its limit.
fn policy(limit: u32) -> FleetPolicy {
    let limits = LevelLimits { nominal: limit, lendable: 0, borrowing: 0, min: limit, max: limit, max_seats: None, initial_current: limit };
    FleetPolicy {
        server_concurrency_limit: limit,
        levels: vec![FleetLevel { name: LEVEL_NAME.to_string(), exempt: false, limits, queue_seats: u64::MAX }],
    }
}

impl<'a> FleetLevels<'a> {
    /// The fleet `sim` of scenario `sc`, replica `r` on `stores[r]` (fresh stores).
    pub fn new(stores: &'a [MemStore], sc: &Scenario, sim: &FleetSim) -> Result<FleetLevels<'a>, SimError> {
        let n = sim.replicas as usize;
        let mut replicas = Vec::with_capacity(n);
        for (r, store) in stores.iter().take(n).enumerate() {
            let level = EngineLevel::new(store, sc)?;
            let (seats, executing, changes) = (Vec::new(), Vec::new(), Vec::new());
            replicas.push(Replica {
                id: format!("replica-{r}"),
                level,
                feed: None,
                in_use: 0,
                max_in_use: 0,
                limit: 0,
                changes,
                seats,
                executing,
            });
        }
        if replicas.len() != n {
            return Err(SimError::run("a store per replica is needed"));
        }
        let eval_end = super::add_time(sc.start, sc.eval)?;
        let drain_end = eval_end.saturating_add(sim.config.period.saturating_mul(DRAIN_PERIODS));
        let mut f = FleetLevels {
            sim: sim.clone(),
            policy: policy(sc.cfg.concurrency_limit),
            replicas,
            clients: sc.clients.iter().map(|c| c.replica).collect(),
            etcd: MemEtcd::new(),
            agenda: BinaryHeap::new(),
            seq: 0,
            wire: BTreeMap::new(),
            next_token: 1,
            start: sc.start,
            eval_end,
            drain_end,
            max_total: 0,
            max_total_at: sc.start,
            sample_times: Vec::new(),
        };
        f.schedule(sc.start, Job::Sample);
        let spread = i64::from(sim.replicas.max(1));
        for r in 0..n {
            f.schedule(sc.start.saturating_add(TICK * r as i64 / spread), Job::Tick(r));
        }
        Ok(f)
    }

    fn schedule(&mut self, t: Nanos, job: Job) {
        self.seq += 1;
        self.agenda.push(Reverse((t, self.seq, job)));
    }

    fn replica(&mut self, r: usize) -> Result<&mut Replica<'a>, SimError> {
        self.replicas.get_mut(r).ok_or_else(|| SimError::run("no such replica"))
    }

    fn state(level: &EngineLevel<'_>) -> Result<Option<LevelState>, SimError> {
        engine::read_level(level.timer_store()?, level.key()).map_err(err)
    }

    /// Notes replica `r`'s seats in use and limit after an event at `now`, and the fleet's
    /// seats in use.
    fn observe(&mut self, r: usize, now: Nanos) -> Result<(), SimError> {
        let rep = self.replica(r)?;
        let st = Self::state(&rep.level)?;
        rep.in_use = st.as_ref().map_or(0, |st| st.qs.seats_in_use());
        rep.max_in_use = rep.max_in_use.max(rep.in_use);
        let limit = st.map_or(0, |st| st.qs.config().concurrency_limit);
        if limit != rep.limit {
            rep.limit = limit;
            rep.changes.push((now, limit));
        }
        let total = self.replicas.iter().fold(0u32, |s, r| s.saturating_add(r.in_use));
        if total > self.max_total {
            self.max_total = total;
            self.max_total_at = now;
        }
        Ok(())
    }

    /// Sends replica `r`'s etcd calls.
    fn send(&mut self, replica: usize, calls: Vec<EtcdCall>, now: Nanos) {
        for call in calls {
            let token = self.next_token;
            self.next_token += 1;
            self.wire.insert(token, Wire::Request { replica, call });
            self.schedule(now.saturating_add(self.sim.etcd_delay / 2), Job::Request(token));
        }
    }

    /// `gateway::fleet::FleetDriver::apply`: the fleet's limits to replica `r`'s level, what
    /// they dispatch routed by its worker 0.
    fn apply(&mut self, r: usize, now: Nanos, force: bool, out: &mut Outcomes) -> Result<(), SimError> {
        let Replica { level, feed, .. } = self.replica(r)?;
        let Some(feed) = feed.as_mut() else { return Ok(()) };
        let mut notices = Vec::new();
        feed.apply(level.compiled(), level.timer_store()?, now, force, &mut notices).map_err(err)?;
        level.route_notices(now, notices, out);
        self.observe(r, now)
    }

    /// `gateway::fleet::on_tick` on replica `r`'s driver.
    fn tick(&mut self, r: usize, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        let (config, policy) = (self.sim.config.clone(), self.policy.clone());
        let Replica { id, level, feed, .. } = self.replica(r)?;
        if feed.is_none() {
            *feed = Some(FleetFeed::new(Fleet::new(config, policy, id).map_err(err)?, level.compiled(), now));
        }
        let Some(feed) = feed.as_mut() else { return Ok(()) };
        let tick = feed.tick(level.compiled(), level.timer_store()?, now);
        self.send(r, tick.calls, now);
        self.apply(r, now, tick.period_ended, out)?;
        self.schedule(now.saturating_add(TICK), Job::Tick(r));
        Ok(())
    }

    /// `gateway::fleet::on_call_response`: etcd's answer on the wire under `token` reaches its
    /// replica.
    fn answer(&mut self, token: u64, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        let Some(Wire::Answer { replica, id, status, body }) = self.wire.remove(&token) else { return Ok(()) };
        let Some(feed) = self.replica(replica)?.feed.as_mut() else { return Ok(()) };
        let calls = feed.on_response(id, status, &body, now);
        self.send(replica, calls, now);
        self.apply(replica, now, false, out)
    }

    fn sample(&mut self, now: Nanos) -> Result<(), SimError> {
        self.sample_times.push(now);
        for rep in &mut self.replicas {
            let st = Self::state(&rep.level)?;
            rep.seats.push(st.as_ref().map_or(0, |s| s.qs.config().concurrency_limit));
            rep.executing.push(st.as_ref().map_or(0, |s| s.qs.seats_in_use()));
        }
        let next = now.saturating_add(self.sim.config.period);
        if next <= self.eval_end {
            self.schedule(next, Job::Sample);
        }
        Ok(())
    }

    fn secs(&self, t: Nanos) -> f64 {
        t.saturating_sub(self.start) as f64 / crate::NANOS_PER_SEC as f64
    }
}

impl Admission for FleetLevels<'_> {
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Outcomes) -> Result<(), SimError> {
        let r = call.replica as usize;
        self.replica(r)?.level.arrive(now, call, out)?;
        self.observe(r, now)
    }

    fn finish(&mut self, now: Nanos, call: CallId, out: &mut Outcomes) -> Result<(), SimError> {
        let Some(r) = self.replicas.iter().position(|rep| rep.level.has_call(&call)) else { return Ok(()) };
        self.replica(r)?.level.finish(now, call, out)?;
        self.observe(r, now)
    }

    fn expire(&mut self, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        for r in 0..self.replicas.len() {
            self.replica(r)?.level.expire(now, out)?;
            self.observe(r, now)?;
        }
        Ok(())
    }

    fn queue_set(&self) -> Result<Option<Cow<'_, QueueSet>>, SimError> {
        Ok(None)
    }

    fn next_timer(&self) -> Result<Option<Nanos>, SimError> {
        let mut next = None;
        for rep in &self.replicas {
            if let Some(t) = rep.level.next_timer()? {
                next = Some(next.map_or(t, |n: Nanos| n.min(t)));
            }
        }
        Ok(next)
    }

    fn epoch_advances(&self) -> Result<u64, SimError> {
        self.replicas.iter().try_fold(0u64, |s, rep| Ok(s.saturating_add(rep.level.epoch_advances()?)))
    }

    fn next_host_event(&self) -> Option<Nanos> {
        self.agenda.peek().map(|Reverse((t, _, _))| *t)
    }

    fn host_event(&mut self, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        let Some(Reverse((t, _, job))) = self.agenda.pop() else { return Ok(()) };
        let now = now.max(t);
        match job {
            Job::Tick(r) => self.tick(r, now, out),
            Job::Request(token) => {
                let Some(Wire::Request { replica, call }) = self.wire.remove(&token) else { return Ok(()) };
                let (status, body) = self.etcd.handle(call.path, &call.headers, &call.body, now);
                self.wire.insert(token, Wire::Answer { replica, id: call.id, status, body });
                let back = self.sim.etcd_delay - self.sim.etcd_delay / 2;
                self.schedule(now.saturating_add(back), Job::Answer(token));
                Ok(())
            }
            Job::Answer(token) => self.answer(token, now, out),
            Job::Sample => self.sample(now),
        }
    }

    /// Through the window (its samples), then while calls wait that a later allocation may
    /// dispatch, for at most [`DRAIN_PERIODS`].
    fn host_continues(&self, now: Nanos) -> Result<bool, SimError> {
        if now <= self.eval_end {
            return Ok(true);
        }
        if now > self.drain_end {
            return Ok(false);
        }
        for rep in &self.replicas {
            if Self::state(&rep.level)?.is_some_and(|st| st.qs.requests_waiting() > 0) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn fleet_result(&self) -> Option<FleetResult> {
        let replicas = self.replicas.iter().enumerate().map(|(r, rep)| ReplicaResult {
            id: rep.id.clone(),
            clients: self
                .clients
                .iter()
                .enumerate()
                .filter(|(_, c)| **c as usize == r)
                .filter_map(|(i, _)| u32::try_from(i).ok())
                .collect(),
            seats: rep.seats.clone(),
            executing: rep.executing.clone(),
            seat_changes: rep.changes.iter().map(|(t, s)| (self.secs(*t), *s)).collect(),
            max_executing: rep.max_in_use,
        });
        Some(FleetResult {
            limit: self.policy.server_concurrency_limit,
            max_executing: self.max_total,
            max_executing_at: self.secs(self.max_total_at),
            sample_times: self.sample_times.iter().map(|t| self.secs(*t)).collect(),
            replicas: replicas.collect(),
        })
    }
}
