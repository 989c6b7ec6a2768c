//! Prometheus metrics through proxy-wasm stats, under upstream's names and labels
//! (`crate::observe::metrics` defines the naming scheme and Envoy's tag extraction).
//!
//! Counters and gauges are accumulated per VM and flushed as ± deltas on the timer, so the
//! request path makes no host call for them and gauges stay right with several workers (each
//! worker only ever adds its own deltas; nobody overwrites). Histograms are aggregated per VM
//! into upstream's buckets ([`names::HistogramAcc`]) and flushed as Prometheus' classic series,
//! each an Envoy counter: `<name>_bucket{le=…}` and `<name>_count` under upstream's names, units
//! (seconds) and bounds, all defined on a series' first flush so `histogram_quantile` sees every
//! bucket. Envoy stats are integers, so the sum of a seconds histogram is exported exactly as
//! integer microseconds under `<name-in-µs>_sum` (`request_wait_duration_microseconds_sum`), its
//! sub-microsecond remainder carried per worker; upstream's `_sum` in seconds comes from the
//! recording rules in `observability/apf-wasm-rules.yaml`. Label cardinality is bounded by the
//! number of levels and FlowSchemas.

use super::host;
use crate::engine::store::{Store, WorkerState};
use crate::engine::Compiled;
use crate::observe::metrics::{self as names, MetricKind};
use std::cell::RefCell;
use hashbrown::HashMap;

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

/// Third label of a series, where the metric has one.
pub const EXTRA_NONE: u8 = 0;
pub fn reason_extra(r: crate::fairqueuing::RejectReason) -> u8 {
    1 + r.code()
}
pub const EXECUTE_TRUE: u8 = 10;
pub const EXECUTE_FALSE: u8 = 11;
pub const TYPE_REGULAR: u8 = 20;
pub const TYPE_WATCH: u8 = 21;

fn extra_value(extra: u8) -> &'static str {
    match extra {
        1 => "queue-full",
        2 => "concurrency-limit",
        3 => "time-out",
        EXECUTE_TRUE => "true",
        EXECUTE_FALSE => "false",
        TYPE_REGULAR => "regular",
        TYPE_WATCH => "watch",
        _ => "",
    }
}

type Key = (u64, M, u16, u16, u8);

struct Series {
    name: String,
    kind: MetricKind,
    id: Option<u32>,
    pending: i64,
    hist: Option<Hist>,
}

/// A histogram series: its samples aggregated in the VM, its stat names and counter ids (in the
/// order of [`names::HistogramStatNames::all`]).
struct Hist {
    acc: names::HistogramAcc,
    names: Vec<String>,
    ids: Vec<Option<u32>>,
}

impl Hist {
    fn new(spec: &'static names::MetricSpec, stat_names: &names::HistogramStatNames) -> Hist {
        let names: Vec<String> = stat_names.all().cloned().collect();
        let ids = vec![None; names.len()];
        Hist { acc: names::HistogramAcc::new(spec), names, ids }
    }
    fn flush(&mut self) {
        let Some(deltas) = self.acc.take() else { return };
        // Every counter of the series is defined on its first flush, even at 0: with a missing
        // lower bucket `histogram_quantile` would interpolate from 0 instead of from that bound.
        for ((name, slot), delta) in self.names.iter().zip(self.ids.iter_mut()).zip(deltas) {
            if slot.is_none() {
                *slot = host::define_metric(host::METRIC_COUNTER, name);
            }
            if let (Some(id), true) = (*slot, delta > 0) {
                host::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
            }
        }
    }
}

#[derive(Default)]
struct Registry {
    series: HashMap<Key, Series>,
}

thread_local! {
    static REG: RefCell<Registry> = RefCell::new(Registry::default());
}

/// A new series: its stat name (counters, gauges) or its histogram.
fn new_series(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8) -> Option<Series> {
    let spec = names::spec(m.upstream_name())?;
    let pl_name = c.levels.get(pl).map(|l| l.name.as_str()).unwrap_or("");
    let fs_name = c.config.policy.flow_schemas.get(fs).map(|f| f.name.as_str()).unwrap_or("");
    let values: Vec<&str> = spec
        .labels
        .iter()
        .map(|k| match *k {
            "priority_level" => pl_name,
            "flow_schema" => fs_name,
            _ => extra_value(extra),
        })
        .collect();
    let (name, hist) = match spec.kind {
        MetricKind::Histogram => (String::new(), Some(Hist::new(spec, &names::histogram_stat_names(spec, &values).ok()?))),
        _ => (names::stat_name(spec, &values).ok()?, None),
    };
    Some(Series { name, kind: spec.kind, id: None, pending: 0, hist })
}

fn with_series<T>(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8, f: impl FnOnce(&mut Series) -> T) -> Option<T> {
    let key: Key = (c.generation, m, pl as u16, fs as u16, extra);
    REG.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(s) = r.series.get_mut(&key) {
            return Some(f(s));
        }
        let s = r.series.entry(key).or_insert(new_series(c, m, pl, fs, extra)?);
        Some(f(s))
    })
}

fn ensure_id(s: &mut Series) -> Option<u32> {
    if s.id.is_none() {
        let kind = match s.kind {
            MetricKind::Counter => host::METRIC_COUNTER,
            MetricKind::Gauge => host::METRIC_GAUGE,
            MetricKind::Histogram => host::METRIC_HISTOGRAM,
        };
        s.id = host::define_metric(kind, &s.name);
    }
    s.id
}

