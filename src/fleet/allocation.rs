//! The fleet's allocation: a pure, deterministic function from a snapshot of every live
//! replica's seat demand to every replica's seats per priority level (docs/fleet.md, "The
//! allocation"). 1. upstream's borrowing (`apf_controller.go: updateBorrowingLocked`) runs once
//! on the replicas' summed demand ([`fleet_demand`]): each level's fleet CurrentCL; 2. each
//! limited level's CurrentCL is split among the replicas ([`split_seats`]): the minimum
//! [`minimum_share`] each, the rest by demand envelope, largest remainder, ties by replica id;
//! 3. a replica whose widest waiting request needs more seats is raised to that width from the
//! others' surplus, oldest need first ([`make_room_for_wide`]): each replica enforces its seats
//! strictly (upstream's "too wide runs alone", `queueset.go: canAccommodateSeatsLocked`, would
//! break the fleet's sum). Exempt levels are not split; their fleet CurrentCL is reported.

use super::levels::FleetPolicy;
use crate::limits::borrowing::{update_borrowing, BorrowingLevel, BorrowingRegime, SeatDemandStats};

/// The guaranteed minimum is `⌊C / (MIN_SHARE_DIVISOR × N)⌋`: with 8, the replicas without
/// demand keep at most 1/8 of a level's seats, so a replica with all the load gets ≥ 7/8 of them.
pub const MIN_SHARE_DIVISOR: u32 = 8;

/// Demand weights are in thousandths of a seat (exact integer arithmetic from here on).
const WEIGHT_SCALE: f64 = 1000.0;
/// Largest demand envelope that counts (seats); larger values are treated as this.
const MAX_DEMAND_SEATS: f64 = 1e9;

/// One replica's demand as published in its record.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaDemand<'a> {
    pub id: &'a str,
    /// Per level, in the policy's order; missing levels count as no demand.
    pub demand: &'a [SeatDemandStats],
    /// Per level, in the policy's order: the widest request waiting for more seats than the
    /// replica has; missing levels count as none.
    pub wide: &'a [WideNeed],
}

/// A request waiting for more seats than its replica has on a level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WideNeed {
    /// Its seats (MaxSeats); 0: no such request.
    pub seats: u32,
    /// The store revision since which the replica has been waiting for them: its place in line.
    pub since: i64,
}

/// One level of an allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelAllocation {
    pub exempt: bool,
    /// The fleet's CurrentCL for this level.
    pub current: u32,
    /// The guaranteed minimum per replica (0 for exempt levels).
    pub minimum: u32,
    /// Seats per replica, in [`Allocation::replicas`] order (all 0 for exempt levels).
    pub seats: Vec<u32>,
    /// The fleet's summed demand.
    pub demand: SeatDemandStats,
}

/// The allocation computed from one snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Replica ids, sorted and unique.
    pub replicas: Vec<String>,
    /// Per level, in the policy's order.
    pub levels: Vec<LevelAllocation>,
    /// Which regime of `updateBorrowingLocked` applied.
    pub regime: BorrowingRegime,
}

impl Allocation {
    pub fn replica_index(&self, id: &str) -> Option<usize> {
        self.replicas.binary_search_by(|r| r.as_str().cmp(id)).ok()
    }

    /// A replica's seats per level (exempt levels: 0), if it is in the snapshot.
    pub fn seats_of(&self, id: &str) -> Option<Vec<u32>> {
        let i = self.replica_index(id)?;
        debug_assert!(self.levels.iter().all(|l| l.seats.len() == self.replicas.len()), "seats per replica");
        Some(self.levels.iter().map(|l| l.seats.get(i).copied().unwrap_or(0)).collect())
    }

    /// Σ fleet CurrentCL over the limited levels.
    pub fn limited_total(&self) -> u64 {
        self.levels.iter().filter(|l| !l.exempt).map(|l| u64::from(l.current)).sum()
    }

    /// The static share of every level: fleet CurrentCL ÷ the number of replicas (floor).
    pub fn static_shares(&self) -> Vec<u32> {
        self.levels.iter().map(|l| static_share(l.current, self.replicas.len())).collect()
    }
}

/// Non-finite and negative values count as 0.
pub fn clean(x: f64) -> f64 {
    Some(x).filter(|x| x.is_finite() && *x > 0.0).unwrap_or(0.0)
}

