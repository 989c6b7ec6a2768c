//! The QueueSet of one priority level: upstream's "fair queuing for server requests"
//! (`pkg/util/flowcontrol/fairqueuing/queueset/queueset.go`, reference §5), as a plain value
//! driven with explicit times (`now`), so that it can live in a shared key-value store
//! (`encode`/`decode`) and be replayed by the simulator.
//!
//! Semantics follow upstream exactly: virtual time R advancing at `min(seatsRequested, C)/NEQ`
//! (§5.3) with epoch advance, queue choice by least waiting work in the shuffle-sharded hand with
//! the `enqueues mod handSize` rotation (§5.5), reject iff `seatsInUse ≥ C ∧ len ≥ QLL` (§5.6),
//! global-minimum virtual-finish dispatch in round-robin tie order with strict head-of-line
//! blocking, "too wide runs alone" and final-seats narrowing (§5.7), finish correction with the
//! actual service time and `AdditionalLatency` lingering on MaxSeats (§5.8), anti-windup (§5.9),
//! cancellation without dispatch (§5.10), reconfiguration (§5.11), exempt levels (§5.12).
//!
//! Storage is sparse: only non-idle queues (waiting, executing or lingering requests) are kept,
//! in a vector sorted by queue index. Upstream resets an idle queue's `nextDispatchR` to R on its
//! next arrival and never reads it otherwise, and scanning the sorted active indices in cyclic
//! order after `robinIndex` visits them in the same order as scanning all queues, so this is
//! exact. Memory is proportional to queued requests plus distinct (owner, queue) pairs of
//! executing requests, never to flows seen.
//!
//! Executing requests are not stored: each dispatch hands out a [`Receipt`] (in
//! [`Arrival::Executing`] or [`Dispatched::receipt`]) that the owner keeps and gives back to
//! [`QueueSet::finish`], which applies upstream's finish from it. The QueueSet keeps only, per
//! (owner, queue), the number of executing requests and their seats (so that a lease expiry
//! releases a dead owner's seats, and a finish after that, or a second finish, changes
//! nothing), and the lingering seats (`AdditionalLatency`) with their release time.
//!
//! Deviation: when a reconfiguration shrinks the number of queues, upstream removes excess
//! queues when they become empty and shifts the indices of later queues down; here indices are
//! stable (queues at indices ≥ DesiredNumQueues receive no new requests and disappear when
//! drained).
//!
//! Deviation: time never runs backwards: an operation with `now` earlier than the last one
//! advances R by nothing (upstream's clock is monotonic; shared-state workers may race).
//!
//! Deviation: when a dispatched request's final seats are narrowed to C, upstream subtracts the
//! *narrowed* MaxSeats from `totSeatsWaiting` (letting that gauge drift); here the seats the
//! request was counted with are subtracted.
//!
//! Deviation: wait deadlines are data (`RequestTag::wait_deadline`) instead of contexts; the
//! caller must call [`QueueSet::expire`] at (or before any other operation after) the times
//! given by [`QueueSet::next_event`].
//!
//! Deviation (owner affinity): when the dispatching worker (the one whose request arrives or
//! finishes) has a request among the first 16 of the chosen queue such that every request from
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
//!
//! Deviation: a lease expiry ([`QueueSet::remove_owner`]) releases the dead owner's executing
//! seats without the service-time correction of the queues' virtual finish (its requests'
//! start times are not stored); upstream has no lease expiry.

use std::collections::VecDeque;

use serde::Serialize;

use super::seat_seconds::{duration_per_seat, seats_times_duration, SeatSeconds};
use super::shuffle_sharding::Dealer;
use super::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::Nanos;

/// G: the estimated service duration used for the initial work guess (upstream: 3 ms).
pub const ESTIMATED_SERVICE_DURATION: Nanos = 3_000_000;
/// Amount by which R is wound back on an epoch advance.
pub const R_DECREMENT: u64 = u64::MAX / 2;
/// Threshold that triggers an epoch advance.
pub const HIGH_R: u64 = R_DECREMENT + R_DECREMENT / 2;

/// The encoding of a QueueSet value: executing requests as per-(owner, queue) aggregates and
/// lingering seats (receipts), waiting requests delta-coded per queue with their skip counts
/// ([`QueueSet::encode_waiting`]). Values of another version are not read (state keys carry
/// the version, so modules of different versions never share a value).
const ENCODING_VERSION: u8 = 4;
/// Flags of a waiting request's encoding: which fields repeat the previous request's.
const SAME_OWNER: u8 = 1;
const SAME_SCHEMA: u8 = 2;
const SAME_FLOW: u8 = 4;
const SAME_WORK: u8 = 8;
const SAME_ALLOWANCE: u8 = 16;
/// The request has been overtaken (a skip count follows).
const SKIPPED: u8 = 32;
const ALL_FLAGS: u8 = 63;
/// How many times a waiting request may be overtaken by later requests of its own queue
/// (owner affinity, see the module documentation).
pub const MAX_SKIPS: u8 = 8;
/// How far into a queue the dispatcher looks for a request of the dispatching owner.
const AFFINITY_SCAN: usize = 16;
/// Largest queue index that can exist (the Dealer's maximum deck size).
const MAX_QUEUES: u32 = 1 << 26;

/// Outcome of [`QueueSet::arrive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Dispatched immediately; call `finish` with this receipt when the handler returns.
    Executing(Receipt),
    /// Waiting in a queue; it shows up later in some `out` list, or is removed by
    /// `cancel`/`expire`/`remove_owner`.
    Queued(RequestId),
    Rejected(RejectReason),
}

/// Totals kept for dumps and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    /// Requests that started executing (queued or not).
    pub dispatched: u64,
    pub rejected_queue_full: u64,
    pub rejected_concurrency_limit: u64,
    /// Waiting requests removed by cancel, wait deadline or lease expiry (reason `time-out`).
    pub timed_out: u64,
    /// Epoch advances without detected underflow (`epoch_advance_total{success="true"}`).
    pub epoch_advances: u64,
    /// Epoch advances with an underflow (`success="false"`).
    pub epoch_advance_failures: u64,
    /// `request_dispatch_no_accommodation_total`.
    pub no_accommodation: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Waiting {
    id: RequestId,
    tag: RequestTag,
    work: WorkEstimate,
    arrival_r: u64,
    arrival: Nanos,
    /// Times a later request of this queue was dispatched before it (owner affinity).
    skips: u8,
}

/// The executing requests of one owner in one queue (−1: queue-less). Kept sorted by
/// (owner, queue); an entry exists only while `executing > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OwnerExec {
    owner: u32,
    queue: i32,
    executing: u32,
    /// Sum of their MaxSeats.
    seats: u64,
}

/// Seats of a finished request held until `until` (`AdditionalLatency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Linger {
    until: Nanos,
    /// Queue index, or −1 for queue-less.
    queue: i32,
    owner: u32,
    seats: u64,
}

/// Key of a queue in receipts, aggregates and lingers (indices are below 2^26).
fn qkey(index: u32) -> i32 {
    i32::try_from(index).unwrap_or(i32::MAX)
}

#[derive(Debug, Clone, PartialEq)]
struct Queue {
    index: u32,
    next_dispatch_r: u64,
    waiting: WaitList,
    // Derived sums (recomputed on decode).
    initial_seats_sum: u64,
    max_seats_sum: u64,
    total_work_sum: u64,
    /// MaxSeats of executing + lingering requests.
    seats_in_use: u64,
    /// Executing (not lingering) requests.
    requests_executing: u32,
    /// Lingering entries of this queue.
    lingering: u32,
}

/// A queue's waiting requests, with their encoding ([`encode_segment`]) kept once computed:
/// each queue's requests are stored as a self-contained segment of the level's value, so an
/// operation re-encodes only the queues it changed and a reader decodes only the segments that
/// differ from the state it already holds ([`QueueSet::decode_reusing`]). Read access derefs to
/// the requests; every change goes through [`WaitList::edit`], which drops the encoding, so
/// the kept encoding is always exactly the requests'.
#[derive(Clone, Default)]
struct WaitList {
    reqs: VecDeque<Waiting>,
    enc: std::cell::OnceCell<Vec<u8>>,
}

impl WaitList {
    fn edit(&mut self) -> &mut VecDeque<Waiting> {
        self.enc.take();
        &mut self.reqs
    }

    /// The segment: the requests' encoding (computed on first use after a change).
    fn encoded(&self) -> &[u8] {
        self.enc.get_or_init(|| encode_segment(&self.reqs))
    }

    /// Appends `w`, extending a kept encoding by its entry.
    fn push_back(&mut self, w: Waiting) {
        if let Some(enc) = self.enc.get_mut() {
            let mut wr = Writer { buf: std::mem::take(enc) };
            QueueSet::encode_waiting(&mut wr, &w, self.reqs.back());
            *enc = wr.buf;
        }
        self.reqs.push_back(w);
    }

    /// Removes the head (a kept encoding is dropped: the first entry of a segment is absolute).
    fn pop_front(&mut self) -> Option<Waiting> {
        self.enc.take();
        self.reqs.pop_front()
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

impl std::fmt::Debug for WaitList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reqs.fmt(f)
    }
}

impl Queue {
    fn new(index: u32) -> Queue {
        Queue {
            index,
            next_dispatch_r: 0,
            waiting: WaitList::default(),
            initial_seats_sum: 0,
            max_seats_sum: 0,
            total_work_sum: 0,
            seats_in_use: 0,
            requests_executing: 0,
            lingering: 0,
        }
    }
    fn is_stored_idle(&self) -> bool {
        self.waiting.is_empty() && self.requests_executing == 0 && self.lingering == 0
    }
    fn is_active(&self) -> bool {
        !self.waiting.is_empty() || self.requests_executing > 0
    }
}

/// Final work and total work of a request (upstream `completeWorkEstimate`).
pub fn request_work(we: &WorkEstimate, g: Nanos) -> (SeatSeconds, SeatSeconds) {
    let final_work = seats_times_duration(we.final_seats as f64, we.additional_latency);
    let initial = seats_times_duration(we.initial_seats as f64, g);
    (final_work, initial.wrapping_add(final_work))
}

/// The fair-queuing state of one priority level.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSet {
    cfg: QueueSetConfig,
    g: Nanos,
    current_r: u64,
    last_real_time: Nanos,
    robin_index: u32,
    enqueues: u64,
    next_id: u64,
    queues: Vec<Queue>,
    /// Executing requests per (owner, queue), sorted by (owner, queue).
    execs: Vec<OwnerExec>,
    /// Lingering seats.
    lingers: Vec<Linger>,
    counters: Counters,
    // Derived totals.
    tot_requests_waiting: u32,
    tot_requests_executing: u32,
    tot_seats_in_use: u64,
    tot_seats_waiting: u64,
}

fn check_config(cfg: &QueueSetConfig) -> Result<(), String> {
    if cfg.desired_queues > 0 {
        // Cheap sufficient condition for `Dealer::new` to succeed (it is checked on every
        // decode): 0 < hand ≤ deck ≤ 2^26 and hand·⌈log2 deck⌉ ≤ 60 imply
        // ⌈log2(deck)·hand⌉ ≤ 60 (the float log2 of an integer never exceeds its ceiling).
        let deck = cfg.desired_queues as u32;
        let hand = cfg.hand_size;
        if hand > 0 && hand <= deck && deck <= MAX_QUEUES && hand.saturating_mul(deck.next_power_of_two().trailing_zeros()) <= 60 {
            return Ok(());
        }
        Dealer::new(cfg.desired_queues, cfg.hand_size.min(i32::MAX as u32) as i32).map_err(|e| {
            format!("the QueueSetConfig implies an invalid shuffle sharding config (DesiredNumQueues is deckSize): {e}")
        })?;
    }
    Ok(())
}

