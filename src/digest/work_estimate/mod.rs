//! Work estimation: how many seats a request occupies (upstream `request/width.go`), with
//! upstream's defaults (`DefaultWorkEstimatorConfig`, `WatchList` gate on,
//! `SizeBasedListCostEstimate` on ⇒ LIST max 100 seats, mutating max 10).
//!
//! Dispatch by verb (`width.go: workEstimator.estimate`): `list` → LIST estimator
//! (`list_work_estimator.go: estimate`); `watch` → LIST estimator (WatchList gate on);
//! `create`/`update`/`patch`/`delete` → mutating estimator
//! (`mutating_work_estimator.go: estimate`); anything else → 1.
//!
//! A proxy cannot see the apiserver's object-count tracker (`object_count_tracker.go`), so object
//! counts and average sizes come from the `objectCounts` table of the configuration, keyed
//! `resource` (core group) or `group/resource`. A resource absent from the table behaves like
//! upstream's `ObjectCountNotFoundErr` ⇒ 1 seat. The stale / tracker-error branches exist in
//! [`estimate_list_with_stats`] for fidelity but the configuration cannot produce them.
//!
//! Serving from cache or storage follows `ShouldDelegateListMeta` with `CacheWithoutSnapshots`
//! (`delegator/interface.go`, as called from `list_work_estimator.go: estimate`); whether
//! consistent reads (`resourceVersion=""`) are served from the watch cache (etcd supports
//! `RequestWatchProgress`) is the knob `consistentReadsFromCache` (default false, as in upstream's
//! unit tests).

//!
//! - `list`: the LIST estimator and watches' initial phase; `mutating`: the mutating estimator;
//!   `watch_tracker`: open watches.

mod config_error;
mod list;
mod mutating;
mod watch_tracker;

pub use config_error::WorkEstimatorError;
pub use list::*;
pub use mutating::*;
pub use watch_tracker::*;

use crate::digest::request_info::RequestInfo;
use crate::fairqueuing::WorkEstimate;
use crate::Nanos;
use serde::Deserialize;
use std::collections::BTreeMap;
pub const MINIMUM_SEATS: u32 = 1;
pub const MAXIMUM_LIST_SEATS_SIZE_BASED: u32 = 100;
pub const MAXIMUM_LIST_SEATS_COUNT_BASED: u32 = 10;
pub const MAXIMUM_MUTATING_SEATS: u32 = 10;
pub const OBJECTS_PER_SEAT: f64 = 100.0;
pub const WATCHES_PER_SEAT: f64 = 10.0;
pub const EVENT_ADDITIONAL_DURATION: Nanos = 5_000_000;
pub const BYTES_PER_SEAT: i64 = 100_000;
pub const CACHE_WITH_STREAMING_MAX_MEMORY_USAGE: i64 = 1_000_000;
pub const MAX_OBJECT_SIZE: i64 = 1_500_000;
pub const INFINITE_OBJECT_COUNT: i64 = 1_000_000_000;

/// One `objectCounts` entry: a bare count, or `{count, averageObjectSizeBytes}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ObjectCountEntry {
    Count(i64),
    Detailed(ObjectStats),
}

/// Upstream `storage.Stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectStats {
    pub count: i64,
    #[serde(default)]
    pub average_object_size_bytes: i64,
}

/// `"workEstimator"` key of the plugin configuration; absent fields take [`Default`]'s values.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkEstimatorConfig {
    /// `resource` (core) or `group/resource` → count or `{count, averageObjectSizeBytes}`.
    pub object_counts: BTreeMap<String, ObjectCountEntry>,
    /// Average object size for bare-count entries (0 = upstream's 1.5 MB stand-in).
    pub default_average_object_size_bytes: i64,
    /// Consistent LISTs (`resourceVersion` unset) are served from the watch cache.
    pub consistent_reads_from_cache: bool,
    /// Feature gate `SizeBasedListCostEstimate` (default on; off = count-based, max 10 seats).
    pub size_based_list_cost: bool,
    /// Feature gate `WatchList` (default on: watches with initial events are costed as LISTs).
    pub watch_list: bool,
    /// Mutating estimator enabled (default on).
    pub mutating_enabled: bool,
    /// Object counts and sizes from the cluster's `/metrics` (resolved into
    /// `PluginConfig::cluster_metrics`; `false` turns off the default that `clusterPolicy` implies).
    pub cluster_metrics: Option<serde_json::Value>,
    /// The longest a WATCH holds its seats while its initial state streams (a Go duration;
    /// resolved into `PluginConfig::watch_initial_events_max_hold`).
    pub watch_initial_events_max_hold: Option<String>,
    /// Our extension: learn LIST costs from complete JSON LIST responses of resources with no
    /// count from the table or the cluster (`crate::digest::list_size`).
    pub learn_from_responses: bool,
}

impl Default for WorkEstimatorConfig {
    fn default() -> Self {
        WorkEstimatorConfig {
            object_counts: BTreeMap::new(),
            default_average_object_size_bytes: 0,
            consistent_reads_from_cache: false,
            size_based_list_cost: true,
            watch_list: true,
            mutating_enabled: true,
            cluster_metrics: None,
            watch_initial_events_max_hold: None,
            learn_from_responses: false,
        }
    }
}

