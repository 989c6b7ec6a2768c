//! What the event loop asks of the admission path it simulates, and the bare-QueueSet path.
//!
//! A call is named by its thread and its number within the thread (with upstream's pacing a
//! thread's next call may arrive before its previous one returned). An operation reports what happened to calls as [`Outcome`]s in the order the path decided them: first
//! the operating call's own (for an arrival that executes at once or is rejected), then the
//! waiting calls the operation dispatched or timed out.

use std::collections::HashMap;

use crate::fairqueuing::queueset::{Arrival, QueueSet};
use crate::fairqueuing::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// What happened to a call during an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call started executing after waiting `waited` (0: at once).
    Started { call: CallId, waited: Nanos },
    /// The call was answered 429.
    Rejected { call: CallId, reason: RejectReason },
}

/// Call `k` of thread `thread`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId {
    pub thread: u32,
    pub k: u32,
}

/// One call as it reaches the filter.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub id: CallId,
    /// The simulated Envoy worker the thread's connection is on.
    pub worker: u32,
    pub work: WorkEstimate,
    pub flow_schema: u16,
    pub flow_hash: u64,
    pub wait_deadline: Nanos,
}

/// An admission path: the bare QueueSet ([`BareQueueSet`]) or the engine with simulated
/// workers ([`super::engine_level::EngineLevel`]).
pub trait Admission {
    /// The call arrives at `now`.
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Vec<Outcome>) -> Result<(), String>;
    /// The executing call (on `worker`) returned from its handler at `now`.
    fn finish(&mut self, now: Nanos, call: CallId, worker: u32, out: &mut Vec<Outcome>) -> Result<(), String>;
    /// When the level next needs [`Admission::expire`] (`QueueSet::next_event`).
    fn next_event(&self) -> Result<Option<Nanos>, String>;
    /// Timer work due at `now`: wait deadlines and lingering seats.
    fn expire(&mut self, now: Nanos, out: &mut Vec<Outcome>) -> Result<(), String>;
    /// Successful epoch advances of the level's progress meter so far.
    fn epoch_advances(&self) -> Result<u64, String>;
}

/// Upstream's `uniformScenario` shape: the harness calls the QueueSet directly (one owner).
pub struct BareQueueSet {
    qs: QueueSet,
    /// Waiting calls by request id.
    pending: HashMap<RequestId, CallId>,
    /// Receipts of the executing calls (handed back to `QueueSet::finish`).
    running: HashMap<CallId, Receipt>,
    out: Vec<Dispatched>,
}

impl BareQueueSet {
    pub fn new(cfg: QueueSetConfig, start: Nanos) -> Result<BareQueueSet, String> {
        Ok(BareQueueSet { qs: QueueSet::new(cfg, start)?, pending: HashMap::new(), running: HashMap::new(), out: Vec::new() })
    }

    fn dispatched(&mut self, out: &mut Vec<Outcome>) {
        for d in self.out.drain(..) {
            if let Some(call) = self.pending.remove(&d.id) {
                self.running.insert(call, d.receipt);
                out.push(Outcome::Started { call, waited: d.waited });
            }
        }
    }
}

impl Admission for BareQueueSet {
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Vec<Outcome>) -> Result<(), String> {
        let tag = RequestTag { owner: 0, context: call.id.thread, flow_schema: call.flow_schema, flow_hash: call.flow_hash, wait_deadline: call.wait_deadline };
        match self.qs.arrive(now, call.work, tag, &mut self.out) {
            Arrival::Executing(receipt) => {
                self.running.insert(call.id, receipt);
                out.push(Outcome::Started { call: call.id, waited: 0 });
            }
            Arrival::Queued(id) => {
                self.pending.insert(id, call.id);
            }
            Arrival::Rejected(reason) => out.push(Outcome::Rejected { call: call.id, reason }),
        }
        self.dispatched(out);
        Ok(())
    }

    fn finish(&mut self, now: Nanos, call: CallId, _worker: u32, out: &mut Vec<Outcome>) -> Result<(), String> {
        if let Some(receipt) = self.running.remove(&call) {
            self.qs.finish(now, &receipt, &mut self.out);
        }
        self.dispatched(out);
        Ok(())
    }

    fn next_event(&self) -> Result<Option<Nanos>, String> {
        Ok(self.qs.next_event())
    }

    fn expire(&mut self, now: Nanos, out: &mut Vec<Outcome>) -> Result<(), String> {
        let mut timed_out = Vec::new();
        self.qs.expire(now, &mut timed_out, &mut self.out);
        for (id, _) in timed_out {
            if let Some(call) = self.pending.remove(&id) {
                out.push(Outcome::Rejected { call, reason: RejectReason::TimeOut });
            }
        }
        self.dispatched(out);
        Ok(())
    }

    fn epoch_advances(&self) -> Result<u64, String> {
        Ok(self.qs.counters().epoch_advances)
    }
}
