//! Prometheus metrics through proxy-wasm stats, under upstream's names and labels
//! (`crate::observe::metrics` defines the naming scheme and Envoy's tag extraction).
//!
//! Counters and gauges are accumulated per VM and flushed as ± deltas on the timer, so the
//! request path makes no host call for them and gauges stay right with several workers (each
//! worker only ever adds its own deltas; nobody overwrites). The series are kept per flow
//! (configuration, level, FlowSchema): the records a request makes at one of its transitions
//! take the worker's lock and find their flow once ([`Stats::with_flow`]). Histograms are aggregated per VM
//! into upstream's buckets ([`names::HistogramAcc`]) and flushed as Prometheus' classic series,
//! each an Envoy counter: `<name>_bucket{le=…}` and `<name>_count` under upstream's names, units
//! (seconds) and bounds, all defined on a series' first flush so `histogram_quantile` sees every
//! bucket. Envoy stats are integers, so the sum of a seconds histogram is exported exactly as
//! integer microseconds under `<name-in-µs>_sum` (`request_wait_duration_microseconds_sum`), its
//! sub-microsecond remainder carried per worker; upstream's `_sum` in seconds comes from the
//! recording rules in `observability/apf-wasm-rules.yaml`. Label cardinality is bounded by the
//! number of levels and FlowSchemas.

use super::host::{Host, StatKind};
use crate::engine::store::WorkerState;
use crate::engine::Compiled;
use crate::observe::metrics::{self as names, MetricKind};
use hashbrown::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The metrics the filter records (names from upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum M {
    Rejected,
    Dispatched,
    InqueueRequests,
    InqueueSeats,
    ExecutingRequests,
    ExecutingSeats,
    WaitDuration,
    ExecutionDuration,
    WorkEstimatedSeats,
    NominalLimit,
    LowerLimit,
    UpperLimit,
    CurrentLimit,
    /// Length of the request's queue after it was enqueued (histogram; upstream observes it in
    /// `pkg/util/flowcontrol/fairqueuing/queueset/queueset.go`
    /// `timeoutOldRequestsAndRejectOrEnqueueLocked`).
    QueueLengthAfterEnqueue,
}

impl M {
    fn upstream_name(self) -> &'static str {
        match self {
            M::Rejected => "rejected_requests_total",
            M::Dispatched => "dispatched_requests_total",
            M::InqueueRequests => "current_inqueue_requests",
            M::InqueueSeats => "current_inqueue_seats",
            M::ExecutingRequests => "current_executing_requests",
            M::ExecutingSeats => "current_executing_seats",
            M::WaitDuration => "request_wait_duration_seconds",
            M::ExecutionDuration => "request_execution_seconds",
            M::WorkEstimatedSeats => "work_estimated_seats",
            M::NominalLimit => "nominal_limit_seats",
            M::LowerLimit => "lower_limit_seats",
            M::UpperLimit => "upper_limit_seats",
            M::CurrentLimit => "current_limit_seats",
            M::QueueLengthAfterEnqueue => "request_queue_length_after_enqueue",
        }
    }
}

/// The third label's value of a series where the metric has none.
pub const EXTRA_NONE: &str = "";

/// Whose series: (configuration generation, level, FlowSchema).
type FlowKey = (u64, u16, u16);

