//! One worker's requests: the table of those queued or holding seats, and what the worker does
//! with the [`Notice`]s the engine returns. Only the worker that owns a stream resumes or answers
//! it, so a notice for another worker is posted to that worker; a notice for a request whose
//! stream is gone gives its seats back at once. Hosts (the filter, the simulator, native tests)
//! implement [`Host`]; everything else is here, so every host behaves alike.

use super::store::Store;
use super::{Decision, EngineError, Notice, NoticeKind};
use crate::fairqueuing::{Receipt, RejectReason, RequestId};
use crate::Nanos;
use hashbrown::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Waiting,
    Executing,
}

/// One of this worker's requests that is queued or holds seats; `extra` is the host's own data.
#[derive(Debug, Clone)]
pub struct Entry<X> {
    pub level_key: std::sync::Arc<str>,
    pub id: RequestId,
    pub phase: Phase,
    pub arrived: Nanos,
    pub wait_deadline: Nanos,
    /// How long it waited in a queue (set when it starts executing).
    pub waited: Nanos,
    /// When it started executing.
    pub started: Nanos,
    /// Set once it executes: what the QueueSet needs back to finish it.
    pub receipt: Option<Receipt>,
    pub extra: X,
}

impl<X> Entry<X> {
    /// The entry of a request the engine just admitted at `arrived` (`None` for a rejection):
    /// executing with its receipt, or waiting in its queue.
    pub fn admitted(
        level_key: std::sync::Arc<str>,
        decision: &Decision,
        arrived: Nanos,
        wait_deadline: Nanos,
        extra: X,
    ) -> Option<Entry<X>> {
        let (id, phase, receipt) = match *decision {
            Decision::Execute(rc) => (rc.id, Phase::Executing, Some(rc)),
            Decision::Queued(id) => (id, Phase::Waiting, None),
            Decision::Rejected { .. } => return None,
        };
        Some(Entry { level_key, id, phase, arrived, wait_deadline, waited: 0, started: arrived, receipt, extra })
    }
}

/// What the engine needs from the host for one worker's requests.
pub trait Host<X> {
    /// This worker's slot (its lease), to tell its notices from other workers'.
    fn slot(&self) -> Option<u32>;
    /// Resumes the paused stream of `context`, which now holds seats; false when the stream is
    /// gone (its seats are then given back).
    fn resume(&mut self, context: u32, entry: &Entry<X>) -> bool;
    /// Answers the waiting request of `context` with 429 (it left its queue).
    fn reject(&mut self, context: u32, entry: &Entry<X>, reason: RejectReason, retry_after: i64);
    /// Delivers a notice to its owner, another worker; false when it cannot be delivered.
    fn post(&mut self, notice: &Notice) -> bool;
    /// A waiting request left its queue without running (stream gone, deadline, lease expiry).
    fn left_queue(&mut self, _entry: &Entry<X>, _now: Nanos) {}
    /// A waiting request starts executing (after `entry.waited`).
    fn dispatched(&mut self, _entry: &Entry<X>) {}
    /// An executing request gives its seats back.
    fn finished(&mut self, _entry: &Entry<X>, _now: Nanos) {}
    /// An engine operation failed (the filter logs it; seats stay with their lease).
    fn failed(&mut self, _what: &str, _e: &EngineError) {}
}

/// The call context of the operations on a worker's requests: the shared store, the worker's
/// [`Host`] and the time of the call.
pub struct Ctx<'a, X> {
    pub store: &'a dyn Store,
    pub host: &'a mut dyn Host<X>,
    pub now: Nanos,
}

/// This worker's requests, by stream context.
#[derive(Debug, Clone)]
pub struct Requests<X> {
    map: HashMap<u32, Entry<X>>,
}

impl<X> Default for Requests<X> {
    fn default() -> Self {
        Requests { map: HashMap::new() }
    }
}

