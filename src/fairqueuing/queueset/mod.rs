//! The QueueSet of one priority level: upstream's "fair queuing for server requests"
//! (`pkg/util/flowcontrol/fairqueuing/queueset/queueset.go`), as a plain value
//! driven with explicit times (`now`), so that it can live in a shared key-value store
//! (`encode`/`decode`) and be replayed by the simulator.
//!
//! Semantics follow upstream exactly: virtual time R advancing at `min(seatsRequested, C)/NEQ`
//! (`syncTimeLocked`, `getVirtualTimeRatioLocked`) with epoch advance (`advanceEpoch`), queue
//! choice by least waiting work in the shuffle-sharded hand with the `enqueues mod handSize`
//! rotation (`shuffleShardLocked`), reject iff `seatsInUse ≥ C ∧ len ≥ QLL`
//! (`rejectOrEnqueueToBoundLocked`), global-minimum virtual-finish dispatch in round-robin tie
//! order with strict head-of-line blocking, "too wide runs alone" and final-seats narrowing
//! (`dispatchAsMuchAsPossibleLocked`, `findDispatchQueueToBoundLocked`,
//! `canAccommodateSeatsLocked`, `dispatchLocked`), finish correction with the actual service
//! time and `AdditionalLatency` lingering on MaxSeats (`finishRequestLocked`), anti-windup
//! (`boundNextDispatchLocked`), cancellation without dispatch (`request.wait`), reconfiguration
//! (`BeginConfigChange`, `setConfiguration`), exempt levels (`dispatchSansQueueLocked`).
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
//! Deviation: a lease expiry ([`QueueSet::remove_owner`]) releases the dead owner's executing
//! seats without the service-time correction of the queues' virtual finish (its requests'
//! start times are not stored); upstream has no lease expiry.

use std::collections::VecDeque;

use super::seat_seconds::{duration_per_seat, seats_times_duration, SeatSeconds};
use super::shuffle_sharding::{Dealer, DealerError};
use super::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

mod codec;
mod executing;
mod fifo;
mod snapshot;
#[cfg(test)]
mod tests;

pub use executing::{ExecutingByOwner, Linger};
use fifo::{Queue, Waiting};
pub use snapshot::{QueueSetSnapshot, QueueSnapshot, WaitingSnapshot};

/// G: the estimated service duration used for the initial work guess (upstream: 3 ms).
pub const ESTIMATED_SERVICE_DURATION: Nanos = 3_000_000;
/// Amount by which R is wound back on an epoch advance.
pub const R_DECREMENT: u64 = u64::MAX / 2;
/// Threshold that triggers an epoch advance.
pub const HIGH_R: u64 = R_DECREMENT + R_DECREMENT / 2;

/// Largest queue index that can exist (the Dealer's maximum deck size).
const MAX_QUEUES: u32 = 1 << 26;

/// What [`QueueSet::start_request`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub arrival: Arrival,
    /// The length of the request's queue right after it was enqueued (upstream's
    /// `request_queue_length_after_enqueue`, observed in `queueset.go:
    /// timeoutOldRequestsAndRejectOrEnqueueLocked`): `None` when it was not enqueued (rejected,
    /// exempt, a level without queues). A request dispatched at once was enqueued first, as
    /// upstream does.
    pub queue_length: Option<u32>,
}

impl Started {
    fn new(arrival: Arrival, queue_length: Option<u32>) -> Started {
        Started { arrival, queue_length }
    }
}

/// The outcome of an arrival ([`Started::arrival`]).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

impl Counters {
    /// Every counter, in the order of the fields (the codec's order).
    pub fn values(&self) -> [u64; 7] {
        [
            self.dispatched,
            self.rejected_queue_full,
            self.rejected_concurrency_limit,
            self.timed_out,
            self.epoch_advances,
            self.epoch_advance_failures,
            self.no_accommodation,
        ]
    }
}

/// Key of a queue in receipts, aggregates and lingers (indices are below 2^26).
fn qkey(index: u32) -> i32 {
    i32::try_from(index).unwrap_or(i32::MAX)
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
    execs: Vec<ExecutingByOwner>,
    /// Lingering seats.
    lingers: Vec<Linger>,
    counters: Counters,
    // Derived totals.
    tot_requests_waiting: u32,
    tot_requests_executing: u32,
    tot_seats_in_use: u64,
    tot_seats_waiting: u64,
}