/// One flow's series (a dozen at most: a request's few metrics, some with a third label), as
/// (metric, third label's value, series) in the order of their first record: cheaper to find
/// than by hashing the metric and the label's string into the worker's table.
#[derive(Default)]
struct FlowSeries {
    all: Vec<(M, &'static str, Series)>,
    /// Per metric (`M as usize`), 1 + the index of its first series (0: none yet): where a
    /// metric without a third label, or its first label value, is found at once.
    first: [u8; 16],
}

/// A counter or gauge (`pending`: its delta since the last flush), or a histogram (`hist`: its
/// samples aggregated in the VM; `names`, `ids`: its counters, in the order of
/// [`names::HistogramStatNames::all`]).
struct Series {
    kind: StatKind,
    names: Vec<String>,
    ids: Vec<Option<u32>>,
    pending: i64,
    hist: Option<names::HistogramAcc>,
}

/// What a worker accumulated since it last gave its deltas away: its series and the filter's
/// own counters (the store's contention counts, then [`Own`]'s).
#[derive(Default)]
struct Pending {
    series: HashMap<FlowKey, FlowSeries>,
    own: [u64; 11],
    own_ids: [Option<u32>; 11],
}

/// One worker's stats. Its pending deltas sit behind their own lock, uncontended but for a
/// thread draining them through a [`PendingStats`] handle (the native host's main thread adds an
/// idle worker's deltas that way): whoever takes a delta adds it, so each is added once.
#[derive(Default)]
pub struct Stats {
    pending: Arc<Mutex<Pending>>,
    own_gauge_ids: [Option<u32>; 2],
    fleet_gauge_ids: [Option<u32>; 2],
    /// `apf_wasm_fleet_allocated_seats` per (configuration generation, level).
    fleet_level_ids: HashMap<(u64, usize), Option<u32>>,
}

/// A worker's pending deltas, to be taken from any thread ([`Stats::pending`]).
#[derive(Clone)]
pub struct PendingStats(Arc<Mutex<Pending>>);

impl PendingStats {
    /// Moves every pending delta into `out` as (stat id, delta), like [`Stats::take_pending`]
    /// but without the store's counts, which only the worker's own thread sees.
    pub fn take(&self, h: &dyn Host, out: &mut Vec<(u32, i64)>) {
        lock(&self.0).take_into(h, out);
    }
}

/// The pending deltas (a poisoned lock still holds whole deltas: nothing panics under it).
fn lock(p: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    p.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whose series: a request's configuration, priority level and flow schema (indexes into the
/// configuration's; a per-level series has flow schema 0).
#[derive(Clone, Copy)]
pub struct Labels<'a> {
    pub compiled: &'a Compiled,
    pub pl: usize,
    pub fs: usize,
}

/// A new series: its stat name (counters, gauges) or its histogram's.
fn new_series(l: Labels<'_>, m: M, extra: &'static str) -> Option<Series> {
    let Labels { compiled: c, pl, fs } = l;
    let spec = names::spec(m.upstream_name())?;
    let pl_name = c.levels.get(pl).map(|l| l.name.as_str()).unwrap_or("");
    let fs_name = c.config.policy.flow_schemas.get(fs).map(|f| f.name.as_str()).unwrap_or("");
    let value = |k: &&str| match *k {
        "priority_level" => pl_name,
        "flow_schema" => fs_name,
        _ => extra,
    };
    let values: Vec<&str> = spec.labels.iter().map(value).collect();
    let (names, hist) = match spec.kind {
        MetricKind::Histogram => {
            let names = names::histogram_stat_names(spec, &values).ok()?.all().cloned().collect();
            (names, Some(names::HistogramAcc::new(spec)))
        }
        _ => (vec![names::stat_name(spec, &values).ok()?], None),
    };
    let kind = if spec.kind == MetricKind::Gauge { StatKind::Gauge } else { StatKind::Counter };
    Some(Series { kind, ids: vec![None; names.len()], names, pending: 0, hist })
}

/// The id of the stat `name` kept in `slot`, defined on first use.
fn metric_id(h: &dyn Host, slot: &mut Option<u32>, kind: StatKind, name: &str) -> Option<u32> {
    if slot.is_none() {
        *slot = h.define_metric(kind, name);
    }
    *slot
}

/// The id of a counter or gauge, defined on first use.
fn scalar_id(h: &dyn Host, s: &mut Series) -> Option<u32> {
    let (Some(name), Some(id)) = (s.names.first(), s.ids.first_mut()) else { return None };
    metric_id(h, id, s.kind, name)
}

/// Sets the gauges `names` (their ids in `ids`, defined on first use) to `values`; `None`
/// leaves a gauge as it is.
fn record_gauges(h: &dyn Host, names: &[&str], ids: &mut [Option<u32>], values: impl IntoIterator<Item = Option<u64>>) {
    for ((name, id), value) in names.iter().zip(ids).zip(values) {
        let Some(value) = value else { continue };
        if let Some(id) = metric_id(h, id, StatKind::Gauge, name) {
            h.record_metric(id, value);
        }
    }
}

/// Moves `deltas` of the counters `names` (their ids in `ids`, defined on the first call even
/// at 0, so that the series exist from the start) into `out`.
fn take_counters(
    h: &dyn Host,
    names: &[impl AsRef<str>],
    ids: &mut [Option<u32>],
    deltas: impl IntoIterator<Item = u64>,
    out: &mut Vec<(u32, i64)>,
) {
    for ((name, id), delta) in names.iter().zip(ids).zip(deltas) {
        if let (Some(id), true) = (metric_id(h, id, StatKind::Counter, name.as_ref()), delta > 0) {
            out.push((id, i64::try_from(delta).unwrap_or(i64::MAX)));
        }
    }
}

/// One flow's series under its worker's lock, for the records a request makes at one moment
/// ([`Stats::with_flow`]).
pub struct Flow<'a> {
    labels: Labels<'a>,
    series: &'a mut FlowSeries,
}