fn sat_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl QueueSet {
    /// Upstream `BeginConstruction` + `Complete`.
    pub fn new(cfg: QueueSetConfig, now: Nanos) -> Result<QueueSet, String> {
        check_config(&cfg)?;
        Ok(QueueSet {
            cfg,
            g: ESTIMATED_SERVICE_DURATION,
            current_r: 0,
            last_real_time: now,
            robin_index: 0,
            enqueues: 0,
            next_id: 1,
            queues: Vec::new(),
            execs: Vec::new(),
            lingers: Vec::new(),
            counters: Counters::default(),
            tot_requests_waiting: 0,
            tot_requests_executing: 0,
            tot_seats_in_use: 0,
            tot_seats_waiting: 0,
        })
    }

    /// Test hook: upstream white-box tests use other values of G. Not encoded.
    #[doc(hidden)]
    pub fn set_estimated_service_duration(&mut self, g: Nanos) {
        self.g = g;
    }

    pub fn config(&self) -> QueueSetConfig {
        self.cfg
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Current reading of the progress meter R.
    pub fn current_r(&self) -> SeatSeconds {
        SeatSeconds(self.current_r)
    }

    /// Upstream `BeginConfigChange` + `Complete`: applies the new configuration and dispatches as
    /// much as possible (returned).
    pub fn reconfigure(&mut self, cfg: QueueSetConfig, now: Nanos) -> Result<Vec<Dispatched>, String> {
        check_config(&cfg)?;
        self.sync_time(now);
        let mut cfg = cfg;
        if cfg.desired_queues <= 0 {
            cfg.queue_length_limit = self.cfg.queue_length_limit;
            cfg.hand_size = self.cfg.hand_size;
        }
        self.cfg = cfg;
        let mut out = Vec::new();
        self.dispatch_as_much_as_possible(now, &mut out);
        Ok(out)
    }

    pub fn seats_in_use(&self) -> u32 {
        sat_u32(self.tot_seats_in_use)
    }
    pub fn seats_waiting(&self) -> u32 {
        sat_u32(self.tot_seats_waiting)
    }
    pub fn requests_waiting(&self) -> u32 {
        self.tot_requests_waiting
    }
    pub fn requests_executing(&self) -> u32 {
        self.tot_requests_executing
    }
    pub fn seat_demand(&self) -> u32 {
        sat_u32(self.tot_seats_in_use.saturating_add(self.tot_seats_waiting))
    }
    /// Upstream `isIdleLocked`: nothing waiting and nothing executing (lingering seats do not
    /// count).
    pub fn is_idle(&self) -> bool {
        self.tot_requests_waiting == 0 && self.tot_requests_executing == 0
    }
    /// True when the state holds no request at all (not even lingering seats).
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty() && self.execs.is_empty() && self.lingers.is_empty()
    }

    fn exec_pos(&self, owner: u32, queue: i32) -> Result<usize, usize> {
        self.execs.binary_search_by(|e| (e.owner, e.queue).cmp(&(owner, queue)))
    }

    /// Counts a request that starts executing in the (owner, queue) aggregate and the totals
    /// (the queue's own counts are the caller's).
    fn add_executing(&mut self, owner: u32, queue: i32, seats: u32) {
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

    fn new_id(&mut self) -> RequestId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    // ---------------------------------------------------------------- virtual time

    fn virtual_time_ratio(&self) -> f64 {
        let mut active = 0u64;
        let mut seats_requested = 0u64;
        for q in &self.queues {
            seats_requested = seats_requested.saturating_add(q.seats_in_use.saturating_add(q.max_seats_sum));
            if q.is_active() {
                active += 1;
            }
        }
        if active == 0 {
            return 0.0;
        }
        (seats_requested as f64).min(self.cfg.concurrency_limit as f64) / active as f64
    }

    /// Upstream `syncTimeLocked`.
    fn sync_time(&mut self, now: Nanos) {
        let dt = if now > self.last_real_time { now.saturating_sub(self.last_real_time) } else { 0 };
        if now > self.last_real_time {
            self.last_real_time = now;
        }
        if dt == 0 {
            return;
        }
        let prev = self.current_r;
        let incr = seats_times_duration(self.virtual_time_ratio(), dt).0;
        self.current_r = prev.wrapping_add(incr);
        if prev > self.current_r {
            log::error!("queueset: currentR overflow (prevR {prev}, incrR {incr})");
        } else if self.current_r >= HIGH_R {
            self.advance_epoch();
        }
    }

    fn advance_epoch(&mut self) {
        self.current_r = self.current_r.wrapping_sub(R_DECREMENT);
        let mut success = true;
        for q in &mut self.queues {
            if !q.is_active() {
                q.next_dispatch_r = 0;
                continue;
            }
            let old = q.next_dispatch_r;
            q.next_dispatch_r = old.wrapping_sub(R_DECREMENT);
            if q.next_dispatch_r > old {
                success = false;
            }
            for w in q.waiting.edit() {
                let old = w.arrival_r;
                w.arrival_r = old.wrapping_sub(R_DECREMENT);
                if w.arrival_r > old {
                    success = false;
                }
            }
        }
        if success {
            self.counters.epoch_advances = self.counters.epoch_advances.saturating_add(1);
        } else {
            self.counters.epoch_advance_failures = self.counters.epoch_advance_failures.saturating_add(1);
        }
    }

    // ---------------------------------------------------------------- arrival

    fn can_accommodate(&self, seats: u32) -> bool {
        let c = self.cfg.concurrency_limit as u64;
        let seats = seats as u64;
        if self.cfg.desired_queues < 0 {
            return true;
        }
        if seats > c {
            return self.tot_requests_executing == 0;
        }
        self.tot_seats_in_use.saturating_add(seats) <= c
    }

    fn queue_pos(&self, index: u32) -> Result<usize, usize> {
        self.queues.binary_search_by_key(&index, |q| q.index)
    }

    fn waiting_work_of(&self, index: u32) -> u64 {
        match self.queue_pos(index) {
            Ok(p) => self.queues.get(p).map(|q| q.total_work_sum).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Upstream `shuffleShardLocked`.
    fn shuffle_shard(&mut self, hash: u64) -> u32 {
        let Ok(dealer) = Dealer::new(self.cfg.desired_queues, self.cfg.hand_size.min(i32::MAX as u32) as i32) else {
            return 0;
        };
        let (hand, n) = dealer.deal_array(hash);
        let hand = hand.get(..n).unwrap_or(&[]);
        if hand.is_empty() {
            return 0;
        }
        let offset = (self.enqueues % hand.len() as u64) as usize;
        self.enqueues = self.enqueues.wrapping_add(1);
        let mut best: Option<u32> = None;
        let mut min_work = u64::MAX;
        let first = hand.get(offset).copied().unwrap_or(0);
        for i in 0..hand.len() {
            let idx = hand.get((offset + i) % hand.len()).copied().unwrap_or(0);
            let w = self.waiting_work_of(idx);
            if w < min_work {
                min_work = w;
                best = Some(idx);
            }
        }
        best.unwrap_or(first)
    }

    /// Upstream `StartRequest`. `out` receives the requests dispatched as a consequence (not
    /// including this one when the result is `Executing`).
    pub fn arrive(&mut self, now: Nanos, work: WorkEstimate, tag: RequestTag, out: &mut Vec<Dispatched>) -> Arrival {
        self.sync_time(now);
        if self.cfg.desired_queues < 1 {
            if !self.can_accommodate(work.max_seats()) {
                self.counters.rejected_concurrency_limit = self.counters.rejected_concurrency_limit.saturating_add(1);
                return Arrival::Rejected(RejectReason::ConcurrencyLimit);
            }
            let id = self.new_id();
            let seats = work.max_seats();
            self.add_executing(tag.owner, -1, seats);
            return Arrival::Executing(Receipt {
                id,
                queue: -1,
                owner: tag.owner,
                initial_seats: work.initial_seats,
                max_seats: seats,
                start: now,
                additional_latency: work.additional_latency,
            });
        }
        let qidx = self.shuffle_shard(tag.flow_hash);
        let pos = match self.queue_pos(qidx) {
            Ok(p) => p,
            Err(p) => {
                self.queues.insert(p, Queue::new(qidx));
                p
            }
        };
        let reject = match self.queues.get(pos) {
            Some(q) => {
                self.tot_seats_in_use >= self.cfg.concurrency_limit as u64
                    && q.waiting.len() as u64 >= self.cfg.queue_length_limit as u64
            }
            None => true,
        };
        if reject {
            if self.queues.get(pos).is_some_and(|q| q.is_stored_idle()) {
                self.queues.remove(pos);
            }
            self.counters.rejected_queue_full = self.counters.rejected_queue_full.saturating_add(1);
            return Arrival::Rejected(RejectReason::QueueFull);
        }
        let id = self.new_id();
        let g = self.g;
        let r = self.current_r;
        let (_, total_work) = request_work(&work, g);
        if let Some(receipt) = self.try_dispatch_directly(pos, id, tag, work, now) {
            return Arrival::Executing(receipt);
        }
        if let Some(q) = self.queues.get_mut(pos) {
            if q.waiting.is_empty() && q.requests_executing == 0 {
                q.next_dispatch_r = r;
            }
            q.waiting.push_back(Waiting { id, tag, work, arrival_r: r, arrival: now, skips: 0 });
            q.initial_seats_sum = q.initial_seats_sum.saturating_add(work.initial_seats as u64);
            q.max_seats_sum = q.max_seats_sum.saturating_add(work.max_seats() as u64);
            q.total_work_sum = q.total_work_sum.wrapping_add(total_work.0);
            bound_next_dispatch(q);
        }
        self.tot_requests_waiting += 1;
        self.tot_seats_waiting = self.tot_seats_waiting.saturating_add(work.max_seats() as u64);
        let before = out.len();
        self.dispatch_preferring(now, out, Some(tag.owner));
        let mut found = None;
        for (i, d) in out.iter().enumerate().skip(before) {
            if d.id == id {
                found = Some(i);
                break;
            }
        }
        match found {
            Some(i) => Arrival::Executing(out.remove(i).receipt),
            None => Arrival::Queued(id),
        }
    }

    /// The uncontended arrival, without the round trip through the queue: when nothing else
    /// waits, enqueuing the request and dispatching as much as possible would pick exactly this
    /// request (the only queue head) if it fits. Applies the same net state change as
    /// enqueue + [`Self::dispatch_one`] and returns the receipt; returns None (changing
    /// nothing) when the request would not be dispatched right away.
    fn try_dispatch_directly(&mut self, pos: usize, id: RequestId, tag: RequestTag, work: WorkEstimate, now: Nanos) -> Option<Receipt> {
        #[cfg(test)]
        if !DIRECT_DISPATCH.with(|d| d.get()) {
            return None;
        }
        if self.tot_requests_waiting != 0 || self.tot_seats_in_use >= self.cfg.concurrency_limit as u64 {
            return None;
        }
        let c = self.cfg.concurrency_limit;
        let g = self.g;
        let r = self.current_r;
        let (final_work, total_work) = request_work(&work, g);
        let q = self.queues.get(pos)?;
        if !q.waiting.is_empty() {
            return None;
        }
        // next_dispatch_r after the enqueue (idle reset, then anti-windup against the arrival R).
        let ndr = if q.requests_executing == 0 { r } else { q.next_dispatch_r };
        let ndr = ndr.max(r);
        // `find_dispatch_queue`: the head's virtual finish must be below the initial minimum.
        if ndr.wrapping_add(total_work.0) == u64::MAX || !self.can_accommodate(work.max_seats()) {
            return None;
        }
        let mut work = work;
        if work.final_seats > c {
            work.additional_latency = duration_per_seat(final_work, c as f64);
            work.final_seats = c;
        }
        let seats = work.max_seats();
        let q = self.queues.get_mut(pos)?;
        q.next_dispatch_r = ndr.wrapping_add(total_work.0);
        q.seats_in_use = q.seats_in_use.saturating_add(seats as u64);
        q.requests_executing = q.requests_executing.saturating_add(1);
        let index = q.index;
        self.robin_index = index;
        self.add_executing(tag.owner, qkey(index), seats);
        Some(Receipt {
            id,
            queue: qkey(index),
            owner: tag.owner,
            initial_seats: work.initial_seats,
            max_seats: seats,
            start: now,
            additional_latency: work.additional_latency,
        })
    }

    // ---------------------------------------------------------------- dispatch

    fn dispatch_as_much_as_possible(&mut self, now: Nanos, out: &mut Vec<Dispatched>) {
        self.dispatch_preferring(now, out, None)
    }

    /// [`Self::dispatch_as_much_as_possible`], preferring `owner`'s requests within each chosen
    /// queue (owner affinity).
    fn dispatch_preferring(&mut self, now: Nanos, out: &mut Vec<Dispatched>, owner: Option<u32>) {
        while self.tot_requests_waiting != 0
            && self.tot_seats_in_use < self.cfg.concurrency_limit as u64
            && self.dispatch_one(now, out, owner)
        {}
    }

    /// Virtual finish R of `q`'s head (what fair queuing orders queues by).
    fn head_finish(&self, q: &Queue) -> Option<u64> {
        let head = q.waiting.front()?;
        Some(q.next_dispatch_r.wrapping_add(request_work(&head.work, self.g).1 .0))
    }

    /// Upstream `findDispatchQueueToBoundLocked`: position of the queue whose head has the
    /// minimal virtual finish R (round-robin order after `robinIndex` breaks ties), if that head
    /// can be accommodated now.
    fn find_dispatch_queue(&mut self) -> Option<usize> {
        let n = self.queues.len();
        let start = self.queues.partition_point(|q| q.index <= self.robin_index);
        let mut min_finish = u64::MAX;
        let mut min_pos = None;
        for pos in (start..n).chain(0..start) {
            let Some(q) = self.queues.get(pos) else { continue };
            let Some(finish) = self.head_finish(q) else { continue };
            if finish < min_finish {
                min_finish = finish;
                min_pos = Some(pos);
            }
        }
        let pos = min_pos?;
        let seats = self.queues.get(pos)?.waiting.front()?.work.max_seats();
        if !self.can_accommodate(seats) {
            self.counters.no_accommodation = self.counters.no_accommodation.saturating_add(1);
            return None;
        }
        Some(pos)
    }

    /// Owner affinity across queues: `pos` (fair queuing's choice) unless it has no request of
    /// `owner` that [`affinity_pick`] may take and another queue, whose head belongs to `owner`
    /// and fits, finishes within one request's work (the chosen head's) of `pos`'s head.
    fn affinity_queue(&self, pos: usize, owner: u32) -> usize {
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

    /// Upstream `dispatchLocked`, except for owner affinity: the queue is upstream's choice or,
    /// when that one has nothing of `owner` to offer, a queue headed by `owner` that finishes
    /// within one request's work of it (see [`Self::affinity_queue`]); within it a request of
    /// `owner` with the same work as the head may be dispatched instead of the head (see
    /// [`affinity_pick`]).
    fn dispatch_one(&mut self, now: Nanos, out: &mut Vec<Dispatched>, owner: Option<u32>) -> bool {
        let Some(pos) = self.find_dispatch_queue() else { return false };
        #[cfg(test)]
        let owner = owner.filter(|_| AFFINITY.with(|a| a.get()));
        let pos = match owner {
            Some(o) => self.affinity_queue(pos, o),
            None => pos,
        };
        let c = self.cfg.concurrency_limit;
        let g = self.g;
        let Some(q) = self.queues.get_mut(pos) else { return false };
        let pick = owner.map_or(0, |o| affinity_pick(&q.waiting, o));
        let taken = if pick == 0 {
            q.waiting.pop_front()
        } else {
            // The overtaken requests move up one place in R terms: each takes the arrival R of
            // the request behind it, so the queue's arrival Rs (what anti-windup reads from the
            // head) are exactly those upstream's queue has after dispatching its head.
            let waiting = q.waiting.edit();
            for j in 0..pick {
                let next_r = waiting.get(j + 1).map(|w| w.arrival_r);
                if let (Some(w), Some(r)) = (waiting.get_mut(j), next_r) {
                    w.skips = w.skips.saturating_add(1);
                    w.arrival_r = r;
                }
            }
            waiting.remove(pick)
        };
        let Some(req) = taken else { return false };
        let (final_work, total_work) = request_work(&req.work, g);
        q.initial_seats_sum = q.initial_seats_sum.saturating_sub(req.work.initial_seats as u64);
        q.max_seats_sum = q.max_seats_sum.saturating_sub(req.work.max_seats() as u64);
        q.total_work_sum = q.total_work_sum.wrapping_sub(total_work.0);
        let mut work = req.work;
        if work.final_seats > c {
            work.additional_latency = duration_per_seat(final_work, c as f64);
            work.final_seats = c;
        }
        let seats = work.max_seats();
        q.seats_in_use = q.seats_in_use.saturating_add(seats as u64);
        q.requests_executing = q.requests_executing.saturating_add(1);
        q.next_dispatch_r = q.next_dispatch_r.wrapping_add(total_work.0);
        bound_next_dispatch(q);
        let index = q.index;
        self.robin_index = index;
        self.tot_requests_waiting = self.tot_requests_waiting.saturating_sub(1);
        self.tot_seats_waiting = self.tot_seats_waiting.saturating_sub(req.work.max_seats() as u64);
        self.add_executing(req.tag.owner, qkey(index), seats);
        let receipt = Receipt {
            id: req.id,
            queue: qkey(index),
            owner: req.tag.owner,
            initial_seats: work.initial_seats,
            max_seats: seats,
            start: now,
            additional_latency: work.additional_latency,
        };
        out.push(Dispatched { id: req.id, tag: req.tag, waited: now.saturating_sub(req.arrival), seats, receipt });
        true
    }

    // ---------------------------------------------------------------- finish

    /// Upstream `finishRequestAndDispatchAsMuchAsPossible`: the handler of the executing request
    /// of `receipt` returned at `now`. Applies the service-time correction to the receipt's
    /// queue, lingers on (or releases) its MaxSeats and dispatches. Returns false, changing
    /// nothing, when its (owner, queue) has no executing request left (the owner's lease was
    /// reaped and its seats released, or a second finish).
    pub fn finish(&mut self, now: Nanos, receipt: &Receipt, out: &mut Vec<Dispatched>) -> bool {
        if self.exec_pos(receipt.owner, receipt.queue).is_err() {
            return false;
        }
        self.sync_time(now);
        if !self.finish_locked(now, receipt) {
            return false;
        }
        self.dispatch_preferring(now, out, Some(receipt.owner));
        true
    }

    fn finish_locked(&mut self, now: Nanos, rc: &Receipt) -> bool {
        let Ok(p) = self.exec_pos(rc.owner, rc.queue) else { return false };
        let Some(e) = self.execs.get_mut(p) else { return false };
        if e.executing == 0 {
            return false;
        }
        e.executing -= 1;
        // The seats counted for this request (all that is left with the last one, so that the
        // aggregate always drains to zero whatever the receipts say).
        let seats = if e.executing == 0 { e.seats } else { e.seats.min(rc.max_seats as u64) };
        e.seats = e.seats.saturating_sub(seats);
        if e.executing == 0 {
            self.execs.remove(p);
        }
        self.tot_requests_executing = self.tot_requests_executing.saturating_sub(1);
        let linger = rc.additional_latency > 0;
        if linger {
            self.lingers.push(Linger { until: now.saturating_add(rc.additional_latency), queue: rc.queue, owner: rc.owner, seats });
        } else {
            self.tot_seats_in_use = self.tot_seats_in_use.saturating_sub(seats);
        }
        let g = self.g;
        if let Some(pos) = u32::try_from(rc.queue).ok().and_then(|i| self.queue_pos(i).ok()) {
            let Some(q) = self.queues.get_mut(pos) else { return true };
            q.requests_executing = q.requests_executing.saturating_sub(1);
            let actual = now.saturating_sub(rc.start);
            let corr = seats_times_duration(rc.initial_seats as f64, g.saturating_sub(actual));
            q.next_dispatch_r = q.next_dispatch_r.wrapping_sub(corr.0);
            bound_next_dispatch(q);
            if linger {
                q.lingering = q.lingering.saturating_add(1);
            } else {
                q.seats_in_use = q.seats_in_use.saturating_sub(seats);
                if q.is_stored_idle() {
                    self.queues.remove(pos);
                }
            }
        }
        true
    }

    /// Gives back the seats of a lingering entry already removed from `lingers` (the queue is
    /// left in place even when it becomes idle).
    fn release_linger(&mut self, l: &Linger) {
        self.tot_seats_in_use = self.tot_seats_in_use.saturating_sub(l.seats);
        if let Some(pos) = u32::try_from(l.queue).ok().and_then(|i| self.queue_pos(i).ok()) {
            if let Some(q) = self.queues.get_mut(pos) {
                q.seats_in_use = q.seats_in_use.saturating_sub(l.seats);
                q.lingering = q.lingering.saturating_sub(1);
            }
        }
    }

    /// Releases the seats of lingering requests whose time is `<= t`. Returns true if any.
    fn release_lingering(&mut self, t: Nanos) -> bool {
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
    // ---------------------------------------------------------------- removal of waiting requests

    fn remove_waiting_where(&mut self, pred: impl Fn(&Waiting) -> bool, removed: &mut Vec<(RequestId, RequestTag)>) {
        let g = self.g;
        let mut n = 0u32;
        let mut seats = 0u64;
        for q in &mut self.queues {
            let before = q.waiting.len();
            if !q.waiting.iter().any(&pred) {
                continue;
            }
            let mut kept = VecDeque::with_capacity(before);
            for w in q.waiting.edit().drain(..) {
                if pred(&w) {
                    let (_, tw) = request_work(&w.work, g);
                    q.initial_seats_sum = q.initial_seats_sum.saturating_sub(w.work.initial_seats as u64);
                    q.max_seats_sum = q.max_seats_sum.saturating_sub(w.work.max_seats() as u64);
                    q.total_work_sum = q.total_work_sum.wrapping_sub(tw.0);
                    seats = seats.saturating_add(w.work.max_seats() as u64);
                    n += 1;
                    removed.push((w.id, w.tag));
                } else {
                    kept.push_back(w);
                }
            }
            *q.waiting.edit() = kept;
            if q.waiting.len() != before {
                bound_next_dispatch(q);
            }
        }
        self.tot_requests_waiting = self.tot_requests_waiting.saturating_sub(n);
        self.tot_seats_waiting = self.tot_seats_waiting.saturating_sub(seats);
        self.counters.timed_out += n as u64;
        self.queues.retain(|q| !q.is_stored_idle());
    }

    /// A waiting request gave up (client gone / wait limit): removed and counted as `time-out`;
    /// no dispatch is attempted (upstream behaviour). Returns its tag, or None if it is not
    /// waiting.
    pub fn cancel(&mut self, now: Nanos, id: RequestId) -> Option<RequestTag> {
        self.sync_time(now);
        let mut removed = Vec::new();
        // Ids are unique (arrivals number them; decoding rejects duplicates).
        self.remove_waiting_where(|w| w.id == id, &mut removed);
        removed.first().map(|(_, t)| *t)
    }

    /// Earliest wait deadline of a waiting request or end of a lingering period.
    pub fn next_event(&self) -> Option<Nanos> {
        let mut best: Option<Nanos> = self.lingers.iter().map(|l| l.until).min();
        for q in &self.queues {
            for w in q.waiting.iter() {
                if w.tag.wait_deadline != Nanos::MAX && best.is_none_or(|b| w.tag.wait_deadline < b) {
                    best = Some(w.tag.wait_deadline);
                }
            }
        }
        best
    }

    /// Processes every due event (`<= now`) in time order: waiting requests whose deadline
    /// passed are removed (reason `time-out`, no dispatch after those removals) and reported in
    /// `timed_out`; lingering seats whose time is up are released, then as much as possible is
    /// dispatched.
    pub fn expire(&mut self, now: Nanos, timed_out: &mut Vec<(RequestId, RequestTag)>, out: &mut Vec<Dispatched>) {
        // Bounded: each iteration removes at least one event.
        while let Some(t) = self.next_event() {
            if t > now {
                break;
            }
            self.sync_time(t);
            let before = timed_out.len();
            self.remove_waiting_where(|w| w.tag.wait_deadline <= t, timed_out);
            let released = self.release_lingering(t);
            if released {
                self.dispatch_as_much_as_possible(t, out);
            }
            if timed_out.len() == before && !released {
                break;
            }
        }
    }

    /// Lease expiry: drops every waiting request of `owner` (counted as time-out) and releases
    /// the seats of its executing requests (without the service-time correction: their start
    /// times are not kept) and of its lingering ones, then dispatches. A later `finish` with a
    /// receipt of that owner returns false. Returns the number of requests removed (waiting,
    /// executing and lingering).
    pub fn remove_owner(&mut self, owner: u32, now: Nanos, out: &mut Vec<Dispatched>) -> usize {
        self.sync_time(now);
        let mut removed = Vec::new();
        self.remove_waiting_where(|w| w.tag.owner == owner, &mut removed);
        let mut count = removed.len();
        let lo = self.execs.partition_point(|e| e.owner < owner);
        let hi = self.execs.partition_point(|e| e.owner <= owner);
        let gone: Vec<OwnerExec> = self.execs.drain(lo..hi.max(lo)).collect();
        for e in gone {
            count = count.saturating_add(e.executing as usize);
            self.tot_requests_executing = self.tot_requests_executing.saturating_sub(e.executing);
            self.tot_seats_in_use = self.tot_seats_in_use.saturating_sub(e.seats);
            if let Some(pos) = u32::try_from(e.queue).ok().and_then(|i| self.queue_pos(i).ok()) {
                if let Some(q) = self.queues.get_mut(pos) {
                    q.requests_executing = q.requests_executing.saturating_sub(e.executing);
                    q.seats_in_use = q.seats_in_use.saturating_sub(e.seats);
                }
            }
        }
        let mut i = 0;
        while let Some(l) = self.lingers.get(i).copied() {
            if l.owner == owner {
                self.lingers.swap_remove(i);
                self.release_linger(&l);
                count = count.saturating_add(1);
            } else {
                i += 1;
            }
        }
        self.queues.retain(|q| !q.is_stored_idle());
        self.dispatch_as_much_as_possible(now, out);
        count
    }
    // ---------------------------------------------------------------- dumps

    pub fn snapshot(&self) -> QueueSetSnapshot {
        let g = self.g;
        let executing_of = |queue: i32| -> Vec<ExecutingByOwner> {
            self.execs
                .iter()
                .filter(|e| e.queue == queue)
                .map(|e| ExecutingByOwner { owner: e.owner, executing: e.executing, seats: e.seats })
                .collect()
        };
        let lingering_of = |queue: i32| -> Vec<LingeringSnapshot> {
            let mut v: Vec<LingeringSnapshot> = self
                .lingers
                .iter()
                .filter(|l| l.queue == queue)
                .map(|l| LingeringSnapshot { owner: l.owner, seats: l.seats, until: l.until })
                .collect();
            v.sort_by_key(|l| (l.until, l.owner, l.seats));
            v
        };
        QueueSetSnapshot {
            desired_queues: self.cfg.desired_queues,
            queue_length_limit: self.cfg.queue_length_limit,
            hand_size: self.cfg.hand_size,
            concurrency_limit: self.cfg.concurrency_limit,
            current_r: SeatSeconds(self.current_r).to_string(),
            last_time: self.last_real_time,
            robin_index: self.robin_index,
            requests_waiting: self.tot_requests_waiting,
            requests_executing: self.tot_requests_executing,
            seats_in_use: self.seats_in_use(),
            seats_waiting: self.seats_waiting(),
            counters: self.counters,
            queues: self
                .queues
                .iter()
                .map(|q| QueueSnapshot {
                    index: q.index,
                    next_dispatch_r: SeatSeconds(q.next_dispatch_r).to_string(),
                    initial_seats_sum: q.initial_seats_sum,
                    max_seats_sum: q.max_seats_sum,
                    total_work_sum: SeatSeconds(q.total_work_sum).to_string(),
                    requests_executing: q.requests_executing,
                    seats_in_use: q.seats_in_use,
                    waiting: q
                        .waiting
                        .iter()
                        .map(|w| WaitingSnapshot {
                            id: w.id,
                            owner: w.tag.owner,
                            context: w.tag.context,
                            flow_schema: w.tag.flow_schema,
                            flow_hash: w.tag.flow_hash,
                            wait_deadline: w.tag.wait_deadline,
                            arrival: w.arrival,
                            arrival_r: SeatSeconds(w.arrival_r).to_string(),
                            initial_seats: w.work.initial_seats,
                            final_seats: w.work.final_seats,
                            additional_latency: w.work.additional_latency,
                            total_work: request_work(&w.work, g).1.to_string(),
                        })
                        .collect(),
                    executing_by_owner: executing_of(qkey(q.index)),
                    lingering: lingering_of(qkey(q.index)),
                })
                .collect(),
            queueless_executing_by_owner: executing_of(-1),
            queueless_lingering: lingering_of(-1),
        }
    }

    // ---------------------------------------------------------------- encoding

    pub fn encode(&self, w: &mut Writer) {
        w.u8(ENCODING_VERSION);
        w.i32(self.cfg.desired_queues);
        w.u32(self.cfg.queue_length_limit);
        w.u32(self.cfg.hand_size);
        w.u32(self.cfg.concurrency_limit);
        w.u64(self.current_r);
        w.i64(self.last_real_time);
        w.u32(self.robin_index);
        w.u64(self.enqueues);
        w.u64(self.next_id);
        let c = &self.counters;
        for v in [
            c.dispatched,
            c.rejected_queue_full,
            c.rejected_concurrency_limit,
            c.timed_out,
            c.epoch_advances,
            c.epoch_advance_failures,
            c.no_accommodation,
        ] {
            w.u64(v);
        }
        w.usize(self.execs.len());
        for e in &self.execs {
            w.u32(e.owner);
            w.i32(e.queue);
            w.u32(e.executing);
            w.u64(e.seats);
        }
        w.usize(self.lingers.len());
        for l in &self.lingers {
            w.i64(l.until.wrapping_sub(self.last_real_time));
            w.i32(l.queue);
            w.u32(l.owner);
            w.u64(l.seats);
        }
        w.usize(self.queues.len());
        let mut prev: u32 = 0;
        for (k, q) in self.queues.iter().enumerate() {
            // Index delta from the previous one (first: absolute).
            w.u32(if k == 0 { q.index } else { q.index.wrapping_sub(prev) });
            prev = q.index;
            w.i64(q.next_dispatch_r.wrapping_sub(self.current_r) as i64);
            w.usize(q.waiting.len());
            w.bytes(q.waiting.encoded());
        }
    }

    /// One waiting request, delta-coded against the one before it in its queue (`prev`):
    /// a flags byte says which of owner, FlowSchema, flow, work and wait allowance (deadline
    /// minus arrival) repeat the previous request's and are left out; id, context, arrival
    /// and virtual arrival are differences from the previous request's (the first request's
    /// are absolute, so a queue's encoding depends on its requests alone). Requests of one
    /// queue mostly come from one flow moments apart, so an entry takes ≈ 10 bytes, not ≈ 30.
    fn encode_waiting(w: &mut Writer, r: &Waiting, prev: Option<&Waiting>) {
        let t = &r.tag;
        let allowance = wait_allowance(r);
        let mut flags = if r.skips > 0 { SKIPPED } else { 0 };
        if let Some(p) = prev {
            for (same, bit) in [
                (p.tag.owner == t.owner, SAME_OWNER),
                (p.tag.flow_schema == t.flow_schema, SAME_SCHEMA),
                (p.tag.flow_hash == t.flow_hash, SAME_FLOW),
                (p.work == r.work, SAME_WORK),
                (wait_allowance(p) == allowance, SAME_ALLOWANCE),
            ] {
                if same {
                    flags |= bit;
                }
            }
        }
        w.u8(flags);
        match prev {
            None => {
                w.u64(r.id);
                w.u32(t.context);
                w.u64(r.arrival_r);
                w.i64(r.arrival);
            }
            Some(p) => {
                w.i64(r.id.wrapping_sub(p.id) as i64);
                w.i64(i64::from(t.context) - i64::from(p.tag.context));
                w.i64(r.arrival_r.wrapping_sub(p.arrival_r) as i64);
                w.i64(r.arrival.wrapping_sub(p.arrival));
            }
        }
        if flags & SAME_OWNER == 0 {
            w.u32(t.owner);
        }
        if flags & SAME_SCHEMA == 0 {
            w.u32(u32::from(t.flow_schema));
        }
        if flags & SAME_FLOW == 0 {
            w.fixed64(t.flow_hash);
        }
        if flags & SAME_WORK == 0 {
            w.u32(r.work.initial_seats);
            w.u32(r.work.final_seats);
            w.i64(r.work.additional_latency);
        }
        if flags & SAME_ALLOWANCE == 0 {
            match allowance {
                None => w.u8(0),
                Some(a) => {
                    w.u8(1);
                    w.i64(a);
                }
            }
        }
        if r.skips > 0 {
            w.u8(r.skips);
        }
    }

    /// Decodes a state written by [`QueueSet::encode`]. Never panics; rejects structurally
    /// inconsistent input (bad config, unsorted or idle queues, duplicate ids, overflowing sums).
    pub fn decode(r: &mut Reader) -> CodecResult<QueueSet> {
        Self::decode_reusing(r, None)
    }

    /// [`QueueSet::decode`], taking each queue's waiting requests from `prior` (a state this
    /// thread holds, e.g. the one it wrote last) when they encode to exactly the stored
    /// segment: the result is the same, but only the queues that changed are decoded.
    pub fn decode_reusing(r: &mut Reader, prior: Option<QueueSet>) -> CodecResult<QueueSet> {
        // Room for as many ids as the prior state held waiting (the usual count).
        let id_room = prior.as_ref().map_or(0, |p| p.tot_requests_waiting as usize).saturating_add(8);
        let mut prior_queues = prior.map(|p| p.queues).unwrap_or_default().into_iter().peekable();
        if r.u8()? != ENCODING_VERSION {
            return Err(CodecError("unknown queueset encoding version"));
        }
        let cfg = QueueSetConfig {
            desired_queues: r.i32()?,
            queue_length_limit: r.u32()?,
            hand_size: r.u32()?,
            concurrency_limit: r.u32()?,
        };
        if check_config(&cfg).is_err() {
            return Err(CodecError("invalid queueset config"));
        }
        let current_r = r.u64()?;
        let last_real_time = r.i64()?;
        let robin_index = r.u32()?;
        let enqueues = r.u64()?;
        let next_id = r.u64()?;
        if next_id == 0 {
            return Err(CodecError("bad next id"));
        }
        let counters = Counters {
            dispatched: r.u64()?,
            rejected_queue_full: r.u64()?,
            rejected_concurrency_limit: r.u64()?,
            timed_out: r.u64()?,
            epoch_advances: r.u64()?,
            epoch_advance_failures: r.u64()?,
            no_accommodation: r.u64()?,
        };
        let mut ids = IdSet { ids: Vec::with_capacity(id_room) };
        let mut qs = QueueSet {
            cfg,
            g: ESTIMATED_SERVICE_DURATION,
            current_r,
            last_real_time,
            robin_index,
            enqueues,
            next_id,
            queues: Vec::new(),
            execs: Vec::new(),
            lingers: Vec::new(),
            counters,
            tot_requests_waiting: 0,
            tot_requests_executing: 0,
            tot_seats_in_use: 0,
            tot_seats_waiting: 0,
        };
        let n = r.count(4)?;
        qs.execs.reserve(n);
        for _ in 0..n {
            let e = OwnerExec { owner: r.u32()?, queue: r.i32()?, executing: r.u32()?, seats: r.u64()? };
            if e.queue < -1 || e.executing == 0 {
                return Err(CodecError("bad executing aggregate"));
            }
            if qs.execs.last().is_some_and(|p| (p.owner, p.queue) >= (e.owner, e.queue)) {
                return Err(CodecError("executing aggregates not sorted"));
            }
            qs.tot_requests_executing = qs.tot_requests_executing.checked_add(e.executing).ok_or(CodecError("too many requests"))?;
            qs.tot_seats_in_use = qs.tot_seats_in_use.checked_add(e.seats).ok_or(CodecError("seat overflow"))?;
            qs.execs.push(e);
        }
        let n = r.count(4)?;
        qs.lingers.reserve(n);
        for _ in 0..n {
            let l = Linger { until: last_real_time.wrapping_add(r.i64()?), queue: r.i32()?, owner: r.u32()?, seats: r.u64()? };
            if l.queue < -1 {
                return Err(CodecError("bad lingering queue"));
            }
            qs.tot_seats_in_use = qs.tot_seats_in_use.checked_add(l.seats).ok_or(CodecError("seat overflow"))?;
            qs.lingers.push(l);
        }
        let nq = r.count(3)?;
        qs.queues.reserve(nq);
        let mut prev: Option<u32> = None;
        for _ in 0..nq {
            let d = r.u32()?;
            let index = match prev {
                None => d,
                Some(p) => {
                    if d == 0 {
                        return Err(CodecError("queues not sorted"));
                    }
                    p.checked_add(d).ok_or(CodecError("queue index overflow"))?
                }
            };
            if index >= MAX_QUEUES {
                return Err(CodecError("queue index out of range"));
            }
            prev = Some(index);
            let mut q = Queue::new(index);
            q.next_dispatch_r = current_r.wrapping_add(r.i64()? as u64);
            // The queue's requests, and their sums, taken from the prior state when its segment
            // is unchanged (the sums depend on the requests alone); else decoded.
            let nw = r.count(0)?;
            let seg = r.bytes()?;
            while prior_queues.peek().is_some_and(|p| p.index < index) {
                prior_queues.next();
            }
            match prior_queues.next_if(|p| p.index == index) {
                Some(p) if p.waiting.len() == nw && p.waiting.enc.get().map(Vec::as_slice) == Some(seg) => {
                    (q.initial_seats_sum, q.max_seats_sum, q.total_work_sum) = (p.initial_seats_sum, p.max_seats_sum, p.total_work_sum);
                    q.waiting = p.waiting;
                }
                _ => {
                    q.waiting = decode_segment(seg, nw)?;
                    for w in q.waiting.iter() {
                        let work = w.work;
                        q.initial_seats_sum = q.initial_seats_sum.checked_add(work.initial_seats as u64).ok_or(CodecError("seat overflow"))?;
                        q.max_seats_sum = q.max_seats_sum.checked_add(work.max_seats() as u64).ok_or(CodecError("seat overflow"))?;
                        q.total_work_sum = q.total_work_sum.wrapping_add(request_work(&work, qs.g).1 .0);
                    }
                }
            }
            for w in q.waiting.iter() {
                ids.add(w.id, qs.next_id)?;
            }
            let n = u32::try_from(q.waiting.len()).map_err(|_| CodecError("too many requests"))?;
            qs.tot_requests_waiting = qs.tot_requests_waiting.checked_add(n).ok_or(CodecError("too many requests"))?;
            qs.tot_seats_waiting = qs.tot_seats_waiting.checked_add(q.max_seats_sum).ok_or(CodecError("seat overflow"))?;
            qs.queues.push(q);
        }
        // Attach the executing and lingering seats to their queues (which must be stored).
        for k in 0..qs.execs.len().saturating_add(qs.lingers.len()) {
            let (queue, executing, lingering, seats) = match qs.execs.get(k) {
                Some(e) => (e.queue, e.executing, 0, e.seats),
                None => match qs.lingers.get(k.saturating_sub(qs.execs.len())) {
                    Some(l) => (l.queue, 0, 1, l.seats),
                    None => break,
                },
            };
            let Ok(index) = u32::try_from(queue) else { continue };
            let pos = qs.queue_pos(index).map_err(|_| CodecError("seats held in a queue that is not stored"))?;
            let q = qs.queues.get_mut(pos).ok_or(CodecError("bad queue position"))?;
            q.requests_executing = q.requests_executing.checked_add(executing).ok_or(CodecError("too many requests"))?;
            q.lingering = q.lingering.checked_add(lingering).ok_or(CodecError("too many requests"))?;
            q.seats_in_use = q.seats_in_use.checked_add(seats).ok_or(CodecError("seat overflow"))?;
        }
        if qs.queues.iter().any(|q| q.is_stored_idle()) {
            return Err(CodecError("idle queue stored"));
        }
        if ids.has_duplicates() {
            return Err(CodecError("duplicate request id"));
        }
        Ok(qs)
    }

    /// The inverse of [`QueueSet::encode_waiting`] (the id is checked by the caller).
    fn decode_waiting(r: &mut Reader, prev: Option<&Waiting>) -> CodecResult<Waiting> {
        let flags = r.u8()?;
        if flags & !ALL_FLAGS != 0 || (prev.is_none() && flags & !SKIPPED != 0) {
            return Err(CodecError("bad waiting-request flags"));
        }
        let (id, context, arrival_r, arrival) = match prev {
            None => (r.u64()?, r.u32()?, r.u64()?, r.i64()?),
            Some(p) => (
                p.id.wrapping_add(r.i64()? as u64),
                u32::try_from(i64::from(p.tag.context).wrapping_add(r.i64()?)).map_err(|_| CodecError("bad context"))?,
                p.arrival_r.wrapping_add(r.i64()? as u64),
                p.arrival.wrapping_add(r.i64()?),
            ),
        };
        let same = |bit: u8| prev.filter(|_| flags & bit != 0);
        let owner = match same(SAME_OWNER) {
            Some(p) => p.tag.owner,
            None => r.u32()?,
        };
        let flow_schema = match same(SAME_SCHEMA) {
            Some(p) => p.tag.flow_schema,
            None => u16::try_from(r.u32()?).map_err(|_| CodecError("bad flow schema"))?,
        };
        let flow_hash = match same(SAME_FLOW) {
            Some(p) => p.tag.flow_hash,
            None => r.fixed64()?,
        };
        let work = match same(SAME_WORK) {
            Some(p) => p.work,
            None => WorkEstimate { initial_seats: r.u32()?, final_seats: r.u32()?, additional_latency: r.i64()? },
        };
        let allowance = match same(SAME_ALLOWANCE) {
            Some(p) => wait_allowance(p),
            None => match r.u8()? {
                0 => None,
                1 => Some(r.i64()?),
                _ => return Err(CodecError("bad deadline flag")),
            },
        };
        let wait_deadline = allowance.map_or(Nanos::MAX, |a| arrival.wrapping_add(a));
        let skips = if flags & SKIPPED != 0 { r.u8()?.clamp(1, MAX_SKIPS) } else { 0 };
        Ok(Waiting { id, tag: RequestTag { owner, context, flow_schema, flow_hash, wait_deadline }, work, arrival_r, arrival, skips })
    }

}

#[cfg(test)]
thread_local! {
    /// Test switch: false forces arrivals through the general enqueue + dispatch path.
    static DIRECT_DISPATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    /// Test switch: false turns owner affinity off (upstream's queue choice and FIFO order).
    static AFFINITY: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    /// Test record of cross-queue affinity: how many dispatches took another queue than fair
    /// queuing's choice, and the most by which one's virtual finish exceeded the bound (the
    /// chosen head's finish plus that head's work): must stay 0.
    static CROSS_QUEUE: std::cell::Cell<(u32, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Request ids seen while decoding, to reject duplicates.
#[derive(Default)]
struct IdSet {
    ids: Vec<RequestId>,
}

impl IdSet {
    /// Ids within this distance of the smallest are checked with a bitmap (the usual case:
    /// waiting requests arrived recently), others by sorting.
    const WINDOW: u64 = 4096;

    /// Adds a request's id, which must be one the state has handed out (1 to `next_id` − 1).
    fn add(&mut self, id: RequestId, next_id: RequestId) -> CodecResult<()> {
        if id == 0 || id >= next_id {
            return Err(CodecError("bad request id"));
        }
        self.ids.push(id);
        Ok(())
    }

    fn has_duplicates(&mut self) -> bool {
        let Some((lo, hi)) = self.ids.iter().fold(None, |b, &id| Some(b.map_or((id, id), |(lo, hi): (u64, u64)| (lo.min(id), hi.max(id))))) else { return false };
        // A bitmap no larger than the ids span (usually a few hundred ids: 8 words).
        let span = hi - lo;
        if span < 512 {
            return Self::repeats(&self.ids, lo, &mut [0u64; 8]);
        }
        if span < Self::WINDOW {
            return Self::repeats(&self.ids, lo, &mut [0u64; (IdSet::WINDOW / 64) as usize]);
        }
        self.ids.sort_unstable();
        self.ids.windows(2).any(|w| w.first() == w.get(1))
    }

    /// Whether an id occurs twice, with `seen` (zeroed) as a bitmap from `lo`.
    fn repeats(ids: &[RequestId], lo: u64, seen: &mut [u64]) -> bool {
        for &id in ids {
            let off = id - lo;
            let Some(word) = seen.get_mut((off / 64) as usize) else { return true };
            let bit = 1u64 << (off % 64);
            if *word & bit != 0 {
                return true;
            }
            *word |= bit;
        }
        false
    }
}

/// A queue's segment: its requests, each delta-coded against the one before it.
fn encode_segment(reqs: &VecDeque<Waiting>) -> Vec<u8> {
    let mut w = Writer::with_capacity(12 * reqs.len());
    let mut prev: Option<&Waiting> = None;
    for r in reqs {
        QueueSet::encode_waiting(&mut w, r, prev);
        prev = Some(r);
    }
    w.into_bytes()
}

/// A queue's `n` waiting requests from its segment (which must hold exactly them); the
/// segment is kept as their encoding.
fn decode_segment(seg: &[u8], n: usize) -> CodecResult<WaitList> {
    if n.saturating_mul(5) > seg.len() {
        return Err(CodecError("count exceeds input"));
    }
    let mut r = Reader::new(seg);
    let mut reqs: VecDeque<Waiting> = VecDeque::with_capacity(n);
    for _ in 0..n {
        let w = QueueSet::decode_waiting(&mut r, reqs.back())?;
        reqs.push_back(w);
    }
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes in a queue"));
    }
    let enc = std::cell::OnceCell::new();
    let _ = enc.set(seg.to_vec());
    Ok(WaitList { reqs, enc })
}

/// How long a waiting request may wait from its arrival (`None`: no deadline).
fn wait_allowance(w: &Waiting) -> Option<Nanos> {
    (w.tag.wait_deadline != Nanos::MAX).then(|| w.tag.wait_deadline.wrapping_sub(w.arrival))
}

/// Upstream `boundNextDispatchLocked` (anti-windup).
/// Owner affinity: the position in `waiting` to dispatch when `owner` (the worker whose arrival
/// or finish is dispatching) asks. The head (0), unless the head belongs to another owner and
/// one of the first [`AFFINITY_SCAN`] requests belongs to `owner`, every request from the head
/// to it has exactly the head's work, and none before it has been overtaken [`MAX_SKIPS`] times.
fn affinity_pick(waiting: &VecDeque<Waiting>, owner: u32) -> usize {
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

fn bound_next_dispatch(q: &mut Queue) {
    if let Some(head) = q.waiting.front() {
        if q.next_dispatch_r < head.arrival_r {
            q.next_dispatch_r = head.arrival_r;
        }
    }
}

/// Debug view of a QueueSet (for `dump_queues` / `dump_requests`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueSetSnapshot {
    pub desired_queues: i32,
    pub queue_length_limit: u32,
    pub hand_size: u32,
    pub concurrency_limit: u32,
    pub current_r: String,
    pub last_time: Nanos,
    pub robin_index: u32,
    pub requests_waiting: u32,
    pub requests_executing: u32,
    pub seats_in_use: u32,
    pub seats_waiting: u32,
    pub counters: Counters,
    /// Non-idle queues only, by index.
    pub queues: Vec<QueueSnapshot>,
    /// Executing requests of queue-less levels (exempt, Reject), per owner.
    pub queueless_executing_by_owner: Vec<ExecutingByOwner>,
    /// Lingering seats of queue-less levels, by release time.
    pub queueless_lingering: Vec<LingeringSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueSnapshot {
    pub index: u32,
    pub next_dispatch_r: String,
    pub initial_seats_sum: u64,
    pub max_seats_sum: u64,
    pub total_work_sum: String,
    pub requests_executing: u32,
    pub seats_in_use: u64,
    pub waiting: Vec<WaitingSnapshot>,
    /// Executing requests of this queue, per owner (by owner). Individual executing requests
    /// are not stored (their owners keep their receipts).
    pub executing_by_owner: Vec<ExecutingByOwner>,
    /// Seats held after a finish (`AdditionalLatency`), by release time.
    pub lingering: Vec<LingeringSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitingSnapshot {
    pub id: RequestId,
    pub owner: u32,
    pub context: u32,
    pub flow_schema: u16,
    pub flow_hash: u64,
    pub wait_deadline: Nanos,
    pub arrival: Nanos,
    pub arrival_r: String,
    pub initial_seats: u32,
    pub final_seats: u32,
    pub additional_latency: Nanos,
    pub total_work: String,
}

/// The executing requests of one owner (worker slot) in one queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecutingByOwner {
    pub owner: u32,
    /// Executing (not lingering) requests.
    pub executing: u32,
    /// Their MaxSeats, summed.
    pub seats: u64,
}

/// Seats of a finished request still held for its `AdditionalLatency`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LingeringSnapshot {
    pub owner: u32,
    pub seats: u64,
    /// Release time.
    pub until: Nanos,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC;

    const SEC: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;

    fn cfg(q: i32, qll: u32, hand: u32, c: u32) -> QueueSetConfig {
        QueueSetConfig { desired_queues: q, queue_length_limit: qll, hand_size: hand, concurrency_limit: c }
    }
    fn tag(hash: u64) -> RequestTag {
        RequestTag { owner: 1, context: hash as u32, flow_schema: 0, flow_hash: hash, wait_deadline: Nanos::MAX }
    }
    fn one() -> WorkEstimate {
        WorkEstimate { initial_seats: 1, final_seats: 0, additional_latency: 0 }
    }
    fn ss(secs: f64) -> u64 {
        seats_times_duration(1.0, (secs * 1e9) as Nanos).0
    }

    /// Builds a queue with one waiting request of `seats` seats.
    fn queue_with_head(qs: &mut QueueSet, index: u32, next_r: u64, seats: u32) {
        let mut q = Queue::new(index);
        q.next_dispatch_r = next_r;
        let work = WorkEstimate { initial_seats: seats, final_seats: 0, additional_latency: 0 };
        q.max_seats_sum = seats as u64;
        q.initial_seats_sum = seats as u64;
        q.total_work_sum = request_work(&work, qs.g).1 .0;
        let id = qs.new_id();
        q.waiting.edit().push_back(Waiting { id, tag: tag(index as u64), work, arrival_r: 0, arrival: 0, skips: 0 });
        qs.tot_requests_waiting += 1;
        qs.tot_seats_waiting += seats as u64;
        qs.queues.push(q);
    }

    fn find_case(c: u32, in_use: u64, robin_minus_one_of: u32, queues: &[(u64, u32)]) -> QueueSet {
        let mut qs = QueueSet::new(cfg(queues.len() as i32, 8, 1, c), 0).unwrap();
        // robinIndex −1 ≡ nq−1 (mod nq): the scan starts at queue 0.
        qs.robin_index = robin_minus_one_of - 1;
        qs.tot_seats_in_use = in_use;
        for (i, (r, seats)) in queues.iter().enumerate() {
            queue_with_head(&mut qs, i as u32, *r, *seats);
        }
        qs
    }

    fn picked(qs: &mut QueueSet) -> Option<u32> {
        qs.find_dispatch_queue().map(|p| {
            let idx = qs.queues[p].index;
            // upstream sets robinIndex inside findDispatchQueueToBoundLocked
            qs.robin_index = idx;
            idx
        })
    }

    #[test]
    fn find_dispatch_queue_vectors() {
        // 1. seats available, the queue with less virtual start wins
        let mut qs = find_case(1, 0, 2, &[(ss(200.0), 1), (ss(100.0), 1)]);
        assert_eq!(picked(&mut qs), Some(1));
        assert_eq!(qs.robin_index, 1);
        // 2. all seats occupied
        let mut qs = find_case(1, 1, 1, &[(ss(200.0), 1)]);
        assert_eq!(picked(&mut qs), None);
        assert_eq!(qs.robin_index, 0);
        // 3. wide requests, fits
        let mut qs = find_case(50, 25, 2, &[(ss(200.0), 50), (ss(100.0), 25)]);
        assert_eq!(picked(&mut qs), Some(1));
        assert_eq!(qs.robin_index, 1);
        // 4. minimal finish does not fit; the other would but is not chosen
        let mut qs = find_case(50, 26, 2, &[(ss(200.0), 10), (ss(100.0), 25)]);
        for _ in 0..3 {
            assert_eq!(picked(&mut qs), None);
            assert_eq!(qs.robin_index, 1);
        }
        assert_eq!(qs.counters.no_accommodation, 3);
        // 5. seats become available before the 3rd attempt
        let mut qs = find_case(50, 26, 2, &[(ss(200.0), 10), (ss(100.0), 25)]);
        assert_eq!(picked(&mut qs), None);
        assert_eq!(qs.robin_index, 1);
        assert_eq!(picked(&mut qs), None);
        assert_eq!(qs.robin_index, 1);
        qs.tot_seats_in_use = 25;
        assert_eq!(picked(&mut qs), Some(1));
        assert_eq!(qs.robin_index, 1);
    }

    #[test]
    fn finish_request_vectors() {
        for work in [
            WorkEstimate { initial_seats: 1, final_seats: 10, additional_latency: 60 * SEC },
            WorkEstimate { initial_seats: 10, final_seats: 0, additional_latency: 0 },
        ] {
            let mut qs = QueueSet::new(cfg(1, 8, 1, 1000), 0).unwrap();
            qs.set_estimated_service_duration(SEC);
            let max = work.max_seats();
            let mut q = Queue::new(0);
            q.requests_executing = 2;
            q.seats_in_use = 22;
            qs.queues.push(q);
            // Request 1 (owner 1) under test; another one of owner 2 holds the other seats.
            qs.execs = vec![
                OwnerExec { owner: 1, queue: 0, executing: 1, seats: max as u64 },
                OwnerExec { owner: 2, queue: 0, executing: 1, seats: 22 - max as u64 },
            ];
            qs.tot_requests_executing = 111;
            qs.tot_seats_in_use = 222;
            let rc = Receipt {
                id: 1,
                queue: 0,
                owner: 1,
                initial_seats: work.initial_seats,
                max_seats: max,
                start: 0,
                additional_latency: work.additional_latency,
            };
            let mut out = Vec::new();
            assert!(qs.finish(0, &rc, &mut out));
            // Service-time correction: G − (now − start) = 1 s at InitialSeats.
            assert_eq!(qs.queues[0].next_dispatch_r, 0u64.wrapping_sub(seats_times_duration(work.initial_seats as f64, SEC).0));
            let before = qs.clone();
            assert!(!qs.finish(0, &rc, &mut out), "second finish of the same request");
            assert!(!qs.finish(0, &Receipt { owner: 3, ..rc }, &mut out), "unknown owner");
            assert_eq!(qs, before, "a refused finish changes nothing");
            let mut to = Vec::new();
            qs.expire(work.additional_latency, &mut to, &mut out);
            assert_eq!(qs.tot_requests_executing, 110);
            assert_eq!(qs.tot_seats_in_use, 222 - max as u64);
            assert_eq!(qs.queues[0].seats_in_use, 22 - max as u64);
            assert_eq!(qs.queues[0].requests_executing, 1);
            assert_eq!(qs.execs, vec![OwnerExec { owner: 2, queue: 0, executing: 1, seats: 22 - max as u64 }]);
            assert!(qs.lingers.is_empty());
            assert!(out.is_empty() && to.is_empty());
        }
    }

    #[test]
    fn request_work_and_seats() {
        let w = WorkEstimate { initial_seats: 3, final_seats: 50, additional_latency: 70 * SEC };
        let (_, total) = request_work(&w, 2 * SEC);
        assert_eq!(
            total,
            seats_times_duration(3.0, 2 * SEC).wrapping_add(seats_times_duration(50.0, 70 * SEC))
        );
        assert_eq!(total.to_string(), "3506.00000000ss");
        let seats = |i, f| WorkEstimate { initial_seats: i, final_seats: f, additional_latency: 0 }.max_seats();
        assert_eq!(seats(3, 3), 3);
        assert_eq!(seats(1, 3), 3);
        assert_eq!(seats(3, 1), 3);
    }

    fn ndr(qs: &QueueSet, index: u32) -> u64 {
        qs.queues.iter().find(|q| q.index == index).map(|q| q.next_dispatch_r).unwrap()
    }

    /// Reference §5.13.
    #[test]
    fn worked_example() {
        let mut qs = QueueSet::new(cfg(2, 8, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        // Dealer(2,1): hash mod 2 → X (hash 0) uses q0, Y (hash 1) uses q1.
        let x1 = qs.arrive(0, one(), tag(0), &mut out);
        assert!(matches!(x1, Arrival::Executing(_)));
        assert_eq!(ndr(&qs, 0), ss(0.003));
        assert_eq!(qs.robin_index, 0);
        let y1 = qs.arrive(0, one(), tag(1), &mut out);
        let x2 = qs.arrive(0, one(), tag(0), &mut out);
        let (Arrival::Executing(x1), Arrival::Queued(y1), Arrival::Queued(x2)) = (x1, y1, x2) else { panic!() };
        assert!(out.is_empty());
        assert_eq!(qs.virtual_time_ratio(), 0.5);
        assert_eq!((x1.queue, x1.owner, x1.start, x1.max_seats), (0, 1, 0, 1));
        assert!(qs.finish(100 * MS, &x1, &mut out));
        assert_eq!(qs.current_r, ss(0.05));
        assert_eq!(ndr(&qs, 0), ss(0.1));
        assert_eq!(out.iter().map(|d| d.id).collect::<Vec<_>>(), vec![y1]);
        assert_eq!(out[0].waited, 100 * MS);
        assert_eq!(ndr(&qs, 1), ss(0.003));
        assert_eq!(qs.robin_index, 1);
        let y1 = out[0].receipt;
        assert_eq!((y1.queue, y1.start), (1, 100 * MS));
        out.clear();
        assert!(qs.finish(200 * MS, &y1, &mut out));
        assert_eq!(qs.current_r, ss(0.1));
        assert_eq!(out.iter().map(|d| d.id).collect::<Vec<_>>(), vec![x2]);
        assert_eq!(ndr(&qs, 0), ss(0.103));
        // q1 became idle and is no longer stored.
        assert_eq!(qs.queues.len(), 1);
        let x2 = out[0].receipt;
        out.clear();
        assert!(qs.finish(300 * MS, &x2, &mut out));
        assert!(qs.is_idle() && qs.is_empty());
    }

    /// TestContextCancel: the cancelled waiting request never executes; no dispatch attempt.
    #[test]
    fn context_cancel() {
        let mut qs = QueueSet::new(cfg(11, 11, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        let Arrival::Executing(r1) = qs.arrive(0, one(), tag(1), &mut out) else { panic!() };
        let Arrival::Queued(r2) = qs.arrive(0, one(), tag(2), &mut out) else { panic!() };
        assert_eq!(qs.cancel(SEC, r2), Some(tag(2)));
        assert_eq!(qs.cancel(SEC, r2), None);
        assert_eq!(qs.counters.timed_out, 1);
        assert!(!qs.is_idle());
        assert!(qs.finish(SEC, &r1, &mut out));
        assert!(out.is_empty());
        assert!(qs.is_idle() && qs.is_empty());
    }

    #[test]
    fn wait_deadline_expiry_and_next_event() {
        let mut qs = QueueSet::new(cfg(4, 10, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        let Arrival::Executing(r1) = qs.arrive(0, one(), tag(1), &mut out) else { panic!() };
        let mut t = tag(2);
        t.wait_deadline = 5 * SEC;
        let Arrival::Queued(r2) = qs.arrive(0, one(), t, &mut out) else { panic!() };
        assert_eq!(qs.next_event(), Some(5 * SEC));
        let mut to = Vec::new();
        qs.expire(4 * SEC, &mut to, &mut out);
        assert!(to.is_empty());
        qs.expire(6 * SEC, &mut to, &mut out);
        assert_eq!(to, vec![(r2, t)]);
        assert!(out.is_empty());
        assert_eq!(qs.next_event(), None);
        assert!(qs.finish(7 * SEC, &r1, &mut out));
        assert!(qs.is_empty());
    }

    #[test]
    fn reject_levels_and_exempt() {
        let mut qs = QueueSet::new(cfg(0, 0, 0, 2), 0).unwrap();
        let mut out = Vec::new();
        let w2 = WorkEstimate { initial_seats: 2, final_seats: 0, additional_latency: 0 };
        assert!(matches!(qs.arrive(0, one(), tag(1), &mut out), Arrival::Executing(_)));
        assert_eq!(qs.arrive(0, w2, tag(1), &mut out), Arrival::Rejected(RejectReason::ConcurrencyLimit));
        assert_eq!(qs.counters.rejected_concurrency_limit, 1);
        let mut ex = QueueSet::new(cfg(-1, 0, 0, 0), 0).unwrap();
        for _ in 0..5 {
            assert!(matches!(ex.arrive(0, w2, tag(1), &mut out), Arrival::Executing(_)));
        }
        assert_eq!(ex.seats_in_use(), 10);
        // too wide runs alone
        let mut qs = QueueSet::new(cfg(4, 10, 1, 2), 0).unwrap();
        let w3 = WorkEstimate { initial_seats: 3, final_seats: 0, additional_latency: 0 };
        let Arrival::Executing(a) = qs.arrive(0, one(), tag(0), &mut out) else { panic!() };
        let Arrival::Queued(b) = qs.arrive(0, w3, tag(1), &mut out) else { panic!() };
        assert!(qs.finish(SEC, &a, &mut out));
        assert_eq!(out.iter().map(|d| (d.id, d.seats)).collect::<Vec<_>>(), vec![(b, 3)]);
        assert_eq!(qs.seats_in_use(), 3);
    }

    #[test]
    fn final_seats_narrowing_and_linger() {
        let mut qs = QueueSet::new(cfg(4, 10, 1, 4), 0).unwrap();
        let mut out = Vec::new();
        let w = WorkEstimate { initial_seats: 1, final_seats: 8, additional_latency: SEC };
        // MaxSeats 8 > C: runs alone; final seats narrowed to 4, latency doubled.
        let r = qs.arrive(0, w, tag(0), &mut out);
        let Arrival::Executing(id) = r else { panic!("{r:?}") };
        assert_eq!(qs.seats_in_use(), 4);
        assert!(qs.finish(SEC, &id, &mut out));
        assert!(qs.is_idle());
        assert_eq!(qs.seats_in_use(), 4);
        assert_eq!(qs.next_event(), Some(3 * SEC));
        let mut to = Vec::new();
        qs.expire(3 * SEC, &mut to, &mut out);
        assert_eq!(qs.seats_in_use(), 0);
        assert!(qs.is_empty());
    }

    #[test]
    fn reconfigure_and_remove_owner() {
        let mut qs = QueueSet::new(cfg(8, 10, 2, 1), 0).unwrap();
        let mut out = Vec::new();
        let Arrival::Executing(_a) = qs.arrive(0, one(), tag(5), &mut out) else { panic!() };
        let mut t = tag(6);
        t.owner = 2;
        let Arrival::Queued(_b) = qs.arrive(0, one(), t, &mut out) else { panic!() };
        let Arrival::Queued(c) = qs.arrive(0, one(), tag(7), &mut out) else { panic!() };
        assert!(qs.reconfigure(cfg(512, 8, 8, 1), SEC).unwrap_err().contains("required entropy bits"));
        // owner 1 gone: its executing request releases its seat, its... c is owner 1 too
        let n = qs.remove_owner(2, SEC, &mut out);
        assert_eq!(n, 1);
        assert!(out.is_empty());
        let d = qs.reconfigure(cfg(4, 10, 1, 2), 2 * SEC).unwrap();
        assert_eq!(d.iter().map(|d| d.id).collect::<Vec<_>>(), vec![c]);
        assert_eq!(qs.remove_owner(1, 3 * SEC, &mut out), 2);
        assert!(qs.is_empty());
        // Reject level keeps old QLL / hand.
        qs.reconfigure(cfg(0, 0, 0, 3), 3 * SEC).unwrap();
        assert_eq!(qs.config(), cfg(0, 10, 1, 3));
    }

    /// Lease expiry releases executing and lingering seats of the owner; its receipts are
    /// refused afterwards; other owners are untouched.
    #[test]
    fn remove_owner_releases_aggregates_and_lingers() {
        let mut qs = QueueSet::new(cfg(4, 10, 1, 10), 0).unwrap();
        let mut out = Vec::new();
        let lw = WorkEstimate { initial_seats: 2, final_seats: 3, additional_latency: SEC };
        let mut t7 = tag(0);
        t7.owner = 7;
        let Arrival::Executing(a) = qs.arrive(0, lw, t7, &mut out) else { panic!() };
        let Arrival::Executing(b) = qs.arrive(0, one(), t7, &mut out) else { panic!() };
        let Arrival::Executing(c) = qs.arrive(0, one(), tag(0), &mut out) else { panic!() };
        assert_eq!((a.queue, b.queue, c.queue), (0, 0, 0));
        assert_eq!(qs.execs.len(), 2, "one aggregate per (owner, queue)");
        assert!(qs.finish(MS, &a, &mut out));
        assert_eq!(qs.seats_in_use(), 5, "a lingers on 3 seats");
        assert_eq!(qs.remove_owner(7, 2 * MS, &mut out), 2);
        assert_eq!((qs.seats_in_use(), qs.requests_executing()), (1, 1));
        assert!(qs.lingers.is_empty() && qs.next_event().is_none());
        assert!(!qs.finish(3 * MS, &b, &mut out), "reaped");
        assert_eq!(qs.snapshot().queues[0].executing_by_owner, vec![ExecutingByOwner { owner: 1, executing: 1, seats: 1 }]);
        assert!(qs.finish(3 * MS, &c, &mut out));
        assert!(!qs.finish(3 * MS, &c, &mut out), "double finish");
        assert!(qs.is_empty());
    }

    /// State size depends on distinct (owner, queue) pairs, not on executing requests.
    #[test]
    fn executing_requests_do_not_grow_the_state() {
        let size = |qs: &QueueSet| {
            let mut w = Writer::new();
            qs.encode(&mut w);
            w.buf.len()
        };
        let mut qs = QueueSet::new(cfg(-1, 0, 0, 0), SEC).unwrap();
        let mut out = Vec::new();
        qs.arrive(SEC, one(), tag(1), &mut out);
        let one_size = size(&qs);
        for i in 0..500 {
            qs.arrive(SEC + i, one(), tag(1), &mut out);
        }
        // Only varints grow (counters, next id, the aggregate's count and seats).
        assert!(size(&qs) <= one_size + 8, "{} vs {one_size}", size(&qs));
        assert_eq!(qs.requests_executing(), 501);
        let back = QueueSet::decode(&mut Reader::new(&{
            let mut w = Writer::new();
            qs.encode(&mut w);
            w.buf
        }))
        .unwrap();
        assert_eq!(back, qs);
    }

    #[test]
    fn decode_rejects_inconsistent_aggregates() {
        let enc = |qs: &QueueSet| {
            let mut w = Writer::new();
            qs.encode(&mut w);
            w.buf
        };
        let mut qs = QueueSet::new(cfg(4, 10, 1, 10), 0).unwrap();
        let mut out = Vec::new();
        qs.arrive(0, one(), tag(0), &mut out);
        assert!(QueueSet::decode(&mut Reader::new(&enc(&qs))).is_ok());
        // Seats held in a queue that is not stored.
        let mut bad = qs.clone();
        bad.execs[0].queue = 3;
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
        bad = qs.clone();
        bad.lingers.push(Linger { until: 5, queue: 2, owner: 1, seats: 1 });
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
        // Duplicate / unsorted aggregates, empty aggregate.
        bad = qs.clone();
        bad.execs.push(bad.execs[0]);
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
        bad = qs.clone();
        bad.execs[0].executing = 0;
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
        // A stored queue with nothing in it.
        bad = qs.clone();
        bad.execs.clear();
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
        // Overflowing totals.
        bad = qs.clone();
        bad.execs.push(OwnerExec { owner: 9, queue: -1, executing: 1, seats: u64::MAX });
        assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    }

    fn busy_state() -> QueueSet {
        let mut qs = QueueSet::new(cfg(64, 50, 8, 3), 1_000_000_000_000).unwrap();
        let mut out = Vec::new();
        let mut now = 1_000_000_000_000;
        let mut running = Vec::new();
        for i in 0..40u64 {
            now += 1_234_567;
            let mut t = tag(i.wrapping_mul(0x9E3779B97F4A7C15));
            if i % 3 == 0 {
                t.wait_deadline = now + 15 * SEC;
            }
            let w = WorkEstimate { initial_seats: 1 + (i % 2) as u32, final_seats: (i % 5) as u32, additional_latency: (i % 4) as i64 * MS };
            if let Arrival::Executing(rc) = qs.arrive(now, w, t, &mut out) {
                running.push(rc);
            }
        }
        // Two finish (one of them lingers: additional latency), the third keeps executing.
        for rc in running.iter().skip(1) {
            now += MS / 2;
            assert!(qs.finish(now, rc, &mut out));
        }
        assert!(!qs.lingers.is_empty() && !qs.execs.is_empty());
        qs
    }

    #[test]
    fn encode_roundtrip() {
        let qs = busy_state();
        assert!(qs.requests_waiting() > 10);
        let mut w = Writer::new();
        qs.encode(&mut w);
        let bytes = w.into_bytes();
        let back = QueueSet::decode(&mut Reader::new(&bytes)).unwrap();
        assert_eq!(back, qs);
        assert_eq!(back.snapshot(), qs.snapshot());
        // Common case: one executing request.
        let mut qs = QueueSet::new(cfg(128, 50, 6, 100), 123_456_789_000_000).unwrap();
        let mut out = Vec::new();
        let mut t = tag(17644606172554983095);
        t.wait_deadline = 123_456_789_000_000 + 15 * SEC;
        qs.arrive(123_456_789_000_000, one(), t, &mut out);
        let mut w = Writer::new();
        qs.encode(&mut w);
        let n = w.buf.len();
        assert!(n < 54, "{n} bytes");
        assert_eq!(QueueSet::decode(&mut Reader::new(&w.buf)).unwrap(), qs);
    }

    #[test]
    fn direct_dispatch_matches_enqueue_then_dispatch() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
        let slow = |f: &mut dyn FnMut()| {
            DIRECT_DISPATCH.with(|d| d.set(false));
            f();
            DIRECT_DISPATCH.with(|d| d.set(true));
        };
        let mut direct = 0;
        for case in 0..300 {
            let queues = 1 + rnd(8) as i32;
            let hand = 1 + rnd(queues as u64) as u32;
            let c = 1 + rnd(6) as u32;
            let mut a = QueueSet::new(cfg(queues, rnd(4) as u32, hand, c), 1_000 * SEC).unwrap();
            if case % 7 == 0 {
                a.current_r = u64::MAX - rnd(1 << 40);
            }
            let mut b = a.clone();
            let mut now = 1_000 * SEC;
            // Waiting (None) or executing (its receipt) requests.
            let mut ids: Vec<(RequestId, Option<Receipt>)> = Vec::new();
            let note = |ids: &mut Vec<(RequestId, Option<Receipt>)>, out: &[Dispatched]| {
                for d in out {
                    for e in ids.iter_mut().filter(|e| e.0 == d.id) {
                        e.1 = Some(d.receipt);
                    }
                }
            };
            for _ in 0..200 {
                now += rnd(5) as i64 * MS;
                match rnd(10) {
                    0..=4 => {
                        let w = WorkEstimate {
                            initial_seats: 1 + rnd(3) as u32 + if rnd(10) == 0 { c } else { 0 },
                            final_seats: rnd(4) as u32 + if rnd(10) == 0 { 2 * c } else { 0 },
                            additional_latency: rnd(3) as i64 * MS,
                        };
                        let mut t = tag(rnd(u64::MAX));
                        t.wait_deadline = now + rnd(50) as i64 * MS;
                        let (mut oa, mut ob) = (Vec::new(), Vec::new());
                        let ra = a.arrive(now, w, t, &mut oa);
                        let mut rb = Arrival::Rejected(RejectReason::QueueFull);
                        slow(&mut || rb = b.arrive(now, w, t, &mut ob));
                        assert_eq!(ra, rb);
                        assert_eq!(oa, ob);
                        note(&mut ids, &oa);
                        match ra {
                            Arrival::Executing(rc) => {
                                assert_eq!((rc.owner, rc.start, rc.initial_seats), (t.owner, now, w.initial_seats));
                                direct += 1;
                                ids.push((rc.id, Some(rc)))
                            }
                            Arrival::Queued(id) => ids.push((id, None)),
                            Arrival::Rejected(_) => {}
                        }
                    }
                    5..=7 if !ids.is_empty() => {
                        let (id, rc) = ids.swap_remove(rnd(ids.len() as u64) as usize);
                        let (mut oa, mut ob) = (Vec::new(), Vec::new());
                        if let Some(rc) = rc {
                            let fa = a.finish(now, &rc, &mut oa);
                            let mut fb = false;
                            slow(&mut || fb = b.finish(now, &rc, &mut ob));
                            assert!(fa);
                            assert_eq!((fa, &oa), (fb, &ob));
                            note(&mut ids, &oa);
                        } else {
                            assert_eq!(a.cancel(now, id), b.cancel(now, id));
                        }
                    }
                    _ => {
                        let (mut ta, mut tb, mut oa, mut ob) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                        a.expire(now, &mut ta, &mut oa);
                        slow(&mut || b.expire(now, &mut tb, &mut ob));
                        assert_eq!((&ta, &oa), (&tb, &ob));
                        note(&mut ids, &oa);
                        ids.retain(|e| !ta.iter().any(|(id, _)| *id == e.0));
                    }
                }
                assert_eq!(a, b, "case {case}");
            }
        }
        assert!(direct > 1000, "{direct}");
    }

    #[test]
    fn config_fast_check_agrees_with_dealer() {
        for deck in (1..=300).chain([1 << 10, (1 << 26) - 1, 1 << 26, (1 << 26) + 1, i32::MAX]) {
            for hand in (0..=20).chain([deck as u32, u32::MAX]) {
                let c = cfg(deck, 10, hand, 5);
                let want = Dealer::new(deck, hand.min(i32::MAX as u32) as i32).is_ok();
                assert_eq!(check_config(&c).is_ok(), want, "deck {deck} hand {hand}");
            }
        }
    }

    #[test]
    fn id_set_finds_duplicates() {
        for n in [0usize, 1, 2, 15, 16, 17, 40] {
            // Close ids (bitmap) and spread ones (sorting).
            for spread in [1u64, 3, IdSet::WINDOW - 1, IdSet::WINDOW, 1 << 40] {
                let id = |i: usize| 7 + i as u64 * spread;
                let mut s = IdSet::default();
                for i in 0..n {
                    s.ids.push(id(i));
                }
                assert!(!s.has_duplicates(), "{n} {spread}");
                for dup in 0..n {
                    let mut s = IdSet::default();
                    for i in 0..n {
                        s.ids.push(id(i));
                    }
                    s.ids.push(id(dup));
                    assert!(s.has_duplicates(), "{n} {dup} {spread}");
                }
            }
        }
    }

    /// Decoding rejects a request id that appears twice, within one queue or across queues,
    /// and accepts every state `encode` writes.
    #[test]
    fn decode_rejects_duplicate_ids() {
        let roundtrip = |qs: &QueueSet| {
            let mut w = Writer::new();
            qs.encode(&mut w);
            let b = w.into_bytes();
            QueueSet::decode(&mut Reader::new(&b))
        };
        // One queue (one flow), several waiting.
        let mut one = QueueSet::new(cfg(4, 50, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        for _ in 0..6 {
            let _ = one.arrive(1, WorkEstimate::ONE, tag(7), &mut out);
        }
        assert_eq!(one.queues.iter().filter(|q| !q.waiting.is_empty()).count(), 1);
        assert!(roundtrip(&one).is_ok());
        for (a, b) in [(0usize, 1usize), (1, 3), (0, 4)] {
            let mut bad = one.clone();
            let q = bad.queues.iter_mut().find(|q| !q.waiting.is_empty()).unwrap();
            let a_id = q.waiting[a].id;
            q.waiting.edit()[b].id = a_id;
            assert!(roundtrip(&bad).is_err(), "{a} {b}");
        }
        // Several queues.
        let qs = busy_state();
        assert!(qs.queues.iter().filter(|q| !q.waiting.is_empty()).count() > 1);
        assert!(roundtrip(&qs).is_ok());
        let mut bad = qs.clone();
        let first = bad.queues.iter().find(|q| !q.waiting.is_empty()).unwrap().waiting[0].id;
        let other = bad.queues.iter_mut().filter(|q| !q.waiting.is_empty()).nth(1).unwrap();
        let last = other.waiting.len() - 1;
        other.waiting.edit()[last].id = first;
        assert!(roundtrip(&bad).is_err());
        // Decoding with a prior state whose queues are taken unchanged: a request decoded here
        // that repeats a kept request's id, or another decoded request's, is rejected too.
        let encode = |qs: &QueueSet| {
            let mut w = Writer::new();
            qs.encode(&mut w);
            w.into_bytes()
        };
        let with_prior = |qs: &QueueSet, prior: &QueueSet| QueueSet::decode_reusing(&mut Reader::new(&encode(qs)), Some(prior.clone()));
        let mut prior = qs.clone();
        prior.queues.iter_mut().for_each(|q| {
            q.waiting.encoded();
        });
        assert_eq!(with_prior(&qs, &prior).unwrap(), qs);
        let nonempty: Vec<usize> = (0..qs.queues.len()).filter(|&i| !qs.queues[i].waiting.is_empty()).collect();
        let (qa, qb) = (nonempty[0], nonempty[1]);
        let kept_id = qs.queues[qa].waiting[0].id;
        let appended = |qs: &mut QueueSet, q: usize, id: RequestId| {
            let mut w = qs.queues[q].waiting.back().unwrap().clone();
            w.id = id;
            qs.queues[q].waiting.push_back(w);
            qs.next_id = qs.next_id.max(id + 1);
        };
        // Appended with a fresh id: accepted (and decoded from the prior's queues).
        let mut ok = qs.clone();
        appended(&mut ok, qb, qs.next_id);
        assert_eq!(with_prior(&ok, &prior).unwrap(), QueueSet::decode(&mut Reader::new(&encode(&ok))).unwrap());
        // Appended with the id of a request of another queue the prior holds unchanged.
        let mut dup = qs.clone();
        appended(&mut dup, qb, kept_id);
        assert!(with_prior(&dup, &prior).is_err());
        // Two appended requests with the same fresh id.
        let mut dup = qs.clone();
        appended(&mut dup, qa, qs.next_id + 3);
        appended(&mut dup, qb, qs.next_id + 3);
        assert!(with_prior(&dup, &prior).is_err());
        // A fresh id at or above the state's next id.
        let mut bad = ok.clone();
        bad.next_id = qs.next_id;
        assert!(with_prior(&bad, &prior).is_err());
    }

    #[test]
    fn garbage_decode_never_panics() {
        let qs = busy_state();
        let mut w = Writer::new();
        qs.encode(&mut w);
        let good = w.into_bytes();
        for cut in 0..good.len() {
            assert!(QueueSet::decode(&mut Reader::new(&good[..cut])).is_err());
        }
        let mut x: u64 = 88172645463325252;
        for round in 0..3000 {
            let mut b = good.clone();
            for _ in 0..(1 + round % 4) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % b.len() as u64) as usize;
                b[i] = (x >> 20) as u8;
            }
            if let Ok(mut q) = QueueSet::decode(&mut Reader::new(&b)) {
                // whatever decoded must be usable without panics
                let mut out = Vec::new();
                let mut to = Vec::new();
                q.arrive(q.last_real_time + SEC, one(), tag(x), &mut out);
                q.expire(q.last_real_time + 100 * SEC, &mut to, &mut out);
                let _ = q.snapshot();
            }
            let rnd: Vec<u8> = (0..(round % 64)).map(|k| (x >> (k % 57)) as u8).collect();
            let _ = QueueSet::decode(&mut Reader::new(&rnd));
        }
    }

    fn owned(owner: u32, ctx: u32) -> RequestTag {
        // One flow: every request lands in the same queue (hand size 1, one queue).
        RequestTag { owner, context: ctx, flow_schema: 0, flow_hash: 7, wait_deadline: Nanos::MAX }
    }

    /// Owner affinity: a finishing owner resumes its own request of the chosen queue instead of
    /// another owner's head, a head is overtaken at most MAX_SKIPS times, and with one owner the
    /// order is plain FIFO.
    #[test]
    fn owner_affinity_prefers_the_dispatching_owner_within_bounds() {
        let mut qs = QueueSet::new(cfg(1, 100, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        // Owner 1 runs one request; owner 2 queues the head, then owner 1 queues many.
        let Arrival::Executing(mut rc) = qs.arrive(0, one(), owned(1, 100), &mut out) else { panic!("first runs") };
        let Arrival::Queued(head) = qs.arrive(MS, one(), owned(2, 200), &mut out) else { panic!("queued") };
        let mut mine = Vec::new();
        for k in 0..(MAX_SKIPS as u32 + 3) {
            let Arrival::Queued(id) = qs.arrive(2 * MS, one(), owned(1, 101 + k), &mut out) else { panic!("queued") };
            mine.push(id);
        }
        // Each finish of owner 1 dispatches owner 1's next request, until the head has been
        // overtaken MAX_SKIPS times; then the head goes (to owner 2).
        let mut t = 10 * MS;
        for &expected in mine.iter().take(MAX_SKIPS as usize) {
            out.clear();
            assert!(qs.finish(t, &rc, &mut out));
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].id, expected, "owner 1's own request, in its FIFO order");
            assert_eq!(out[0].tag.owner, 1);
            rc = out[0].receipt;
            t += MS;
        }
        out.clear();
        assert!(qs.finish(t, &rc, &mut out));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].id, head, "the head, overtaken MAX_SKIPS times, goes next");
        assert_eq!(out[0].tag.owner, 2);
        // The encoded state keeps the skip counts.
        let mut w = Writer::with_capacity(64);
        qs.encode(&mut w);
        let back = QueueSet::decode(&mut Reader::new(&w.into_bytes())).unwrap();
        assert_eq!(back, qs);
    }

    #[test]
    fn owner_affinity_never_swaps_different_work_or_beyond_the_scan() {
        let two = WorkEstimate { initial_seats: 2, final_seats: 0, additional_latency: 0 };
        let mut qs = QueueSet::new(cfg(1, 100, 1, 2), 0).unwrap();
        let mut out = Vec::new();
        let Arrival::Executing(rc) = qs.arrive(0, two, owned(1, 1), &mut out) else { panic!("runs") };
        let Arrival::Queued(head) = qs.arrive(MS, one(), owned(2, 2), &mut out) else { panic!("queued") };
        // Owner 1's request has different work: the head goes.
        let _ = qs.arrive(MS, two, owned(1, 3), &mut out);
        out.clear();
        assert!(qs.finish(5 * MS, &rc, &mut out));
        assert_eq!(out.first().map(|d| d.id), Some(head));

        // Owner 1's request beyond the first AFFINITY_SCAN positions is not looked at.
        let mut qs = QueueSet::new(cfg(1, 100, 1, 1), 0).unwrap();
        let Arrival::Executing(rc) = qs.arrive(0, one(), owned(1, 1), &mut out) else { panic!("runs") };
        let mut others = Vec::new();
        for k in 0..AFFINITY_SCAN as u32 {
            let Arrival::Queued(id) = qs.arrive(MS, one(), owned(2, 10 + k), &mut out) else { panic!("queued") };
            others.push(id);
        }
        let _ = qs.arrive(MS, one(), owned(1, 99), &mut out);
        out.clear();
        assert!(qs.finish(5 * MS, &rc, &mut out));
        assert_eq!(out.first().map(|d| d.id), Some(others[0]));
    }

    #[test]
    fn single_owner_order_is_fifo() {
        let mut qs = QueueSet::new(cfg(1, 100, 1, 1), 0).unwrap();
        let mut out = Vec::new();
        let Arrival::Executing(mut rc) = qs.arrive(0, one(), owned(1, 1), &mut out) else { panic!("runs") };
        let ids: Vec<RequestId> = (0..5)
            .map(|k| match qs.arrive(MS, one(), owned(1, 10 + k), &mut out) {
                Arrival::Queued(id) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        let mut got = Vec::new();
        for k in 0..5 {
            out.clear();
            assert!(qs.finish((10 + k) * MS, &rc, &mut out));
            rc = out[0].receipt;
            got.push(out[0].id);
        }
        assert_eq!(got, ids);
    }

    /// Decoding with a prior state gives exactly what decoding alone gives, whatever the prior
    /// (an older state, a newer one, one of another configuration), and every kept queue
    /// encoding is exactly its requests' encoding: random arrivals, finishes, cancellations,
    /// time-outs and owner purges from 3 owners, decoding each state with earlier ones.
    #[test]
    fn decoding_with_a_prior_state_equals_decoding() {
        let mut rnd = xorshift(0x9E37_79B9_7F4A_7C15);
        let mut qs = QueueSet::new(cfg(8, 20, 2, 3), 0).unwrap();
        let mut now: Nanos = 0;
        let mut executing: Vec<Receipt> = Vec::new();
        let mut history: Vec<(Vec<u8>, QueueSet)> = Vec::new();
        let mut out = Vec::new();
        let mut reused = 0;
        for step in 0..4000u32 {
            now += rnd(3 * MS as u64) as Nanos;
            out.clear();
            match rnd(20) {
                0 => {
                    let _ = qs.cancel(now, qs.next_id.saturating_sub(1 + rnd(8)));
                }
                1 => {
                    qs.expire(now, &mut Vec::new(), &mut out);
                }
                2 if step % 500 == 0 => {
                    let _ = qs.remove_owner(1 + rnd(3) as u32, now, &mut out);
                }
                k if k < 12 => {
                    let mut tag = RequestTag { owner: 1 + rnd(3) as u32, context: step, flow_schema: rnd(2) as u16, flow_hash: rnd(6), wait_deadline: Nanos::MAX };
                    if rnd(3) == 0 {
                        tag.wait_deadline = now + rnd(40 * MS as u64) as Nanos;
                    }
                    let work = WorkEstimate { initial_seats: 1 + rnd(2) as u32, final_seats: rnd(2) as u32, additional_latency: rnd(2) as Nanos * MS };
                    if let Arrival::Executing(rc) = qs.arrive(now, work, tag, &mut out) {
                        executing.push(rc);
                    }
                }
                _ if !executing.is_empty() => {
                    let rc = executing.remove(rnd(executing.len() as u64) as usize);
                    let _ = qs.finish(now, &rc, &mut out);
                }
                _ => {}
            }
            executing.extend(out.iter().map(|d| d.receipt));
            executing.retain(|rc| qs.execs.iter().any(|e| e.owner == rc.owner));
            let mut w = Writer::new();
            qs.encode(&mut w);
            let bytes = w.into_bytes();
            for q in &qs.queues {
                if let Some(enc) = q.waiting.enc.get() {
                    assert_eq!(*enc, encode_segment(&q.waiting), "step {step}: a kept queue encoding is stale");
                }
            }
            let plain = QueueSet::decode(&mut Reader::new(&bytes)).unwrap();
            assert_eq!(plain, qs);
            for back in [1usize, 2, 7] {
                let Some((_, prior)) = history.len().checked_sub(back).and_then(|i| history.get(i)) else { continue };
                let got = QueueSet::decode_reusing(&mut Reader::new(&bytes), Some(prior.clone())).unwrap();
                assert_eq!(got, plain, "step {step}: decoding with the state {back} steps back differs");
                reused += got.queues.iter().zip(&prior.queues).filter(|(a, b)| a.index == b.index && a.waiting.enc == b.waiting.enc && !a.waiting.is_empty()).count();
                let mut w = Writer::new();
                got.encode(&mut w);
                assert_eq!(w.into_bytes(), bytes, "step {step}: re-encoding differs");
            }
            // A prior newer than the value, and one of another configuration.
            if let Some((old, _)) = history.get(history.len().saturating_sub(5)) {
                assert_eq!(QueueSet::decode_reusing(&mut Reader::new(old), Some(qs.clone())).unwrap(), QueueSet::decode(&mut Reader::new(old)).unwrap());
            }
            history.push((bytes, plain));
        }
        assert!(reused > 1000, "queues were reused only {reused} times");
        assert!(history.iter().any(|(_, q)| q.requests_waiting() > 10), "never saturated");
    }

    /// A deterministic generator for the randomized tests: `rnd(n)` is in `0..n` (0 for n = 0).
    fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        }
    }

    /// Owner affinity bounds its reordering and loses nothing: no request is overtaken by more
    /// than MAX_SKIPS later requests of its own queue, no dispatch from another queue than fair
    /// queuing's choice finishes (in virtual time) more than one request's work after that
    /// choice, every arrival is dispatched, rejected or still waiting; with one owner (one
    /// worker, the simulator) the dispatch sequence and the rejections are exactly upstream's.
    #[test]
    fn owner_affinity_bounds_reordering_and_loses_nothing() {
        type Trace = (Vec<(Nanos, i32, u32)>, Vec<u8>, u32);
        fn run(seed: u64, affinity: bool, owners: u64) -> Trace {
            AFFINITY.with(|a| a.set(affinity));
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n.max(1)
            };
            let two = WorkEstimate { initial_seats: 2, final_seats: 0, additional_latency: 0 };
            let mut qs = QueueSet::new(cfg(8, 50, 2, 3), 0).unwrap();
            let mut now: Nanos = 0;
            let mut executing: Vec<Receipt> = Vec::new();
            let mut out = Vec::new();
            let mut dispatches = Vec::new();
            let mut outcomes = Vec::new();
            // Per queue: waiting ids in arrival order (for the overtaking bound).
            let mut order: std::collections::HashMap<i32, Vec<RequestId>> = std::collections::HashMap::new();
            let mut max_overtaken = 0u32;
            let mut overtaken: std::collections::HashMap<RequestId, u32> = std::collections::HashMap::new();
            for step in 0..3000u32 {
                now += rnd(2_000_000) as Nanos;
                out.clear();
                if rnd(10) < 6 {
                    let flow = rnd(12);
                    let tag = RequestTag { owner: 1 + rnd(owners) as u32, context: step, flow_schema: 0, flow_hash: flow, wait_deadline: Nanos::MAX };
                    let work = if rnd(5) == 0 { two } else { one() };
                    match qs.arrive(now, work, tag, &mut out) {
                        Arrival::Executing(rc) => {
                            outcomes.push(0);
                            out.push(Dispatched { id: 0, tag, waited: 0, seats: rc.max_seats, receipt: rc });
                        }
                        Arrival::Queued(_) => outcomes.push(0),
                        Arrival::Rejected(_) => outcomes.push(2),
                    }
                } else if !executing.is_empty() {
                    let k = rnd(executing.len() as u64) as usize;
                    let rc = executing.remove(k);
                    assert!(qs.finish(now, &rc, &mut out));
                }
                // Overtaking, in dispatch order: the requests of the same queue that arrived earlier
                // and still wait (an arrival that runs at once comes last in `out`).
                for d in &out {
                    let q = order.entry(d.receipt.queue).or_default();
                    let pos = q.iter().position(|&i| i == d.id).unwrap_or(q.len());
                    for earlier in q.iter().take(pos) {
                        let n = overtaken.entry(*earlier).or_insert(0);
                        *n += 1;
                        max_overtaken = max_overtaken.max(*n);
                    }
                    if pos < q.len() {
                        q.remove(pos);
                    }
                }
                // Requests started by one operation, in a canonical order (which of two equivalent
                // requests of a queue runs is exactly what affinity may change).
                out.sort_by_key(|d| (d.receipt.queue, d.seats));
                for d in &out {
                    dispatches.push((now, d.receipt.queue, d.seats));
                    executing.push(d.receipt);
                }
                // Newly queued requests join their queue's arrival order (queues are appended
                // to at the back, so the snapshot's order among unseen ids is arrival order).
                for q in &qs.queues {
                    let known = order.entry(qkey(q.index)).or_default();
                    for w in q.waiting.iter().skip(known.len()) {
                        known.push(w.id);
                    }
                }
            }
            AFFINITY.with(|a| a.set(true));
            let rejected = outcomes.iter().filter(|&&o| o == 2).count();
            assert_eq!(outcomes.len(), dispatches.len() + rejected + qs.tot_requests_waiting as usize, "seed {seed}: a request was lost");
            (dispatches, outcomes, max_overtaken)
        }
        let mut reordered = false;
        CROSS_QUEUE.with(|c| c.set((0, 0)));
        for seed in 1..=8u64 {
            let (_, _, max_on) = run(seed, true, 3);
            let (_, _, max_off) = run(seed, false, 3);
            assert_eq!(max_off, 0, "without affinity every queue is FIFO");
            assert!(max_on <= u32::from(MAX_SKIPS), "seed {seed}: a request was overtaken {max_on} times");
            reordered |= max_on > 0;
            let (d_one, o_one, max_one) = run(seed, true, 1);
            let (d_up, o_up, _) = run(seed, false, 1);
            assert_eq!((d_one, o_one, max_one), (d_up, o_up, 0), "seed {seed}: one owner differs from upstream");
        }
        let (cross, excess) = CROSS_QUEUE.with(|c| c.get());
        assert!(cross > 0, "the scenario exercises affinity across queues");
        assert_eq!(excess, 0, "a dispatch from another queue finished beyond one request's work after fair queuing's choice");
        assert!(reordered, "the scenario exercises the affinity");
    }
}