impl<X> Requests<X> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, context: u32, entry: Entry<X>) {
        self.map.insert(context, entry);
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, context: u32) -> Option<&Entry<X>> {
        self.map.get(&context)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Entry<X>)> {
        self.map.iter().map(|(c, e)| (*c, e))
    }

    /// Delivers notices: this worker's are handled here, others posted to their owner; one
    /// that cannot be delivered gives its seats back (its owner is gone).
    pub fn route(&mut self, cx: &mut Ctx<'_, X>, notices: Vec<Notice>) {
        // In the order the engine gave them (its dispatch order), and then what they caused.
        let me = cx.host.slot();
        let mut pending: std::collections::VecDeque<Notice> = notices.into();
        let mut more = Vec::new();
        while let Some(n) = pending.pop_front() {
            if Some(n.owner) == me {
                self.handle(cx, n, &mut more);
            } else if let (false, NoticeKind::Run { receipt, .. }) = (cx.host.post(&n), n.kind) {
                if let Err(e) = super::finish(cx.store, cx.now, &n.level_key, &receipt, &mut more) {
                    cx.host.failed("release of an undeliverable dispatch", &e);
                }
            }
            pending.extend(more.drain(..));
        }
    }

    /// Handles a notice for one of this worker's requests (further notices go to `more`).
    pub fn handle(&mut self, cx: &mut Ctx<'_, X>, n: Notice, more: &mut Vec<Notice>) {
        let known = self.map.get(&n.context).is_some_and(|e| e.id == n.id && *e.level_key == *n.level_key);
        match n.kind {
            NoticeKind::Run { waited, receipt } => {
                if !known {
                    // The stream is gone (or was answered) before its wake-up arrived.
                    release(cx, &n.level_key, n.id, Some(&receipt), more);
                    return;
                }
                let Some(e) = self.map.get_mut(&n.context).filter(|e| e.phase == Phase::Waiting) else { return };
                e.phase = Phase::Executing;
                e.waited = waited;
                e.started = cx.now;
                e.receipt = Some(receipt);
                cx.host.dispatched(e);
                if !cx.host.resume(n.context, e) {
                    // Stream gone between dispatch and wake-up: give the seats back.
                    self.end_into(cx, n.context, more);
                }
            }
            NoticeKind::Reject { reason, retry_after } => {
                let Some(e) = known.then(|| self.map.remove(&n.context)).flatten() else { return };
                cx.host.left_queue(&e, cx.now);
                cx.host.reject(n.context, &e, reason, retry_after);
            }
        }
    }

    /// The stream of `context` ended (client gone, response done, reset): releases what it
    /// holds. Returns its entry, if it had one.
    pub fn end(&mut self, cx: &mut Ctx<'_, X>, context: u32) -> Option<Entry<X>> {
        let mut more = Vec::new();
        let e = self.end_into(cx, context, &mut more);
        self.route(cx, more);
        e
    }

    fn end_into(&mut self, cx: &mut Ctx<'_, X>, context: u32, more: &mut Vec<Notice>) -> Option<Entry<X>> {
        let e = self.map.remove(&context)?;
        match e.phase {
            Phase::Executing => cx.host.finished(&e, cx.now),
            Phase::Waiting => cx.host.left_queue(&e, cx.now),
        }
        release(cx, &e.level_key, e.id, e.receipt.as_ref(), more);
        Some(e)
    }

    /// Backstop for the wait limit: this worker's waiting requests whose deadline passed
    /// `grace` ago and that no expiry has answered yet are timed out here.
    pub fn time_out_overdue(&mut self, cx: &mut Ctx<'_, X>, grace: Nanos) {
        let now = cx.now;
        let overdue: Vec<_> = (self.map.iter())
            .filter(|(_, e)| e.phase == Phase::Waiting && e.wait_deadline.saturating_add(grace) <= now)
            .map(|(c, e)| (*c, e.level_key.clone(), e.id))
            .collect();
        for (context, key, id) in overdue {
            match super::time_out(cx.store, now, &key, id) {
                Ok(Some(retry_after)) => {
                    let owner = cx.host.slot().unwrap_or(0);
                    let n = Notice {
                        owner,
                        context,
                        level_key: key.to_string(),
                        id,
                        kind: NoticeKind::Reject { reason: RejectReason::TimeOut, retry_after },
                    };
                    self.handle(cx, n, &mut Vec::new());
                }
                // Dispatched meanwhile: its wake-up notice (with the receipt) is on its way.
                Ok(None) => {}
                Err(e) => cx.host.failed("time-out of a waiting request", &e),
            }
        }
    }
}

/// Gives back what a request of this worker holds (its seats, or its place in a queue).
fn release<X>(cx: &mut Ctx<'_, X>, level_key: &str, id: RequestId, receipt: Option<&Receipt>, more: &mut Vec<Notice>) {
    if let Err(e) = super::end(cx.store, cx.now, level_key, id, receipt, more) {
        cx.host.failed("release", &e);
    }
}
