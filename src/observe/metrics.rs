//! Upstream APF metrics (reference §9.3; `pkg/util/flowcontrol/metrics/metrics.go`) and their
//! mapping to flat Envoy stat names.
//!
//! ## Naming scheme
//! proxy-wasm metrics have flat names (Envoy stores them as `wasmcustom.<name>`), so labels are
//! encoded as `.key.value` pairs after the metric name, in the label order of [`MetricSpec`]:
//!
//! ```text
//! apiserver_flowcontrol_<envoy_name>(.<label>.<sanitized value>)*
//! e.g. apiserver_flowcontrol_rejected_requests_total.priority_level.workload-low.flow_schema.service-accounts.reason.queue-full
//! ```
//!
//! Label values are sanitized by [`sanitize_label_value`]: every `.` becomes `_` and the empty
//! value becomes `_`. Kubernetes object names never contain `_`, so the mapping is collision-free
//! for them (a name with dots, e.g. `a.b`, is reported as `a_b`).
//!
//! ## Turning names back into Prometheus labels
//! For each label key `k`, Envoy's `stats_config.stats_tags` gets
//! `{tag_name: k, regex: '^(?:wasmcustom\.)?apiserver_flowcontrol_[a-z_]+(?:\.[a-z_]+\.[^.]+)*?(\.k\.([^.]+))'}`.
//! Envoy semantics: the first capture group (`.k.value`) is removed from the tag-extracted name,
//! the second one is the tag value; every specifier runs against the full name. The pair
//! structure before the group keeps key/value alignment, so a value equal to a key name can't
//! be mistaken for a key. After all tags are extracted the name is
//! `wasmcustom.apiserver_flowcontrol_<envoy_name>`, which Envoy's Prometheus endpoint exports
//! as `apiserver_flowcontrol_<envoy_name>{k="value",...}` (custom namespace stripped, no
//! `envoy_` prefix). In Istio, put [`envoy_stats_config_yaml`] into an `EnvoyFilter`
//! `BOOTSTRAP` `MERGE` patch and [`istio_proxy_stats_matcher_yaml`] into `proxyStatsMatcher`.
//!
//! Deviation: Envoy stat values are integers. Metrics whose upstream values are fractional are
//! recorded as `round(value × 1000)`: seconds histograms are renamed `*_milliseconds`, other
//! fractional gauges/histograms get a `_milli` suffix, and their buckets are scaled ×1000.

/// Common prefix of all APF metrics.
pub const PREFIX: &str = "apiserver_flowcontrol_";
/// Envoy's namespace for proxy-wasm stats.
pub const ENVOY_CUSTOM_NAMESPACE: &str = "wasmcustom";

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
    pub stability: &'static str,
    /// Recorded Envoy value = `round(upstream value × envoy_scale)`.
    pub envoy_scale: f64,
    /// Envoy name without [`PREFIX`] (differs from `name` when scaled).
    pub envoy_name: &'static str,
}

pub const DURATION_BUCKETS: &[f64] = &[0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0];
pub const QUEUE_LENGTH_BUCKETS: &[f64] = &[0.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];
pub const WORK_ESTIMATED_SEATS_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0];
pub const WATCH_COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 10.0, 100.0, 1000.0, 10000.0];
pub const SEAT_UTILIZATION_BUCKETS: &[f64] =
    &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0];
pub const REQUEST_UTILIZATION_BUCKETS: &[f64] = &[0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.25, 0.5, 0.75, 1.0];
pub const READ_WRITE_BUCKETS: &[f64] =
    &[0.0, 0.001, 0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0];
pub const DEMAND_SEATS_BUCKETS: &[f64] = &[0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.8, 4.0, 6.0];

const PL: &[&str] = &["priority_level"];
const PL_FS: &[&str] = &["priority_level", "flow_schema"];

const fn m(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    stability: &'static str,
    envoy_scale: f64,
    envoy_name: &'static str,
) -> MetricSpec {
    MetricSpec { name, kind, labels, buckets, stability, envoy_scale, envoy_name }
}

use MetricKind::{Counter, Gauge, Histogram};

