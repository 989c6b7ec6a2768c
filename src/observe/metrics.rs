//! Upstream APF metrics (`pkg/util/flowcontrol/metrics/metrics.go`) and their mapping to flat
//! Envoy stat names; `docs/observability.md` describes what is exported and why.
//!
//! ## Naming scheme
//! proxy-wasm metrics have flat names (Envoy stores them as `wasmcustom.<name>`), so labels are
//! encoded as `.key.value` pairs after the metric name, in the label order of [`MetricSpec`]:
//! `apiserver_flowcontrol_<name>(.<label>.<sanitized value>)*`. Label values are sanitized by
//! [`sanitize_label_value`]; Kubernetes object names never contain `_`, so the mapping is
//! collision-free for them.
//!
//! ## Turning names back into Prometheus labels
//! One Envoy `stats_config.stats_tags` entry per label key ([`stats_tags`]): the first capture
//! group (`.k.value`) is removed from the tag-extracted name, the second one is the tag value;
//! every specifier runs against the full name. The pair structure before the group keeps
//! key/value alignment, so a value equal to a key name can't be mistaken for a key. Envoy's
//! Prometheus endpoint then exports `apiserver_flowcontrol_<name>{k="value",...}`.
//!
//! ## Histograms and fractional values
//! A histogram is exported as Prometheus' classic series, each an Envoy counter:
//! `<name>_bucket.<labels>.le.<bound>` (cumulative, then `+Inf`) and `<name>_count.<labels>`.
//! `le` is always the last pair and the only value that may contain a dot (`0.005`). Envoy stat
//! values are integers: a histogram with fractional samples exports its exact sum in a smaller
//! unit under `<envoy_name>_sum` instead of `<name>_sum` ([`HistogramAcc`] carries the
//! remainder), and fractional gauges such as `current_r` are recorded as
//! `round(value × envoy_scale)` under `envoy_name` (a `_milli` suffix for ×1000).

/// Common prefix of all APF metrics.
pub const PREFIX: &str = "apiserver_flowcontrol_";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSpec {
    /// Upstream name without [`PREFIX`].
    pub name: &'static str,
    pub kind: MetricKind,
    /// Label keys, in the order they appear in the stat name.
    pub labels: &'static [&'static str],
    /// Upstream histogram buckets (upstream units); empty for counters/gauges.
    pub buckets: &'static [f64],
    /// Counters and gauges: recorded Envoy value = `round(upstream value × envoy_scale)`.
    /// Histograms: the exported sum counts units of `1 / envoy_scale` (1e6: microseconds).
    pub envoy_scale: f64,
    /// Envoy name without [`PREFIX`]. Counters and gauges: the exported name (differs from
    /// `name` when scaled). Histograms: `_bucket` and `_count` always use `name`; the sum is
    /// `<envoy_name>_sum` (equal to `name` when the sum is not scaled).
    pub envoy_name: &'static str,
}

pub const DURATION_BUCKETS: &[f64] = &[0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0];
pub const QUEUE_LENGTH_BUCKETS: &[f64] = &[0.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];
pub const WORK_ESTIMATED_SEATS_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0];
pub const WATCH_COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 10.0, 100.0, 1000.0, 10000.0];
pub const SEAT_UTILIZATION_BUCKETS: &[f64] = &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0];
pub const REQUEST_UTILIZATION_BUCKETS: &[f64] = &[0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.25, 0.5, 0.75, 1.0];
pub const READ_WRITE_BUCKETS: &[f64] = &[0.0, 0.001, 0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0];
pub const DEMAND_SEATS_BUCKETS: &[f64] = &[0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.8, 4.0, 6.0];

const PL: &[&str] = &["priority_level"];
const PL_FS: &[&str] = &["priority_level", "flow_schema"];

const fn m(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    envoy_scale: f64,
    envoy_name: &'static str,
) -> MetricSpec {
    MetricSpec { name, kind, labels, buckets, envoy_scale, envoy_name }
}

use MetricKind::{Counter, Gauge, Histogram};

