//! Executing requests as the QueueSet keeps them: per-(owner, queue) aggregates (the requests
//! themselves are kept by their owners as receipts) and lingering seats (a finished request's
//! `AdditionalLatency`, `queueset.go: finishRequestLocked`).

use super::QueueSet;
use crate::Nanos;

/// The executing requests of one owner in one queue (−1: queue-less). Kept sorted by
/// (owner, queue); an entry exists only while `executing > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OwnerExec {
    pub(super) owner: u32,
    pub(super) queue: i32,
    pub(super) executing: u32,
    /// Sum of their MaxSeats.
    pub(super) seats: u64,
}

/// Seats of a finished request held until `until` (`AdditionalLatency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Linger {
    pub(super) until: Nanos,
    /// Queue index, or −1 for queue-less.
    pub(super) queue: i32,
    pub(super) owner: u32,
    pub(super) seats: u64,
}

impl QueueSet {
    pub(super) fn exec_pos(&self, owner: u32, queue: i32) -> Result<usize, usize> {
        self.execs.binary_search_by(|e| (e.owner, e.queue).cmp(&(owner, queue)))
    }

    /// Counts a request that starts executing in the (owner, queue) aggregate and the totals
    /// (the queue's own counts are the caller's).
    pub(super) fn add_executing(&mut self, owner: u32, queue: i32, seats: u32) {
        match self.exec_pos(owner, queue) {
            Ok(p) => {
                if let Some(e) = self.execs.get_mut(p) {
                    e.executing = e.executing.saturating_add(1);
                    e.seats = e.seats.saturating_add(seats as u64);
                }
            }
            Err(p) => self.execs.insert(p, OwnerExec { owner, queue, executing: 1, seats: seats as u64 }),
        }
        self.tot_requests_executing = self.tot_requests_executing.saturating_add(1);
        self.tot_seats_in_use = self.tot_seats_in_use.saturating_add(seats as u64);
        self.counters.dispatched = self.counters.dispatched.saturating_add(1);
    }

    /// Gives back the seats of a lingering entry already removed from `lingers` (the queue is
    /// left in place even when it becomes idle).
    pub(super) fn release_linger(&mut self, l: &Linger) {
        self.tot_seats_in_use = self.tot_seats_in_use.saturating_sub(l.seats);
        if let Some(pos) = u32::try_from(l.queue).ok().and_then(|i| self.queue_pos(i).ok()) {
            if let Some(q) = self.queues.get_mut(pos) {
                q.seats_in_use = q.seats_in_use.saturating_sub(l.seats);
                q.lingering = q.lingering.saturating_sub(1);
            }
        }
    }

    /// Releases the seats of lingering requests whose time is `<= t`. Returns true if any.
    pub(super) fn release_lingering(&mut self, t: Nanos) -> bool {
        let mut any = false;
        let mut i = 0;
        while let Some(l) = self.lingers.get(i).copied() {
            if l.until <= t {
                self.lingers.swap_remove(i);
                self.release_linger(&l);
                any = true;
            } else {
                i += 1;
            }
        }
        if any {
            self.queues.retain(|q| !q.is_stored_idle());
        }
        any
    }
}