/// All upstream APF metrics (HEAD; the two removed after 1.36 are not included).
pub const METRICS: &[MetricSpec] = &[
    m("rejected_requests_total", Counter, &["priority_level", "flow_schema", "reason"], &[], "BETA", 1.0, "rejected_requests_total"),
    m("dispatched_requests_total", Counter, PL_FS, &[], "BETA", 1.0, "dispatched_requests_total"),
    m("current_inqueue_requests", Gauge, PL_FS, &[], "BETA", 1.0, "current_inqueue_requests"),
    m("current_inqueue_seats", Gauge, PL_FS, &[], "ALPHA", 1.0, "current_inqueue_seats"),
    m("current_executing_requests", Gauge, PL_FS, &[], "BETA", 1.0, "current_executing_requests"),
    m("current_executing_seats", Gauge, PL_FS, &[], "BETA", 1.0, "current_executing_seats"),
    m("request_wait_duration_seconds", Histogram, &["priority_level", "flow_schema", "execute"], DURATION_BUCKETS, "BETA", 1000.0, "request_wait_duration_milliseconds"),
    m("request_execution_seconds", Histogram, &["priority_level", "flow_schema", "type"], DURATION_BUCKETS, "ALPHA", 1000.0, "request_execution_milliseconds"),
    m("request_queue_length_after_enqueue", Histogram, PL_FS, QUEUE_LENGTH_BUCKETS, "ALPHA", 1.0, "request_queue_length_after_enqueue"),
    m("work_estimated_seats", Histogram, PL_FS, WORK_ESTIMATED_SEATS_BUCKETS, "ALPHA", 1.0, "work_estimated_seats"),
    m("watch_count_samples", Histogram, PL_FS, WATCH_COUNT_BUCKETS, "ALPHA", 1.0, "watch_count_samples"),
    m("request_dispatch_no_accommodation_total", Counter, PL_FS, &[], "ALPHA", 1.0, "request_dispatch_no_accommodation_total"),
    m("epoch_advance_total", Counter, &["priority_level", "success"], &[], "ALPHA", 1.0, "epoch_advance_total"),
    m("current_r", Gauge, PL, &[], "ALPHA", 1000.0, "current_r_milli"),
    m("dispatch_r", Gauge, PL, &[], "ALPHA", 1000.0, "dispatch_r_milli"),
    m("latest_s", Gauge, PL, &[], "ALPHA", 1000.0, "latest_s_milli"),
    m("next_s_bounds", Gauge, &["priority_level", "bound"], &[], "ALPHA", 1000.0, "next_s_bounds_milli"),
    m("next_discounted_s_bounds", Gauge, &["priority_level", "bound"], &[], "ALPHA", 1000.0, "next_discounted_s_bounds_milli"),
    m("nominal_limit_seats", Gauge, PL, &[], "BETA", 1.0, "nominal_limit_seats"),
    m("lower_limit_seats", Gauge, PL, &[], "ALPHA", 1.0, "lower_limit_seats"),
    m("upper_limit_seats", Gauge, PL, &[], "ALPHA", 1.0, "upper_limit_seats"),
    m("current_limit_seats", Gauge, PL, &[], "ALPHA", 1.0, "current_limit_seats"),
    m("demand_seats_high_watermark", Gauge, PL, &[], "ALPHA", 1.0, "demand_seats_high_watermark"),
    m("demand_seats_average", Gauge, PL, &[], "ALPHA", 1000.0, "demand_seats_average_milli"),
    m("demand_seats_stdev", Gauge, PL, &[], "ALPHA", 1000.0, "demand_seats_stdev_milli"),
    m("demand_seats_smoothed", Gauge, PL, &[], "ALPHA", 1000.0, "demand_seats_smoothed_milli"),
    m("target_seats", Gauge, PL, &[], "ALPHA", 1000.0, "target_seats_milli"),
    m("seat_fair_frac", Gauge, &[], &[], "ALPHA", 1000.0, "seat_fair_frac_milli"),
    m("priority_level_seat_utilization", Histogram, &["priority_level", "phase"], SEAT_UTILIZATION_BUCKETS, "ALPHA", 1000.0, "priority_level_seat_utilization_milli"),
    m("priority_level_request_utilization", Histogram, &["phase", "priority_level"], REQUEST_UTILIZATION_BUCKETS, "ALPHA", 1000.0, "priority_level_request_utilization_milli"),
    m("read_vs_write_current_requests", Histogram, &["phase", "request_kind"], READ_WRITE_BUCKETS, "ALPHA", 1000.0, "read_vs_write_current_requests_milli"),
    m("demand_seats", Histogram, PL, DEMAND_SEATS_BUCKETS, "ALPHA", 1000.0, "demand_seats_milli"),
];

/// Every label key used by some metric (one `stats_tags` entry each).
pub const LABEL_KEYS: &[&str] =
    &["priority_level", "flow_schema", "reason", "execute", "type", "success", "bound", "phase", "request_kind", "le"];

/// Reject reasons (`reason` label).
pub const REASON_QUEUE_FULL: &str = "queue-full";
pub const REASON_CONCURRENCY_LIMIT: &str = "concurrency-limit";
pub const REASON_TIME_OUT: &str = "time-out";

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

