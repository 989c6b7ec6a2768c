//! Fair queuing for server requests: seat-seconds arithmetic, the shuffle-sharding dealer and
//! the QueueSet (one per priority level), exactly as upstream's
//! `pkg/util/flowcontrol/fairqueuing/queueset` (`queueset.go`), with `request/seat_seconds.go`
//! and `pkg/util/shufflesharding/shufflesharding.go`.
//!
//! Shared vocabulary used by digest (work estimate), the engine and the simulator lives here.

use crate::Nanos;

pub mod queueset;
pub mod seat_seconds;
pub mod shuffle_sharding;

/// Seats and additional latency of one request (upstream `WorkEstimate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkEstimate {
    pub initial_seats: u32,
    pub final_seats: u32,
    /// Nanoseconds the request keeps `max_seats()` after its handler returned.
    pub additional_latency: Nanos,
}

impl WorkEstimate {
    pub const ONE: WorkEstimate = WorkEstimate { initial_seats: 1, final_seats: 0, additional_latency: 0 };
    pub fn max_seats(&self) -> u32 {
        self.initial_seats.max(self.final_seats)
    }
}

/// Why a request was rejected (the `reason` label of `rejected_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    QueueFull = 0,
    ConcurrencyLimit = 1,
    TimeOut = 2,
}

impl RejectReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue-full",
            RejectReason::ConcurrencyLimit => "concurrency-limit",
            RejectReason::TimeOut => "time-out",
        }
    }
    pub fn code(&self) -> u8 {
        *self as u8
    }
    pub fn from_code(c: u8) -> Option<Self> {
        let all = [RejectReason::QueueFull, RejectReason::ConcurrencyLimit, RejectReason::TimeOut];
        all.into_iter().find(|r| r.code() == c)
    }
}

/// Opaque data the engine keeps with each request inside the QueueSet (encoded with it).
/// The QueueSet never interprets it except `wait_deadline` (queued requests still waiting at
/// that time are removed with reason `time-out`) and `owner` (for lease expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestTag {
    /// Worker slot that owns the paused stream (lease holder).
    pub owner: u32,
    /// The owner's stream/context id.
    pub context: u32,
    /// Index of the FlowSchema in the effective policy (for metrics and dumps).
    pub flow_schema: u16,
    /// Flow hash (also identifies the flow in dumps).
    pub flow_hash: u64,
    /// Absolute time at which waiting in queue gives up (`i64::MAX` = never).
    pub wait_deadline: Nanos,
}

/// Queuing parameters of one level: `desired_queues` −1 = exempt, 0 = Reject level (no queues),
/// > 0 = queuing. `concurrency_limit` is the level's CurrentCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSetConfig {
    pub desired_queues: i32,
    pub queue_length_limit: u32,
    pub hand_size: u32,
    pub concurrency_limit: u32,
    /// The limit is never exceeded, not even by a request wider than it, which then waits (or,
    /// without queues, is rejected) until the limit grows. Upstream lets such a request run
    /// alone on an idle level (`queueset.go: canAccommodateSeatsLocked`); in fleet mode the limit
    /// is this replica's share of the fleet's, and running alone would break the fleet's sum.
    pub strict_limit: bool,
}

/// Request identifier, unique within one QueueSet's lifetime.
pub type RequestId = u64;

/// A request that started executing (left its queue) during an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatched {
    pub id: RequestId,
    pub tag: RequestTag,
    /// Time spent waiting in queue.
    pub waited: Nanos,
    /// What the owner must hand back to `QueueSet::finish`.
    pub receipt: Receipt,
}

/// What the owner of an executing request keeps, everything `QueueSet::finish` needs (the
/// QueueSet does not store executing requests, keeping shared values small).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Receipt {
    pub id: RequestId,
    /// Queue index, or −1 for queue-less levels (exempt, Reject).
    pub queue: i32,
    pub owner: u32,
    pub initial_seats: u32,
    /// Seats held while executing (and while lingering).
    pub max_seats: u32,
    /// Dispatch time (for the service-time correction of the queue's virtual finish).
    pub start: Nanos,
    /// Seats are held this long after the handler returns.
    pub additional_latency: Nanos,
}

impl Receipt {
    pub fn encode(&self, w: &mut crate::codec::Writer) {
        w.u64(self.id);
        w.i32(self.queue);
        w.u32(self.owner);
        w.u32(self.initial_seats);
        w.u32(self.max_seats);
        w.i64(self.start);
        w.i64(self.additional_latency);
    }
    pub fn decode(r: &mut crate::codec::Reader) -> crate::codec::CodecResult<Receipt> {
        Ok(Receipt {
            id: r.u64()?,
            queue: r.i32()?,
            owner: r.u32()?,
            initial_seats: r.u32()?,
            max_seats: r.u32()?,
            start: r.i64()?,
            additional_latency: r.i64()?,
        })
    }
}
