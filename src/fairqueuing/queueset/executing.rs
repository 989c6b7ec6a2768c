//! Executing requests as the QueueSet keeps them: per-(owner, queue) aggregates (the requests
//! themselves are kept by their owners as receipts) and lingering seats (a finished request's
//! `AdditionalLatency`, `queueset.go: finishRequestLocked`).

use super::QueueSet;
use crate::fairqueuing::{Receipt, RequestId, WorkEstimate};
use crate::Nanos;

/// The executing requests of one owner (worker slot) in one queue (−1: queue-less). Kept
/// sorted by (owner, queue); an entry exists only while `executing > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutingByOwner {
    pub owner: u32,
    pub queue: i32,
    /// Executing (not lingering) requests.
    pub executing: u32,
    /// Sum of their MaxSeats.
    pub seats: u64,
}

/// Seats of a finished request held until `until` (`AdditionalLatency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    pub until: Nanos,
    /// Queue index, or −1 for queue-less.
    pub queue: i32,
    pub owner: u32,
    pub seats: u64,
}

impl QueueSet {
    pub(super) fn exec_pos(&self, owner: u32, queue: i32) -> Result<usize, usize> {
        self.execs.binary_search_by(|e| (e.owner, e.queue).cmp(&(owner, queue)))
    }

    /// Counts a request that starts executing in the (owner, queue) aggregate and the totals
    /// (the queue's own counts are the caller's) and returns its receipt.
    pub(super) fn start_executing(&mut self, id: RequestId, owner: u32, queue: i32, work: &WorkEstimate, now: Nanos) -> Receipt {
        let seats = work.max_seats();
        let p = self.exec_pos(owner, queue).unwrap_or_else(|p| {
            self.execs.insert(p, ExecutingByOwner { owner, queue, executing: 0, seats: 0 });
            p
        });
        if let Some(e) = self.execs.get_mut(p) {
            e.executing = e.executing.saturating_add(1);
            e.seats = e.seats.saturating_add(seats as u64);
        }
        self.tot_requests_executing = self.tot_requests_executing.saturating_add(1);
        self.tot_seats_in_use = self.tot_seats_in_use.saturating_add(seats as u64);
        self.counters.dispatched = self.counters.dispatched.saturating_add(1);
        let (initial_seats, additional_latency) = (work.initial_seats, work.additional_latency);
        Receipt { id, queue, owner, initial_seats, max_seats: seats, start: now, additional_latency }
    }

    /// Releases the lingering seats `pred` selects (the queues are left in place even when they
    /// become idle). Returns how many.
    pub(super) fn release_lingers_where(&mut self, pred: impl Fn(&Linger) -> bool) -> usize {
        let mut n = 0;
        let mut i = 0;
        while let Some(l) = self.lingers.get(i).copied() {
            if !pred(&l) {
                i += 1;
                continue;
            }
            self.lingers.swap_remove(i);
            n += 1;
            self.release(l.queue, 0, 1, l.seats);
        }
        n
    }

    /// Takes executing or lingering requests and their seats off the totals and their queue (if
    /// stored; it is left in place even when it becomes idle).
    pub(super) fn release(&mut self, queue: i32, executing: u32, lingering: u32, seats: u64) {
        self.tot_requests_executing = self.tot_requests_executing.saturating_sub(executing);
        self.tot_seats_in_use = self.tot_seats_in_use.saturating_sub(seats);
        if let Some(q) = self.stored_pos(queue).and_then(|p| self.queues.get_mut(p)) {
            q.requests_executing = q.requests_executing.saturating_sub(executing);
            q.lingering = q.lingering.saturating_sub(lingering);
            q.seats_in_use = q.seats_in_use.saturating_sub(seats);
        }
    }
}
