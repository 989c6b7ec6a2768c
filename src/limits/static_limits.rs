//! Static per-level concurrency values, recomputed on every configuration change: NominalCL,
//! LendableCL, BorrowingCL, MinCL, MaxCL, the initial CurrentCL, and the per-level max seats
//! (`apf_controller.go`, `finishQueueSetReconfigsLocked`).
//!
//! Float semantics follow Go exactly: `ceil(float64(ServerCL) * float64(NCS) / shareSum)`,
//! `math.Round` (half away from zero, = Rust `f64::round`) for lendable / borrowing, integer
//! division for `NominalCL / handSize` and `LendableCL / 2`. Float→integer casts saturate.
use crate::policy::model::{PriorityLevel, PriorityLevelSpec};

/// Fraction of a level's NominalCL one request may occupy (`priorityLevelMaxSeatsPercent`).
pub const PRIORITY_LEVEL_MAX_SEATS_FRACTION: f64 = 0.15;

/// Static limits of one priority level (same order as the policy's `priority_levels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LevelLimits {
    /// NominalCL.
    pub nominal: u32,
    /// LendableCL.
    pub lendable: u32,
    /// BorrowingCL (ServerCL when unlimited, and for exempt levels).
    pub borrowing: u32,
    /// MinCL = NominalCL − LendableCL.
    pub min: u32,
    /// MaxCL = NominalCL + BorrowingCL.
    pub max: u32,
    /// plMaxSeats for Queue levels, `None` for Reject and Exempt levels.
    pub max_seats: Option<u32>,
    /// CurrentCL of a brand-new level: NominalCL − LendableCL div 2.
    pub initial_current: u32,
}

/// `round(nominal × percent / 100)` with Go's `math.Round`.
fn percent_of(nominal: u32, percent: i32) -> u32 {
    (f64::from(nominal) * f64::from(percent) / 100.0).round() as u32
}

/// `apf_controller.go: finishQueueSetReconfigsLocked`:
/// `max(1, min(ceil(NominalCL × 0.15), NominalCL div handSize))`.
pub fn max_seats(nominal: u32, hand_size: i32) -> u32 {
    let seats = (f64::from(nominal) * PRIORITY_LEVEL_MAX_SEATS_FRACTION).ceil() as u32;
    let with_hand = u32::try_from(hand_size).ok().and_then(|h| nominal.checked_div(h));
    seats.min(with_hand.unwrap_or(u32::MAX)).max(1)
}

/// Computes every level's static limits and `nominalCLSum` (which may exceed `server_cl`
/// because of the ceil rounding). `shareSum` covers all levels, Exempt ones included.
pub fn compute_limits(server_cl: u32, levels: &[PriorityLevel]) -> (Vec<LevelLimits>, u32) {
    let shares = |l: &PriorityLevel| f64::from(l.nominal_concurrency_shares().max(0));
    let share_sum: f64 = levels.iter().map(shares).sum();
    let limits: Vec<LevelLimits> = levels
        .iter()
        .map(|l| {
            let nominal = if share_sum > 0.0 { (f64::from(server_cl) * shares(l) / share_sum).ceil() as u32 } else { 0 };
            let lendable = percent_of(nominal, l.lendable_percent()).min(nominal);
            let (borrowing, seats) = match &l.spec {
                PriorityLevelSpec::Exempt { .. } => (server_cl, None),
                PriorityLevelSpec::Limited { borrowing_limit_percent, .. } => (
                    borrowing_limit_percent.map_or(server_cl, |p| percent_of(nominal, p)),
                    l.queuing().map(|q| max_seats(nominal, q.hand_size)),
                ),
            };
            LevelLimits {
                nominal,
                lendable,
                borrowing,
                min: nominal.saturating_sub(lendable),
                max: nominal.saturating_add(borrowing),
                max_seats: seats,
                initial_current: nominal.saturating_sub(lendable / 2),
            }
        })
        .collect();
    let sum = limits.iter().fold(0u32, |s, l| s.saturating_add(l.nominal));
    (limits, sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::{LimitResponse, Queuing};

    #[test]
    fn max_seats_vectors_6_3() {
        // (nominalCL, handSize) → plMaxSeats (max_seats_test.go).
        for (n, h, want) in
            [(5, 6, 1), (10, 6, 1), (15, 6, 2), (20, 6, 3), (35, 6, 5), (100, 6, 15), (200, 6, 30), (10, 1, 2), (100, 20, 5)]
        {
            assert_eq!(max_seats(n, h), want, "nominal {n} hand {h}");
        }
    }

    #[test]
    fn max_seats_via_single_level_with_huge_shares() {
        // max_seats_test.go uses one PL with NCS 10000 next to the imagined exempt (0) and
        // catch-all (5): NominalCL = ceil(ServerCL × 10000 / 10005) = ServerCL.
        for (server, h, want) in
            [(5u32, 6, 1), (10, 6, 1), (15, 6, 2), (20, 6, 3), (35, 6, 5), (100, 6, 15), (200, 6, 30), (10, 1, 2), (100, 20, 5)]
        {
            let levels = vec![
                PriorityLevel {
                    name: "test-pl".into(),
                    uid: String::new(),
                    spec: PriorityLevelSpec::Limited {
                        nominal_concurrency_shares: 10000,
                        lendable_percent: 0,
                        borrowing_limit_percent: None,
                        limit_response: LimitResponse::Queue(Queuing { queues: 128, hand_size: h, queue_length_limit: 100 }),
                    },
                },
                PriorityLevel {
                    name: "exempt".into(),
                    uid: String::new(),
                    spec: PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 },
                },
            ];
            let (lim, _) = compute_limits(server, &levels);
            assert_eq!(lim[0].nominal, server);
            assert_eq!(lim[0].max_seats, Some(want));
            assert_eq!(lim[1].max_seats, None);
        }
    }

    #[test]
    fn zero_shares_everywhere_gives_zero() {
        let levels = vec![PriorityLevel {
            name: "exempt".into(),
            uid: String::new(),
            spec: PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 },
        }];
        let (lim, sum) = compute_limits(600, &levels);
        assert_eq!(sum, 0);
        assert_eq!(lim[0].nominal, 0);
        assert_eq!(lim[0].max, 600);
    }
}