/// Adds `delta` to a counter or gauge (flushed on the timer).
pub fn add(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8, delta: i64) {
    with_series(c, m, pl, fs, extra, |s| s.pending += delta);
}

/// Records one histogram sample, in upstream units (seconds, seats); flushed on the timer.
pub fn observe(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8, value: f64) {
    with_series(c, m, pl, fs, extra, |s| {
        if let Some(h) = s.hist.as_mut() {
            h.acc.observe(value);
        }
    });
}

/// Sets a per-level gauge to an absolute value (values that are the same for every worker).
pub fn set(c: &Compiled, m: M, pl: usize, value: u64) {
    with_series(c, m, pl, 0, EXTRA_NONE, |s| {
        if let Some(id) = ensure_id(s) {
            host::record_metric(id, value);
        }
    });
}

/// Global-state contention counters (not upstream metrics; see [`crate::engine::contention`]).
pub const CONTENTION_METRICS: [&str; 5] = [
    "apf_wasm_shared_state_writes_total",
    "apf_wasm_shared_state_conflicts_total",
    "apf_wasm_level_state_decodes_total",
    "apf_wasm_level_state_reuses_total",
    "apf_wasm_cross_worker_wakeups_total",
];

thread_local! {
    static CONTENTION_IDS: RefCell<[Option<u32>; 5]> = const { RefCell::new([None; 5]) };
}

fn flush_contention() {
    let c = host::store().worker().map(WorkerState::take).unwrap_or_default();
    let deltas = [c.writes, c.conflicts, c.decodes, c.reuses, c.wakeups];
    CONTENTION_IDS.with(|ids| add_to_counters(&CONTENTION_METRICS, &mut ids.borrow_mut()[..], deltas.map(|d| i64::try_from(d).unwrap_or(i64::MAX))));
}

/// The filter's own counters of where LIST and WATCH costs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// Successful polls of the cluster's `/metrics`.
    CountsRefreshes = 0,
    /// Failed polls (unreachable, non-200, no usable line).
    CountsRefreshFailures = 1,
    /// Watches whose initial phase reached `watchInitialEventsMaxHold`.
    WatchHoldTimeouts = 2,
}

pub const OWN_METRICS: [&str; 3] = [
    "apf_wasm_object_counts_refreshes_total",
    "apf_wasm_object_counts_refresh_failures_total",
    "apf_wasm_watch_initial_hold_timeouts_total",
];

/// Gauges: resources whose cluster count is stale; seconds since the last successful poll.
pub const OWN_GAUGES: [&str; 2] = ["apf_wasm_object_counts_stale_resources", "apf_wasm_object_counts_age_seconds"];

thread_local! {
    static OWN_PENDING: std::cell::Cell<[u64; 3]> = const { std::cell::Cell::new([0; 3]) };
    static OWN_IDS: RefCell<[Option<u32>; 3]> = const { RefCell::new([None; 3]) };
    static OWN_GAUGE_IDS: RefCell<[Option<u32>; 2]> = const { RefCell::new([None; 2]) };
}

pub fn count_own(m: Own) {
    OWN_PENDING.with(|p| {
        let mut v = p.get();
        if let Some(x) = v.get_mut(m as usize) {
            *x = x.saturating_add(1);
        }
        p.set(v);
    });
}

/// Sets the cost gauges (the same value from every worker).
pub fn set_own_gauges(stale_resources: u64, age_seconds: Option<u64>) {
    OWN_GAUGE_IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        for ((name, value), slot) in OWN_GAUGES.iter().zip([Some(stale_resources), age_seconds]).zip(ids.iter_mut()) {
            let Some(value) = value else { continue };
            if slot.is_none() {
                *slot = host::define_metric(host::METRIC_GAUGE, name);
            }
            if let Some(id) = *slot {
                host::record_metric(id, value);
            }
        }
    });
}

fn flush_own() {
    let deltas = OWN_PENDING.with(|p| p.replace([0; 3]));
    OWN_IDS.with(|ids| add_to_counters(&OWN_METRICS, &mut ids.borrow_mut()[..], deltas.map(|d| i64::try_from(d).unwrap_or(i64::MAX))));
}

/// Adds `deltas` to the filter's own counters `names` (their ids in `ids`, defined on the first
/// call even at 0, so that the series exist from the start).
pub fn add_to_counters(names: &[&str], ids: &mut [Option<u32>], deltas: impl IntoIterator<Item = i64>) {
    for ((name, id), delta) in names.iter().zip(ids.iter_mut()).zip(deltas) {
        if id.is_none() {
            *id = host::define_metric(host::METRIC_COUNTER, name);
        }
        if let (Some(id), true) = (*id, delta > 0) {
            host::increment_metric(id, delta);
        }
    }
}

/// Pushes accumulated deltas to the host.
pub fn flush() {
    flush_contention();
    flush_own();
    REG.with(|r| {
        let mut r = r.borrow_mut();
        for s in r.series.values_mut() {
            if let Some(h) = s.hist.as_mut() {
                h.flush();
                continue;
            }
            if s.pending != 0 {
                if let Some(id) = ensure_id(s) {
                    host::increment_metric(id, s.pending);
                    s.pending = 0;
                }
            }
        }
    });
}