pub use super::metric_error::StatNameError;

/// All upstream APF metrics (HEAD; the two removed after 1.36 are not included).
pub const METRICS: &[MetricSpec] = &[
    m("rejected_requests_total", Counter, &["priority_level", "flow_schema", "reason"], &[], 1.0, "rejected_requests_total"),
    m("dispatched_requests_total", Counter, PL_FS, &[], 1.0, "dispatched_requests_total"),
    m("current_inqueue_requests", Gauge, PL_FS, &[], 1.0, "current_inqueue_requests"),
    m("current_inqueue_seats", Gauge, PL_FS, &[], 1.0, "current_inqueue_seats"),
    m("current_executing_requests", Gauge, PL_FS, &[], 1.0, "current_executing_requests"),
    m("current_executing_seats", Gauge, PL_FS, &[], 1.0, "current_executing_seats"),
    m(
        "request_wait_duration_seconds",
        Histogram,
        &["priority_level", "flow_schema", "execute"],
        DURATION_BUCKETS,
        1e6,
        "request_wait_duration_microseconds",
    ),
    m(
        "request_execution_seconds",
        Histogram,
        &["priority_level", "flow_schema", "type"],
        DURATION_BUCKETS,
        1e6,
        "request_execution_microseconds",
    ),
    m("request_queue_length_after_enqueue", Histogram, PL_FS, QUEUE_LENGTH_BUCKETS, 1.0, "request_queue_length_after_enqueue"),
    m("work_estimated_seats", Histogram, PL_FS, WORK_ESTIMATED_SEATS_BUCKETS, 1.0, "work_estimated_seats"),
    m("watch_count_samples", Histogram, PL_FS, WATCH_COUNT_BUCKETS, 1.0, "watch_count_samples"),
    m("request_dispatch_no_accommodation_total", Counter, PL_FS, &[], 1.0, "request_dispatch_no_accommodation_total"),
    m("epoch_advance_total", Counter, &["priority_level", "success"], &[], 1.0, "epoch_advance_total"),
    m("current_r", Gauge, PL, &[], 1000.0, "current_r_milli"),
    m("dispatch_r", Gauge, PL, &[], 1000.0, "dispatch_r_milli"),
    m("latest_s", Gauge, PL, &[], 1000.0, "latest_s_milli"),
    m("next_s_bounds", Gauge, &["priority_level", "bound"], &[], 1000.0, "next_s_bounds_milli"),
    m("next_discounted_s_bounds", Gauge, &["priority_level", "bound"], &[], 1000.0, "next_discounted_s_bounds_milli"),
    m("nominal_limit_seats", Gauge, PL, &[], 1.0, "nominal_limit_seats"),
    m("lower_limit_seats", Gauge, PL, &[], 1.0, "lower_limit_seats"),
    m("upper_limit_seats", Gauge, PL, &[], 1.0, "upper_limit_seats"),
    m("current_limit_seats", Gauge, PL, &[], 1.0, "current_limit_seats"),
    m("demand_seats_high_watermark", Gauge, PL, &[], 1.0, "demand_seats_high_watermark"),
    m("demand_seats_average", Gauge, PL, &[], 1000.0, "demand_seats_average_milli"),
    m("demand_seats_stdev", Gauge, PL, &[], 1000.0, "demand_seats_stdev_milli"),
    m("demand_seats_smoothed", Gauge, PL, &[], 1000.0, "demand_seats_smoothed_milli"),
    m("target_seats", Gauge, PL, &[], 1000.0, "target_seats_milli"),
    m("seat_fair_frac", Gauge, &[], &[], 1000.0, "seat_fair_frac_milli"),
    m(
        "priority_level_seat_utilization",
        Histogram,
        &["priority_level", "phase"],
        SEAT_UTILIZATION_BUCKETS,
        1e6,
        "priority_level_seat_utilization_micro",
    ),
    m(
        "priority_level_request_utilization",
        Histogram,
        &["phase", "priority_level"],
        REQUEST_UTILIZATION_BUCKETS,
        1e6,
        "priority_level_request_utilization_micro",
    ),
    m(
        "read_vs_write_current_requests",
        Histogram,
        &["phase", "request_kind"],
        READ_WRITE_BUCKETS,
        1e6,
        "read_vs_write_current_requests_micro",
    ),
    m("demand_seats", Histogram, PL, DEMAND_SEATS_BUCKETS, 1e6, "demand_seats_micro"),
];

