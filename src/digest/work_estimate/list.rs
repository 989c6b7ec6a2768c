//! The LIST estimator (`list_work_estimator.go: estimate`), which also costs a WATCH with
//! initial events (`WatchList` gate), and how a WATCH's initial phase ends.

use super::*;
use crate::digest::request_info::RequestInfo;
use crate::fairqueuing::WorkEstimate;

/// How a WATCH's initial phase ends, for holding its seats until then (upstream holds them
/// until the storage layer signals that the initial events were sent: `apf_filter.go`'s
/// watch initialization signal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WatchInit {
    /// No initial events (`resourceVersion` set, no `sendInitialEvents=true`): nothing to hold.
    #[default]
    None,
    /// `sendInitialEvents=true`: the initial events end with the `k8s.io/initial-events-end`
    /// bookmark.
    Bookmark,
    /// Legacy watch with initial state (`resourceVersion` "" or "0"): no end marker.
    Unmarked,
}

/// Which initial phase a WATCH has (`None` for other verbs).
pub fn watch_init(info: &RequestInfo) -> WatchInit {
    if info.verb != "watch" {
        return WatchInit::None;
    }
    let rv = &info.query.resource_version;
    match info.query.send_initial_events {
        Some(true) => WatchInit::Bookmark,
        None if rv.is_empty() || rv == "0" => WatchInit::Unmarked,
        _ => WatchInit::None,
    }
}

/// `ShouldDelegateListMeta(opts, CacheWithoutSnapshots)` → true = served from storage.
pub fn list_from_storage(info: &RequestInfo, consistent_reads_from_cache: bool) -> bool {
    let q = &info.query;
    let rv = q.resource_version.as_str();
    match q.resource_version_match.as_str() {
        "NotOlderThan" => false,
        // Legacy exact match, a continue token, a consistent read.
        "" => {
            (q.limit > 0 && !rv.is_empty() && rv != "0") || !q.continue_token.is_empty() || (rv.is_empty() && !consistent_reads_from_cache)
        }
        // "Exact", and any other value.
        _ => true,
    }
}

/// LIST estimator (`list_work_estimator.go: estimate`) with an explicit stats lookup result.
pub fn estimate_list_with_stats(
    cfg: &WorkEstimatorConfig,
    info: &RequestInfo,
    pl_max_seats: Option<u32>,
    stats: StatsLookup,
) -> WorkEstimate {
    let max_seats = if cfg.size_based_list_cost { MAXIMUM_LIST_SEATS_SIZE_BASED } else { MAXIMUM_LIST_SEATS_COUNT_BASED };
    let max_seats = clamp_max(pl_max_seats, max_seats);
    let matches_single = !info.name.is_empty();
    let q = &info.query;
    if q.options_error {
        return seats(max_seats);
    }
    // A WATCH with no initial events: neither `sendInitialEvents=true` nor a legacy RV.
    let legacy = q.resource_version.is_empty() || q.resource_version == "0";
    if info.verb == "watch" && q.send_initial_events != Some(true) && !legacy {
        return seats(MINIMUM_SEATS);
    }
    let from_cache = info.verb == "watch" || !list_from_storage(info, cfg.consistent_reads_from_cache);
    let stats = match stats {
        StatsLookup::Found(s) => s,
        StatsLookup::NotFound => return seats(MINIMUM_SEATS),
        StatsLookup::Stale | StatsLookup::OtherError => {
            ObjectStats { count: INFINITE_OBJECT_COUNT, average_object_size_bytes: MAX_OBJECT_SIZE }
        }
    };
    let has_selector = !q.field_selector.is_empty() || !q.label_selector.is_empty();
    let n = if cfg.size_based_list_cost {
        seats_based_on_object_size(stats, q.limit, has_selector, from_cache, matches_single)
    } else {
        seats_based_on_object_count(stats, q.limit, has_selector, from_cache, matches_single)
    };
    let n = n.clamp(u64::from(MINIMUM_SEATS), u64::from(max_seats.max(MINIMUM_SEATS)));
    seats(u32::try_from(n).unwrap_or(max_seats))
}

/// Count-based formula (gate off; 1.23–1.33), unclamped.
pub fn seats_based_on_object_count(stats: ObjectStats, limit: i64, has_selector: bool, from_cache: bool, matches_single: bool) -> u64 {
    let num_stored = stats.count;
    let limited = if limit > 0 && limit < num_stored { limit } else { num_stored };
    let objects = match (matches_single, from_cache, has_selector) {
        (true, _, _) => 1,
        (_, true, _) => num_stored,
        (_, _, true) => num_stored.saturating_add(limited),
        _ => limited.saturating_mul(2),
    };
    ceil_div_f64(objects as f64, OBJECTS_PER_SEAT)
}

/// Size-based formula (gate on; 1.34+), unclamped.
pub fn seats_based_on_object_size(mut stats: ObjectStats, limit: i64, has_selector: bool, from_cache: bool, matches_single: bool) -> u64 {
    if stats.average_object_size_bytes <= 0 && stats.count != 0 {
        stats.average_object_size_bytes = MAX_OBJECT_SIZE;
    }
    let limited = if limit > 0 && limit < stats.count { limit } else { stats.count };
    let objects = match (matches_single, from_cache, has_selector) {
        (true, _, _) => 1,
        (_, false, true) => limited.max(stats.count / 2),
        _ => limited,
    };
    let mut bytes = objects.saturating_mul(stats.average_object_size_bytes);
    if from_cache {
        bytes = bytes.min(CACHE_WITH_STREAMING_MAX_MEMORY_USAGE);
    }
    ceil_div_f64(bytes as f64, BYTES_PER_SEAT as f64)
}
