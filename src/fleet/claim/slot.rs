//! One priority level's state in a replica's [`super::Fleet`], one per level of its policy (in
//! the policy's order): what the host feeds in (demand, the widest waiting request, seats in
//! use), what etcd holds of it (the claim, the granted seats) and the safe mode's cap.

use crate::limits::borrowing::SeatDemandStats;

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct LevelSlot {
    /// Seat demand statistics, published with the next write.
    pub(super) demand: SeatDemandStats,
    /// The widest request waiting for more seats than the local limit (0: none), and the
    /// revision since which it has been waiting for them.
    pub(super) wide: u32,
    pub(super) wide_since: i64,
    /// Seats in use as last reported.
    pub(super) in_use: u32,
    /// The claim last seen in etcd (kept when the record is lost).
    pub(super) claim: u32,
    /// The seats a confirmed write was granted by the fleet check: the replica admits only
    /// below them (kept when the record is lost, for the fallback).
    pub(super) granted: u32,
    /// Safe mode after etcd lost its data: the limit's cap.
    pub(super) recovery_cap: u32,
}

/// A per-level value (0 past the end).
pub(super) fn at(v: &[u32], i: usize) -> u32 {
    debug_assert!(i < v.len() || v.is_empty(), "level {i} of {}", v.len());
    v.get(i).copied().unwrap_or(0)
}