fn dealer(cfg: &QueueSetConfig) -> Result<Dealer, DealerError> {
    Dealer::new(cfg.desired_queues, cfg.hand_size.min(i32::MAX as u32) as i32)
}

fn check_config(cfg: &QueueSetConfig) -> Result<(), String> {
    // Cheap sufficient condition for `Dealer::new` to succeed (it is checked on every decode):
    // 0 < hand ≤ deck ≤ 2^26 and hand·⌈log2 deck⌉ ≤ 60 imply ⌈log2(deck)·hand⌉ ≤ 60 (the float
    // log2 of an integer never exceeds its ceiling).
    let (deck, hand) = (cfg.desired_queues as u32, cfg.hand_size);
    let cheap = hand > 0 && hand <= deck && deck <= MAX_QUEUES;
    if cfg.desired_queues <= 0 || cheap && hand.saturating_mul(deck.next_power_of_two().trailing_zeros()) <= 60 {
        return Ok(());
    }
    let what = "the QueueSetConfig implies an invalid shuffle sharding config (DesiredNumQueues is deckSize)";
    dealer(cfg).map(drop).map_err(|e| format!("{what}: {e}"))
}

fn sat_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl QueueSet {
    /// Upstream `BeginConstruction` + `Complete`. Inlined: every decode builds on it, and a
    /// call returns the whole set by copy.
    #[inline]
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

    pub fn config(&self) -> QueueSetConfig {
        self.cfg
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Upstream `BeginConfigChange` + `Complete`: applies the new configuration and dispatches as
    /// much as possible (returned).
    pub fn reconfigure(&mut self, mut cfg: QueueSetConfig, now: Nanos) -> Result<Vec<Dispatched>, String> {
        check_config(&cfg)?;
        self.sync_time(now);
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
    pub fn requests_waiting(&self) -> u32 {
        self.tot_requests_waiting
    }
    pub fn requests_executing(&self) -> u32 {
        self.tot_requests_executing
    }
    pub fn seat_demand(&self) -> u32 {
        sat_u32(self.tot_seats_in_use.saturating_add(self.tot_seats_waiting))
    }
    /// The MaxSeats of the widest waiting request (0 when none waits): under a strict limit it
    /// can run only once the limit is at least that.
    pub fn widest_waiting(&self) -> u32 {
        self.queues.iter().flat_map(|q| q.waiting.iter()).map(|w| w.work.max_seats()).max().unwrap_or(0)
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

    fn new_id(&mut self) -> RequestId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    // ---------------------------------------------------------------- virtual time

    fn virtual_time_ratio(&self) -> f64 {
        let active = self.queues.iter().filter(|q| q.is_active()).count();
        let seats_requested = self.queues.iter().fold(0u64, |s, q| s.saturating_add(q.seats_in_use.saturating_add(q.max_seats_sum)));
        if active == 0 {
            return 0.0;
        }
        (seats_requested as f64).min(self.cfg.concurrency_limit as f64) / active as f64
    }

    /// Upstream `syncTimeLocked`.
    fn sync_time(&mut self, now: Nanos) {
        if now <= self.last_real_time {
            return;
        }
        let dt = now.saturating_sub(self.last_real_time);
        self.last_real_time = now;
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
        // Success: no reading of R wrapped around below zero.
        let mut success = true;
        for q in &mut self.queues {
            if !q.is_active() {
                q.next_dispatch_r = 0;
                continue;
            }
            success &= q.next_dispatch_r >= R_DECREMENT;
            q.next_dispatch_r = q.next_dispatch_r.wrapping_sub(R_DECREMENT);
            for w in q.waiting.edit() {
                success &= w.arrival_r >= R_DECREMENT;
                w.arrival_r = w.arrival_r.wrapping_sub(R_DECREMENT);
            }
        }
        let c = &mut self.counters;
        let n = if success { &mut c.epoch_advances } else { &mut c.epoch_advance_failures };
        *n = n.saturating_add(1);
    }

    // ---------------------------------------------------------------- arrival

    /// Upstream `canAccommodateSeatsLocked` ("too wide runs alone", unless the limit is strict);
    /// exempt levels always can.
    fn can_accommodate(&self, seats: u32) -> bool {
        let (c, seats) = (self.cfg.concurrency_limit as u64, seats as u64);
        let fits = self.tot_seats_in_use.saturating_add(seats) <= c;
        let alone = !self.cfg.strict_limit && self.tot_requests_executing == 0;
        self.cfg.desired_queues < 0 || if seats > c { alone } else { fits }
    }

    fn queue_pos(&self, index: u32) -> Result<usize, usize> {
        self.queues.binary_search_by_key(&index, |q| q.index)
    }

    /// Position of the stored queue of a receipt, aggregate or linger (`queue` −1: none).
    fn stored_pos(&self, queue: i32) -> Option<usize> {
        u32::try_from(queue).ok().and_then(|i| self.queue_pos(i).ok())
    }

    fn waiting_work_of(&self, index: u32) -> u64 {
        self.queue_pos(index).ok().and_then(|p| self.queues.get(p)).map_or(0, |q| q.total_work_sum)
    }

    /// Upstream `shuffleShardLocked`.
    fn shuffle_shard(&mut self, hash: u64) -> u32 {
        let Ok(dealer) = dealer(&self.cfg) else { return 0 };
        let (hand, n) = dealer.deal_array(hash);
        let hand = hand.get(..n).unwrap_or(&[]);
        if hand.is_empty() {
            return 0;
        }
        let offset = (self.enqueues % hand.len() as u64) as usize;
        self.enqueues = self.enqueues.wrapping_add(1);
        // The first queue with the least waiting work, from `offset` on (cyclically).
        let rotated = hand.iter().cycle().skip(offset).take(hand.len()).copied();
        rotated.min_by_key(|&i| self.waiting_work_of(i)).unwrap_or(0)
    }

    /// Upstream `StartRequest`: the request is rejected, queued, or executing (in the order of
    /// `timeoutOldRequestsAndRejectOrEnqueueLocked`, then `dispatchAsMuchAsPossibleLocked`).
    /// `out` receives the requests dispatched as a consequence (not including this one when it
    /// is executing).
    pub fn start_request(&mut self, now: Nanos, work: WorkEstimate, tag: RequestTag, out: &mut Vec<Dispatched>) -> Started {
        self.start_request_via(now, work, tag, out, true)
    }

    /// [`QueueSet::start_request`]; `direct`: a request that would be dispatched at once
    /// skips the enqueue (the fast path, [`Self::try_dispatch_directly`]); without it every
    /// arrival takes the general enqueue-then-dispatch path (tests compare the two).
    fn start_request_via(&mut self, now: Nanos, work: WorkEstimate, tag: RequestTag, out: &mut Vec<Dispatched>, direct: bool) -> Started {
        self.sync_time(now);
        if self.cfg.desired_queues < 1 {
            if !self.can_accommodate(work.max_seats()) {
                self.counters.rejected_concurrency_limit = self.counters.rejected_concurrency_limit.saturating_add(1);
                return Started::new(Arrival::Rejected(RejectReason::ConcurrencyLimit), None);
            }
            let id = self.new_id();
            return Started::new(Arrival::Executing(self.start_executing(id, tag.owner, -1, &work, now)), None);
        }
        let qidx = self.shuffle_shard(tag.flow_hash);
        let pos = self.queue_pos(qidx).unwrap_or_else(|p| {
            self.queues.insert(p, Queue::new(qidx));
            p
        });
        let waiting = self.queues.get(pos).map_or(0, |q| q.waiting.len() as u64);
        if self.tot_seats_in_use >= self.cfg.concurrency_limit as u64 && waiting >= self.cfg.queue_length_limit as u64 {
            if self.queues.get(pos).is_some_and(|q| q.is_stored_idle()) {
                self.queues.remove(pos);
            }
            self.counters.rejected_queue_full = self.counters.rejected_queue_full.saturating_add(1);
            return Started::new(Arrival::Rejected(RejectReason::QueueFull), None);
        }
        let id = self.new_id();
        let r = self.current_r;
        let length = Some(sat_u32(waiting.saturating_add(1)));
        if let Some(receipt) = direct.then(|| self.try_dispatch_directly(pos, id, tag, work, now)).flatten() {
            return Started::new(Arrival::Executing(receipt), length);
        }
        if let Some(q) = self.queues.get_mut(pos) {
            if q.waiting.is_empty() && q.requests_executing == 0 {
                q.next_dispatch_r = r;
            }
            q.waiting.push_back(Waiting { id, tag, work, arrival_r: r, arrival: now });
            q.initial_seats_sum = q.initial_seats_sum.saturating_add(work.initial_seats as u64);
            q.max_seats_sum = q.max_seats_sum.saturating_add(work.max_seats() as u64);
            q.total_work_sum = q.total_work_sum.wrapping_add(request_work(&work, self.g).1 .0);
            bound_next_dispatch(q);
        }
        self.tot_requests_waiting += 1;
        self.tot_seats_waiting = self.tot_seats_waiting.saturating_add(work.max_seats() as u64);
        let before = out.len();
        self.dispatch_as_much_as_possible(now, out);
        let arrival = match out.iter().skip(before).position(|d| d.id == id) {
            Some(i) => Arrival::Executing(out.remove(before + i).receipt),
            None => Arrival::Queued(id),
        };
        Started::new(arrival, length)
    }

    /// The uncontended arrival, without the round trip through the queue: when nothing else
    /// waits, enqueuing the request and dispatching as much as possible would pick exactly this
    /// request (the only queue head) if it fits. Applies the same net state change as
    /// enqueue + [`Self::dispatch_one`] and returns the receipt; returns None (changing
    /// nothing) when the request would not be dispatched right away.
    fn try_dispatch_directly(&mut self, pos: usize, id: RequestId, tag: RequestTag, work: WorkEstimate, now: Nanos) -> Option<Receipt> {
        if self.tot_requests_waiting != 0 || self.tot_seats_in_use >= self.cfg.concurrency_limit as u64 {
            return None;
        }
        let r = self.current_r;
        let total_work = request_work(&work, self.g).1;
        let q = self.queues.get(pos).filter(|q| q.waiting.is_empty())?;
        // next_dispatch_r after the enqueue (idle reset, then anti-windup against the arrival R).
        let ndr = if q.requests_executing == 0 { r } else { q.next_dispatch_r }.max(r);
        // `find_dispatch_queue`: the head's virtual finish must be below the initial minimum.
        if ndr.wrapping_add(total_work.0) == u64::MAX || !self.can_accommodate(work.max_seats()) {
            return None;
        }
        self.queues.get_mut(pos)?.next_dispatch_r = ndr.wrapping_add(total_work.0);
        self.start_in_queue(pos, id, tag.owner, work, now)
    }

    /// The queue's and totals' side of a dispatch (`dispatchLocked`): final seats above C are
    /// narrowed to C (the final work spread over a longer additional latency), the request's
    /// seats become in use in the queue at `pos`, which becomes `robinIndex`. Returns the receipt.
    fn start_in_queue(&mut self, pos: usize, id: RequestId, owner: u32, mut work: WorkEstimate, now: Nanos) -> Option<Receipt> {
        let c = self.cfg.concurrency_limit;
        if work.final_seats > c {
            work.additional_latency = duration_per_seat(request_work(&work, self.g).0, c as f64);
            work.final_seats = c;
        }
        let q = self.queues.get_mut(pos)?;
        q.seats_in_use = q.seats_in_use.saturating_add(work.max_seats() as u64);
        q.requests_executing = q.requests_executing.saturating_add(1);
        self.robin_index = q.index;
        Some(self.start_executing(id, owner, qkey(self.robin_index), &work, now))
    }

    /// Upstream `dispatchAsMuchAsPossibleLocked`.
    fn dispatch_as_much_as_possible(&mut self, now: Nanos, out: &mut Vec<Dispatched>) {
        while self.tot_requests_waiting != 0 && self.tot_seats_in_use < self.cfg.concurrency_limit as u64 && self.dispatch_one(now, out) {}
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
        // The first minimum in that order (a finish of u64::MAX is never below the initial one).
        let heads = (start..n).chain(0..start).filter_map(|pos| Some((self.head_finish(self.queues.get(pos)?)?, pos)));
        let (_, pos) = heads.filter(|&(finish, _)| finish != u64::MAX).min_by_key(|&(finish, _)| finish)?;
        let seats = self.queues.get(pos)?.waiting.front()?.work.max_seats();
        if !self.can_accommodate(seats) {
            self.counters.no_accommodation = self.counters.no_accommodation.saturating_add(1);
            return None;
        }
        Some(pos)
    }

    /// Upstream `dispatchLocked`: dispatches the head of the queue fair queuing chooses.
    fn dispatch_one(&mut self, now: Nanos, out: &mut Vec<Dispatched>) -> bool {
        let Some(pos) = self.find_dispatch_queue() else { return false };
        let Some(q) = self.queues.get_mut(pos) else { return false };
        let Some(req) = q.waiting.pop_front() else { return false };
        let total_work = q.forget(&req.work, self.g);
        q.next_dispatch_r = q.next_dispatch_r.wrapping_add(total_work);
        bound_next_dispatch(q);
        self.tot_requests_waiting = self.tot_requests_waiting.saturating_sub(1);
        self.tot_seats_waiting = self.tot_seats_waiting.saturating_sub(req.work.max_seats() as u64);
        let Some(receipt) = self.start_in_queue(pos, req.id, req.tag.owner, req.work, now) else { return false };
        let waited = now.saturating_sub(req.arrival);
        out.push(Dispatched { id: req.id, tag: req.tag, waited, receipt });
        true
    }

    /// Upstream `finishRequestAndDispatchAsMuchAsPossible`: the handler of the executing request
    /// of `receipt` returned at `now`. Applies the service-time correction to the receipt's
    /// queue, lingers on (or releases) its MaxSeats and dispatches. Returns false, changing
    /// nothing, when its (owner, queue) has no executing request left (the owner's lease was
    /// reaped and its seats released, or a second finish).
    pub fn finish(&mut self, now: Nanos, rc: &Receipt, out: &mut Vec<Dispatched>) -> bool {
        let Ok(p) = self.exec_pos(rc.owner, rc.queue) else { return false };
        self.sync_time(now);
        let Some(e) = self.execs.get_mut(p).filter(|e| e.executing > 0) else { return false };
        e.executing -= 1;
        // The seats counted for this request (all that is left with the last one, so that the
        // aggregate always drains to zero whatever the receipts say).
        let seats = if e.executing == 0 { e.seats } else { e.seats.min(rc.max_seats as u64) };
        e.seats = e.seats.saturating_sub(seats);
        if e.executing == 0 {
            self.execs.remove(p);
        }
        // Its seats linger (still in use) or are released.
        let linger = rc.additional_latency > 0;
        self.release(rc.queue, 1, 0, if linger { 0 } else { seats });
        if linger {
            self.lingers.push(Linger { until: now.saturating_add(rc.additional_latency), queue: rc.queue, owner: rc.owner, seats });
        }
        if let Some((pos, q)) = self.stored_pos(rc.queue).and_then(|p| Some((p, self.queues.get_mut(p)?))) {
            let actual = now.saturating_sub(rc.start);
            let corr = seats_times_duration(rc.initial_seats as f64, self.g.saturating_sub(actual));
            q.next_dispatch_r = q.next_dispatch_r.wrapping_sub(corr.0);
            bound_next_dispatch(q);
            q.lingering = q.lingering.saturating_add(u32::from(linger));
            if q.is_stored_idle() {
                self.queues.remove(pos);
            }
        }
        self.dispatch_as_much_as_possible(now, out);
        true
    }

    /// Removes the waiting requests `pred` selects (counted as `time-out`) into `removed`.
    fn remove_waiting_where(&mut self, pred: impl Fn(&Waiting) -> bool, removed: &mut Vec<(RequestId, RequestTag)>) {
        let (mut n, mut seats) = (0u32, 0u64);
        for q in &mut self.queues {
            if !q.waiting.iter().any(&pred) {
                continue;
            }
            let (gone, kept): (VecDeque<Waiting>, _) = q.waiting.edit().drain(..).partition(&pred);
            *q.waiting.edit() = kept;
            for w in gone {
                q.forget(&w.work, self.g);
                seats = seats.saturating_add(w.work.max_seats() as u64);
                n += 1;
                removed.push((w.id, w.tag));
            }
            bound_next_dispatch(q);
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
        let waits = self.queues.iter().flat_map(|q| q.waiting.iter()).map(|w| w.tag.wait_deadline);
        self.lingers.iter().map(|l| l.until).chain(waits.filter(|&d| d != Nanos::MAX)).min()
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
            let released = self.release_lingers_where(|l| l.until <= t) > 0;
            if released {
                self.queues.retain(|q| !q.is_stored_idle());
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
        for e in self.execs.drain(lo..hi.max(lo)).collect::<Vec<ExecutingByOwner>>() {
            count = count.saturating_add(e.executing as usize);
            self.release(e.queue, e.executing, 0, e.seats);
        }
        count = count.saturating_add(self.release_lingers_where(|l| l.owner == owner));
        self.queues.retain(|q| !q.is_stored_idle());
        self.dispatch_as_much_as_possible(now, out);
        count
    }
}

/// Upstream `boundNextDispatchLocked` (anti-windup).
fn bound_next_dispatch(q: &mut Queue) {
    if let Some(head) = q.waiting.front() {
        q.next_dispatch_r = q.next_dispatch_r.max(head.arrival_r);
    }
}
