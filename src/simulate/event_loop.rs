//! The discrete-event loop: client threads issue calls to an admission path
//! ([`super::admission::Admission`]) on a virtual clock, in (time, scheduling order).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::add_time;
use super::admission::{Admission, Call, CallId};
use super::jitter::service_time;
use super::results::{Accounts, CallKind};
use super::scenario::{Client, Pacing, Scenario};
use super::SimError;
use crate::fairqueuing::RequestTag;
use crate::Nanos;

const MAX_EVENTS: u64 = 50_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The call is issued.
    Call(CallId),
    /// The call returns from its handler.
    ExecEnd(CallId),
    /// The level's next timer event is due.
    Timer,
    /// The host's own work is due (fleet mode).
    Host,
}

struct Thread {
    client: usize,
    calls: u32,
    replica: u32,
    worker: u32,
}

pub struct EventLoop<'a> {
    sc: &'a Scenario,
    pub adm: Box<dyn Admission + 'a>,
    threads: Vec<Thread>,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    seq: u64,
    timers: BTreeSet<Nanos>,
    /// When host events are scheduled.
    hosts: BTreeSet<Nanos>,
    /// Scheduled events other than host events.
    pending: u64,
    pub acc: Accounts,
}

impl<'a> EventLoop<'a> {
    /// Schedules every thread's first call (upstream `uniformScenario`'s times, see [`super`]).
    pub fn new(sc: &'a Scenario, adm: Box<dyn Admission + 'a>, acc: Accounts) -> Result<EventLoop<'a>, SimError> {
        let mut lp = EventLoop {
            sc,
            adm,
            threads: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            timers: BTreeSet::new(),
            hosts: BTreeSet::new(),
            pending: 0,
            acc,
        };
        let workers = sc.workers.max(1);
        for (i, c) in sc.clients.iter().enumerate() {
            for j in 0..c.threads {
                let mut delay = 90 * j as i64 + 20 * i as i64;
                let mut calls = c.calls;
                if c.split && j >= c.threads / 2 {
                    delay += sc.eval / 2;
                    calls /= 2;
                }
                let thread = u32::try_from(lp.threads.len()).map_err(|_| SimError::scenario("too many threads"))?;
                let worker = u32::try_from((i as u64 + u64::from(j)) % u64::from(workers)).unwrap_or(0);
                lp.threads.push(Thread { client: i, calls, replica: c.replica, worker });
                lp.schedule(add_time(sc.start, delay)?, Ev::Call(CallId { thread, k: 0 }));
            }
        }
        lp.schedule_host();
        Ok(lp)
    }

    fn schedule(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.pending += u64::from(ev != Ev::Host);
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// Schedules the host's next own work, unless a host event is already due then.
    fn schedule_host(&mut self) {
        if let Some(t) = self.adm.next_host_event() {
            if self.hosts.insert(t) {
                self.schedule(t, Ev::Host);
            }
        }
    }

    /// The client and the thread of `call`.
    fn thread(&self, call: CallId) -> Option<(&'a Client, &Thread)> {
        let th = self.threads.get(call.thread as usize)?;
        Some((self.sc.clients.get(th.client)?, th))
    }

    /// Accounts for what happened to `call` at `t`.
    fn note(&mut self, t: Nanos, call: CallId, kind: CallKind) {
        let Some((c, th)) = self.thread(call) else { return };
        self.acc.note(t, th.client, call, kind, c.work.initial_seats.into());
    }

    /// Runs every event to completion. The host's own work goes on while other events are
    /// pending, and then as long as it says ([`Admission::host_continues`]).
    pub fn run(&mut self) -> Result<(), SimError> {
        let mut processed = 0;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            processed += 1;
            if processed > MAX_EVENTS {
                return Err(SimError::run("simulation exceeded its event budget"));
            }
            if ev == Ev::Host {
                self.hosts.remove(&t);
                if self.pending == 0 && !self.adm.host_continues(t)? {
                    continue;
                }
            } else {
                self.pending = self.pending.saturating_sub(1);
            }
            self.step(t, ev)?;
            self.schedule_host();
        }
        Ok(())
    }

    /// The call started executing at `now` after waiting `waited`.
    fn started(&mut self, now: Nanos, call: CallId, waited: Nanos) -> Result<(), SimError> {
        let Some((c, _)) = self.thread(call) else { return Ok(()) };
        let exec = service_time(self.sc.seed, call.thread, call.k, &c.service);
        self.note(now, call, CallKind::Start { waited });
        if let Pacing::AfterDispatch { think } = c.pacing {
            let next = add_time(now, add_time(exec, think)?)?.max(now);
            self.schedule(next, Ev::Call(CallId { k: call.k + 1, ..call }));
        }
        self.schedule(add_time(now, exec)?.max(now), Ev::ExecEnd(call));
        Ok(())
    }

    fn step(&mut self, now: Nanos, ev: Ev) -> Result<(), SimError> {
        let mut out = Vec::new();
        match ev {
            Ev::Call(id) => {
                let Some((c, th)) = self.thread(id) else { return Ok(()) };
                if id.k >= th.calls {
                    return Ok(());
                }
                let wait_deadline = self.sc.wait_limit.map_or(Nanos::MAX, |l| now.saturating_add(l));
                let flow_schema = u16::try_from(th.client).unwrap_or(u16::MAX);
                let tag = RequestTag { owner: 0, context: 0, flow_schema, flow_hash: c.hash, wait_deadline };
                let call = Call { id, replica: th.replica, worker: th.worker, work: c.work, tag };
                self.note(now, id, CallKind::Arrive);
                self.adm.arrive(now, &call, &mut out)?;
            }
            Ev::ExecEnd(id) => {
                let Some((c, _)) = self.thread(id) else { return Ok(()) };
                self.note(now, id, CallKind::End);
                if let Pacing::AfterResponse { round_trip } = c.pacing {
                    self.schedule(add_time(now, round_trip)?, Ev::Call(CallId { k: id.k + 1, ..id }));
                }
                self.adm.finish(now, id, &mut out)?;
            }
            Ev::Timer => {
                self.timers.remove(&now);
                self.adm.expire(now, &mut out)?;
            }
            Ev::Host => self.adm.host_event(now, &mut out)?,
        }
        for (call, kind) in out {
            match kind {
                CallKind::Start { waited } => self.started(now, call, waited)?,
                _ => self.note(now, call, kind),
            }
        }
        if !self.sc.timers {
            return Ok(());
        }
        if let Some(t) = self.adm.next_timer()? {
            if self.timers.insert(t) {
                self.schedule(t, Ev::Timer);
            }
        }
        Ok(())
    }
}