impl Flow<'_> {
    /// Adds `delta` to a counter or gauge of the flow (flushed on the timer).
    #[inline]
    pub fn add(&mut self, m: M, extra: &'static str, delta: i64) {
        if let Some(s) = self.series(m, extra) {
            s.pending += delta;
        }
    }

    /// Records one sample of a histogram of the flow, in upstream units (seconds, seats).
    #[inline]
    pub fn observe(&mut self, m: M, extra: &'static str, value: f64) {
        if let Some(hist) = self.series(m, extra).and_then(|s| s.hist.as_mut()) {
            hist.observe(value);
        }
    }

    /// The flow's series of `m` with `extra`, created on first use (`None`: no such metric):
    /// the metric's first series when its label value is that one (the same literal, the same
    /// pointer), else by linear scan.
    #[inline]
    fn series(&mut self, m: M, extra: &'static str) -> Option<&mut Series> {
        let fs = &mut *self.series;
        let first = fs.first.get(m as usize).map_or(0, |&i| usize::from(i));
        let same = |i: &usize| fs.all.get(*i).is_some_and(|(_, se, _)| std::ptr::eq(*se, extra));
        let i = match first.checked_sub(1).filter(same) {
            Some(i) => i,
            None => fs.find(self.labels, m, extra)?,
        };
        fs.all.get_mut(i).map(|(_, _, s)| s)
    }
}

impl FlowSeries {
    /// The index of the series of `m` with `extra`, by linear scan (the metric first, then the
    /// label's value), created if missing.
    #[inline(never)]
    fn find(&mut self, l: Labels<'_>, m: M, extra: &'static str) -> Option<usize> {
        let same = |e: &&'static str| std::ptr::eq(*e, extra) || *e == extra;
        match self.all.iter().position(|(sm, se, _)| *sm == m && same(se)) {
            Some(i) => Some(i),
            None => self.insert(l, m, extra),
        }
    }

    /// A new series of the flow `l` (once per series: kept out of the lookup's code).
    #[cold]
    #[inline(never)]
    fn insert(&mut self, l: Labels<'_>, m: M, extra: &'static str) -> Option<usize> {
        let i = self.all.len();
        self.all.push((m, extra, new_series(l, m, extra)?));
        if let Some(first @ 0) = self.first.get_mut(m as usize) {
            *first = u8::try_from(i + 1).unwrap_or(0);
        }
        Some(i)
    }
}

