//! What the event loop asks of the admission path it simulates, and the bare-QueueSet path.
//!
//! A call is named by its thread and its number within the thread (with upstream's pacing a
//! thread's next call may arrive before its previous one returned). An operation reports the
//! calls that started or were rejected ([`Outcomes`]) in the order the path decided them: first
//! the operating call's own (for an arrival that executes at once or is rejected), then the
//! waiting calls the operation dispatched or timed out.

use std::borrow::Cow;
use std::collections::HashMap;

use super::results::CallKind;
use super::SimError;
use crate::fairqueuing::queueset::{Arrival, QueueSet};
use crate::fairqueuing::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// Calls that started executing ([`CallKind::Start`]) or were rejected ([`CallKind::Reject`]).
pub type Outcomes = Vec<(CallId, CallKind)>;

/// Call `k` of thread `thread`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId {
    pub thread: u32,
    pub k: u32,
}

/// One call as it reaches the filter; its tag's owner and context are the path's to set.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub id: CallId,
    /// The replica (fleet mode: gateway process) and the simulated Envoy worker of it the
    /// thread's connection is on.
    pub replica: u32,
    pub worker: u32,
    pub work: WorkEstimate,
    pub tag: RequestTag,
}

/// An admission path: the bare QueueSet ([`BareQueueSet`]), the engine with simulated
/// workers ([`super::engine_level::EngineLevel`]), or a fleet of them
/// ([`super::fleet::FleetLevels`]).
pub trait Admission {
    /// The call arrives at `now`.
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Outcomes) -> Result<(), SimError>;
    /// The executing call returned from its handler at `now`.
    fn finish(&mut self, now: Nanos, call: CallId, out: &mut Outcomes) -> Result<(), SimError>;
    /// Timer work due at `now`: wait deadlines and lingering seats.
    fn expire(&mut self, now: Nanos, out: &mut Outcomes) -> Result<(), SimError>;
    /// The level's QueueSet as it is now (its next timer event, its epoch advances).
    fn queue_set(&self) -> Result<Option<Cow<'_, QueueSet>>, SimError>;
    /// When the next timer event of the level is due ([`Admission::expire`]).
    fn next_timer(&self) -> Result<Option<Nanos>, SimError> {
        Ok(self.queue_set()?.and_then(|qs| qs.next_event()))
    }
    /// Successful epoch advances of the level's progress meter.
    fn epoch_advances(&self) -> Result<u64, SimError> {
        Ok(self.queue_set()?.map_or(0, |qs| qs.counters().epoch_advances))
    }
    /// When the host's next own work is due (fleet mode: timer ticks, etcd's answers).
    fn next_host_event(&self) -> Option<Nanos> {
        None
    }
    /// Runs the host's next own work, due at `now`.
    fn host_event(&mut self, _now: Nanos, _out: &mut Outcomes) -> Result<(), SimError> {
        Ok(())
    }
    /// Whether the host's own work goes on at `now` when nothing else is left to happen.
    fn host_continues(&self, _now: Nanos) -> Result<bool, SimError> {
        Ok(false)
    }
    /// Fleet mode: what the fleet did.
    fn fleet_result(&self) -> Option<super::results::FleetResult> {
        None
    }
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
    pub fn new(cfg: QueueSetConfig, start: Nanos) -> Result<BareQueueSet, SimError> {
        Ok(BareQueueSet {
            qs: QueueSet::new(cfg, start).map_err(SimError::scenario)?,
            pending: HashMap::new(),
            running: HashMap::new(),
            out: Vec::new(),
        })
    }

    fn dispatched(&mut self, out: &mut Outcomes) {
        for d in self.out.drain(..) {
            if let Some(call) = self.pending.remove(&d.id) {
                self.running.insert(call, d.receipt);
                out.push((call, CallKind::Start { waited: d.waited }));
            }
        }
    }
}

impl Admission for BareQueueSet {
    fn arrive(&mut self, now: Nanos, call: &Call, out: &mut Outcomes) -> Result<(), SimError> {
        let tag = RequestTag { owner: 0, context: call.id.thread, ..call.tag };
        match self.qs.start_request(now, call.work, tag, &mut self.out).arrival {
            Arrival::Executing(receipt) => {
                self.running.insert(call.id, receipt);
                out.push((call.id, CallKind::Start { waited: 0 }));
            }
            Arrival::Queued(id) => {
                self.pending.insert(id, call.id);
            }
            Arrival::Rejected(reason) => out.push((call.id, CallKind::Reject(reason))),
        }
        self.dispatched(out);
        Ok(())
    }

    fn finish(&mut self, now: Nanos, call: CallId, out: &mut Outcomes) -> Result<(), SimError> {
        if let Some(receipt) = self.running.remove(&call) {
            self.qs.finish(now, &receipt, &mut self.out);
        }
        self.dispatched(out);
        Ok(())
    }

    fn expire(&mut self, now: Nanos, out: &mut Outcomes) -> Result<(), SimError> {
        let mut timed_out = Vec::new();
        self.qs.expire(now, &mut timed_out, &mut self.out);
        for (id, _) in timed_out {
            if let Some(call) = self.pending.remove(&id) {
                out.push((call, CallKind::Reject(RejectReason::TimeOut)));
            }
        }
        self.dispatched(out);
        Ok(())
    }

    fn queue_set(&self) -> Result<Option<Cow<'_, QueueSet>>, SimError> {
        Ok(Some(Cow::Borrowed(&self.qs)))
    }
}