/// Result of the object-count lookup (upstream `statsGetterFn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsLookup {
    Found(ObjectStats),
    NotFound,
    Stale,
    OtherError,
}

impl WorkEstimatorConfig {
    /// Object stats for (group, resource) from the `objectCounts` table alone.
    pub fn stats(&self, group: &str, resource: &str) -> StatsLookup {
        let average_object_size_bytes = self.default_average_object_size_bytes;
        match get_by_resource(&self.object_counts, group, resource) {
            None => StatsLookup::NotFound,
            Some(&ObjectCountEntry::Count(count)) => StatsLookup::Found(ObjectStats { count, average_object_size_bytes }),
            Some(ObjectCountEntry::Detailed(s)) => StatsLookup::Found(*s),
        }
    }

    /// Configuration problems, each naming its field.
    pub fn validate(&self) -> Vec<WorkEstimatorError> {
        let mut errs = Vec::new();
        for (k, v) in &self.object_counts {
            let (c, a) = match v {
                ObjectCountEntry::Count(c) => (*c, 0),
                ObjectCountEntry::Detailed(s) => (s.count, s.average_object_size_bytes),
            };
            if c < 0 || a < 0 {
                errs.push(WorkEstimatorError::NegativeObjectCount { key: k.clone() });
            }
            if k.is_empty() || k.matches('/').count() > 1 || k.starts_with('/') || k.ends_with('/') {
                errs.push(WorkEstimatorError::BadObjectCountKey { key: k.clone() });
            }
        }
        if self.default_average_object_size_bytes < 0 {
            errs.push(WorkEstimatorError::NegativeDefaultAverageSize);
        }
        errs
    }
}

/// The key of (group, resource) in `objectCounts` and the object-count tracker: `resource` for
/// the core group, `group/resource` otherwise.
pub fn resource_key(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{group}/{resource}")
    }
}

/// `map.get(&resource_key(group, resource))` without building the key for the core group (the
/// common case): lookups on the request path allocate nothing for it.
pub fn get_by_resource<'m, V>(map: &'m BTreeMap<String, V>, group: &str, resource: &str) -> Option<&'m V> {
    if group.is_empty() {
        map.get(resource)
    } else {
        map.get(&resource_key(group, resource))
    }
}

/// An estimate of `initial_seats` seats and nothing more.
fn seats(initial_seats: u32) -> WorkEstimate {
    WorkEstimate { initial_seats, final_seats: 0, additional_latency: 0 }
}

/// The per-level limit (`plMaxSeats`; `None`/0 = estimator's own limit) clamped to `limit`.
fn clamp_max(pl_max_seats: Option<u32>, limit: u32) -> u32 {
    pl_max_seats.filter(|&m| m != 0 && m <= limit).unwrap_or(limit)
}

/// Object counts from outside the configuration (the cluster's `/metrics`), by (group, resource).
pub type ClusterStats<'a> = &'a dyn Fn(&str, &str) -> StatsLookup;

/// No counts besides the configuration's table.
pub fn no_cluster_stats(_group: &str, _resource: &str) -> StatsLookup {
    StatsLookup::NotFound
}

/// `workEstimator.estimate` (`request/width.go: estimate`). `watch_count` = interested watches
/// for mutating requests. Object counts from the `objectCounts` table only.
pub fn estimate(cfg: &WorkEstimatorConfig, info: &RequestInfo, pl_max_seats: Option<u32>, watch_count: u32) -> WorkEstimate {
    estimate_with(cfg, info, pl_max_seats, watch_count, &no_cluster_stats).0
}

/// [`estimate`] with the cluster's counts; also returns the stats lookup a LIST or WATCH used.
pub fn estimate_with(
    cfg: &WorkEstimatorConfig,
    info: &RequestInfo,
    pl_max_seats: Option<u32>,
    watch_count: u32,
    cluster: ClusterStats,
) -> (WorkEstimate, Option<StatsLookup>) {
    match info.verb.as_str() {
        "list" | "watch" if info.verb == "list" || cfg.watch_list => {
            // The `objectCounts` table overrides the cluster's counts.
            let stats = match cfg.stats(&info.api_group, &info.resource) {
                StatsLookup::NotFound => cluster(&info.api_group, &info.resource),
                found => found,
            };
            (estimate_list_with_stats(cfg, info, pl_max_seats, stats), Some(stats))
        }
        "create" | "update" | "patch" | "delete" => (estimate_mutating(cfg, info, pl_max_seats, watch_count), None),
        _ => (seats(MINIMUM_SEATS), None),
    }
}

/// `x / d` rounded up, as upstream's `math.Ceil` then integer conversion (`as` saturates: NaN
/// and negatives give 0, too large gives `u64::MAX`).
fn ceil_div_f64(x: f64, d: f64) -> u64 {
    (x / d).ceil() as u64
}
