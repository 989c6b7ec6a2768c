//! Owner affinity, our deviation from upstream's dispatch order (`queueset.go: dispatchLocked`
//! always takes the chosen queue's head): when the dispatching worker (the one whose request
//! arrives or finishes) has a request among the first 16 of the chosen queue such that every request from
//! the head to it has exactly the head's work estimate, that request is dispatched instead of
//! the head, provided no request ahead of it has already been overtaken [`MAX_SKIPS`] (8) times.
//! The overtaken requests take over the arrival R of the request behind them, so the queue's
//! sequence of work and arrival R, and therefore its virtual time, are exactly upstream's; only
//! which of equivalent requests of one queue runs first changes, by at most `MAX_SKIPS` places
//! per request. Across queues: when the queue fair queuing chooses offers
//! the dispatching worker nothing of its own (by the rule above), a queue whose head is that
//! worker's, fits, and whose virtual finish is at most one request's work (the chosen head's)
//! later than the chosen head's is served instead (the earliest such). This bends fair
//! queuing's order by at most one request's work in virtual time: the passed-over queue keeps
//! its finish time and is chosen as soon as no other queue is within that bound, so it is
//! served after a bounded number of dispatches. Both save waking another worker's thread
//! (through its mailbox) to resume the head when the dispatching worker can resume a request of
//! its own at once. With a single owner (one worker, the simulator) the order is upstream's
//! (tested by replaying random operations from 1 and from 3 owners, affinity on and off).

use std::collections::VecDeque;

use super::fifo::Waiting;
use super::QueueSet;
#[cfg(test)]
use super::CROSS_QUEUE;

/// How many times a waiting request may be overtaken by later requests of its own queue
/// (owner affinity, see the module documentation).
pub const MAX_SKIPS: u8 = 8;
/// How far into a queue the dispatcher looks for a request of the dispatching owner.
pub(super) const AFFINITY_SCAN: usize = 16;

/// Owner affinity: the position in `waiting` to dispatch when `owner` (the worker whose arrival
/// or finish is dispatching) asks. The head (0), unless the head belongs to another owner and
/// one of the first [`AFFINITY_SCAN`] requests belongs to `owner`, every request from the head
/// to it has exactly the head's work, and none before it has been overtaken [`MAX_SKIPS`] times.
pub(super) fn affinity_pick(waiting: &VecDeque<Waiting>, owner: u32) -> usize {
    let Some(head) = waiting.front() else { return 0 };
    if head.tag.owner == owner {
        return 0;
    }
    for (j, w) in waiting.iter().enumerate().take(AFFINITY_SCAN) {
        // Only within a run of equal work from the head: then the queue's sequence of work
        // (what its virtual finish times are computed from) is upstream's whichever one goes.
        if w.work != head.work {
            return 0;
        }
        if j > 0 && w.tag.owner == owner {
            return j;
        }
        if w.skips >= MAX_SKIPS {
            return 0;
        }
    }
    0
}

impl QueueSet {
    /// Owner affinity across queues: `pos` (fair queuing's choice) unless it has no request of
    /// `owner` that [`affinity_pick`] may take and another queue, whose head belongs to `owner`
    /// and fits, finishes within one request's work (the chosen head's) of `pos`'s head.
    pub(super) fn affinity_queue(&self, pos: usize, owner: u32) -> usize {
        let Some(q) = self.queues.get(pos) else { return pos };
        let (Some(head), Some(min_finish)) = (q.waiting.front(), self.head_finish(q)) else { return pos };
        if head.tag.owner == owner || affinity_pick(&q.waiting, owner) != 0 {
            return pos;
        }
        let w = min_finish.wrapping_sub(q.next_dispatch_r);
        let limit = min_finish.saturating_add(w);
        let mut best = (u64::MAX, pos);
        for (p, other) in self.queues.iter().enumerate() {
            let (Some(h), Some(finish)) = (other.waiting.front(), self.head_finish(other)) else { continue };
            if p == pos || h.tag.owner != owner {
                continue;
            }
            if finish <= limit && finish < best.0 && self.can_accommodate(h.work.max_seats()) {
                best = (finish, p);
            }
        }
        #[cfg(test)]
        if best.1 != pos {
            CROSS_QUEUE.with(|c| {
                let (n, excess) = c.get();
                c.set((n + 1, excess.max(best.0.saturating_sub(min_finish).saturating_sub(w))));
            });
        }
        best.1
    }
}
