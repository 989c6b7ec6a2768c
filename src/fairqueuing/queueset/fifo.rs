//! One queue's FIFO of waiting requests, owning its sums (upstream `fifo_list.go` with the
//! queue's `requestsWaiting`, `nextDispatchR`, `seatsInUse` and the waiting requests' seat and
//! work sums, `queueset.go: queue`), plus each queue's encoded segment kept with its requests.

use std::collections::VecDeque;

use super::codec::encode_segment;
use super::QueueSet;
use crate::codec::{Reader, Writer};
use crate::fairqueuing::{RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Waiting {
    pub(super) id: RequestId,
    pub(super) tag: RequestTag,
    pub(super) work: WorkEstimate,
    pub(super) arrival_r: u64,
    pub(super) arrival: Nanos,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Queue {
    pub(super) index: u32,
    pub(super) next_dispatch_r: u64,
    pub(super) waiting: WaitList,
    // Derived sums (recomputed on decode).
    pub(super) initial_seats_sum: u64,
    pub(super) max_seats_sum: u64,
    pub(super) total_work_sum: u64,
    /// MaxSeats of executing + lingering requests.
    pub(super) seats_in_use: u64,
    /// Executing (not lingering) requests.
    pub(super) requests_executing: u32,
    /// Lingering entries of this queue.
    pub(super) lingering: u32,
}

/// A queue's waiting requests, with their encoding (the queue's segment of the level's value,
/// [`encode_segment`]) kept once computed. Read access derefs to the requests; every change
/// goes through [`WaitList::edit`], which drops the encoding, so the kept encoding is always
/// exactly the requests'.
#[derive(Debug, Clone, Default)]
pub(super) struct WaitList {
    pub(super) reqs: VecDeque<Waiting>,
    pub(super) enc: std::cell::OnceCell<Vec<u8>>,
}

impl WaitList {
    pub(super) fn edit(&mut self) -> &mut VecDeque<Waiting> {
        self.enc.take();
        &mut self.reqs
    }

    /// The segment: the requests' encoding (computed on first use after a change).
    pub(super) fn encoded(&self) -> &[u8] {
        self.enc.get_or_init(|| encode_segment(&self.reqs))
    }

    /// Appends `w`, extending a kept encoding by its entry.
    pub(super) fn push_back(&mut self, w: Waiting) {
        if let Some(enc) = self.enc.get_mut() {
            let mut wr = Writer { buf: std::mem::take(enc) };
            QueueSet::encode_waiting(&mut wr, &w, self.reqs.back());
            *enc = wr.buf;
        }
        self.reqs.push_back(w);
    }

    /// Removes the head; a kept encoding gets the new head's entry written in full (the first
    /// entry of a segment is absolute) before the unchanged entries after it, in place (an
    /// emptied queue keeps its empty encoding, so a later `push_back` extends it).
    pub(super) fn pop_front(&mut self) -> Option<Waiting> {
        let first = self.reqs.pop_front()?;
        let Some(enc) = self.enc.get_mut() else { return Some(first) };
        let Some(head) = self.reqs.front() else {
            enc.clear();
            return Some(first);
        };
        // Where the entries after the new head start: past the old head's entry and the new
        // head's (delta-coded) one, skipped over rather than decoded.
        let mut r = Reader::new(enc);
        match QueueSet::skip_waiting(&mut r, true).and_then(|()| QueueSet::skip_waiting(&mut r, false)).map(|()| r.position()) {
            Ok(end) if end <= enc.len() => {
                // Append the new head's full entry, drop the two old entries and rotate the new
                // entry to the front: no allocation.
                let mut w = Writer { buf: std::mem::take(enc) };
                let old_len = w.buf.len();
                QueueSet::encode_waiting(&mut w, head, None);
                let head_len = w.buf.len().saturating_sub(old_len);
                w.buf.drain(..end);
                let n = w.buf.len();
                w.buf.rotate_right(head_len.min(n));
                *enc = w.buf;
            }
            _ => {
                self.enc.take();
            }
        }
        Some(first)
    }
}

impl std::ops::Deref for WaitList {
    type Target = VecDeque<Waiting>;
    fn deref(&self) -> &VecDeque<Waiting> {
        &self.reqs
    }
}

impl PartialEq for WaitList {
    fn eq(&self, other: &Self) -> bool {
        self.reqs == other.reqs
    }
}

impl Queue {
    pub(super) fn new(index: u32) -> Queue {
        Queue { index, ..Queue::default() }
    }
    /// Takes a request that leaves the queue out of its sums; returns its total work.
    pub(super) fn forget(&mut self, work: &WorkEstimate, g: Nanos) -> u64 {
        let total_work = super::request_work(work, g).1 .0;
        self.initial_seats_sum = self.initial_seats_sum.saturating_sub(work.initial_seats as u64);
        self.max_seats_sum = self.max_seats_sum.saturating_sub(work.max_seats() as u64);
        self.total_work_sum = self.total_work_sum.wrapping_sub(total_work);
        total_work
    }
    pub(super) fn is_stored_idle(&self) -> bool {
        self.waiting.is_empty() && self.requests_executing == 0 && self.lingering == 0
    }
    pub(super) fn is_active(&self) -> bool {
        !self.waiting.is_empty() || self.requests_executing > 0
    }
}
