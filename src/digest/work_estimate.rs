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

use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::digest::request_info::RequestInfo;
use crate::digest::selectors;
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

    pub fn validate(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for (k, v) in &self.object_counts {
            let (c, a) = match v {
                ObjectCountEntry::Count(c) => (*c, 0),
                ObjectCountEntry::Detailed(s) => (s.count, s.average_object_size_bytes),
            };
            if c < 0 || a < 0 {
                errs.push(format!("workEstimator.objectCounts[{k:?}]: negative value"));
            }
            if k.is_empty() || k.matches('/').count() > 1 || k.starts_with('/') || k.ends_with('/') {
                errs.push(format!("workEstimator.objectCounts: bad key {k:?} (want \"resource\" or \"group/resource\")"));
            }
        }
        if self.default_average_object_size_bytes < 0 {
            errs.push("workEstimator.defaultAverageObjectSizeBytes: negative".into());
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

/// How a WATCH's initial phase ends, for holding its seats until then (upstream holds them
/// until the storage layer signals that the initial events were sent: `apf_filter.go`'s
/// watch initialization signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchInit {
    /// No initial events (`resourceVersion` set, no `sendInitialEvents=true`): nothing to hold.
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

fn ceil_div_f64(x: f64, d: f64) -> u64 {
    // `as` saturates: NaN and negatives give 0, too large gives u64::MAX.
    (x / d).ceil() as u64
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

// ---------------------------------------------------------------------------------------------
// WatchTracker (`watch_tracker.go`: `RegisterWatch`, `GetInterestedWatchCount`)

/// Identifies one registered watch (returned by [`WatchTracker::register`], passed to `forget`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    pub api_group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Hash, PartialEq, Eq)]
struct KeyRef<'a>(&'a str, &'a str, &'a str, &'a str);

/// Derived `Hash` hashes the fields in order, so a `KeyRef` hashes like its `WatchKey`: lookups
/// need no allocation.
impl hashbrown::Equivalent<WatchKey> for KeyRef<'_> {
    fn equivalent(&self, k: &WatchKey) -> bool {
        self.0 == k.api_group && self.1 == k.resource && self.2 == k.namespace && self.3 == k.name
    }
}

/// Counts open watches per (group, resource, namespace, name), upstream `watchTracker`.
/// Built-in index: `pods` watches pinned to a node (`spec.nodeName=<non-empty>`) are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchTracker {
    counts: hashbrown::HashMap<WatchKey, u32>,
}

const READ_ONLY_VERBS: [&str; 4] = ["get", "list", "watch", "proxy"];

impl WatchTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// `RegisterWatch`: only verb `watch`; returns the key to `forget` when the watch ends,
    /// or None if the watch is not tracked.
    pub fn register(&mut self, info: &RequestInfo) -> Option<WatchKey> {
        if info.verb != "watch" {
            return None;
        }
        if info.api_group.is_empty() && info.resource == "pods" && pinned_to_node(info) {
            return None;
        }
        let key = WatchKey {
            api_group: info.api_group.clone(),
            resource: info.resource.clone(),
            namespace: info.namespace.clone(),
            name: info.name.clone(),
        };
        let c = self.counts.entry(key.clone()).or_insert(0);
        *c = c.saturating_add(1);
        Some(key)
    }

    /// The watch ended: decrement, deleting zero entries.
    pub fn forget(&mut self, key: &WatchKey) {
        let k = KeyRef(&key.api_group, &key.resource, &key.namespace, &key.name);
        if let Some(c) = self.counts.get_mut(&k) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.counts.remove(&k);
            }
        }
    }

    fn get(&self, g: &str, r: &str, ns: &str, n: &str) -> u32 {
        self.counts.get(&KeyRef(g, r, ns, n)).copied().unwrap_or(0)
    }

    /// `GetInterestedWatchCount` (0 for read-only verbs).
    pub fn interested_count(&self, info: &RequestInfo) -> u32 {
        if READ_ONLY_VERBS.contains(&info.verb.as_str()) {
            return 0;
        }
        let (g, r) = (info.api_group.as_str(), info.resource.as_str());
        let mut n = self.get(g, r, "", "");
        if !info.namespace.is_empty() {
            n = n.saturating_add(self.get(g, r, &info.namespace, ""));
        }
        if !info.name.is_empty() {
            n = n.saturating_add(self.get(g, r, &info.namespace, &info.name));
        }
        n
    }

    /// Total tracked watches.
    pub fn total(&self) -> u64 {
        self.counts.values().map(|&c| u64::from(c)).sum()
    }

    /// Deterministic encoding (entries sorted by key).
    pub fn encode(&self, w: &mut Writer) {
        let mut entries: Vec<(&WatchKey, u32)> = self.counts.iter().map(|(k, c)| (k, *c)).collect();
        entries.sort();
        w.usize(entries.len());
        for (k, c) in entries {
            w.str(&k.api_group);
            w.str(&k.resource);
            w.str(&k.namespace);
            w.str(&k.name);
            w.u32(c);
        }
    }

    pub fn decode(r: &mut Reader) -> CodecResult<Self> {
        let n = r.count(5)?;
        let mut counts = hashbrown::HashMap::with_capacity(n);
        for _ in 0..n {
            let key = WatchKey {
                api_group: r.str()?.to_string(),
                resource: r.str()?.to_string(),
                namespace: r.str()?.to_string(),
                name: r.str()?.to_string(),
            };
            let c = r.u32()?;
            if c == 0 {
                return Err(CodecError("zero watch count"));
            }
            if counts.insert(key, c).is_some() {
                return Err(CodecError("duplicate watch key"));
            }
        }
        Ok(WatchTracker { counts })
    }
}

/// Whether `getIndexValue(r, "spec.nodeName")` is a node name (not "", which it also is when the
/// list options do not decode).
fn pinned_to_node(info: &RequestInfo) -> bool {
    let q = &info.query;
    let node = |t: Vec<_>| selectors::requires_exact_match(&t, "spec.nodeName").is_some_and(|n| !n.is_empty());
    !q.decode_failed() && selectors::parse_field_selector(&q.field_selector).is_some_and(node)
}