/// Flat Envoy stat name (as passed to `define_metric`) for a metric and its label values,
/// given in the order of `spec.labels`.
pub fn stat_name(spec: &MetricSpec, label_values: &[&str]) -> Result<String, String> {
    if label_values.len() != spec.labels.len() {
        return Err(format!(
            "metric {} takes {} label values, got {}",
            spec.name,
            spec.labels.len(),
            label_values.len()
        ));
    }
    let mut s = String::with_capacity(64);
    s.push_str(PREFIX);
    s.push_str(spec.envoy_name);
    for (k, v) in spec.labels.iter().zip(label_values) {
        s.push('.');
        s.push_str(k);
        s.push('.');
        s.push_str(&sanitize_label_value(v));
    }
    Ok(s)
}

/// Value to record in Envoy for an upstream value: `round(x × scale)`, clamped to `u64`
/// (negative and NaN → 0).
pub fn envoy_value(spec: &MetricSpec, x: f64) -> u64 {
    let v = (x * spec.envoy_scale).round();
    if v.is_nan() || v <= 0.0 {
        0
    } else if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

/// Envoy `stats_tags` regex for one label key (RE2 syntax; group 1 removed, group 2 = value).
pub fn tag_regex(label_key: &str) -> String {
    format!(r"^(?:wasmcustom\.)?apiserver_flowcontrol_[a-z_]+(?:\.[a-z_]+\.[^.]+)*?(\.{label_key}\.([^.]+))")
}

/// `(tag_name, regex)` for every label key.
pub fn stats_tags() -> Vec<(String, String)> {
    LABEL_KEYS.iter().map(|k| (k.to_string(), tag_regex(k))).collect()
}

/// Envoy histogram buckets (scaled) for a histogram metric.
pub fn envoy_buckets(spec: &MetricSpec) -> Vec<f64> {
    spec.buckets.iter().map(|b| (b * spec.envoy_scale * 1e6).round() / 1e6).collect()
}


/// Envoy bootstrap `stats_config` snippet: tag regexes and histogram buckets.
pub fn envoy_stats_config_yaml() -> String {
    let mut y = String::from("stats_config:\n  use_all_default_tags: true\n  stats_tags:\n");
    for (tag, re) in stats_tags() {
        y.push_str(&format!("  - tag_name: {tag}\n    regex: '{re}'\n"));
    }
    y
}

/// Istio `proxyStatsMatcher` snippet (mesh config `defaultConfig` or the
/// `proxy.istio.io/config` annotation) so the custom stats reach the Prometheus endpoint.
pub fn istio_proxy_stats_matcher_yaml() -> String {
    format!("proxyStatsMatcher:\n  inclusionPrefixes:\n  - {ENVOY_CUSTOM_NAMESPACE}.{PREFIX}\n  - {PREFIX}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let s = spec("rejected_requests_total").unwrap();
        assert_eq!(
            stat_name(s, &["workload-low", "service-accounts", REASON_QUEUE_FULL]).unwrap(),
            "apiserver_flowcontrol_rejected_requests_total.priority_level.workload-low.flow_schema.service-accounts.reason.queue-full"
        );
        assert!(stat_name(s, &["x"]).is_err());
        assert_eq!(stat_name(spec("seat_fair_frac").unwrap(), &[]).unwrap(), "apiserver_flowcontrol_seat_fair_frac_milli");
        assert_eq!(sanitize_label_value("a.b.c"), "a_b_c");
        assert_eq!(sanitize_label_value(""), "_");
        let w = spec("request_wait_duration_seconds").unwrap();
        assert_eq!(envoy_value(w, 0.0125), 13);
        assert_eq!(envoy_value(w, f64::NAN), 0);
        assert_eq!(envoy_value(w, -1.0), 0);
        assert_eq!(envoy_value(w, f64::INFINITY), u64::MAX);
        assert_eq!(envoy_buckets(w)[1], 5.0);
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
        assert!(y.contains("  - tag_name: priority_level\n    regex: '^(?:wasmcustom\\.)?apiserver_flowcontrol_[a-z_]+(?:\\.[a-z_]+\\.[^.]+)*?(\\.priority_level\\.([^.]+))'\n"), "{y}");
        assert!(y.contains("  - tag_name: le\n"), "{y}");
        assert!(!y.contains("histogram_bucket_settings"), "histograms are bucket counters: {y}");
        let i = istio_proxy_stats_matcher_yaml();
        assert!(i.contains("- wasmcustom.apiserver_flowcontrol_\n"));
    }
}
