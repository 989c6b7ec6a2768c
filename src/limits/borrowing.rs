//! Seat-demand statistics and the periodic CurrentCL adjustment (upstream
//! `apf_controller.go`: `seatDemandStats.update`, `updateBorrowingLocked`).
//!
//! Every `BORROWING_ADJUSTMENT_PERIOD` (10 s) and right after every config digest, the engine
//! resets each level's seat-demand integrator, feeds the results to [`SeatDemandStats::update`]
//! and then calls [`update_borrowing`], which sets every level's `current` (CurrentCL) in one of
//! three regimes:
//! 1. `remaining ≤ Σ MinCL` → every non-exempt level gets its MinCL;
//! 2. `remaining ≤ Σ MinCurrentCL` → MinCL plus a `shareFrac` of `MinCurrentCL − MinCL`;
//! 3. otherwise `computeConcurrencyAllocation(nominalCLSum, items)` (the code passes
//!    `nominalCLSum`, not `remaining`, and we reproduce that), on error the previous values stay.
//!
//! Exempt levels get `max(MinCL, highWatermark)` and that is subtracted from `remaining`.

use super::conc_alloc::{compute_concurrency_allocation, go_max, AllocError, AllocProblemItem};
use super::integrator::IntegratorResults;
use crate::codec::{CodecResult, Reader, Writer};
use crate::Nanos;

/// `seatDemandSmoothingCoefficient` (half-life ≈ 30 periods ≈ 5 min).
pub const SEAT_DEMAND_SMOOTHING_COEFFICIENT: f64 = 0.977;
/// `borrowingAdjustmentPeriod`.
pub const BORROWING_ADJUSTMENT_PERIOD: Nanos = 10 * crate::NANOS_PER_SEC;

/// Per-level seat-demand statistics (upstream `seatDemandStats`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SeatDemandStats {
    pub avg: f64,
    pub std_dev: f64,
    /// `round(Max)` of the last period.
    pub high_watermark: i64,
    pub smoothed: f64,
}

impl SeatDemandStats {
    /// Fold in one period's integrator results.
    pub fn update(&mut self, obs: &IntegratorResults) {
        // Go's `int(math.Round(x))` made total: NaN → 0, out-of-range saturates.
        self.high_watermark = obs.max.round() as i64;
        if obs.duration_secs <= 0.0 || obs.duration_secs.is_nan() {
            return;
        }
        let deviation = if obs.deviation.is_nan() { 0.0 } else { obs.deviation };
        self.avg = obs.average;
        self.std_dev = deviation;
        let envelope = obs.average + deviation;
        let c = SEAT_DEMAND_SMOOTHING_COEFFICIENT;
        self.smoothed = go_max(envelope, c * self.smoothed + (1.0 - c) * envelope);
    }

    pub fn encode(&self, w: &mut Writer) {
        w.f64(self.avg);
        w.f64(self.std_dev);
        w.i64(self.high_watermark);
        w.f64(self.smoothed);
    }

    pub fn decode(r: &mut Reader<'_>) -> CodecResult<Self> {
        Ok(SeatDemandStats { avg: r.f64()?, std_dev: r.f64()?, high_watermark: r.i64()?, smoothed: r.f64()? })
    }
}

/// One priority level as seen by the borrowing adjustment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BorrowingLevel {
    pub exempt: bool,
    /// NominalCL.
    pub nominal: u32,
    /// MinCL = NominalCL − LendableCL.
    pub min: u32,
    /// MaxCL = NominalCL + BorrowingCL.
    pub max: u32,
    pub stats: SeatDemandStats,
    /// CurrentCL (input: previous value, output: new value).
    pub current: u32,
}

impl BorrowingLevel {
    /// `MinCurrentCL` of `updateBorrowingLocked` for this level with its current stats.
    pub fn min_current(&self) -> i64 {
        let hw = self.stats.high_watermark;
        (self.min as i64).max(if self.exempt { hw } else { (self.nominal as i64).min(hw) })
    }
}

/// Which of the three regimes of `updateBorrowingLocked` applied.
#[derive(Debug, Clone, PartialEq)]
pub enum BorrowingRegime {
    /// No non-exempt level and a positive nominal sum: nothing was changed (upstream returns).
    NoLevels,
    /// `remaining ≤ Σ MinCL`.
    AllMin,
    /// `remaining ≤ Σ MinCurrentCL`, with `shareFrac`.
    Shared { share_frac: f64 },
    /// Allocation problem solved.
    Allocated,
    /// Allocation problem failed (why): previous CurrentCLs kept.
    AllocationFailed(AllocError),
}

/// Result of one adjustment (for metrics and logs).
#[derive(Debug, Clone, PartialEq)]
pub struct BorrowingOutcome {
    pub regime: BorrowingRegime,
    /// `seat_fair_frac` metric: fairProp in the allocated regime, else 0.
    pub fair_frac: f64,
}