/// The fleet's demand for one level: the replicas' statistics summed, except the standard
/// deviation: the square root of the summed variances, what one apiserver would measure if the
/// replicas' loads fluctuate independently (never above the plain sum). The high watermark is an
/// upper bound of the merged peak.
pub fn fleet_demand<'a>(stats: impl IntoIterator<Item = &'a SeatDemandStats>) -> SeatDemandStats {
    let (mut avg, mut var, mut hw, mut smoothed) = (0.0f64, 0.0f64, 0i64, 0.0f64);
    for s in stats {
        avg += clean(s.avg).min(MAX_DEMAND_SEATS);
        var += clean(s.std_dev).min(MAX_DEMAND_SEATS).powi(2);
        hw = hw.saturating_add(s.high_watermark.max(0));
        smoothed += clean(s.smoothed).min(MAX_DEMAND_SEATS);
    }
    SeatDemandStats { avg, std_dev: var.sqrt(), high_watermark: hw, smoothed }
}

/// The minimum every replica gets of a level whose fleet CurrentCL is `current`:
/// `⌊current / (8·N)⌋`, at least 1 seat when `current ≥ N`, 0 when `current < N`.
pub fn minimum_share(current: u32, replicas: usize) -> u32 {
    let n = u32::try_from(replicas).unwrap_or(u32::MAX);
    if n == 0 || current < n {
        return 0;
    }
    (current / n.saturating_mul(MIN_SHARE_DIVISOR)).max(1)
}

/// The static share: `⌊current / N⌋` (used before the first snapshot and as the fallback).
pub fn static_share(current: u32, replicas: usize) -> u32 {
    let n = u32::try_from(replicas).unwrap_or(u32::MAX).max(1);
    current / n
}

/// A replica's weight for the proportional part: its demand envelope (average + standard
/// deviation of the last period) in thousandths of a seat. The envelope rather than the smoothed
/// value (whose half-life is about 30 periods) because seats must follow load that moves between
/// replicas within a few periods (long-lived connections land on one replica); rather than the
/// high watermark because one instant's burst would claim seats for a whole period.
pub fn demand_weight(s: &SeatDemandStats) -> u64 {
    let envelope = (clean(s.avg) + clean(s.std_dev)).min(MAX_DEMAND_SEATS);
    (envelope * WEIGHT_SCALE).round() as u64
}

/// Splits `current` seats among replicas with the given weights (replicas sorted by id, which
/// breaks ties): the minimum each, the rest in proportion to the weights (equally when every
/// weight is 0), integer seats by largest remainder. Σ == `current` when there is a replica.
pub fn split_seats(current: u32, weights: &[u64]) -> Vec<u32> {
    let n = weights.len();
    if n == 0 {
        return Vec::new();
    }
    let minimum = minimum_share(current, n);
    let rest = current.saturating_sub(minimum.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX)));
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let weight = |w: u64| if total == 0 { 1u128 } else { u128::from(w) };
    let denominator = if total == 0 { n as u128 } else { total };
    // Exact quotas rest·w/W: integer parts, and remainders compared over the same denominator.
    let quotas: Vec<(u128, u128)> = weights
        .iter()
        .map(|&w| {
            let x = u128::from(rest) * weight(w);
            (x / denominator, x % denominator)
        })
        .collect();
    let given: u128 = quotas.iter().map(|q| q.0).sum();
    let left = u128::from(rest).saturating_sub(given);
    let mut order: Vec<usize> = (0..n).collect();
    // Largest remainder first; equal remainders go to the replica that sorts first by id.
    order.sort_by_key(|&i| (std::cmp::Reverse(quotas.get(i).map_or(0, |q| q.1)), i));
    let mut seats: Vec<u32> = quotas.iter().map(|q| minimum.saturating_add(u32::try_from(q.0).unwrap_or(u32::MAX))).collect();
    for &i in order.iter().take(usize::try_from(left).unwrap_or(n)) {
        if let Some(s) = seats.get_mut(i) {
            *s = s.saturating_add(1);
        }
    }
    debug_assert_eq!(seats.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(current));
    seats
}