/// Every label key used by some metric (one `stats_tags` entry each).
pub const LABEL_KEYS: &[&str] =
    &["priority_level", "flow_schema", "reason", "execute", "type", "success", "bound", "phase", "request_kind", "le"];

/// Look a metric up by its upstream name (without prefix).
pub fn spec(name: &str) -> Option<&'static MetricSpec> {
    METRICS.iter().find(|s| s.name == name)
}

/// Make a label value safe for a flat, dot-separated stat name: `.` → `_`, empty → `_`.
pub fn sanitize_label_value(v: &str) -> String {
    if v.is_empty() {
        "_".to_string()
    } else {
        v.replace('.', "_")
    }
}

/// `.key.value` pairs for `label_values`, given in the order of `spec.labels`.
fn label_pairs(spec: &MetricSpec, label_values: &[&str]) -> Result<String, StatNameError> {
    if label_values.len() != spec.labels.len() {
        let (want, got) = (spec.labels.len(), label_values.len());
        return Err(StatNameError::LabelCount { metric: spec.name, want, got });
    }
    let pairs = spec.labels.iter().zip(label_values);
    Ok(pairs.map(|(k, v)| format!(".{k}.{}", sanitize_label_value(v))).collect())
}

/// Flat Envoy stat name (as passed to `define_metric`) for a counter or gauge and its label
/// values, given in the order of `spec.labels`. Histograms have several series:
/// [`histogram_stat_names`].
pub fn stat_name(spec: &MetricSpec, label_values: &[&str]) -> Result<String, StatNameError> {
    if spec.kind == MetricKind::Histogram {
        return Err(StatNameError::IsHistogram { metric: spec.name });
    }
    Ok(format!("{PREFIX}{}{}", spec.envoy_name, label_pairs(spec, label_values)?))
}

/// The `le` label value of a bucket bound, as upstream's Prometheus client prints it
/// (`strconv.FormatFloat(b, 'g', -1, 64)`): shortest round-trip digits, no exponent for the
/// bounds upstream uses (all between 0.001 and 10000).
pub fn le_label(bound: f64) -> String {
    if bound.is_infinite() && bound > 0.0 {
        "+Inf".to_string()
    } else {
        format!("{bound}")
    }
}

/// Whether a histogram's `_sum` is exported under upstream's name (integer samples) or scaled
/// under `<envoy_name>_sum` (fractional samples).
pub fn sum_is_scaled(spec: &MetricSpec) -> bool {
    spec.envoy_scale != 1.0
}

/// Name of the series carrying a histogram's sum, without [`PREFIX`]: `<name>_sum`, or
/// `<envoy_name>_sum` when scaled (`request_wait_duration_microseconds_sum`).
pub fn sum_series_name(spec: &MetricSpec) -> String {
    format!("{}_sum", if sum_is_scaled(spec) { spec.envoy_name } else { spec.name })
}

/// The flat Envoy stat names of one histogram series (one label set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramStatNames {
    /// `<name>_bucket.<labels>.le.<bound>`: one per upstream bound, then `+Inf`.
    pub buckets: Vec<String>,
    /// [`sum_series_name`] with the labels.
    pub sum: String,
    /// `<name>_count.<labels>`.
    pub count: String,
}

impl HistogramStatNames {
    /// Every name in the order of [`HistogramAcc::take`]'s deltas: buckets, sum, count.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.buckets.iter().chain([&self.sum, &self.count])
    }
}