/// Recompute every level's `current` (upstream `updateBorrowingLocked`, after the stats update).
pub fn update_borrowing(levels: &mut [BorrowingLevel], nominal_sum: u32) -> BorrowingOutcome {
    let mut items: Vec<AllocProblemItem> = Vec::with_capacity(levels.len());
    // `remaining` = `nominalCLSum − Σ exempt MinCurrentCL`.
    let (mut min_cl_sum, mut min_current_cl_sum, mut remaining) = (0i64, 0i64, i64::from(nominal_sum));
    for l in levels.iter() {
        let mc = l.min_current();
        if l.exempt {
            remaining = remaining.saturating_sub(mc);
        } else {
            let target = go_max(mc as f64, l.stats.smoothed);
            items.push(AllocProblemItem { lower_bound: mc as f64, upper_bound: l.max as f64, target });
            min_cl_sum = min_cl_sum.saturating_add(l.min as i64);
            min_current_cl_sum = min_current_cl_sum.saturating_add(mc);
        }
    }
    if items.is_empty() && nominal_sum > 0 {
        return BorrowingOutcome { regime: BorrowingRegime::NoLevels, fair_frac: 0.0 };
    }
    let (mut allocs, mut fair_frac) = (Vec::new(), 0.0);
    let regime = if remaining <= min_cl_sum {
        BorrowingRegime::AllMin
    } else if remaining <= min_current_cl_sum {
        // Here min_current_cl_sum > min_cl_sum, so the division is safe.
        let den = min_current_cl_sum.saturating_sub(min_cl_sum);
        let share_frac = if den > 0 { (remaining - min_cl_sum) as f64 / den as f64 } else { 1.0 };
        BorrowingRegime::Shared { share_frac }
    } else {
        match compute_concurrency_allocation(nominal_sum as i64, &items) {
            Ok(solution) => {
                (allocs, fair_frac) = solution;
                BorrowingRegime::Allocated
            }
            Err(e) => BorrowingRegime::AllocationFailed(e),
        }
    };
    // The non-exempt levels' allocations, in order.
    let mut allocs = allocs.into_iter();
    for l in levels.iter_mut() {
        let mc = l.min_current();
        let new_cl: i64 = match regime {
            _ if l.exempt => mc,
            BorrowingRegime::AllMin => l.min as i64,
            BorrowingRegime::Shared { share_frac } => {
                (l.min as i64).saturating_add(((mc - l.min as i64) as f64 * share_frac).round() as i64)
            }
            BorrowingRegime::Allocated => allocs.next().map_or(l.current as i64, |a| a.round() as i64),
            BorrowingRegime::AllocationFailed(_) | BorrowingRegime::NoLevels => l.current as i64,
        };
        l.current = new_cl.clamp(0, u32::MAX as i64) as u32;
    }
    BorrowingOutcome { regime, fair_frac }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_update_rules() {
        let mut s = SeatDemandStats::default();
        s.update(&IntegratorResults { duration_secs: 0.0, average: f64::NAN, deviation: f64::NAN, min: 0.0, max: 2.5 });
        assert_eq!(s, SeatDemandStats { high_watermark: 3, ..Default::default() });
        s.update(&IntegratorResults { duration_secs: 10.0, average: 4.0, deviation: f64::NAN, min: 0.0, max: 4.0 });
        assert_eq!((s.avg, s.std_dev, s.smoothed, s.high_watermark), (4.0, 0.0, 4.0, 4));
        s.update(&IntegratorResults { duration_secs: 10.0, average: 1.0, deviation: 1.0, min: 0.0, max: 2.0 });
        assert!((s.smoothed - (0.977 * 4.0 + 0.023 * 2.0)).abs() < 1e-12);
        let mut w = Writer::new();
        s.encode(&mut w);
        let b = w.into_bytes();
        assert_eq!(SeatDemandStats::decode(&mut Reader::new(&b)).unwrap(), s);
        for n in 0..b.len() {
            assert!(SeatDemandStats::decode(&mut Reader::new(&b[..n])).is_err());
        }
    }

    #[test]
    fn nan_and_huge_inputs_do_not_panic() {
        let mut l = BorrowingLevel { exempt: false, nominal: 10, min: 5, max: 20, stats: SeatDemandStats::default(), current: 7 };
        l.stats.update(&IntegratorResults { duration_secs: 1.0, average: f64::NAN, deviation: 0.0, min: 0.0, max: f64::INFINITY });
        let mut ex = BorrowingLevel { exempt: true, nominal: 0, min: 0, max: 600, stats: SeatDemandStats::default(), current: 0 };
        ex.stats.high_watermark = i64::MAX;
        let mut levels = [l, ex];
        let out = update_borrowing(&mut levels, u32::MAX);
        assert_eq!(out.regime, BorrowingRegime::AllMin);
        assert_eq!(levels[0].current, 5);
        assert_eq!(levels[1].current, u32::MAX);
        levels[0].current = 7;
        let out = update_borrowing(&mut levels[..1], 30);
        assert!(matches!(out.regime, BorrowingRegime::AllocationFailed(_)));
        assert_eq!(levels[0].current, 7);
        let out = update_borrowing(&mut [], 5);
        assert_eq!(out.regime, BorrowingRegime::NoLevels);
    }
}