/// Raises the replicas whose widest waiting request needs more seats than they have (`wide`,
/// capped at `current`) to that width, oldest need first (ties by position, i.e. replica id),
/// with seats taken from the others: never below `minimum`, never below a width already
/// satisfied (in this pass or by step 2), largest surplus first (ties: first position). A
/// replica whose need the others cannot cover keeps its seats. Σ seats is unchanged.
pub fn make_room_for_wide(current: u32, minimum: u32, seats: &mut [u32], wide: &[WideNeed]) {
    let need = |i: usize| wide.get(i).map_or(0, |w| w.seats.min(current));
    let at = |s: &[u32], i: usize| s.get(i).copied().unwrap_or(0);
    let mut line: Vec<usize> = (0..seats.len()).filter(|&i| need(i) > at(seats, i)).collect();
    line.sort_by_key(|&i| (wide.get(i).map_or(0, |w| w.since), i));
    let mut served = vec![false; seats.len()];
    for &i in &line {
        // What each other replica may give: its seats above its floor.
        let floor = |s: &[u32], j: usize| {
            let own = need(j);
            if served.get(j).copied().unwrap_or(false) {
                at(s, j)
            } else if own > 0 && own <= at(s, j) {
                own.max(minimum)
            } else {
                minimum
            }
        };
        let surplus = |s: &[u32], j: usize| if j == i { 0 } else { at(s, j).saturating_sub(floor(s, j)) };
        let short = need(i).saturating_sub(at(seats, i));
        let room: u64 = (0..seats.len()).map(|j| u64::from(surplus(seats, j))).sum();
        if room < u64::from(short) {
            continue;
        }
        for _ in 0..short {
            let donor = (0..seats.len()).max_by_key(|&j| (surplus(seats, j), std::cmp::Reverse(j)));
            if let Some(s) = donor.and_then(|j| seats.get_mut(j)) {
                *s = s.saturating_sub(1);
            }
        }
        if let (Some(s), Some(x)) = (seats.get_mut(i), served.get_mut(i)) {
            (*s, *x) = (need(i), true);
        }
    }
}

/// One replica's demand and wide needs per level, in the policy's order.
type Merged<'a> = (&'a str, Vec<SeatDemandStats>, Vec<WideNeed>);

/// The replicas sorted by id, a repeated id merged by taking the larger of each statistic and
/// the larger, older wide need (so that the result does not depend on the order).
fn merge_replicas<'a>(nlevels: usize, replicas: &[ReplicaDemand<'a>]) -> Vec<Merged<'a>> {
    let mut sorted: Vec<Merged<'a>> = Vec::with_capacity(replicas.len());
    let mut input: Vec<&ReplicaDemand<'a>> = replicas.iter().collect();
    input.sort_by(|a, b| a.id.cmp(b.id));
    for r in input {
        let stats = (0..nlevels).map(|i| r.demand.get(i).copied().unwrap_or_default());
        let wide = (0..nlevels).map(|i| r.wide.get(i).copied().unwrap_or_default());
        match sorted.last_mut() {
            Some((id, prev, prev_wide)) if *id == r.id => {
                for (p, w) in prev_wide.iter_mut().zip(wide) {
                    *p = match (p.seats, w.seats) {
                        (0, _) => w,
                        (_, 0) => *p,
                        _ => WideNeed { seats: p.seats.max(w.seats), since: p.since.min(w.since) },
                    };
                }
                for (p, s) in prev.iter_mut().zip(stats) {
                    *p = SeatDemandStats {
                        avg: clean(p.avg).max(clean(s.avg)),
                        std_dev: clean(p.std_dev).max(clean(s.std_dev)),
                        high_watermark: p.high_watermark.max(s.high_watermark),
                        smoothed: clean(p.smoothed).max(clean(s.smoothed)),
                    };
                }
            }
            _ => sorted.push((r.id, stats.collect(), wide.collect())),
        }
    }
    sorted
}