/// Flat Envoy stat names for a histogram and its label values (order of `spec.labels`).
pub fn histogram_stat_names(spec: &MetricSpec, label_values: &[&str]) -> Result<HistogramStatNames, StatNameError> {
    if spec.kind != MetricKind::Histogram {
        return Err(StatNameError::NotHistogram { metric: spec.name });
    }
    let labels = label_pairs(spec, label_values)?;
    let name = spec.name;
    let bounds = spec.buckets.iter().copied().chain([f64::INFINITY]);
    let buckets = bounds.map(|b| format!("{PREFIX}{name}_bucket{labels}.le.{}", le_label(b))).collect();
    Ok(HistogramStatNames {
        buckets,
        sum: format!("{PREFIX}{}{labels}", sum_series_name(spec)),
        count: format!("{PREFIX}{name}_count{labels}"),
    })
}

/// Sums are accumulated in units of 1e-9 of the upstream unit (nanoseconds for seconds).
const SUM_FINE_PER_UNIT: f64 = 1e9;

/// One histogram series aggregated in a VM between flushes, as Prometheus' client does it
/// (`prometheus/client_golang` `histogram.observe`: a sample goes into the first bucket whose
/// upper bound is ≥ it, NaN and values above every bound only into `+Inf`). Host-independent.
#[derive(Debug, Clone)]
pub struct HistogramAcc {
    bounds: &'static [f64],
    /// Non-cumulative counts since the last [`take`](Self::take): one per bound, then `+Inf`.
    counts: Vec<u64>,
    /// Σ samples since the last take, in [`SUM_FINE_PER_UNIT`] units.
    sum_fine: u64,
    /// Fine units not exported yet (less than one `step`).
    carry_fine: u64,
    /// Fine units per exported sum unit (1000 for microseconds of seconds).
    step: u64,
}

impl HistogramAcc {
    pub fn new(spec: &MetricSpec) -> HistogramAcc {
        let step = ((SUM_FINE_PER_UNIT / spec.envoy_scale).round() as u64).max(1);
        HistogramAcc { bounds: spec.buckets, counts: vec![0; spec.buckets.len() + 1], sum_fine: 0, carry_fine: 0, step }
    }

    /// Records one sample in upstream units (seconds, seats).
    pub fn observe(&mut self, x: f64) {
        let i = self.bounds.iter().position(|b| x <= *b).unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c = c.saturating_add(1);
        }
        // Clamped to `u64`: negative and NaN add 0 (`as` saturates).
        let fine = (x * SUM_FINE_PER_UNIT).round() as u64;
        self.sum_fine = self.sum_fine.saturating_add(fine);
    }

    /// What to add to the exported counters since the last call, in the order of
    /// [`HistogramStatNames::all`]: each `_bucket` (cumulative, `+Inf` last), the sum (in
    /// exported units; the remainder is carried to the next call), `_count`. `None` when
    /// nothing was recorded.
    pub fn take(&mut self) -> Option<Vec<u64>> {
        let mut total = 0u64;
        let cumulative = self.counts.iter_mut().map(|c| {
            total = total.saturating_add(std::mem::take(c));
            total
        });
        let mut out: Vec<u64> = cumulative.collect();
        if total == 0 {
            return None;
        }
        let fine = self.carry_fine.saturating_add(std::mem::take(&mut self.sum_fine));
        self.carry_fine = fine % self.step;
        out.extend([fine / self.step, total]);
        Some(out)
    }
}

/// `(tag_name, regex)` for every label key: Envoy `stats_tags` regexes (RE2 syntax; group 1
/// removed, group 2 = value). `le` is always the last pair and its value may have one dot
/// (`0.005`), so its regex is anchored at the end and takes an optional `.digits`.
pub fn stats_tags() -> Vec<(String, String)> {
    let tag = |k: &&str| {
        let value = if *k == "le" { r"([^.]+(?:\.[0-9]+)?))$" } else { r"([^.]+))" };
        let prefix = r"^(?:wasmcustom\.)?(?:apiserver_flowcontrol|apf_wasm)_[a-z_]+(?:\.[a-z_]+\.[^.]+)*?";
        (k.to_string(), format!(r"{prefix}(\.{k}\.{value}"))
    };
    LABEL_KEYS.iter().map(tag).collect()
}

