//! The priority levels as the fleet sees them: the static per-level limits computed from the
//! fleet limit (`serverConcurrencyLimit`) exactly as the engine computes them for one process
//! (`limits::static_limits::compute_limits`, upstream `apf_controller.go:
//! finishQueueSetReconfigsLocked`).

use crate::config::PluginConfig;
use crate::digest::work_estimate::MAXIMUM_LIST_SEATS_SIZE_BASED;
use crate::limits::static_limits::{compute_limits, LevelLimits};
use crate::policy::model::PriorityLevel;

/// One priority level's static values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLevel {
    pub name: String,
    /// Exempt levels are never limited; their demand still counts (it lowers `remaining` in
    /// `updateBorrowingLocked`).
    pub exempt: bool,
    pub limits: LevelLimits,
    /// The most seats that can wait on one replica: queues × queueLengthLimit × the widest
    /// request ([`queue_seats`]); 0 for levels without queues; `u64::MAX` when unknown (the
    /// replicas' demand on the level is then not bounded).
    pub queue_seats: u64,
}

/// The most seats that can wait on one replica at a level: `queues × queueLengthLimit` requests
/// (upstream rejects a request whose queue is full, `queueset.go: rejectOrEnqueueToBoundLocked`),
/// each at most as wide as the work estimator makes a request there: `plMaxSeats`, itself
/// capped at the estimator's largest width (`work_estimate::clamp_max`, upstream
/// `request/list_work_estimator.go: estimate`).
pub fn queue_seats(level: &PriorityLevel, limits: &LevelLimits) -> u64 {
    let Some(q) = level.queuing() else { return 0 };
    let requests = u64::try_from(q.queues).unwrap_or(0).saturating_mul(u64::try_from(q.queue_length_limit).unwrap_or(0));
    requests.saturating_mul(u64::from(widest_request(limits)))
}

/// The widest request the work estimator makes at a level (`work_estimate::clamp_max`).
pub fn widest_request(limits: &LevelLimits) -> u32 {
    limits.max_seats.filter(|&m| m != 0 && m <= MAXIMUM_LIST_SEATS_SIZE_BASED).unwrap_or(MAXIMUM_LIST_SEATS_SIZE_BASED)
}

/// `v` (in an old policy's level order) in a new policy's order: `map` names each new level's
/// old index; a level new to the policy gets `fill`.
pub fn remap<T: Clone>(v: &[T], map: &[Option<usize>], fill: T) -> Vec<T> {
    map.iter().map(|m| m.and_then(|i| v.get(i).cloned()).unwrap_or_else(|| fill.clone())).collect()
}

/// The fleet limit and its levels (in the policy's order, which the engine also uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPolicy {
    /// `serverConcurrencyLimit`: the limit of the whole fleet.
    pub server_concurrency_limit: u32,
    pub levels: Vec<FleetLevel>,
}

impl FleetPolicy {
    /// The static limits of `levels` at the fleet limit `server_cl`.
    pub fn new(server_cl: u32, levels: &[PriorityLevel]) -> FleetPolicy {
        FleetPolicy::with_limits(server_cl, levels, &compute_limits(server_cl, levels).0)
    }

    /// The levels of a parsed plugin configuration (its limits are already computed).
    pub fn from_config(cfg: &PluginConfig) -> FleetPolicy {
        FleetPolicy::with_limits(cfg.server_concurrency_limit, &cfg.policy.priority_levels, &cfg.limits)
    }

    fn with_limits(server_cl: u32, levels: &[PriorityLevel], limits: &[LevelLimits]) -> FleetPolicy {
        let level = |(l, limits): (&PriorityLevel, &LevelLimits)| FleetLevel {
            name: l.name.clone(),
            exempt: l.is_exempt(),
            queue_seats: queue_seats(l, limits),
            limits: *limits,
        };
        FleetPolicy { server_concurrency_limit: server_cl, levels: levels.iter().zip(limits).map(level).collect() }
    }

    /// `nominalCLSum`: Σ NominalCL over every level, exempt ones included (upstream passes it to
    /// `updateBorrowingLocked`; the ceil rounding may make it exceed the fleet limit).
    pub fn nominal_sum(&self) -> u32 {
        self.levels.iter().fold(0u32, |s, l| s.saturating_add(l.limits.nominal))
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.levels.iter().position(|l| l.name == name)
    }

    /// Whether the level `name` is in the policy and limited (not exempt).
    pub fn is_limited(&self, name: &str) -> bool {
        self.levels.iter().any(|l| l.name == name && !l.exempt)
    }

    /// How many levels are limited (not exempt).
    pub fn limited_levels(&self) -> usize {
        self.levels.iter().filter(|l| !l.exempt).count()
    }

    /// The largest possible fleet CurrentCL of level `i`: `min(MaxCL, nominalCLSum − Σ MinCL of
    /// the other limited levels)` (upstream `updateBorrowingLocked`: at most MaxCL, every other
    /// level at least MinCL out of `computeConcurrencyAllocation`'s required sum; the other
    /// regimes give at most NominalCL). `None` for exempt or unknown levels.
    pub fn level_max(&self, i: usize) -> Option<u32> {
        let level = self.levels.get(i).filter(|l| !l.exempt)?;
        let others: u64 = self.levels.iter().enumerate().filter(|(j, l)| *j != i && !l.exempt).map(|(_, l)| u64::from(l.limits.min)).sum();
        let room = u64::from(self.nominal_sum()).saturating_sub(others);
        Some(u32::try_from(room.min(u64::from(level.limits.max))).unwrap_or(u32::MAX))
    }

    /// The largest Σ fleet CurrentCL over the limited levels: `nominalCLSum` plus one seat per
    /// two limited levels (upstream rounds each level's allocation to the nearest integer).
    pub fn max_total(&self) -> u64 {
        u64::from(self.nominal_sum()).saturating_add(self.limited_levels() as u64 / 2)
    }

    /// The most seats any replica can hold on one limited level, executing or waiting: the
    /// largest Σ fleet CurrentCL plus the largest queue capacity of any level. One bound for
    /// every level on purpose: a replica still running the previous policy in a rolling change
    /// of the levels' shares or queues stays within it.
    pub fn demand_bound(&self) -> u64 {
        let queues = self.levels.iter().filter(|l| !l.exempt).map(|l| l.queue_seats).max().unwrap_or(0);
        self.max_total().saturating_add(queues)
    }

    /// The widest request that can wait for seats on a limited level (`wide` in a record): the
    /// largest Σ fleet CurrentCL, or the widest request of any level when larger (a level with
    /// fewer seats than one request still queues it). One bound for every level.
    pub fn wide_bound(&self) -> u64 {
        let widest = self.levels.iter().filter(|l| !l.exempt).map(|l| widest_request(&l.limits)).max().unwrap_or(0);
        self.max_total().max(u64::from(widest))
    }
}