/// The allocation for `replicas` (any order; ids are unique in etcd, a repeated id is merged
/// by taking the larger of each statistic so that the result does not depend on the order).
pub fn allocate(policy: &FleetPolicy, replicas: &[ReplicaDemand<'_>]) -> Allocation {
    let nlevels = policy.levels.len();
    let sorted = merge_replicas(nlevels, replicas);
    let demand: Vec<SeatDemandStats> = (0..nlevels).map(|i| fleet_demand(sorted.iter().filter_map(|(_, d, _)| d.get(i)))).collect();
    // Step 1: one kube-apiserver with the fleet's demand. A failed allocation problem keeps the
    // "previous" CurrentCL upstream; a pure function has none, so it is the initial one.
    let mut borrowing: Vec<BorrowingLevel> = policy
        .levels
        .iter()
        .zip(&demand)
        .map(|(l, d)| BorrowingLevel {
            exempt: l.exempt,
            nominal: l.limits.nominal,
            min: l.limits.min,
            max: l.limits.max,
            stats: *d,
            current: l.limits.initial_current,
        })
        .collect();
    let regime = update_borrowing(&mut borrowing, policy.nominal_sum()).regime;
    // Step 2: split each limited level among the replicas.
    let n = sorted.len();
    let levels = borrowing
        .iter()
        .zip(demand)
        .enumerate()
        .map(|(i, (b, demand))| {
            if b.exempt {
                return LevelAllocation { exempt: true, current: b.current, minimum: 0, seats: vec![0; n], demand };
            }
            let weights: Vec<u64> = sorted.iter().map(|(_, d, _)| d.get(i).map_or(0, demand_weight)).collect();
            let wide: Vec<WideNeed> = sorted.iter().map(|(_, _, w)| w.get(i).copied().unwrap_or_default()).collect();
            let minimum = minimum_share(b.current, n);
            let mut seats = split_seats(b.current, &weights);
            make_room_for_wide(b.current, minimum, &mut seats, &wide);
            LevelAllocation { exempt: false, current: b.current, minimum, seats, demand }
        })
        .collect();
    Allocation { replicas: sorted.into_iter().map(|(id, _, _)| id.to_string()).collect(), levels, regime }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_examples() {
        // 20 seats, 3 replicas: minimum 1 each, the other 17 by demand.
        assert_eq!(split_seats(20, &[0, 15_000, 0]), vec![1, 18, 1]);
        assert_eq!(split_seats(20, &[5_000, 5_000, 5_000]), vec![7, 7, 6]);
        assert_eq!(split_seats(20, &[0, 0, 0]), vec![7, 7, 6]);
        assert_eq!(split_seats(2, &[0, 9, 0]), vec![0, 2, 0]);
        assert_eq!(split_seats(600, &[1, 0, 0]), vec![550, 25, 25]);
        assert_eq!(split_seats(0, &[1, 2]), vec![0, 0]);
        assert!(split_seats(5, &[]).is_empty());
        assert_eq!(split_seats(u32::MAX, &[u64::MAX, u64::MAX]).iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(u32::MAX));
    }

    #[test]
    fn wide_requests_get_room_oldest_first() {
        let w = |seats, since| WideNeed { seats, since };
        // 6 seats, 3 replicas, each with a 4-seat request waiting: the oldest need gets 4.
        let mut seats = split_seats(6, &[4_000, 4_000, 4_000]);
        assert_eq!(seats, vec![2, 2, 2]);
        make_room_for_wide(6, 0, &mut seats, &[w(4, 90), w(4, 80), w(4, 85)]);
        assert_eq!(seats, vec![1, 4, 1]);
        // Donors keep the minimum and widths they already have.
        let mut seats = vec![2, 6, 2, 10];
        make_room_for_wide(20, 2, &mut seats, &[w(5, 7), w(6, 1), w(0, 0), w(0, 0)]);
        assert_eq!(seats, vec![5, 6, 2, 7]);
        // Not enough room: nothing moves; a need wider than the level is capped at it.
        let mut seats = vec![2, 2, 2];
        make_room_for_wide(6, 2, &mut seats, &[w(4, 1), w(0, 0), w(0, 0)]);
        assert_eq!(seats, vec![2, 2, 2]);
        let mut seats = vec![3, 3];
        make_room_for_wide(6, 0, &mut seats, &[w(9, 1), w(0, 0)]);
        assert_eq!(seats, vec![6, 0]);
    }

    #[test]
    fn fleet_demand_sums() {
        let a = SeatDemandStats { avg: 3.0, std_dev: 3.0, high_watermark: 5, smoothed: 4.0 };
        let b = SeatDemandStats { avg: 1.0, std_dev: 4.0, high_watermark: 2, smoothed: f64::NAN };
        let d = fleet_demand([&a, &b]);
        assert_eq!(d, SeatDemandStats { avg: 4.0, std_dev: 5.0, high_watermark: 7, smoothed: 4.0 });
    }
}