/// Envoy bootstrap `stats_config` snippet: the tag regexes.
pub fn envoy_stats_config_yaml() -> String {
    let tags = stats_tags().into_iter().map(|(tag, re)| format!("  - tag_name: {tag}\n    regex: '{re}'\n"));
    String::from("stats_config:\n  use_all_default_tags: true\n  stats_tags:\n") + &tags.collect::<String>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let s = spec("rejected_requests_total").unwrap();
        assert_eq!(
            stat_name(s, &["workload-low", "service-accounts", "queue-full"]).unwrap(),
            "apiserver_flowcontrol_rejected_requests_total.priority_level.workload-low.flow_schema.service-accounts.reason.queue-full"
        );
        assert!(stat_name(s, &["x"]).is_err());
        assert_eq!(stat_name(spec("seat_fair_frac").unwrap(), &[]).unwrap(), "apiserver_flowcontrol_seat_fair_frac_milli");
        assert_eq!(sanitize_label_value("a.b.c"), "a_b_c");
        assert_eq!(sanitize_label_value(""), "_");
        let w = spec("request_wait_duration_seconds").unwrap();
        assert!(stat_name(w, &["a", "b", "true"]).is_err());
        let h = histogram_stat_names(w, &["a", "b", "true"]).unwrap();
        assert_eq!(
            h.buckets[1],
            "apiserver_flowcontrol_request_wait_duration_seconds_bucket.priority_level.a.flow_schema.b.execute.true.le.0.005"
        );
        assert_eq!(
            h.buckets.last().unwrap(),
            "apiserver_flowcontrol_request_wait_duration_seconds_bucket.priority_level.a.flow_schema.b.execute.true.le.+Inf"
        );
        assert_eq!(h.sum, "apiserver_flowcontrol_request_wait_duration_microseconds_sum.priority_level.a.flow_schema.b.execute.true");
        assert_eq!(h.count, "apiserver_flowcontrol_request_wait_duration_seconds_count.priority_level.a.flow_schema.b.execute.true");
        assert_eq!(h.all().count(), DURATION_BUCKETS.len() + 3);
        let q = histogram_stat_names(spec("work_estimated_seats").unwrap(), &["a", "b"]).unwrap();
        assert_eq!(q.sum, "apiserver_flowcontrol_work_estimated_seats_sum.priority_level.a.flow_schema.b");
        assert!(histogram_stat_names(spec("dispatched_requests_total").unwrap(), &["a", "b"]).is_err());
        let mut acc = HistogramAcc::new(w);
        assert_eq!(acc.take(), None);
        acc.observe(0.005);
        acc.observe(0.0000005);
        acc.observe(31.0);
        assert_eq!(acc.take().unwrap(), vec![0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 31_005_000, 3]);
        acc.observe(0.0000005);
        assert_eq!(acc.take().unwrap()[14], 1, "the carried 500 ns make a microsecond");
        // Every label key used by a metric has a tag, and names are unique.
        for s in METRICS {
            for l in s.labels {
                assert!(LABEL_KEYS.contains(l), "{l}");
            }
            assert!(s.envoy_name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            assert_eq!(METRICS.iter().filter(|o| o.envoy_name == s.envoy_name).count(), 1);
        }
    }

    #[test]
    fn yaml_snippets() {
        let y = envoy_stats_config_yaml();
        assert!(y.contains("  - tag_name: priority_level\n    regex: '^(?:wasmcustom\\.)?(?:apiserver_flowcontrol|apf_wasm)_[a-z_]+(?:\\.[a-z_]+\\.[^.]+)*?(\\.priority_level\\.([^.]+))'\n"), "{y}");
        assert!(y.contains("  - tag_name: le\n"), "{y}");
        assert!(!y.contains("histogram_bucket_settings"), "histograms are bucket counters: {y}");
    }
}
