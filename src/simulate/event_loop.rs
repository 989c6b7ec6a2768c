//! The discrete-event loop: client threads issue calls to an admission path
//! ([`super::admission::Admission`]) on a virtual clock, in (time, scheduling order).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::admission::{Admission, Call, CallId, Outcome};
use super::jitter::service_time;
use super::results::{Accounts, CallEvent, CallKind};
use super::scenario::{Pacing, Scenario};
use crate::fairqueuing::RejectReason;
use crate::Nanos;

/// Bound on the events of one run.
const MAX_EVENTS: u64 = 50_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Thread `thread` issues its call `k`.
    Call { thread: u32, k: u32 },
    /// Call `k` of `thread` returns from its handler.
    ExecEnd { thread: u32, k: u32 },
    /// The level's next timer event is due.
    Timer,
}

struct Thread {
    client: usize,
    calls: u32,
    worker: u32,
}

pub struct EventLoop<'a> {
    sc: &'a Scenario,
    adm: Box<dyn Admission + 'a>,
    threads: Vec<Thread>,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    seq: u64,
    timers: BTreeSet<Nanos>,
    pub acc: Accounts,
    pub calls: Option<Vec<CallEvent>>,
    processed: u64,
}

fn checked_time(a: Nanos, b: Nanos) -> Result<Nanos, String> {
    a.checked_add(b).ok_or_else(|| String::from("scenario times overflow the clock"))
}

impl<'a> EventLoop<'a> {
    /// Schedules every thread's first call: thread `j` of client `i` at `90·j + 20·i` ns
    /// (upstream `uniformScenario`; a split client's second half of threads at `evalDuration/2`
    /// with half the calls), on worker `(i + j) mod workers`.
    pub fn new(sc: &'a Scenario, adm: Box<dyn Admission + 'a>, acc: Accounts, record_calls: bool) -> Result<EventLoop<'a>, String> {
        let mut lp = EventLoop {
            sc,
            adm,
            threads: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            timers: BTreeSet::new(),
            acc,
            calls: record_calls.then(Vec::new),
            processed: 0,
        };
        let half = sc.eval / 2;
        let workers = sc.workers.max(1);
        for (i, c) in sc.clients.iter().enumerate() {
            for j in 0..c.threads {
                let mut delay = 90 * j as i64 + 20 * i as i64;
                let mut calls = c.calls;
                if c.split && j >= c.threads / 2 {
                    delay += half;
                    calls /= 2;
                }
                let thread = u32::try_from(lp.threads.len()).map_err(|_| String::from("too many threads"))?;
                let worker = u32::try_from((i as u64 + u64::from(j)) % u64::from(workers)).unwrap_or(0);
                lp.threads.push(Thread { client: i, calls, worker });
                lp.schedule(checked_time(sc.start, delay)?, Ev::Call { thread, k: 0 });
            }
        }
        Ok(lp)
    }

    fn schedule(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn record(&mut self, t: Nanos, call: CallId, kind: CallKind) {
        let Some(calls) = self.calls.as_mut() else { return };
        let Some(th) = self.threads.get(call.thread as usize) else { return };
        calls.push(CallEvent { t, client: u32::try_from(th.client).unwrap_or(u32::MAX), thread: call.thread, call: call.k, kind });
    }

    /// Runs every event to completion.
    pub fn run(&mut self) -> Result<(), String> {
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            self.processed += 1;
            if self.processed > MAX_EVENTS {
                return Err(String::from("simulation exceeded its event budget"));
            }
            self.step(t, ev)?;
        }
        Ok(())
    }

    pub fn epoch_advances(&self) -> Result<u64, String> {
        self.adm.epoch_advances()
    }

    /// The call started executing at `now` after waiting `waited`.
    fn started(&mut self, now: Nanos, call: CallId, waited: Nanos) -> Result<(), String> {
        let CallId { thread, k } = call;
        let Some(th) = self.threads.get(thread as usize) else { return Ok(()) };
        let ci = th.client;
        let Some(c) = self.sc.clients.get(ci) else { return Ok(()) };
        let exec = service_time(self.sc.seed, thread, k, c.exec, c.jitter);
        let (pacing, seats) = (c.pacing, c.work.initial_seats as i64);
        self.acc.started(ci, now, waited, seats);
        self.record(now, call, CallKind::Start { waited });
        if let Pacing::AfterDispatch { think } = pacing {
            let next = checked_time(now, checked_time(exec, think)?)?.max(now);
            self.schedule(next, Ev::Call { thread, k: k + 1 });
        }
        let end = checked_time(now, exec)?.max(now);
        self.schedule(end, Ev::ExecEnd { thread, k });
        Ok(())
    }

    fn rejected(&mut self, now: Nanos, call: CallId, reason: RejectReason) {
        let Some(th) = self.threads.get(call.thread as usize) else { return };
        self.acc.rejected(th.client, reason);
        self.record(now, call, CallKind::Reject(reason));
    }

    fn step(&mut self, now: Nanos, ev: Ev) -> Result<(), String> {
        let mut out = Vec::new();
        match ev {
            Ev::Call { thread, k } => {
                let Some(th) = self.threads.get(thread as usize) else { return Ok(()) };
                if k >= th.calls {
                    return Ok(());
                }
                let (ci, worker) = (th.client, th.worker);
                let Some(c) = self.sc.clients.get(ci) else { return Ok(()) };
                let wait_deadline = match self.sc.wait_limit {
                    Some(l) => now.saturating_add(l),
                    None => Nanos::MAX,
                };
                let id = CallId { thread, k };
                let call = Call { id, worker, work: c.work, flow_schema: u16::try_from(ci).unwrap_or(u16::MAX), flow_hash: c.hash, wait_deadline };
                self.record(now, id, CallKind::Arrive);
                self.adm.arrive(now, &call, &mut out)?;
            }
            Ev::ExecEnd { thread, k } => {
                let id = CallId { thread, k };
                let Some(th) = self.threads.get(thread as usize) else { return Ok(()) };
                let (ci, worker) = (th.client, th.worker);
                let Some(c) = self.sc.clients.get(ci) else { return Ok(()) };
                let (pacing, seats) = (c.pacing, c.work.initial_seats as i64);
                self.acc.ended(ci, now, seats);
                self.record(now, id, CallKind::End);
                if let Pacing::AfterResponse { round_trip } = pacing {
                    self.schedule(checked_time(now, round_trip)?, Ev::Call { thread, k: k + 1 });
                }
                self.adm.finish(now, id, worker, &mut out)?;
            }
            Ev::Timer => {
                self.timers.remove(&now);
                self.adm.expire(now, &mut out)?;
            }
        }
        for o in out {
            match o {
                Outcome::Started { call, waited } => self.started(now, call, waited)?,
                Outcome::Rejected { call, reason } => self.rejected(now, call, reason),
            }
        }
        if let Some(t) = self.adm.next_event()? {
            if self.timers.insert(t) {
                self.schedule(t, Ev::Timer);
            }
        }
        Ok(())
    }
}