impl Stats {
    /// Runs `f` over the series of the flow `l`: all of its records under one lock and one
    /// lookup (a request records several series at each of its transitions).
    pub fn with_flow<T>(&mut self, l: Labels<'_>, f: impl FnOnce(&mut Flow<'_>) -> T) -> T {
        let key: FlowKey = (l.compiled.generation, l.pl as u16, l.fs as u16);
        let mut pending = lock(&self.pending);
        let series = pending.series.entry(key).or_default();
        f(&mut Flow { labels: l, series })
    }

    /// A handle on this worker's pending deltas, for another thread to take them.
    pub fn pending(&self) -> PendingStats {
        PendingStats(self.pending.clone())
    }

    /// Adds `delta` to a counter or gauge (flushed on the timer): a single record
    /// ([`Stats::with_flow`] for several).
    pub fn add(&mut self, l: Labels<'_>, m: M, extra: &'static str, delta: i64) {
        self.with_flow(l, |f| f.add(m, extra, delta));
    }

    /// Records one histogram sample, in upstream units (seconds, seats); flushed on the timer.
    pub fn observe(&mut self, l: Labels<'_>, m: M, extra: &'static str, value: f64) {
        self.with_flow(l, |f| f.observe(m, extra, value));
    }

    /// Sets a per-level gauge to an absolute value (values that are the same for every worker).
    pub fn set(&mut self, h: &dyn Host, c: &Compiled, m: M, pl: usize, value: u64) {
        let l = Labels { compiled: c, pl, fs: 0 };
        let id = self.with_flow(l, |f| f.series(m, EXTRA_NONE).and_then(|s| scalar_id(h, s)));
        if let Some(id) = id {
            h.record_metric(id, value);
        }
    }

    pub fn count_own(&mut self, m: Own) {
        self.add_own(m, 1);
    }

    pub fn add_own(&mut self, m: Own, n: u64) {
        if let Some(x) = lock(&self.pending).own.get_mut(STORE_COUNTERS + m as usize) {
            *x = x.saturating_add(n);
        }
    }

    /// Moves the store's contention counts of this worker (which only its own thread sees)
    /// into its pending deltas, where any thread may take them.
    pub fn collect_store_counts(&mut self, h: &dyn Host) {
        let Some(c) = h.store().worker().map(WorkerState::take) else { return };
        let counts = [c.writes, c.conflicts, c.decodes, c.reuses, c.wakeups];
        if counts.iter().all(|&n| n == 0) {
            return;
        }
        let mut p = lock(&self.pending);
        for (x, n) in p.own.iter_mut().zip(counts) {
            *x = x.saturating_add(n);
        }
    }

    /// Fleet mode, on the worker that drives it: the replicas in the fleet's last snapshot and
    /// the seconds since the last successful sync with etcd.
    pub fn set_fleet_gauges(&mut self, h: &dyn Host, replicas: u64, sync_age_seconds: Option<u64>) {
        record_gauges(h, &FLEET_GAUGES, &mut self.fleet_gauge_ids, [Some(replicas), sync_age_seconds]);
    }

    /// Fleet mode, on the worker that drives it: this replica's seats per limited level
    /// (`apf_wasm_fleet_allocated_seats{priority_level}`; `None`: exempt, not exported).
    pub fn set_fleet_allocation(&mut self, h: &dyn Host, c: &Compiled, seats: &[Option<u32>]) {
        self.fleet_level_ids.retain(|(generation, _), _| *generation == c.generation);
        for (i, (lvl, value)) in c.levels.iter().zip(seats).enumerate() {
            let Some(value) = value else { continue };
            let slot = self.fleet_level_ids.entry((c.generation, i)).or_insert(None);
            if slot.is_none() {
                let name = format!("{FLEET_ALLOCATED_SEATS}.priority_level.{}", names::sanitize_label_value(&lvl.name));
                *slot = h.define_metric(StatKind::Gauge, &name);
            }
            if let Some(id) = *slot {
                h.record_metric(id, u64::from(*value));
            }
        }
    }

    /// Sets the cost gauges (the same value from every worker).
    pub fn set_own_gauges(&mut self, h: &dyn Host, stale_resources: u64, age_seconds: Option<u64>) {
        record_gauges(h, &OWN_GAUGES, &mut self.own_gauge_ids, [Some(stale_resources), age_seconds]);
    }

    /// Pushes accumulated deltas to the host.
    pub fn flush(&mut self, h: &dyn Host) {
        let mut deltas = Vec::new();
        self.take_pending(h, &mut deltas);
        deltas.into_iter().for_each(|(id, by)| h.increment_metric(id, by));
    }

    /// Moves every pending delta into `out` as (stat id, delta), for the host to add later or
    /// from another thread ([`Stats::flush`] adds them at once): afterwards nothing is pending.
    /// Every counter is defined on its first take, even at 0 (see [`take_counters`]).
    pub fn take_pending(&mut self, h: &dyn Host, out: &mut Vec<(u32, i64)>) {
        self.collect_store_counts(h);
        lock(&self.pending).take_into(h, out);
    }
}

