//! The mutating estimator (`mutating_work_estimator.go: estimate`).

use super::*;
use crate::digest::request_info::RequestInfo;
use crate::fairqueuing::WorkEstimate;
use crate::Nanos;

/// Mutating estimator (`mutating_work_estimator.go: estimate`).
pub fn estimate_mutating(cfg: &WorkEstimatorConfig, info: &RequestInfo, pl_max_seats: Option<u32>, watch_count: u32) -> WorkEstimate {
    let mut out = seats(MINIMUM_SEATS);
    // Disabled, or a request exempt from watch events (`isRequestExemptFromWatchEvents`).
    if !cfg.mutating_enabled || (info.resource == "serviceaccounts" && info.subresource == "token") {
        return out;
    }
    let max_seats = clamp_max(pl_max_seats, MAXIMUM_MUTATING_SEATS);
    if f64::from(watch_count) >= WATCHES_PER_SEAT {
        let final_seats = ceil_div_f64(f64::from(watch_count), WATCHES_PER_SEAT);
        // SeatsTimesDuration: seat-seconds in 1e-8 units (ns / 10), rounded.
        let final_work = (final_seats as f64 * EVENT_ADDITIONAL_DURATION as f64 / 10.0).round();
        let capped = final_seats.min(u64::from(max_seats)).max(1);
        // DurationPerSeat: truncating conversion, as Go's time.Duration(float64).
        let latency = final_work / capped as f64 * 10.0;
        out.final_seats = u32::try_from(capped).unwrap_or(max_seats);
        out.additional_latency = if latency.is_finite() && latency < i64::MAX as f64 { latency as Nanos } else { 0 };
    }
    out
}
