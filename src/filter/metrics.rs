//! Prometheus metrics through proxy-wasm stats, under upstream's names and labels
//! (`crate::observe::metrics` defines the naming scheme and Envoy's tag extraction).
//!
//! Counters and gauges are accumulated per VM and flushed as ± deltas on the timer, so the
//! request path makes no host call for them and gauges stay right with several workers (each
//! worker only ever adds its own deltas; nobody overwrites). Histograms are aggregated per VM
//! into upstream's buckets and flushed as Prometheus-style cumulative counters
//! (`<name>_bucket{le=…}`, `<name>_sum`, `<name>_count`), again off the request path.
//! Deviation: Envoy stats are integers, so duration histograms are in milliseconds
//! (`request_wait_duration_milliseconds`, buckets 0, 5, 20, … 30000) and their `_sum` counts
//! whole milliseconds. Label cardinality is bounded by the number of levels and FlowSchemas.

use super::host;
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

/// A histogram aggregated in the VM: per-bucket (non-cumulative) pending counts, flushed as
/// cumulative `_bucket` counters.
struct Hist {
    /// Envoy value = round(upstream value × scale).
    spec: &'static names::MetricSpec,
    /// Upper bounds in Envoy units (scaled), ascending.
    bounds: Vec<f64>,
    pending: Vec<u64>,
    pending_inf: u64,
    pending_sum: u64,
    /// Counter ids: one per bound, then +Inf, `_sum`, `_count`.
    ids: Vec<Option<u32>>,
}

impl Hist {
    fn new(spec: &'static names::MetricSpec) -> Hist {
        let bounds = names::envoy_buckets(spec);
        let n = bounds.len();
        Hist { spec, bounds, pending: vec![0; n], pending_inf: 0, pending_sum: 0, ids: vec![None; n + 3] }
    }
    fn record(&mut self, value: f64) {
        let v = names::envoy_value(self.spec, value);
        let x = v as f64;
        match self.bounds.iter().position(|b| x <= *b) {
            Some(i) => {
                if let Some(p) = self.pending.get_mut(i) {
                    *p += 1;
                }
            }
            None => self.pending_inf += 1,
        }
        self.pending_sum = self.pending_sum.saturating_add(v);
    }
    fn flush(&mut self, base: &str) {
        let total: u64 = self.pending.iter().sum::<u64>() + self.pending_inf;
        if total == 0 {
            return;
        }
        // `base` is `apiserver_flowcontrol_<name>.<labels>`: insert the suffix after the name.
        let (name, labels) = base.split_once('.').map(|(n, l)| (n, format!(".{l}"))).unwrap_or((base, String::new()));
        let mut cum = 0u64;
        let n = self.bounds.len();
        for i in 0..=n + 2 {
            let (stat, delta) = if i < n {
                cum += self.pending.get(i).copied().unwrap_or(0);
                let b = self.bounds.get(i).copied().unwrap_or(0.0);
                (format!("{name}_bucket{labels}.le.{b}"), cum)
            } else if i == n {
                (format!("{name}_bucket{labels}.le.+Inf"), total)
            } else if i == n + 1 {
                (format!("{name}_sum{labels}"), self.pending_sum)
            } else {
                (format!("{name}_count{labels}"), total)
            };
            if delta == 0 {
                continue;
            }
            let Some(slot) = self.ids.get_mut(i) else { continue };
            if slot.is_none() {
                *slot = host::define_metric(host::METRIC_COUNTER, &stat);
            }
            if let Some(id) = *slot {
                host::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
            }
        }
        self.pending.iter_mut().for_each(|p| *p = 0);
        self.pending_inf = 0;
        self.pending_sum = 0;
    }
}

#[derive(Default)]
struct Registry {
    series: HashMap<Key, Series>,
}

thread_local! {
    static REG: RefCell<Registry> = RefCell::new(Registry::default());
}

fn series_name(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8) -> Option<(String, MetricKind)> {
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
    names::stat_name(spec, &values).ok().map(|n| (n, spec.kind))
}

fn with_series<T>(c: &Compiled, m: M, pl: usize, fs: usize, extra: u8, f: impl FnOnce(&mut Series) -> T) -> Option<T> {
    let key: Key = (c.generation, m, pl as u16, fs as u16, extra);
    REG.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(s) = r.series.get_mut(&key) {
            return Some(f(s));
        }
        let (name, kind) = series_name(c, m, pl, fs, extra)?;
        let hist = match kind {
            MetricKind::Histogram => names::spec(m.upstream_name()).map(Hist::new),
            _ => None,
        };
        let s = r.series.entry(key).or_insert(Series { name, kind, id: None, pending: 0, hist });
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
            h.record(value);
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
    let c = host::store().state().take();
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
    super::timing::flush();
    REG.with(|r| {
        let mut r = r.borrow_mut();
        for s in r.series.values_mut() {
            if let Some(h) = s.hist.as_mut() {
                h.flush(&s.name);
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