impl Pending {
    fn take_into(&mut self, h: &dyn Host, out: &mut Vec<(u32, i64)>) {
        let own = std::mem::take(&mut self.own);
        take_counters(h, &OWN_COUNTERS, &mut self.own_ids, own, out);
        for (_, _, s) in self.series.values_mut().flat_map(|f| f.all.iter_mut()) {
            if let Some(deltas) = s.hist.as_mut().map(names::HistogramAcc::take) {
                // Every counter of a histogram is defined on its first flush, even at 0: with a
                // missing lower bucket `histogram_quantile` would interpolate from 0 instead of
                // from that bound.
                take_counters(h, &s.names, &mut s.ids, deltas.into_iter().flatten(), out);
            } else if let Some(id) = (s.pending != 0).then(|| scalar_id(h, s)).flatten() {
                out.push((id, std::mem::take(&mut s.pending)));
            }
        }
    }
}

/// How many of [`OWN_COUNTERS`] count the store's contention (the rest are [`Own`]'s).
const STORE_COUNTERS: usize = 5;

/// The filter's own counters (not upstream metrics): global-state contention (see
/// [`crate::engine::contention`]), then where LIST and WATCH costs come from ([`Own`]).
const OWN_COUNTERS: [&str; 11] = [
    "apf_wasm_shared_state_writes_total",
    "apf_wasm_shared_state_conflicts_total",
    "apf_wasm_level_state_decodes_total",
    "apf_wasm_level_state_reuses_total",
    "apf_wasm_cross_worker_wakeups_total",
    "apf_wasm_object_counts_refreshes_total",
    "apf_wasm_object_counts_refresh_failures_total",
    "apf_wasm_watch_initial_hold_timeouts_total",
    "apf_wasm_fleet_sync_failures_total",
    "apf_wasm_fleet_ignored_records_total",
    "apf_wasm_fleet_data_losses_total",
];

/// The filter's own counters of where LIST and WATCH costs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// Successful polls of the cluster's `/metrics`.
    CountsRefreshes = 0,
    /// Failed polls (unreachable, non-200, no usable line).
    CountsRefreshFailures = 1,
    /// Watches whose initial phase reached `watchInitialEventsMaxHold`.
    WatchHoldTimeouts = 2,
    /// Fleet mode: etcd calls that failed (no answer, or an error status).
    FleetSyncFailures = 3,
    /// Fleet mode: records under the fleet's prefix ignored (no lease, undecodable, impossible
    /// numbers), each counted once per write.
    FleetIgnoredRecords = 4,
    /// Fleet mode: times etcd was seen to have lost its data (revision back, new cluster id,
    /// the fleet gone).
    FleetDataLosses = 5,
}

