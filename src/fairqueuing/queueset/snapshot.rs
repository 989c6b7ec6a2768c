//! Debug views of a QueueSet, for upstream's `dump_queues` / `dump_requests`
//! (`apf_controller_debug.go`).

use super::{qkey, request_work, sat_u32, Counters, ExecutingByOwner, Linger, QueueSet};
use crate::fairqueuing::seat_seconds::SeatSeconds;
use crate::fairqueuing::RequestId;
use crate::Nanos;

impl QueueSet {
    pub fn snapshot(&self) -> QueueSetSnapshot {
        let executing_of = |queue: i32| self.execs.iter().filter(|e| e.queue == queue).copied().collect();
        let lingering_of = |queue: i32| {
            let mut v: Vec<Linger> = self.lingers.iter().filter(|l| l.queue == queue).copied().collect();
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
            seats_waiting: sat_u32(self.tot_seats_waiting),
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
                            total_work: request_work(&w.work, self.g).1.to_string(),
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
}

/// Debug view of a QueueSet (for `dump_queues` / `dump_requests`).
#[derive(Debug, Clone, PartialEq)]
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
    pub queueless_lingering: Vec<Linger>,
}

#[derive(Debug, Clone, PartialEq)]
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
    pub lingering: Vec<Linger>,
}

#[derive(Debug, Clone, PartialEq)]
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