/// Fleet mode's gauges (set by the worker that drives the fleet).
const FLEET_GAUGES: [&str; 2] = ["apf_wasm_fleet_replicas", "apf_wasm_fleet_sync_age_seconds"];
/// Fleet mode's per-level gauge: the replica's seats (its level's limit).
const FLEET_ALLOCATED_SEATS: &str = "apf_wasm_fleet_allocated_seats";

/// Gauges: resources whose cluster count is stale; seconds since the last successful poll.
const OWN_GAUGES: [&str; 2] = ["apf_wasm_object_counts_stale_resources", "apf_wasm_object_counts_age_seconds"];

/// Every family of stats the gateway may define, as (kind, family name, label keys): the name of
/// a series is its family's followed by `.key.value` per label, in this order (histograms: their
/// `_bucket` family ends with `le`). For hosts that must declare every family up front (Envoy's
/// dynamic modules freeze stat creation after configuration).
pub fn stat_families() -> Vec<(StatKind, String, Vec<&'static str>)> {
    let mut out = Vec::new();
    for s in names::METRICS {
        let labels = s.labels.to_vec();
        match s.kind {
            MetricKind::Counter => out.push((StatKind::Counter, format!("{}{}", names::PREFIX, s.envoy_name), labels)),
            MetricKind::Gauge => out.push((StatKind::Gauge, format!("{}{}", names::PREFIX, s.envoy_name), labels)),
            MetricKind::Histogram => {
                let with_le = labels.iter().copied().chain(["le"]).collect();
                out.push((StatKind::Counter, format!("{}{}_bucket", names::PREFIX, s.name), with_le));
                out.push((StatKind::Counter, format!("{}{}_count", names::PREFIX, s.name), labels.clone()));
                out.push((StatKind::Counter, format!("{}{}", names::PREFIX, names::sum_series_name(s)), labels));
            }
        }
    }
    out.extend(OWN_COUNTERS.iter().map(|n| (StatKind::Counter, n.to_string(), vec![])));
    out.extend(OWN_GAUGES.iter().chain(FLEET_GAUGES.iter()).map(|n| (StatKind::Gauge, n.to_string(), vec![])));
    for n in [FLEET_ALLOCATED_SEATS, super::watch_limits::OPEN_WATCHES] {
        out.push((StatKind::Gauge, n.to_string(), vec!["priority_level"]));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// However a flow's records are ordered in a batch, each (metric, label value) is one series.
    #[test]
    fn a_flow_keeps_one_series_per_metric_and_label_value() {
        let cfg = crate::config::parse_plugin_config(br#"{"identity":{"sources":[{"type":"frontProxy"}]}}"#).unwrap();
        let c = Compiled::new(cfg, 1);
        let l = Labels { compiled: &c, pl: 1, fs: 1 };
        let mut stats = Stats::default();
        let false_copy: &'static str = Box::leak(String::from("false").into_boxed_str());
        for _ in 0..3 {
            stats.with_flow(l, |f| {
                f.add(M::Dispatched, EXTRA_NONE, 1);
                f.observe(M::WaitDuration, "true", 0.0);
                f.add(M::ExecutingRequests, EXTRA_NONE, 1);
                f.observe(M::WaitDuration, false_copy, 0.1);
                f.add(M::Dispatched, EXTRA_NONE, 1);
            });
            stats.with_flow(l, |f| {
                f.observe(M::WaitDuration, "false", 0.2);
                f.add(M::ExecutingRequests, EXTRA_NONE, -1);
            });
        }
        let pending = lock(&stats.pending);
        let flow = &pending.series[&(1, 1, 1)].all;
        let keys: Vec<(M, &str)> = flow.iter().map(|(m, e, _)| (*m, *e)).collect();
        let expected = [(M::Dispatched, ""), (M::WaitDuration, "true"), (M::ExecutingRequests, ""), (M::WaitDuration, "false")];
        assert_eq!(keys, expected);
        assert_eq!(flow[0].2.pending, 6);
        assert_eq!(flow[2].2.pending, 0);
    }
}
